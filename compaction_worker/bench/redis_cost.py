"""The Redis rows: what a stored turn and an idle worker cost the Redis server, from its own counters.

They are measured on the one-worker process of the throughput rows (this checkout's, and with
``--baseline-source`` the other's) once its rate is measured: attached, warmed up, on its own
topic and key prefix. Three phases follow, with nothing else using Redis (the end of a phase
is read from the group's committed offsets on the broker):

1. idle: the worker attached with nothing to do: the Redis CPU it costs per second (``INFO
   cpu``), then its commands counted with ``MONITOR``;
2. timed, a backlog: 20 new conversations x 20 small turns sent at once, no compaction due,
   between two ``INFO cpu commandstats`` snapshots (the CPU, the command time and the
   commands executed);
3. agent pace, a quiet shard: 20 other conversations x 20 turns, one turn per conversation at
   a time (each round of 20 is sent once the round before it is committed), as agents produce
   them: every turn is a call of its own, where a backlog gives a call a run of turns.
   Redis is idle between rounds, so this is what a turn costs a shard that wakes up for it;
4. agent pace, a busy shard: 400 other conversations x 6 turns, one turn per conversation at a
   time (rounds of 400): still one call a turn, but many conversations' calls arrive
   together, as they do on a shard whose capacity matters. The first round opens the
   conversations (a first turn creates their keys and gives each its deadline) and is measured
   apart: a shard carries its conversations' later turns far more often than their first;
5. a busy shard (shard.py): Redis on a core of its own, sent the worker's writes by several
   stores at once, at agent pace and as a backlog: its capacity;
6. counted: 20 other conversations x 20 turns under ``MONITOR``, which splits the commands
   clients sent from those run inside scripts.

The CPU figures are the Redis process's (user + system), less what the idle worker costs
over the same time.

See ``meter.py`` for why each figure comes from where it does, and docs/performance.md.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeAlias

from redis.asyncio import Redis

from compaction_worker.bench.environment import BenchEnv, BenchError, WorkerSource
from compaction_worker.bench.load import Attached, Input, StoredCounter, make_input, wait_committed
from compaction_worker.bench.meter import SCRIPT_CALLS, TRANSACTION, Meter, Monitored, Snapshot
from compaction_worker.bench.report import Progress, Row
from compaction_worker.bench.shard import (
    BACKLOG_CONVERSATIONS,
    BACKLOG_TURNS,
    CLIENTS,
    PACED_CONVERSATIONS,
    ShardCost,
    busy_shard,
)
from compaction_worker.runtime.connections import WORKER_CLIENT_NAME

CONVERSATIONS, TURNS = 20, 20
BUSY_CONVERSATIONS, BUSY_TURNS = 400, 6
"""The agent-pace phase on a busy shard: many conversations, one turn each at a time (the first
round, their first turns, measured apart)."""
IDLE_SECONDS = 5.0
PACED_CPU_TARGET = 30.0
"""Redis CPU µs per stored turn at agent pace (issue 35)."""
BACKLOG_CPU_TARGET = 15.0
"""Redis CPU µs per stored turn in a backlog (issue 35)."""
Built: TypeAlias = list[tuple[int, Any]]
"""Turns built to send: (partition, record batch) pairs (load.Batches.build)."""
SETTLE_SECONDS = 1.0
"""Before the idle phase: the worker's chores after the turns it stored before are done."""


def idle_seconds(scale: float) -> float:
    """The idle phase: 5 s, at least 2 s on a small run."""
    return max(2.0, IDLE_SECONDS * scale)


@dataclass(frozen=True, slots=True)
class TurnCost:
    """One run's figures: per stored turn, and per second of an idle worker."""

    sent: float
    """Commands clients sent, per stored turn (``MONITOR``, phase 3)."""
    inside: float
    """Commands run inside scripts, per stored turn (``MONITOR``, phase 3)."""
    executed: float
    """Every command executed, per stored turn (``INFO commandstats``, phase 2): sent + inside."""
    usec: float
    """Command time, per stored turn: the time of the commands clients sent (a script's includes its calls)."""
    cpu_usec: float
    """Redis process CPU per stored turn in a backlog (phase 2), the idle worker's cost left out:
    command time plus network I/O and the rest of the event loop."""
    paced_cpu_usec: float
    """Redis process CPU per stored turn at agent pace (phase 3), the idle worker's cost left out."""
    paced_usec: float
    """Command time per stored turn at agent pace (phase 3)."""
    busy_cpu_usec: float
    """Redis process CPU per stored turn at agent pace on a busy shard (phase 4), the idle worker's cost left out."""
    busy_usec: float
    """Command time per stored turn at agent pace on a busy shard (phase 4)."""
    opening_cpu_usec: float
    """Redis process CPU per stored turn of the busy shard's first round: each conversation's first turn."""
    shard_paced_cpu_usec: float
    """Redis CPU per stored turn on a busy shard at agent pace (phase 5; 0: Redis could not have a core of its own)."""
    shard_paced_per_send: float
    shard_backlog_cpu_usec: float
    """Redis CPU per stored turn on a busy shard in a backlog (phase 5; 0: not measured)."""
    shard_backlog_per_send: float
    shard_writes_cpu_usec: float
    """Redis CPU per stored turn on a busy shard for an append's writes alone (phase 5; 0: not measured)."""
    connections: float
    """The Redis connections the worker process held after the backlog and the agent-pace phases (``CLIENT LIST``)."""
    idle_sent: float
    """Commands per second an idle worker sends."""
    idle_inside: float
    """Commands per second an idle worker's scripts run."""
    detail: str = ""


