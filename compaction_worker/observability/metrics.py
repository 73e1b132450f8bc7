"""Metrics: the worker's instruments (OpenTelemetry metrics API) and their catalogue.

The instruments come from the global meter provider, a no-op until
``observability.setup.configure`` (or a test) installs an SDK one; the API's proxy
instruments start recording as soon as it does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

METER_NAME = "compaction_worker"

Kind = Literal["counter", "histogram", "gauge", "observable_gauge"]


@dataclass(frozen=True)
class Instrument:
    """A metric of the catalogue: its OpenTelemetry name, instrument kind, unit and meaning."""

    name: str
    kind: Kind
    unit: str
    description: str
    attributes: tuple[str, ...] = ()


TURNS = Instrument(
    "compaction.turns",
    "counter",
    "{turn}",
    "Consumed turns by outcome: status appended, duplicate, held or dead_lettered (reason says why).",
    ("status", "reason"),
)
RUNS = Instrument(
    "compaction.runs",
    "counter",
    "{compaction}",
    "Compaction runs by trigger and outcome (committed, noop, failed, ...).",
    ("trigger", "outcome"),
)
TOKENS_BEFORE = Instrument(
    "compaction.tokens.before",
    "histogram",
    "{token}",
    "Effective history tokens before a committed compaction.",
)
TOKENS_AFTER = Instrument(
    "compaction.tokens.after",
    "histogram",
    "{token}",
    "Effective history tokens after a committed compaction.",
)
TOKENS_SAVED = Instrument(
    "compaction.tokens.saved", "counter", "{token}", "Tokens removed from effective histories by compactions."
)
CACHE_WRITE_COST = Instrument(
    "compaction.cache_write.cost",
    "counter",
    "USD",
    "What the calls after committed compactions pay for the prompt they rewrote, beyond cache reads "
    "(LiteLLM's prices for the conversation's model).",
)
BREAK_EVEN = Instrument(
    "compaction.break_even",
    "histogram",
    "{call}",
    "Later calls until a committed compaction has paid for its cache write and its summary calls.",
)
LLM_DURATION = Instrument(
    "gen_ai.client.operation.duration",
    "histogram",
    "s",
    "Summarizer LLM call latency (GenAI semantic conventions).",
    ("gen_ai.operation.name", "gen_ai.request.model", "error.type"),
)
LLM_TOKENS = Instrument(
    "gen_ai.client.token.usage",
    "histogram",
    "{token}",
    "Summarizer tokens per call, by gen_ai.token.type (input or output).",
    ("gen_ai.operation.name", "gen_ai.request.model", "gen_ai.token.type"),
)
LLM_COST = Instrument(
    "gen_ai.client.cost",
    "counter",
    "USD",
    "Summarizer cost from LiteLLM's cost map (0 for models it does not price).",
    ("gen_ai.request.model",),
)
LLM_FAILURES = Instrument(
    "compaction.llm.failures",
    "counter",
    "{failure}",
    "Failed summarizer LLM calls.",
    ("gen_ai.request.model", "error.type"),
)
BREAKER_OPENS = Instrument(
    "compaction.breaker.opens", "counter", "{open}", "Times the summarizer's circuit breaker opened."
)
LOCK_WAIT = Instrument(
    "compaction.lock.wait.duration",
    "histogram",
    "s",
    "Time spent acquiring a conversation's compaction lock; acquired says whether it was won.",
    ("acquired",),
)
LOCK_CONTENDED = Instrument(
    "compaction.lock.contended",
    "counter",
    "{acquisition}",
    "Lock acquisitions that found the lock held by another run.",
)
JOBS_PENDING = Instrument(
    "compaction.jobs.pending", "observable_gauge", "{job}", "Compaction jobs queued (due or not)."
)
JOBS_OLDEST = Instrument(
    "compaction.jobs.oldest_due_age",
    "observable_gauge",
    "s",
    "How long the oldest due job has waited (0: none due).",
)
HELD_TURNS = Instrument(
    "compaction.turns.held",
    "observable_gauge",
    "{conversation}",
    "Conversations holding turns back behind a missing predecessor (a gap).",
)
OUTBOX_BACKLOG = Instrument(
    "compaction.outbox.backlog",
    "observable_gauge",
    "{event}",
    "Lifecycle events stored but not yet published.",
)
ROUND_TRIP = Instrument(
    "compaction.redis.round_trip.duration",
    "histogram",
    "s",
    "A send of per-turn calls (together, one in flight a worker; one round trip): rising with "
    "compaction.redis.round_trip.calls while the lag grows, "
    "Redis is the limit.",
)
ROUND_TRIP_CALLS = Instrument(
    "compaction.redis.round_trip.calls",
    "histogram",
    "{call}",
    "Per-turn calls a send carried: the calls made while the one before it was in flight.",
)
CONSUMER_LAG = Instrument(
    "messaging.kafka.consumer.lag",
    "gauge",
    "{message}",
    "Records behind the partition's end, per consumed partition.",
    ("topic", "partition"),
)

METRICS: tuple[Instrument, ...] = (
    TURNS,
    RUNS,
    TOKENS_BEFORE,
    TOKENS_AFTER,
    TOKENS_SAVED,
    CACHE_WRITE_COST,
    BREAK_EVEN,
    LLM_DURATION,
    LLM_TOKENS,
    LLM_COST,
    LLM_FAILURES,
    BREAKER_OPENS,
    LOCK_WAIT,
    LOCK_CONTENDED,
    JOBS_PENDING,
    JOBS_OLDEST,
    HELD_TURNS,
    OUTBOX_BACKLOG,
    ROUND_TRIP,
    ROUND_TRIP_CALLS,
    CONSUMER_LAG,
)

_meter = metrics.get_meter(METER_NAME)

# The last periodic read of the queues (pool's sweeper); observable gauges report it.
_backlog: dict[str, float] = {}


def _gauge_of(key: str) -> metrics.CallbackT:
    def observe(_options: CallbackOptions) -> Iterable[Observation]:
        value = _backlog.get(key)
        return [] if value is None else [Observation(value)]

    return observe


# The catalogue makes the instruments, so an entry cannot lack one; keyed by name.
_counters = {
    m.name: _meter.create_counter(m.name, m.unit, m.description) for m in METRICS if m.kind == "counter"
}
_histograms = {
    m.name: _meter.create_histogram(m.name, m.unit, m.description) for m in METRICS if m.kind == "histogram"
}
_lag = _meter.create_gauge(CONSUMER_LAG.name, CONSUMER_LAG.unit, CONSUMER_LAG.description)
for _gauge in (m for m in METRICS if m.kind == "observable_gauge"):
    _meter.create_observable_gauge(_gauge.name, [_gauge_of(_gauge.name)], _gauge.unit, _gauge.description)


def record_turn(status: str, reason: str | None = None, *, count: int = 1) -> None:
    """Count consumed turns (one by default): appended, duplicate, held or dead_lettered (with its reason)."""
    _counters[TURNS.name].add(
        count, {"status": status} if reason is None else {"status": status, "reason": reason}
    )


def record_lag(topic: str, partition: int, lag: int) -> None:
    """Set a consumed partition's lag (records behind its end)."""
    _lag.set(lag, {"topic": topic, "partition": str(partition)})


