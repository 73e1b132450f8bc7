"""Properties of the whole pipeline over generated conversations (docs/design.md, invariants 1, 4, 5, 6, 8).

Every run draws a valid conversation (``conversations.py``: all roles, parallel tool calls,
images, tiny to huge tool outputs, earlier summary chunks, pinned messages, an open call at
the end, call ids unique, reused every round or shared by parallel calls), limits with a target anywhere from far below to
above its size, a summary placement, and a summarizer that succeeds, fails (forcing the
sliding window), or fails and hands over to the extractive one; then checks what
``compact()`` returned. About 4,700 runs in all, in under a minute.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_worker.budget.tokens import counter_for
from compaction_worker.contracts.events import LlmUsage, Outcome
from compaction_worker.contracts.history import EffectiveHistory, Entry, SummaryPlacement, render
from compaction_worker.settings import BudgetSettings, PipelineSettings
from compaction_worker.strategies import CompactionResult, Limits, compact, provider_problems
from compaction_worker.strategies.dedup import deduplicate
from compaction_worker.strategies.draft import Counter, Draft, StageContext, StageOutcome, summary_overhead
from compaction_worker.strategies.oversized import truncate_oversized
from compaction_worker.strategies.prune import prune_tool_outputs
from compaction_worker.strategies.repair import SYNTHETIC_GAP, repair
from compaction_worker.strategies.standing_state import CHANGED
from compaction_worker.strategies.tail import task_index
from compaction_worker.strategies.truncate import MARKER_RESERVE, QUOTE_TOKENS, TRUNCATION_MODEL
from compaction_worker.summaries.contract import (
    Summarizer,
    SummarizerError,
    SummaryRequest,
    SummaryResult,
    looks_like_error_text,
    validate_summary,
)
from compaction_worker.summaries.extractive import ExtractiveSummarizer

from .conversations import (
    CALL_IDS,
    Conversation,
    conversations,
    coverage_problems,
    limits_for,
    stage_context,
    words,
)
from .helpers import COUNTER
from .ownership import duplicates_ids, ownership_problems

PLACEMENTS: tuple[SummaryPlacement, ...] = ("separate", "merge")
CHECKS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class ShortSummarizer:
    """Always succeeds when a valid summary can exist: a short, deterministic text."""

    name = "short-llm"

    def __init__(self, counter: Counter) -> None:
        self.count = counter.text

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        for text in (
            f"## Current state\n- {len(request.messages)} messages and "
            f"{len(request.previous_summaries)} earlier summaries, condensed.",
            "## Current state\n- condensed",
        ):
            tokens = self.count(text)
            try:
                validate_summary(text, tokens, request)
            except SummarizerError:
                continue
            return SummaryResult(text, self.name, tokens, LlmUsage(calls=1))
        raise SummarizerError("no valid summary fits")  # as a real summarizer would say


class FailingSummarizer:
    """The LLM is down."""

    name = "down-llm"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        raise SummarizerError("service unavailable")


class Recorder:
    """Wraps a summarizer and keeps every request it answered, to check the chunks against."""

    def __init__(self, inner: Summarizer) -> None:
        self.inner = inner
        self.name = inner.name
        self.answered: list[tuple[SummaryRequest, SummaryResult]] = []

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        result = await self.inner.summarize(request)
        self.answered.append((request, result))
        return result


def summarizers(kind: str, counter: Counter) -> list[Recorder]:
    if kind == "succeeds":
        return [Recorder(ShortSummarizer(counter))]
    if kind == "fails":
        return [Recorder(FailingSummarizer())]
    return [Recorder(FailingSummarizer()), Recorder(ExtractiveSummarizer(counter.text))]


@dataclass(frozen=True)
class Case:
    conversation: Conversation
    limits: Limits
    placement: SummaryPlacement


@st.composite
def cases(draw: st.DrawFn, /, counter: Counter = COUNTER, max_turns: int = 8, **kw: Any) -> Case:
    conversation = draw(conversations(counter, max_turns=max_turns, **kw))
    tokens = sum(e.tokens for e in conversation.entries) + sum(c.tokens for c in conversation.chunks)
    return Case(conversation, draw(limits_for(tokens)), draw(st.sampled_from(PLACEMENTS)))


def run(case: Case, kind: str, counter: Counter = COUNTER) -> tuple[CompactionResult, list[Recorder]]:
    used = summarizers(kind, counter)
    result = asyncio.run(
        compact(
            case.conversation.history,
            case.limits,
            used,
            counter,
            settings=PipelineSettings(summary_placement=case.placement),
        )
    )
    return result, used


def reachable(case: Case, counter: Counter) -> bool:
    """Whether the sliding window alone must reach the target: what no stage may drop
    (pinned messages with their pairs, an open call at the end), a marker, the summary
    turn, and room for a repair separator next to each kept message, all fit."""
    c = case.conversation
    # The task counts whole: a cut may not get it under its budget (images, a short text).
    task = task_index(c.entries) if case.limits.task_max_tokens > 0 else None
    keep = sum(e.tokens for i, e in enumerate(c.entries) if e.n in c.must_keep or i == task)
    separator = counter.message({"role": "user", "content": SYNTHETIC_GAP})
    slack = separator * (len(c.must_keep) + 2)
    overhead = summary_overhead(counter)
    return case.limits.fixed_tokens + overhead + MARKER_RESERVE + keep + slack <= case.limits.target


def check(case: Case, result: CompactionResult, used: Sequence[Recorder], counter: Counter) -> None:
    """Every property the pipeline promises, for one run."""
    c, limits = case.conversation, case.limits
    ctx = StageContext(limits, PipelineSettings(), counter, summary_overhead(counter))
    # Ids shared by one message's parallel calls are the runtime's doing: no stage renames calls.
    unique = not duplicates_ids(c.transcript.values())
    for placement in PLACEMENTS:  # the generator's own promise: the input is valid
        assert provider_problems(render(c.history, placement), unique_call_ids=unique) == []
    assert result.outcome in (Outcome.COMPACTED, Outcome.NOOP), result.error
    before = ctx.tokens(Draft(c.chunks, c.entries))
    assert result.tokens_before == before
    assert result.messages_before == len(render(c.history, case.placement))

    if result.outcome is Outcome.NOOP:
        # docs/design.md, invariant 5: nothing is committed, so the draft is exactly the input ...
        assert result.draft.chunks == c.chunks
        assert result.draft.entries == c.entries
        # ... and a noop is only allowed when no stage could reach the target.
        if before > limits.target:
            assert not reachable(case, counter), result.error
        return

    draft = result.draft
    # docs/design.md, invariant 5: under the target, by the same measure as before.
    assert result.tokens_after == ctx.tokens(draft)
    assert result.tokens_after <= limits.target
    for entry in draft.entries:
        assert entry.tokens == counter.message(entry.message), f"stale token count on {entry.n}"
    # docs/design.md, invariant 4, in both placements (the last assistant's calls may stay open).
    after = EffectiveHistory(chunks=draft.chunks, entries=draft.entries)
    for placement in PLACEMENTS:
        assert provider_problems(render(after, placement), unique_call_ids=unique) == [], placement
    assert result.messages_after == len(render(after, case.placement))
    # docs/design.md, invariant 1: every original message is an entry or covered by a chunk, once.
    assert coverage_problems(c, draft.chunks, draft.entries, task_max_tokens=limits.task_max_tokens) == []
    # The task and every system message stay: whole, or (the task) cut to its budget.
    if limits.task_max_tokens > 0 and (task := task_index(c.entries)) is not None:
        assert c.entries[task].n in {e.n for e in draft.entries}
    assert {e.n for e in c.entries if e.role == "system"} <= {e.n for e in draft.entries}
    # docs/design.md, invariant 8: every result still answers its own call and holds what is its own.
    assert ownership_problems(c, draft.entries) == []
    # docs/design.md, invariant 6: every new chunk is a validated summary within its cap, or the marker.
    old = {chunk.id for chunk in c.chunks}
    answered = [pair for r in used for pair in r.answered]
    for chunk in draft.chunks:
        assert chunk.tokens == counter.text(chunk.render_text())
        if chunk.id in old:
            continue
        assert chunk.text.strip()
        assert not looks_like_error_text(chunk.text)
        if chunk.model == TRUNCATION_MODEL:
            # The marker's notice, and at most two trimmed quotes of the conversation's start.
            assert chunk.tokens <= 2 * MARKER_RESERVE + 2 * QUOTE_TOKENS
            continue
        matches = [req for req, res in answered if written(chunk.text, res.text) and res.model == chunk.model]
        assert matches, (chunk.text, chunk.model, [(res.model, res.text) for _, res in answered])
        request = matches[0]
        validate_summary(chunk.text, counter.text(chunk.text), request)
        assert request.max_summary_tokens <= limits.max_summary_tokens


def written(chunk: str, summary: str) -> bool:
    """Whether a chunk's text is ``summary``, less the sentences the user later changed (the run takes
    them out of its summaries, ``standing_state.unsay_changed``) and less lines that gave way to the
    standing state (``standing_state.restore_state``): the rest in order, word for word."""
    if chunk == summary or _lines_of(chunk, summary):
        return True
    at = 0
    for piece in chunk.split(CHANGED):
        found = summary.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return CHANGED in chunk


@settings(CHECKS, max_examples=1500)
@given(case=cases())
def test_with_a_summarizer_that_succeeds(case: Case) -> None:
    """docs/design.md, invariants 1, 4, 5 and 6: they hold when the LLM summary works."""
    result, used = run(case, "succeeds")
    check(case, result, used, COUNTER)


@settings(CHECKS, max_examples=1500)
@given(case=cases())
def test_with_a_summarizer_that_fails(case: Case) -> None:
    """Reference 004 (stage 4 keeps role alternation): docs/design.md, invariants 1, 4, 5 and 6 hold when only the sliding window is left."""
    result, used = run(case, "fails")
    check(case, result, used, COUNTER)


@settings(CHECKS, max_examples=800)
@given(case=cases())
def test_with_the_extractive_fallback(case: Case) -> None:
    """docs/design.md, invariants 1, 4, 5 and 6: they hold when the LLM fails and the extractive summary takes over."""
    result, used = run(case, "extractive")
    check(case, result, used, COUNTER)


REAL = counter_for("gpt-4o-mini", BudgetSettings())


@settings(CHECKS, max_examples=300)
@given(
    case=cases(counter=REAL, max_turns=5, max_output_words=3_000),
    kind=st.sampled_from(("succeeds", "fails", "extractive")),
)
def test_with_a_real_tokenizer(case: Case, kind: str) -> None:
    """The same with tiktoken counts, which do not add up the way word counts do."""
    result, used = run(case, kind, REAL)
    check(case, result, used, REAL)


@settings(CHECKS, max_examples=400)
@given(
    case=st.sampled_from(("per_round", "duplicated")).flatmap(lambda ids: cases(call_ids=ids)),
    kind=st.sampled_from(("succeeds", "fails", "extractive")),
)
def test_with_reused_call_ids(case: Case, kind: str) -> None:
    """Issue 9: the same when every round names its calls ``call_0``, ``call_1``... again, or
    one message's parallel calls share an id; no result ends up under another call."""
    result, used = run(case, kind)
    check(case, result, used, COUNTER)


