"""A busy shard: the worker's writes sent straight to a Redis that has a core of its own.

One worker process on this machine cannot keep a Redis core busy: it spends ten times Redis's
CPU on a turn, so its sends carry a few turns each, and a turn's share of a send's cost (reading
the request, waking up, answering) stays high. A shard in production carries a node's workers,
and their sends grow as it gets busy (scripts.Pipeline). So this phase gives Redis a core of
its own (cores.py) and sends it what workers would, without their CPU: each turn planned
beforehand by the worker's own decision (conversation/decide.py) and written through the worker's
Appends by :data:`CLIENTS` writers (a connection and a pipeline each, as many workers):

- at agent pace: one turn per conversation at a time, each conversation's next turn once the
  one before it is stored (their first turns, which create their keys, go before the clock);
- in a backlog: each conversation's turns as runs, as a worker sends a batch that holds them;
- the writes alone: other conversations' turns at agent pace, each round's writes (those the
  script makes for an append that moves no deadline: :func:`_floor`) sent as one
  ``MULTI``/``EXEC`` a writer, with no read and no check. No worker can store these turns for less: the agent-pace figure over this one
  is what the worker's reads and checks cost, whatever the size of the turns.

What it gives is the shard's capacity: Redis CPU per stored turn while it is kept busy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

from compaction_worker.bench.cores import local_pid, own_core
from compaction_worker.bench.environment import BenchEnv, BenchError
from compaction_worker.bench.load import delete_prefix, make_input
from compaction_worker.bench.meter import Meter, Snapshot
from compaction_worker.bench.report import Progress
from compaction_worker.contracts.events import TurnEvent
from compaction_worker.conversation.apply import Appends, AppendStatus, TurnWrite, records_of
from compaction_worker.conversation.decide import decide
from compaction_worker.conversation.keys import conversation_keys
from compaction_worker.conversation.meta import Meta
from compaction_worker.runtime.connections import connect_redis
from compaction_worker.runtime.runs import RUN_MAX
from compaction_worker.settings import Settings

CLIENTS = 4
"""Stores sending at once, each on its own connection: as many workers."""
PACED_CONVERSATIONS, PACED_TURNS = 400, 6
BACKLOG_CONVERSATIONS, BACKLOG_TURNS = 100, 20
_Part: TypeAlias = Callable[[list[TurnWrite]], list[TurnWrite]]
"""Which of a conversation's writes a phase sends."""


@dataclass(frozen=True, slots=True)
class ShardCost:
    """Redis process CPU per stored turn on a core of its own, and the turns a send carried (0: not measured)."""

    paced_cpu_usec: float = 0.0
    paced_per_send: float = 0.0
    backlog_cpu_usec: float = 0.0
    backlog_per_send: float = 0.0
    writes_cpu_usec: float = 0.0
    """The writes alone (the module's docstring): what storing these turns costs at least."""


def planned(settings: Settings, conversations: int, turns: int, name: str) -> dict[str, list[TurnWrite]]:
    """Each conversation's writes (load.make_input's turns), in order, as the turn handler plans them,
    each from the meta the one before it leaves (no I/O: as runs.py plans a run)."""
    metas = dict[str, Meta]()
    writes: dict[str, list[TurnWrite]] = {}
    for key, raw in make_input(conversations, turns, name).events:
        cid = key.decode()
        turn = decide(metas.get(cid, Meta()), TurnEvent.model_validate_json(raw, strict=True), settings)
        writes.setdefault(cid, []).append(turn.write)
        metas[cid] = turn.plan.after
    return writes