def sent_time(stats: Snapshot, counted: Monitored) -> tuple[float, list[str], list[str]]:
    """Microseconds of the commands clients sent; the names whose time is split, and those not in ``counted``.

    ``commandstats`` counts a command called by a script under its own name too, and the
    script's time already includes it: only the commands clients sent add up. A name seen
    only as sent, or only inside scripts, is exact. A name seen both ways has its time split
    by its calls; one the ``MONITOR`` phase did not see (a sweep that ran in one phase only)
    counts as sent. ``EXEC`` is left out: its time is its queued commands', counted by their names.
    """
    total, split, unseen = 0.0, [], []
    for name, usec in stats.usec.items():
        head = name.split("|")[0]
        if head == TRANSACTION:
            continue
        sent, inside = counted.sent[head], counted.inside[head]
        if head in SCRIPT_CALLS or (sent and not inside):
            total += usec
        elif sent and inside:
            total += usec * sent / (sent + inside)
            split.append(name)
        elif not inside:
            total += usec
            unseen.append(name)
    return total, split, unseen


def turn_cost(
    turns: int,
    stats: Snapshot,
    counted: Monitored,
    idle: Monitored,
    idle_seconds: float,
    *,
    paced: Snapshot,
    busy: Snapshot,
    busy_turns: int,
    opening: Snapshot,
    opening_seconds: float,
    idle_cpu: float = 0.0,
    timed_seconds: float = 0.0,
    paced_seconds: float = 0.0,
    busy_seconds: float = 0.0,
    connections: int = 0,
    shard: ShardCost | None = None,
) -> TurnCost:
    """The figures of one run from its phases; ``idle_cpu``: the idle worker's Redis CPU seconds per
    second; ``shard``: a busy shard's figures (phase 5)."""
    usec, split, unseen = sent_time(stats, counted)
    detail = (
        f"per turn, sent: {_top(counted.sent, turns)}; inside scripts: {_top(counted.inside, turns)}; "
        f"idle, per second: {_top(idle.sent, idle_seconds)}"
    )
    detail += f"; at agent pace, executed per turn: {_top(paced.calls, turns)}"
    detail += f"; busy shard, executed per turn: {_top(busy.calls, busy_turns)}"
    if split:
        detail += f"; sent and inside scripts, time split by calls: {', '.join(sorted(split))}"
    if unseen:
        detail += f"; timed but not counted (taken as sent): {', '.join(sorted(unseen))}"
    return TurnCost(
        sent=counted.sent.total() / turns,
        inside=counted.inside.total() / turns,
        executed=stats.calls.total() / turns,
        usec=usec / turns,
        cpu_usec=stats.cpu_per_turn(timed_seconds, turns, idle_cpu),
        paced_cpu_usec=paced.cpu_per_turn(paced_seconds, turns, idle_cpu),
        paced_usec=sent_time(paced, counted)[0] / turns,
        busy_cpu_usec=busy.cpu_per_turn(busy_seconds, busy_turns, idle_cpu),
        busy_usec=sent_time(busy, counted)[0] / busy_turns,
        opening_cpu_usec=opening.cpu_per_turn(opening_seconds, BUSY_CONVERSATIONS, idle_cpu),
        **{f"shard_{name}": value for name, value in asdict(shard or ShardCost()).items()},
        connections=connections,
        idle_sent=idle.sent.total() / idle_seconds,
        idle_inside=idle.inside.total() / idle_seconds,
        detail=detail,
    )


def _top(counts: Counter[str], per: float, most: int = 6) -> str:
    shown = ", ".join(f"{name} {count / per:.2g}" for name, count in counts.most_common(most))
    rest = counts.total() - sum(count for _, count in counts.most_common(most))
    return (shown + (f", others {rest / per:.2g}" if rest else "")) or "none"