STAGES: dict[str, Callable[[Draft, StageContext], StageOutcome]] = {
    "prune": prune_tool_outputs,
    "deduplicate": deduplicate,
    "truncate_oversized": truncate_oversized,
    "repair": repair,
}


@settings(CHECKS, max_examples=500)
@given(
    conversation=st.sampled_from(CALL_IDS).flatmap(lambda ids: conversations(COUNTER, call_ids=ids)),
    stages=st.lists(st.sampled_from(sorted(STAGES)), min_size=1, max_size=4),
    protect=st.sampled_from((0, 50, 500, 5_000)),
    window=st.sampled_from((2_000, 20_000, 200_000)),
)
def test_no_stage_attaches_content_to_another_call(
    conversation: Conversation, stages: list[str], protect: int, window: int
) -> None:
    """docs/design.md, invariant 8, stage by stage and chained: after pruning, de-duplication, truncation and
    repair, every tool result still follows the call that issued it, holding its own content or
    a placeholder about its own call (its tool, the file it read), whatever the ids."""
    limits = Limits(
        target=window // 2,
        fixed_tokens=0,
        window=window,
        tail_max_messages=6,
        tail_max_tokens=window // 4,
        max_summary_tokens=256,
        chunk_budget=window // 4,
    )
    ctx = stage_context(
        COUNTER,
        limits,
        prune_protect_tokens=protect,
        prune_minimum_savings_tokens=0,
        max_tool_output_lines=40,
    )
    draft = Draft(conversation.chunks, conversation.entries)
    for name in stages:
        draft = STAGES[name](draft, ctx).draft
        assert ownership_problems(conversation, draft.entries) == [], name
        assert (
            coverage_problems(
                conversation, draft.chunks, draft.entries, task_max_tokens=limits.task_max_tokens
            )
            == []
        ), name
    unique = not duplicates_ids(conversation.transcript.values())
    history = EffectiveHistory(draft.chunks, draft.entries)
    assert provider_problems(render(history), unique_call_ids=unique) == []


