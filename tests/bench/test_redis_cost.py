"""The Redis rows' arithmetic: per stored turn, per idle second, and the targets beside a baseline."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from compaction_worker.bench.environment import WorkerSource
from compaction_worker.bench.meter import Monitored, Snapshot
from compaction_worker.bench.redis_cost import TurnCost, cost_rows, median_cost, sent_time, turn_cost

TURNS = 400


def _cost(**figures: float) -> TurnCost:
    base = dict.fromkeys(
        (
            "sent",
            "inside",
            "executed",
            "usec",
            "cpu_usec",
            "paced_cpu_usec",
            "paced_usec",
            "busy_cpu_usec",
            "busy_usec",
            "opening_cpu_usec",
            "shard_paced_cpu_usec",
            "shard_paced_per_send",
            "shard_backlog_cpu_usec",
            "shard_backlog_per_send",
            "shard_writes_cpu_usec",
            "connections",
            "idle_sent",
            "idle_inside",
        ),
        1.0,
    )
    return TurnCost(**{**base, **figures}, detail="d")


def test_a_turns_figures_come_from_the_counted_phase_its_time_from_the_sent_commands() -> None:
    stats = Snapshot(
        Counter({"evalsha": TURNS, "hgetall": 2 * TURNS, "pexpire": 10 * TURNS, "zcard": 8}),
        Counter({"evalsha": 40 * TURNS, "hgetall": 4 * TURNS, "pexpire": 10 * TURNS, "zcard": 16}),
        cpu_seconds=0.03,
    )
    counted = Monitored(
        sent=Counter({"evalsha": TURNS, "hgetall": TURNS, "zrange": 4}),
        inside=Counter({"hgetall": TURNS, "pexpire": 10 * TURNS}),
    )
    idle = Monitored(sent=Counter({"zrangebyscore": 100, "zcard": 100}), inside=Counter({"zadd": 10}))
    paced = Snapshot(Counter({"evalsha": TURNS}), Counter({"evalsha": 50 * TURNS}), cpu_seconds=0.06)
    busy = Snapshot(Counter({"evalsha": 2000}), Counter({"evalsha": 30 * 2000}), cpu_seconds=0.1)
    opening = Snapshot(Counter({"evalsha": 400}), Counter({"evalsha": 60 * 400}), cpu_seconds=0.05)
    cost = turn_cost(
        TURNS,
        stats,
        counted,
        idle,
        idle_seconds=5.0,
        paced=paced,
        busy=busy,
        busy_turns=2000,
        opening=opening,
        opening_seconds=2.0,
        idle_cpu=0.001,
        timed_seconds=2.0,
        paced_seconds=8.0,
        busy_seconds=10.0,
    )
    assert cost.sent == pytest.approx(2.01)
    assert cost.inside == 11.0
    assert cost.executed == pytest.approx(13.02)
    # EVALSHA 40 (its calls inside), HGETALL's 4 split half sent, PEXPIRE only inside: 0, ZCARD not counted: sent.
    assert cost.usec == pytest.approx(40 + 2 + 16 / TURNS)
    # The process's CPU less the idle worker's over the same time: (0.03 - 0.002) s, (0.06 - 0.008) s.
    assert cost.cpu_usec == pytest.approx(70.0)
    assert cost.paced_cpu_usec == pytest.approx(130.0)
    assert cost.paced_usec == 50.0
    # A busy shard's phase: its own turns, (0.1 - 0.01) s over 2,000.
    assert cost.busy_cpu_usec == pytest.approx(45.0)
    assert cost.busy_usec == 30.0
    # The busy shard's first round, apart: (0.05 - 0.002) s over its 400 first turns.
    assert cost.opening_cpu_usec == pytest.approx(120.0)
    assert (cost.idle_sent, cost.idle_inside) == (40.0, 2.0)
    assert "time split by calls: hgetall" in cost.detail
    assert "taken as sent): zcard" in cost.detail


def test_each_figure_is_the_median_of_the_runs() -> None:
    runs = [_cost(usec=30.0, sent=2.0), _cost(usec=10.0, sent=1.0), _cost(usec=20.0, sent=3.0)]
    assert (median_cost(runs).usec, median_cost(runs).sent) == (20.0, 2.0)


def test_alone_the_targets_are_issue_24s_values_beside_a_baseline_the_time_is_a_third_of_its() -> None:
    alone = {
        row.name: row for row in cost_rows(_cost(usec=25.0, sent=1.2, idle_sent=3.0), None, None, 3, 5.0)
    }
    assert alone["Redis commands sent per stored turn"].met is True  # 1.2 <= 1.5
    time_row = alone["Redis command time per stored turn"]
    assert (time_row.target, time_row.baseline, time_row.met) == (30.0, None, True)
    assert "40,000 turns/s" in time_row.note
    source = WorkerSource(Path("/tmp/base"), "worker at abc1234")
    beside = {
        row.name: row
        for row in cost_rows(_cost(usec=25.0, sent=1.2), _cost(usec=60.0, sent=2.0), source, 3, 5.0)
    }
    time_row = beside["Redis command time per stored turn"]
    assert (time_row.baseline, time_row.baseline_name, time_row.met) == (60.0, "worker at abc1234", False)
    sent = beside["Redis commands sent per stored turn"]
    assert (sent.value, sent.baseline, sent.met) == (1.2, 2.0, True)  # the target stays on the value
    assert set(beside) == set(alone)


def test_the_busy_shards_rows_show_only_when_redis_could_have_a_core_of_its_own() -> None:
    shared = {row.name for row in cost_rows(_cost(shard_paced_cpu_usec=0.0), None, None, 3, 5.0)}
    own = {
        row.name: row
        for row in cost_rows(
            _cost(shard_paced_cpu_usec=31.0, shard_backlog_cpu_usec=12.0, shard_writes_cpu_usec=24.8),
            None,
            None,
            3,
            5.0,
        )
    }
    assert set(own) - shared == {
        "Redis CPU per stored turn, a busy shard, agent pace",
        "Redis CPU per stored turn, a busy shard, backlog",
        "Redis CPU per stored turn, a busy shard, the writes alone",
    }
    paced = own["Redis CPU per stored turn, a busy shard, agent pace"]
    assert paced.met is False  # 31 > 30
    assert "1.25x the writes alone" in paced.note  # 31 / 24.8
    assert own["Redis CPU per stored turn, a busy shard, backlog"].met is True  # 12 <= 15
    assert own["Redis CPU per stored turn, a busy shard, the writes alone"].target is None


def test_a_baselines_rows_show_no_busy_shard_beside_this_checkouts() -> None:
    """The busy shard runs this checkout's Store in the bench's process: a baseline has none to show."""
    source = WorkerSource(Path("/tmp/base"), "worker at abc1234")
    this, base = _cost(shard_paced_cpu_usec=31.0), _cost(shard_paced_cpu_usec=0.0)
    rows = {row.name: row for row in cost_rows(this, base, source, 3, 5.0)}
    assert rows["Redis CPU per stored turn, a busy shard, agent pace"].baseline is None
    assert rows["Redis CPU per stored turn, backlog"].baseline == 1.0


def test_a_transactions_time_is_its_commands_counted_once() -> None:
    """``EXEC``'s commandstats time includes the commands it ran, counted under their names too."""
    stats = Snapshot(
        Counter({"watch": 1, "hmget": 10, "multi": 1, "rpush": 20, "exec": 1}),
        Counter({"watch": 5, "hmget": 20, "multi": 1, "rpush": 100, "exec": 110}),
        cpu_seconds=0.0,
    )
    counted = Monitored(
        sent=Counter({"watch": 1, "hmget": 10, "multi": 1, "rpush": 20, "exec": 1}), inside=Counter()
    )
    assert sent_time(stats, counted)[0] == 126.0
