"""Traces: the consumed turn's span and its children, a compaction's spans in the same trace, headers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from compaction_worker.budget.tokens import TokenCounter
from compaction_worker.observability import tracing
from compaction_worker.runtime.turns import TurnOutcome
from compaction_worker.summaries.contract import Summarizer
from compaction_worker.summaries.llm import LiteLLMSummarizer
from compaction_worker.testing import FakeLLMServer
from tests.observability.memory import Memory, children
from tests.orchestration import Parts, compact_now, compactor_with, conversation
from tests.summaries.helpers import GOOD_SUMMARY, count, llm_retry, llm_settings, request

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-01"


class ContextRecorder:
    """A publisher that keeps, with each event, the traceparent current when it was published."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str | None]] = []

    async def __call__(self, topic: str, payload: bytes, key: bytes | None) -> None:
        self.events.append((topic, tracing.current_traceparent()))


def one(spans: Sequence[ReadableSpan]) -> ReadableSpan:
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


class TestHeaders:
    def test_inject_then_extract_keeps_the_trace(self, telemetry: Memory) -> None:
        with tracing.span("outer") as outer:
            headers: list[tuple[str, bytes]] = [("content-type", b"application/json")]
            tracing.inject(headers)
            as_dict: dict[str, str] = {}
            tracing.inject_dict(as_dict)
        (key, value) = headers[1]
        assert key == "traceparent"
        assert f"{outer.get_span_context().trace_id:032x}" in value.decode()
        assert as_dict["traceparent"] == value.decode()
        for carrier in (headers, as_dict, {"traceparent": value}):
            extracted = tracing.get_span_context(tracing.extract_context(carrier))
            assert extracted.span_id == outer.get_span_context().span_id

    def test_no_header_no_parent(self, telemetry: Memory) -> None:
        with tracing.consume_span(
            topic="turns", partition=0, offset=0, group="g", conversation_id="c", headers=None
        ):
            pass
        assert one(telemetry.finished()).parent is None

    def test_nothing_current_nothing_injected(self, telemetry: Memory) -> None:
        headers: list[tuple[str, bytes]] = []
        tracing.inject(headers)
        assert headers == []
        assert tracing.current_traceparent() is None


class TestTurnSpans:
    async def test_a_turn_continues_the_header_trace_with_messaging_attributes(
        self, telemetry: Memory, parts: Parts
    ) -> None:
        outcome = await consume(parts, conversation(1)[0], offset=41)
        assert outcome.status.value == "appended"
        turn = one(telemetry.named(tracing.TURN_SPAN))
        assert turn.kind is SpanKind.CONSUMER
        assert turn.parent is not None
        assert turn.parent.span_id == PARENT_ID
        assert turn.parent.is_remote
        assert turn.context.trace_id == TRACE_ID
        assert dict(turn.attributes or {}) == {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.destination.name": "turns",
            "messaging.destination.partition.id": "3",
            "messaging.kafka.offset": 41,
            "messaging.consumer.group.name": "compaction-worker",
            "messaging.message.conversation_id": "c",
        }
        names = {s.name for s in children(telemetry.finished(), turn)}
        assert names == {tracing.APPEND_SPAN, tracing.BUDGET_SPAN}
        append = one(telemetry.named(tracing.APPEND_SPAN))
        assert (append.attributes or {})["compaction.append.status"] == "appended"