async def redis_phases(
    env: BenchEnv, worker: Attached, idle_seconds: float, progress: Progress, *, shard: bool = True
) -> TurnCost:
    """The phases on a worker attached and warmed up (see the module's docstring); ``shard``: with
    the busy shard's (phase 5: this checkout's Store, so not for a baseline's worker)."""
    if not isinstance(env.redis, Redis):
        raise BenchError("the Redis rows need a single Redis, not a cluster (MONITOR and INFO are per node)")
    timed, paced, busy, counted_input = (
        make_input(CONVERSATIONS, TURNS, "timed"),
        make_input(CONVERSATIONS, TURNS, "paced"),
        make_input(BUSY_CONVERSATIONS, BUSY_TURNS, "busy"),
        make_input(CONVERSATIONS, TURNS, "counted"),
    )
    timed_built, counted_built = (
        worker.batches.build(timed.events),
        worker.batches.build(counted_input.events),
    )
    rounds, busy_rounds = _rounds(worker, paced), _rounds(worker, busy)

    async def handled(*built_rounds: Built, poll: float = 0.02) -> None:
        """Each round sent once the one before it is committed: all of them handled on return."""
        for built in built_rounds:
            ends = await worker.batches.send(worker.topic, built)
            await wait_committed(
                env, worker.group, worker.topic, ends, alive=worker.alive, within=120, poll=poll
            )

    async with Meter(env.redis) as meter:
        await asyncio.sleep(SETTLE_SECONDS)
        progress(f"redis cost: idle for {idle_seconds:g} s, then counted for as long")
        spent, seconds = await meter.spent(asyncio.sleep(idle_seconds))
        idle_cpu = spent.cpu_seconds / seconds
        async with meter.monitor() as idle:
            await asyncio.sleep(idle_seconds)
        progress(
            f"redis cost: {timed.total} turns as a backlog, {paced.total} at agent pace, {busy.total} at agent "
            f"pace on a busy shard, then {counted_input.total} counted"
        )
        stats, timed_seconds = await meter.spent(handled(timed_built))
        connections = await worker_connections(env.redis)
        paced_stats, paced_seconds = await meter.spent(handled(*rounds, poll=0.005))
        connections = max(connections, await worker_connections(env.redis))
        opening_stats, opening_seconds = await meter.spent(handled(*busy_rounds[:1], poll=0.005))
        busy_stats, busy_seconds = await meter.spent(handled(*busy_rounds[1:], poll=0.005))
        connections = max(connections, await worker_connections(env.redis))
        shard_cost = await busy_shard(env, meter, idle_cpu, progress) if shard else None
        async with meter.monitor() as counted:
            await handled(counted_built)
    for data in (timed, paced, busy, counted_input):
        stored = await StoredCounter(env, worker.prefix, data.conversations).stored()
        if stored != data.total:
            raise BenchError(f"the worker committed {data.total} turns but Redis holds {stored}")
    return turn_cost(
        timed.total,
        stats,
        counted,
        idle,
        idle_seconds,
        paced=paced_stats,
        busy=busy_stats,
        busy_turns=busy.total - BUSY_CONVERSATIONS,
        opening=opening_stats,
        opening_seconds=opening_seconds,
        idle_cpu=idle_cpu,
        timed_seconds=timed_seconds,
        paced_seconds=paced_seconds,
        busy_seconds=busy_seconds,
        connections=connections,
        shard=shard_cost,
    )


def _rounds(worker: Attached, data: Input) -> list[Built]:
    """``data``'s turns as rounds of one turn per conversation, built to send (make_input gives
    each round after the one before it)."""
    size = len(data.conversations)
    return [worker.batches.build(data.events[i : i + size]) for i in range(0, len(data.events), size)]


async def worker_connections(redis: Redis) -> int:
    """The connections worker processes hold (named by ``connections.worker_client_name``)."""
    clients = await redis.client_list()
    return sum(1 for c in clients if str(c.get("name", "")).startswith(f"{WORKER_CLIENT_NAME}:"))


