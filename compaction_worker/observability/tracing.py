"""Traces: the worker's spans and W3C trace context carried in Kafka headers.

Everything goes through the global OpenTelemetry API, which is a no-op until
``observability.setup.configure`` (or a test) installs an SDK tracer provider.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

TRACER_NAME = "compaction_worker"
TRACEPARENT = "traceparent"

# A Kafka record's headers as aiokafka gives them, or FastStream's str-valued mapping.
Headers = Sequence[tuple[str, bytes]] | Mapping[str, str] | Mapping[str, bytes] | None

# Whether LLM spans may carry message contents (OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT).
capture_content = False

# Found through the global provider at each call, so a provider installed later is used.
_tracer = trace.get_tracer(TRACER_NAME)
_installed = False


def enabled() -> bool:
    """Whether an SDK tracer provider is installed; until then spans are skipped outright.

    The API's no-op path still parses headers and attaches contexts on every turn; this check
    is far cheaper. Once on, a provider stays.
    """
    global _installed  # noqa: PLW0603  # set once, when a provider first appears
    if not _installed:
        # The API's global (None until set), read directly: get_tracer_provider() looks the
        # environment up on every call while none is set.
        provider = trace._TRACER_PROVIDER
        _installed = provider is not None and not isinstance(provider, trace.NoOpTracerProvider)
    return _installed


@dataclass(frozen=True)
class SpanInfo:
    """A span of the catalogue: its name, kind and meaning."""

    name: str
    kind: str
    description: str
    attributes: tuple[str, ...] = ()


TURN_SPAN = "turns process"
APPEND_SPAN = "compaction.append"
BUDGET_SPAN = "compaction.budget_check"
LOCK_SPAN = "compaction.lock_wait"
RUN_SPAN = "compaction.run"
STAGE_SPAN = "compaction.stage"

_MESSAGING = ("messaging.system", "messaging.destination.name", "messaging.destination.partition.id")
SPANS: tuple[SpanInfo, ...] = (
    SpanInfo(
        TURN_SPAN,
        "consumer",
        "One consumed turn record; its parent is the record's `traceparent` header, if any. A turn "
        "stored with others of its conversation in one script call (a run) says so on its own span.",
        (
            *_MESSAGING,
            "messaging.kafka.offset",
            "messaging.consumer.group.name",
            "messaging.message.conversation_id",
            "compaction.append.status",
            "compaction.append.run",
        ),
    ),
    SpanInfo(
        APPEND_SPAN,
        "internal",
        "Storing the turn in Redis (child of the turn's span).",
        ("compaction.append.status",),
    ),
    SpanInfo(
        BUDGET_SPAN,
        "internal",
        "Checking the conversation's token budget; names the trigger, if any.",
        ("compaction.trigger",),
    ),
    SpanInfo(
        LOCK_SPAN,
        "internal",
        "Waiting for the conversation's compaction lock.",
        ("compaction.lock.acquired",),
    ),
    SpanInfo(
        RUN_SPAN,
        "internal",
        "One compaction; continues the trace of the turn that scheduled it (traceparent stored with the job). "
        "A commit sets the GenAI conventions' `gen_ai.conversation.compacted` (true only, never false).",
        (
            "gen_ai.conversation.id",
            "compaction.trigger",
            "compaction.outcome",
            "compaction.tokens.before",
            "compaction.tokens.after",
            "gen_ai.conversation.compacted",
            "compaction.break_even_calls",
        ),
    ),
    SpanInfo(
        f"{STAGE_SPAN}.{{stage}}",
        "internal",
        "One pipeline stage of a compaction run (prune, deduplicate, summarize, ...).",
        ("compaction.stage", "compaction.stage.applied"),
    ),
    SpanInfo(
        "chat {model}",
        "client",
        "One summarizer LLM call (GenAI semantic conventions; no message contents unless enabled).",
        (
            "gen_ai.operation.name",
            "gen_ai.request.model",
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
            "gen_ai.response.finish_reasons",
        ),
    ),
    SpanInfo(
        "{topic} publish",
        "producer",
        "Publishing compaction.started / compaction.completed; its context travels in the event's headers.",
        _MESSAGING,
    ),
)


class _HeaderGetter(Getter[Headers]):
    def get(self, carrier: Headers, key: str) -> list[str] | None:
        if carrier is None:
            return None
        if isinstance(carrier, Mapping):
            value = carrier.get(key)
            values = [] if value is None else [value]
        else:
            values = [v for k, v in carrier if k.lower() == key]
        decoded = [v.decode("latin-1") if isinstance(v, bytes) else str(v) for v in values]
        return decoded or None

    def keys(self, carrier: Headers) -> list[str]:
        if carrier is None:
            return []
        return list(carrier.keys()) if isinstance(carrier, Mapping) else [k for k, _ in carrier]


class _ListSetter(Setter[list[tuple[str, bytes]]]):
    def set(self, carrier: list[tuple[str, bytes]], key: str, value: str) -> None:
        carrier[:] = [(k, v) for k, v in carrier if k != key]
        carrier.append((key, value.encode("latin-1")))


_GETTER = _HeaderGetter()
_LIST_SETTER = _ListSetter()


def extract_context(headers: Headers) -> Context:
    """The trace context a record's headers carry (an empty context when they carry none)."""
    return propagate.extract(headers, getter=_GETTER)