class TestCompactionSpans:
    async def test_a_compaction_continues_the_trace_of_the_turn_that_scheduled_it(
        self, telemetry: Memory, parts: Parts, fake_llm: FakeLLMServer
    ) -> None:
        fake_llm.set_reply(GOOD_SUMMARY)
        for offset, raw in enumerate(conversation(40)):
            if (await consume(parts, raw, offset=offset)).scheduled is not None:
                break
        else:
            raise AssertionError("no turn crossed the threshold")
        scheduling = telemetry.named(tracing.BUDGET_SPAN)[-1]
        assert (scheduling.attributes or {})["compaction.trigger"] == "threshold"
        job = await parts.jobs.job("c")
        assert job is not None
        assert job.traceparent is not None

        def llm(_model: str, counter: TokenCounter) -> list[Summarizer]:
            return [LiteLLMSummarizer(llm_settings(fake_llm), counter.text, retry=llm_retry())]

        recorder = ContextRecorder()
        telemetry.clear()
        completed = await compact_now(parts.jobs, compactor_with(parts, recorder, llm))
        assert completed.outcome.value == "compacted"
        spans = telemetry.finished()
        run = one(telemetry.named(tracing.RUN_SPAN))
        # Its parent is the budget check that scheduled it: one trace from the runtime's publish.
        assert run.context.trace_id == TRACE_ID
        assert run.parent is not None
        assert run.parent.span_id == scheduling.context.span_id
        attributes: dict[str, Any] = dict(run.attributes or {})
        assert attributes["compaction.trigger"] == "threshold"
        assert attributes["compaction.outcome"] == "compacted"
        assert attributes["compaction.tokens.after"] < attributes["compaction.tokens.before"]
        # Issue 36: the GenAI conventions' conversation attributes (compacted: true only, never false).
        assert (attributes["gen_ai.conversation.id"], attributes["gen_ai.conversation.compacted"]) == (
            "c",
            True,
        )
        assert (
            attributes["compaction.break_even_calls"] == completed.cost.break_even_calls
            if completed.cost
            else True
        )
        names = [s.name for s in children(spans, run)]
        assert tracing.LOCK_SPAN in names
        stages = [s for s in spans if s.name.startswith(tracing.STAGE_SPAN + ".")]
        assert stages
        assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in stages)
        summarize = one([s for s in stages if s.name == f"{tracing.STAGE_SPAN}.summarize"])
        chat = one([s for s in spans if s.name.startswith("chat ")])
        assert chat.kind is SpanKind.CLIENT
        assert chat.parent is not None
        assert chat.parent.span_id == summarize.context.span_id
        gen_ai: dict[str, Any] = dict(chat.attributes or {})
        assert gen_ai["gen_ai.operation.name"] == "chat"
        assert gen_ai["gen_ai.request.model"] == "openai/fake-summarizer"
        assert gen_ai["gen_ai.usage.input_tokens"] > 0
        assert gen_ai["gen_ai.usage.output_tokens"] > 0
        assert tuple(gen_ai["gen_ai.response.finish_reasons"]) == ("stop",)
        # Message contents only when OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT enables them.
        assert not any(key.endswith(".messages") for key in gen_ai)
        # Both lifecycle events are published inside the run's span: their headers carry it.
        topics = dict(recorder.events)
        assert set(topics) == {"compaction.started", "compaction.completed"}
        for tp in topics.values():
            assert tp is not None
            assert tp.split("-")[1:3] == [
                f"{TRACE_ID:032x}",
                f"{run.context.span_id:016x}",
            ]

    async def test_message_contents_only_when_enabled(
        self, telemetry: Memory, fake_llm: FakeLLMServer, monkeypatch: Any
    ) -> None:
        fake_llm.set_reply(GOOD_SUMMARY)
        monkeypatch.setattr(tracing, "capture_content", True)
        await LiteLLMSummarizer(llm_settings(fake_llm), count, retry=llm_retry()).summarize(request())
        chat = one([s for s in telemetry.finished() if s.name.startswith("chat ")])
        assert "## " in str((chat.attributes or {})["gen_ai.output.messages"])
        assert "/health" in str((chat.attributes or {})["gen_ai.input.messages"])


async def consume(parts: Parts, raw: bytes, *, offset: int) -> TurnOutcome:
    """Handle one turn inside its consume span, as the worker does, with a traceparent header."""
    with tracing.consume_span(
        topic="turns",
        partition=3,
        offset=offset,
        group="compaction-worker",
        conversation_id="c",
        headers=[("traceparent", TRACEPARENT.encode())],
    ):
        return await parts.turns.handle(raw, b"c", 3, offset)