@settings(CHECKS, max_examples=300)
@given(data=st.data())
def test_rolling_compaction(data: st.DataObject) -> None:
    """Reference 000 (rolling compaction): a compacted history that grows and compacts again keeps every promise."""
    # The first part ends closed: the generator's next turns do not answer open calls.
    case = data.draw(cases(max_turns=5, open_end=False))
    kind = data.draw(st.sampled_from(("succeeds", "fails", "extractive")))
    first, _ = run(case, kind)
    if first.outcome is not Outcome.COMPACTED:
        return
    c = case.conversation
    more = data.draw(conversations(COUNTER, max_turns=4, start=max(c.transcript) + 1, open_end=True))
    grown = Conversation(
        history=EffectiveHistory(first.draft.chunks, (*first.draft.entries, *more.entries)),
        transcript={**c.transcript, **more.transcript},
        pinned=c.pinned | more.pinned,
        must_keep=c.must_keep | more.must_keep,
    )
    tokens = sum(e.tokens for e in grown.entries) + sum(ch.tokens for ch in grown.chunks)
    second = Case(grown, data.draw(limits_for(tokens)), case.placement)
    result, used = run(second, kind)
    check(second, result, used, COUNTER)


def test_a_task_that_begins_the_newest_step_stays_when_the_tail_gives_way() -> None:
    """Found by the properties above: in a window this small, the task (the only user message,
    so it begins the newest step) did not fit the verbatim tail with the answer after it, and
    the tail gave its older part back to be summarized, the task with it. It stays, as pinned
    messages do."""
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": words(100, "u0")},
        {"role": "assistant", "content": words(100, "a0")},
    ]
    entries = tuple(
        Entry(n=n, seq=n, message=m, tokens=COUNTER.message(m)) for n, m in enumerate(messages, start=1)
    )
    conversation = Conversation(
        history=EffectiveHistory(chunks=(), entries=entries),
        transcript=dict(enumerate(messages, start=1)),
        pinned=frozenset(),
        must_keep=frozenset(),
    )
    limits = Limits(
        target=157,
        fixed_tokens=0,
        window=196,
        tail_max_messages=2,
        tail_max_tokens=98,
        max_summary_tokens=64,
        chunk_budget=7,
        force=True,
        task_max_tokens=39,
    )
    case = Case(conversation, limits, "separate")
    for kind in ("succeeds", "fails", "extractive"):
        result, used = run(case, kind)
        check(case, result, used, COUNTER)


def _lines_of(chunk: str, summary: str) -> bool:
    """Whether every line of ``chunk`` is a line of ``summary`` (a changed sentence in it replaced by the
    mark), in the same order."""
    lines = iter(summary.strip().splitlines())
    return all(any(_same_line(line, other) for other in lines) for line in chunk.strip().splitlines())


def _same_line(line: str, other: str) -> bool:
    if line == other:
        return True
    at = 0
    for piece in line.split(CHANGED):
        found = other.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return CHANGED in line