def inject(headers: list[tuple[str, bytes]], context: Context | None = None) -> None:
    """Add the current (or the given) trace context to Kafka headers, in place."""
    propagate.inject(headers, context=context, setter=_LIST_SETTER)


def inject_dict(headers: MutableMapping[str, str], context: Context | None = None) -> None:
    """Add the current (or the given) trace context to str-valued headers (FastStream's), in place."""
    propagate.inject(headers, context=context)


def get_span_context(context: Context) -> trace.SpanContext:
    """The span context ``context`` carries (invalid when none)."""
    return trace.get_current_span(context).get_span_context()


def current_traceparent() -> str | None:
    """The current span's W3C ``traceparent``, or None when nothing is being traced."""
    if not enabled() or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get(TRACEPARENT)


def context_of(traceparent: str | None) -> Context | None:
    """The context a stored ``traceparent`` names, or None for none."""
    return extract_context({TRACEPARENT: traceparent}) if traceparent else None


class _Off:
    """The span context of a turn while telemetry is off: nothing to start, attach or end."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return trace.INVALID_SPAN

    def __exit__(self, *_exc: object) -> None:
        return None


_OFF = _Off()


class ConsumedRecord(TypedDict):
    """What a consume span says of its record; its parent comes from the record's ``headers``."""

    topic: str
    partition: int
    offset: int
    group: str
    conversation_id: str
    headers: Headers


def consume_span(**record: Unpack[ConsumedRecord]) -> AbstractContextManager[Span]:
    """The span of one consumed turn, current while the turn is handled; its parent comes from the headers."""
    if not enabled():
        return _OFF
    return trace.use_span(
        started_consume_span(**record), end_on_exit=True, record_exception=True, set_status_on_exception=True
    )


def started_consume_span(**record: Unpack[ConsumedRecord]) -> Span:
    """:func:`consume_span`, started and not made current, for the caller to end: each turn of a
    run (runtime/runs.py) keeps its own span while the run's one script call stores them all."""
    if not enabled():
        return trace.INVALID_SPAN
    topic = record["topic"]
    attributes: dict[str, str | int] = {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": topic,
        "messaging.destination.partition.id": str(record["partition"]),
        "messaging.kafka.offset": record["offset"],
        "messaging.consumer.group.name": record["group"],
        "messaging.message.conversation_id": record["conversation_id"],
    }
    return _tracer.start_span(
        f"{topic} process",
        context=extract_context(record["headers"]),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
    )


def current(span: Span) -> AbstractContextManager[Span]:
    """Make ``span`` current for a block without ending it (a run's turn while it is planned)."""
    return trace.use_span(span, end_on_exit=False)


def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    context: Context | None = None,
    links: Sequence[Link] = (),
    record_exception: bool = True,
) -> AbstractContextManager[Span]:
    """A child span of the current one (or of ``context``), current inside the block."""
    if not enabled():
        return _OFF
    return _tracer.start_as_current_span(
        name,
        context=context,
        kind=kind,
        attributes=attributes,
        links=links,
        record_exception=record_exception,
    )


def fail(current: Span, error: BaseException, *, record: bool = True) -> None:
    """Mark a span as failed by ``error`` (``record``: with the exception's message and trace)."""
    if record:
        current.record_exception(error)
    current.set_status(Status(StatusCode.ERROR, type(error).__name__))