async def busy_shard(env: BenchEnv, meter: Meter, idle_cpu: float, progress: Progress) -> ShardCost | None:
    """The two phases (the module's docstring), measured by ``meter`` on ``env``'s Redis, or None
    when Redis cannot have a core of its own (one core; a Redis on another machine)."""
    with own_core(local_pid(await env.redis.info("server"))) as alone:
        if not alone:
            return None
        progress(
            f"redis cost: a busy shard, {CLIENTS} stores sending the turns of {PACED_CONVERSATIONS} "
            f"conversations at agent pace, then {BACKLOG_CONVERSATIONS}'s as a backlog"
        )
        prefix = env.unique("shard")
        stores = [
            Appends(connect_redis(env.settings.redis), prefix, env.settings.redis.retention_seconds)
            for _ in range(CLIENTS)
        ]
        try:
            paced = planned(env.settings, PACED_CONVERSATIONS, PACED_TURNS, "paced")
            await _sent(stores, paced, lambda writes: writes[:1], runs=False)  # the first turns
            paced_cpu, paced_seconds, paced_sends = await _measured(
                meter, stores, paced, lambda writes: writes[1:], runs=False
            )
            backlog = planned(env.settings, BACKLOG_CONVERSATIONS, BACKLOG_TURNS, "backlog")
            backlog_cpu, backlog_seconds, backlog_sends = await _measured(
                meter, stores, backlog, lambda writes: writes, runs=True
            )
            bare = planned(env.settings, PACED_CONVERSATIONS, PACED_TURNS, "bare")
            await _sent(stores, bare, lambda writes: writes[:1], runs=False)
            writes_cpu, writes_seconds = await meter.spent(_written(stores, bare))
        finally:
            for store in stores:
                await store.redis.aclose()
            await delete_prefix(env, prefix)
    paced_turns = PACED_CONVERSATIONS * (PACED_TURNS - 1)
    backlog_turns = BACKLOG_CONVERSATIONS * BACKLOG_TURNS
    return ShardCost(
        paced_cpu_usec=paced_cpu.cpu_per_turn(paced_seconds, paced_turns, idle_cpu),
        paced_per_send=paced_turns / max(1, paced_sends),
        backlog_cpu_usec=backlog_cpu.cpu_per_turn(backlog_seconds, backlog_turns, idle_cpu),
        backlog_per_send=backlog_turns / max(1, backlog_sends),
        writes_cpu_usec=writes_cpu.cpu_per_turn(writes_seconds, paced_turns, idle_cpu),
    )


async def _measured(
    meter: Meter, stores: list[Appends], writes: dict[str, list[TurnWrite]], part: _Part, *, runs: bool
) -> tuple[Snapshot, float, int]:
    """What Redis spent sending ``part`` of every conversation's writes, the seconds it took, and the sends made."""
    sends = sum(store.pipeline.sends for store in stores)
    spent, seconds = await meter.spent(_sent(stores, writes, part, runs=runs))
    return spent, seconds, sum(store.pipeline.sends for store in stores) - sends


async def _sent(
    stores: list[Appends], writes: dict[str, list[TurnWrite]], part: _Part, *, runs: bool
) -> None:
    """Every conversation's ``part`` of its writes, conversations spread over the stores, each
    conversation's in order (one turn, or one run, at a time), all conversations at once."""

    async def conversation(store: Appends, cid: str, mine: list[TurnWrite]) -> None:
        if runs:
            for at in range(0, len(mine), RUN_MAX):
                replies = await store.apply(cid, mine[at : at + RUN_MAX])
                _appended(cid, [reply.status for reply in replies], len(mine[at : at + RUN_MAX]))
        else:
            for write in mine:
                _appended(cid, [reply.status for reply in await store.apply(cid, [write])], 1)

    await asyncio.gather(
        *(
            conversation(stores[i % len(stores)], cid, part(each))
            for i, (cid, each) in enumerate(writes.items())
        )
    )


def _floor(prefix: str, cid: str, write: TurnWrite) -> tuple[tuple[str, ...], ...]:
    """The writes the per-turn script makes for ``write`` when it moves no deadline (lua/turn.lua,
    flush): the transcript, the meta, the fingerprints."""
    keys = conversation_keys(cid, prefix)
    fields = [text for pair in {"rev": str(write.rev + 1), **write.fields}.items() for text in pair]
    return (
        ("RPUSH", keys.transcript, *records_of(write)),
        ("HSET", keys.meta, *fields),
        ("HSET", keys.fingerprints, str(write.seq), write.fingerprint),
    )


async def _written(stores: list[Appends], writes: dict[str, list[TurnWrite]]) -> None:
    """Every conversation's writes after its first, a round at a time (one turn of each), each
    round's as the script makes them (:func:`_floor`) in one ``MULTI``/``EXEC`` a writer: the
    conversations spread as :func:`_sent` spreads them."""
    mine = [list(writes.items())[at :: len(stores)] for at in range(len(stores))]

    async def round_of(store: Appends, conversations: list[tuple[str, list[TurnWrite]]], at: int) -> None:
        async with store.redis.pipeline(transaction=True) as pipe:
            for cid, each in conversations:
                for command in _floor(store.prefix, cid, each[at]):
                    pipe.execute_command(*command)
            await pipe.execute()

    for at in range(1, min(len(each) for each in writes.values())):
        await asyncio.gather(*(round_of(store, mine[i], at) for i, store in enumerate(stores)))


def _appended(cid: str, statuses: list[AppendStatus], expected: int) -> None:
    if statuses != [AppendStatus.APPENDED] * expected:
        raise BenchError(f"{cid}: the busy shard's writes were answered {statuses}, not all appended")