def median_cost(runs: list[TurnCost]) -> TurnCost:
    """Each figure's median over the runs (the detail of the median run by command time)."""
    values = {
        f.name: statistics.median(getattr(r, f.name) for r in runs)
        for f in fields(TurnCost)
        if f.name != "detail"
    }
    middle = sorted(runs, key=lambda r: r.usec)[len(runs) // 2]
    return TurnCost(**values, detail=middle.detail)


def cost_rows(
    this: TurnCost, base: TurnCost | None, source: WorkerSource | None, repeat: int, idle_seconds: float
) -> list[Row]:
    """The rows: targets from issue 24 on the value, the command time's on the ratio beside a baseline."""
    beside = source.label if source else ""

    def row(
        name: str, field: str, unit: str, target: float | None, note: str = "", *, alone: bool = False
    ) -> Row:
        figure = getattr(base, field) if base and not alone else None
        return Row(
            name, getattr(this, field), unit, figure, beside, target=target, target_on_value=True, note=note
        )

    shape = (
        f"{CONVERSATIONS} conversations x {TURNS} turns, no compaction due, 1 worker; median of {repeat} runs; "
        f"{this.detail}"
    )
    if base:
        shape += f"; {beside}: {base.detail}"
    time_row = Row(
        "Redis command time per stored turn",
        this.usec,
        "µs",
        base.usec if base else None,
        beside,
        target=1 / 3 if base else 30.0,
        target_on_value=base is None,
        note=f"commandstats time of the commands clients sent; one Redis core: {_per_core(this.usec)} turns/s of command time",
    )
    shard = (
        [
            row(
                "Redis CPU per stored turn, a busy shard, agent pace",
                "shard_paced_cpu_usec",
                "µs",
                PACED_CPU_TARGET,
                note=f"Redis on a core of its own sent the worker's writes by {CLIENTS} stores (as many workers), "
                f"one turn per conversation at a time over {PACED_CONVERSATIONS} conversations: "
                f"{this.shard_paced_per_send:.3g} turns a send; one Redis core: "
                f"{_per_core(this.shard_paced_cpu_usec)} turns/s; "
                f"{this.shard_paced_cpu_usec / max(this.shard_writes_cpu_usec, 1e-9):.2f}x the writes alone",
                alone=True,  # this checkout's Store, in the bench's process: no baseline's
            ),
            row(
                "Redis CPU per stored turn, a busy shard, backlog",
                "shard_backlog_cpu_usec",
                "µs",
                BACKLOG_CPU_TARGET,
                note=f"the same, {BACKLOG_CONVERSATIONS} conversations' {BACKLOG_TURNS} turns sent as runs: "
                f"{this.shard_backlog_per_send:.3g} turns a send; one Redis core: "
                f"{_per_core(this.shard_backlog_cpu_usec)} turns/s",
                alone=True,
            ),
            row(
                "Redis CPU per stored turn, a busy shard, the writes alone",
                "shard_writes_cpu_usec",
                "µs",
                None,
                note="other conversations' turns at agent pace, each round's writes (an append's: "
                "RPUSH, HSET x2) in one MULTI/EXEC a store, with no read and no check: what storing "
                "these turns costs at least",
                alone=True,
            ),
        ]
        if this.shard_paced_cpu_usec
        else []
    )
    return [
        row("Redis commands sent per stored turn", "sent", "commands", 1.5, note=shape),
        row("Redis commands inside scripts per stored turn", "inside", "commands", 12.0),
        row("Redis commands executed per stored turn (commandstats)", "executed", "commands", None),
        time_row,
        row(
            "Redis CPU per stored turn, backlog",
            "cpu_usec",
            "µs",
            BACKLOG_CPU_TARGET,
            note=f"INFO cpu (process, user + system) less the idle worker's; {CONVERSATIONS} conversations' "
            f"{TURNS} turns each sent at once; Redis sharing the cores with the worker, the broker and the bench; "
            f"one Redis core: {_per_core(this.cpu_usec)} turns/s",
        ),
        row(
            "Redis CPU per stored turn, agent pace, busy shard",
            "busy_cpu_usec",
            "µs",
            PACED_CPU_TARGET,
            note=f"one turn per conversation at a time over {BUSY_CONVERSATIONS} conversations (rounds of "
            f"{BUSY_CONVERSATIONS}, each turn its own call, many conversations' calls arriving together); "
            f"command time {this.busy_usec:.3g} µs; one Redis core: {_per_core(this.busy_cpu_usec)} turns/s; "
            f"their first turns (a round sent before, which creates their keys): {this.opening_cpu_usec:.3g} µs a turn",
        ),
        *shard,
        row(
            "Redis CPU per stored turn, agent pace, quiet shard",
            "paced_cpu_usec",
            "µs",
            None,
            note=f"one turn per conversation at a time over {CONVERSATIONS} conversations, Redis idle between "
            f"rounds: what a turn costs a shard that wakes up for it, not its capacity; command time "
            f"{this.paced_usec:.3g} µs",
        ),
        row(
            "Redis connections a worker holds",
            "connections",
            "connections",
            None,
            note="CLIENT LIST after the backlog and the agent-pace phases; at most redis.max_connections per Redis",
        ),
        row(
            "Redis commands/s an idle worker sends",
            "idle_sent",
            "commands/s",
            5.0,
            note=f"over {idle_seconds:g} s with nothing to do; its scripts ran {this.idle_inside:.3g} more/s",
        ),
    ]


def _per_core(usec: float) -> str:
    """Turns per second one Redis core sustains at ``usec`` per turn."""
    return f"{1e6 / usec:,.0f}" if usec > 0 else "unbounded"