def record_run(
    trigger: str,
    outcome: str,
    before: int | None = None,
    after: int | None = None,
    *,
    cache_write_cost: float | None = None,
    break_even: float | None = None,
) -> None:
    """Count one compaction run; with token counts (a committed run), record them and the saving,
    and its cost where the model is priced."""
    _counters[RUNS.name].add(1, {"trigger": trigger, "outcome": outcome})
    if before is not None and after is not None:
        _histograms[TOKENS_BEFORE.name].record(before)
        _histograms[TOKENS_AFTER.name].record(after)
        _counters[TOKENS_SAVED.name].add(max(0, before - after))
    if cache_write_cost:
        _counters[CACHE_WRITE_COST.name].add(cache_write_cost)
    if break_even is not None:
        _histograms[BREAK_EVEN.name].record(break_even)


def record_llm_call(
    model: str,
    duration: float,
    *,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    cost: float | None = None,
    error: str | None = None,
) -> None:
    """Record one summarizer call: latency, tokens in/out, cost, or its failure."""
    base = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model}
    _histograms[LLM_DURATION.name].record(duration, base if error is None else {**base, "error.type": error})
    if error is not None:
        _counters[LLM_FAILURES.name].add(1, {"gen_ai.request.model": model, "error.type": error})
        return
    if input_tokens is not None:
        _histograms[LLM_TOKENS.name].record(input_tokens, {**base, "gen_ai.token.type": "input"})
    if output_tokens is not None:
        _histograms[LLM_TOKENS.name].record(output_tokens, {**base, "gen_ai.token.type": "output"})
    if cost:
        _counters[LLM_COST.name].add(cost, {"gen_ai.request.model": model})


def record_breaker_open() -> None:
    """Count one opening of the summarizer's circuit breaker."""
    _counters[BREAKER_OPENS.name].add(1)


def record_round_trip(seconds: float, calls: int) -> None:
    """Record one send of per-turn calls: how long it took and how many calls it carried."""
    _histograms[ROUND_TRIP.name].record(seconds)
    _histograms[ROUND_TRIP_CALLS.name].record(calls)


def record_lock_wait(seconds: float, *, acquired: bool) -> None:
    """Record one lock acquisition attempt: its wait and whether it was won (lost: another run held it)."""
    _histograms[LOCK_WAIT.name].record(seconds, {"acquired": str(acquired).lower()})
    if not acquired:
        _counters[LOCK_CONTENDED.name].add(1)


def record_backlog(
    *,
    jobs_pending: int | None = None,
    oldest_due_age: float | None = None,
    held_turns: int | None = None,
    outbox_backlog: int | None = None,
) -> None:
    """Store the latest periodic read of the queues; the observable gauges report it at export."""
    for key, value in (
        (JOBS_PENDING.name, jobs_pending),
        (JOBS_OLDEST.name, oldest_due_age),
        (HELD_TURNS.name, held_turns),
        (OUTBOX_BACKLOG.name, outbox_backlog),
    ):
        if value is not None:
            _backlog[key] = float(value)
