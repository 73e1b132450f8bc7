"""Repair (tool pairs and role order, fixed last) and the provider checker it answers to (docs/design.md, invariant 4)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_worker.contracts.events import LlmUsage, Outcome
from compaction_worker.contracts.history import (
    SYNTHETIC,
    EffectiveHistory,
    Entry,
    SummaryChunk,
    SummaryPlacement,
    render,
)
from compaction_worker.contracts.toolpairs import pair_results
from compaction_worker.settings import PipelineSettings
from compaction_worker.strategies import Draft, Limits, compact, provider_problems, repair
from compaction_worker.strategies.repair import (
    SYNTHETIC_CONTINUE,
    SYNTHETIC_GAP,
    SYNTHETIC_RESULT,
    SYNTHETIC_START,
    open_call_index,
)
from compaction_worker.summaries.contract import SummaryRequest, SummaryResult
from compaction_worker.testing import Chat

from .conversations import stage_context
from .helpers import COUNTER, call, result

PLACEMENTS: tuple[SummaryPlacement, ...] = ("separate", "merge")
CTX = stage_context(COUNTER)
CHUNK = SummaryChunk("c", "earlier work", 1, 1, 1, 1, 3, "2024-01-01T00:00:00+00:00", "fake")


def say(role: str, text: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"role": role, "content": text or role, **extra}


def draft(*messages: Mapping[str, Any], chunks: tuple[SummaryChunk, ...] = (), start: int = 2) -> Draft:
    chat = Chat(start, COUNTER)
    for m in messages:
        chat.add(dict(m))
    return chat.draft(chunks)


def shape(d: Draft) -> list[str]:
    """``role`` for transcript entries, ``role*`` for synthetic ones, with tool ids."""
    out = []
    for e in d.entries:
        mark = "*" if e.synthetic else ""
        ids = ",".join(str(c["id"]) for c in e.message.get("tool_calls") or ())
        tid = e.message.get("tool_call_id")
        out.append(f"{e.role}{mark}" + (f"({ids})" if ids else "") + (f"->{tid}" if tid else ""))
    return out


def rendered_problems(d: Draft) -> list[str]:
    history = EffectiveHistory(d.chunks, d.entries)
    return [p for placement in PLACEMENTS for p in provider_problems(render(history, placement))]


class TestProviderProblems:
    def test_valid_history(self) -> None:
        """A well-formed history has no problems."""
        msgs: Sequence[dict[str, Any]] = [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            call("a"),
            result("a"),
            {"role": "assistant", "content": "x"},
        ]
        assert provider_problems(msgs) == []

    def test_orphans_and_roles(self) -> None:
        """Orphan results, unanswered calls, leading assistants and mid-history systems are reported."""
        msgs = [{"role": "assistant", "content": "hi"}, result("z"), {"role": "system", "content": "s"}]
        problems = provider_problems(msgs)
        assert any("first non-system" in p for p in problems)
        assert any("without its call" in p for p in problems)
        assert any("system message after" in p for p in problems)

    def test_open_calls_at_the_end(self) -> None:
        """The last assistant's calls may wait for the next turn, unless the caller says otherwise."""
        msgs = [say("user"), call("a")]
        assert provider_problems(msgs) == []
        assert provider_problems(msgs, allow_open_calls_at_end=False) == ["tool calls ['a'] never answered"]

    def test_a_result_must_follow_its_own_call(self) -> None:
        """A result after an intervening message answers nothing (providers require it right after)."""
        problems = provider_problems([say("user"), call("a"), say("user"), result("a")])
        assert any("unanswered before message 2" in p for p in problems)
        assert any("tool result a at 3 without its call" in p for p in problems)

    def test_consecutive_assistants_duplicates_and_empties(self) -> None:
        """Two assistant turns in a row, duplicate call ids, empty tool_calls, and nothing at all."""
        assert provider_problems([say("user"), say("assistant"), say("assistant")]) == [
            "two consecutive assistant messages at 2"
        ]
        assert any("duplicate" in p for p in provider_problems([say("user"), call("a", "a"), result("a")]))
        assert any(
            "empty tool_calls" in p
            for p in provider_problems([say("user"), {**say("assistant"), "tool_calls": []}])
        )
        assert provider_problems([{"role": "system", "content": "s"}]) == [
            "no message besides the system prompt"
        ]

    def test_two_user_messages_are_allowed(self) -> None:
        """Every current provider accepts (or merges) consecutive user messages."""
        assert provider_problems([say("user"), say("user")]) == []


class TestRepair:
    def test_a_valid_draft_is_left_alone(self) -> None:
        """On a well-formed draft repair changes nothing and reports nothing."""
        d = draft(say("user"), call("a", "b"), result("b"), result("a"), say("assistant"), chunks=(CHUNK,))
        out = repair(d, CTX)
        assert out.draft is d
        assert out.report is None

    def test_an_orphan_result_gets_a_synthetic_call(self) -> None:
        """Reference 004 (tool pair repair): a result without its call gets a clearly marked synthetic call before it."""
        d = draft(say("user"), result("z", name="search"), say("assistant"))
        out = repair(d, CTX)
        assert shape(out.draft) == ["user", "assistant*(z)", "tool->z", "assistant"]
        made = out.draft.entries[1]
        assert (made.n, made.edit) == (0, SYNTHETIC)
        assert made.message["tool_calls"][0]["function"]["name"] == "search"
        assert "conversation was compacted" in made.message["content"]
        assert made.tokens == COUNTER.message(made.message)
        assert out.report is not None
        assert out.report.stage == "repair"
        assert out.report.tokens_saved == -made.tokens
        assert rendered_problems(out.draft) == []

    def test_an_unanswered_call_gets_a_synthetic_result(self) -> None:
        """Reference 004 (tool pair repair): a call without its result (not at the very end) gets a synthetic result after the real ones."""
        d = draft(say("user"), call("a", "b"), result("a"), say("user"), say("assistant"))
        out = repair(d, CTX)
        assert shape(out.draft) == ["user", "assistant(a,b)", "tool->a", "tool*->b", "user", "assistant"]
        assert out.draft.entries[3].message["content"] == SYNTHETIC_RESULT
        assert rendered_problems(out.draft) == []

    def test_the_last_assistants_open_calls_are_left_open(self) -> None:
        """The runtime's next turn brings those results; a synthetic one would be answered twice."""
        d = draft(say("user"), call("a", "b"), result("b"))
        assert repair(d, CTX).draft is d

    def test_open_calls_followed_by_an_orphan_are_closed(self) -> None:
        """Once something follows the open calls, their results can no longer come right after them."""
        d = draft(say("user"), call("a"), result("z"))
        out = repair(d, CTX)
        assert shape(out.draft) == ["user", "assistant(a)", "tool*->a", "assistant*(z)", "tool->z"]
        assert rendered_problems(out.draft) == []

    def test_an_orphan_among_real_results_moves_after_them(self) -> None:
        """Results of a call stay right after it; the stray one follows, behind its synthetic call."""
        d = draft(say("user"), call("a", "b"), result("z"), result("a"), result("b"), say("assistant"))
        out = repair(d, CTX)
        assert shape(out.draft) == [
            "user",
            "assistant(a,b)",
            "tool->a",
            "tool->b",
            "assistant*(z)",
            "tool->z",
            "assistant",
        ]
        assert rendered_problems(out.draft) == []

    def test_repeated_orphan_ids_get_one_call_each(self) -> None:
        """Call ids must be unique within a message, so two orphans with one id get two calls."""
        out = repair(draft(say("user"), result("z"), result("z")), CTX)
        assert shape(out.draft) == ["user", "assistant*(z)", "tool->z", "assistant*(z)", "tool->z"]
        assert rendered_problems(out.draft) == []

    def test_a_history_must_start_with_the_user(self) -> None:
        """Reference 001 (the first message must be the user's): without chunks, a leading assistant message gets a synthetic user turn before it."""
        out = repair(draft(say("system"), say("assistant", "Hello! How can I help?"), say("user")), CTX)
        assert shape(out.draft) == ["system", "user*", "assistant", "user"]
        assert out.draft.entries[1].message["content"] == SYNTHETIC_START
        assert rendered_problems(out.draft) == []

    def test_with_chunks_the_summary_is_the_first_user_turn(self) -> None:
        """Reference 001 (the summary is the first, user, message): the summary turn is a user message, so an assistant entry may come first."""
        d = draft(say("assistant"), say("user"), chunks=(CHUNK,))
        assert repair(d, CTX).draft is d

    def test_pinned_assistants_meeting_at_a_junction(self) -> None:
        """Two assistant messages whose turns in between were summarized get a user turn between them."""
        d = Draft(
            (CHUNK,),
            (
                Entry(3, 2, say("assistant", "A", pinned=True), 5),
                Entry(9, 5, say("assistant", "B"), 5),
                Entry(10, 6, say("user"), 5),
            ),
        )
        out = repair(d, CTX)
        assert shape(out.draft) == ["assistant", "user*", "assistant", "user"]
        assert out.draft.entries[1].message["content"] == SYNTHETIC_GAP
        assert rendered_problems(out.draft) == []

    def test_adjacent_assistants_get_a_neutral_turn(self) -> None:
        """Two assistant messages that were adjacent in the transcript are not said to have a gap."""
        out = repair(draft(say("user"), say("assistant"), say("system"), say("assistant")), CTX)
        assert shape(out.draft) == ["user", "assistant", "system", "user*", "assistant"]
        assert out.draft.entries[3].message["content"] == SYNTHETIC_CONTINUE

    def test_idempotent(self) -> None:
        """A repaired draft needs no further repair."""
        once = repair(draft(say("assistant"), result("z"), call("a"), say("assistant")), CTX).draft
        assert repair(once, CTX).draft is once


class TestReusedIds:
    """Pairs judged by position (docs/design.md, invariant 8): ids reused across turns and within one message."""

    def test_parallel_calls_sharing_an_id_are_both_answered(self) -> None:
        """Two calls named x answered by two results in order: nothing to repair (the second
        result used to count as an orphan and got a synthetic call of its own)."""
        d = draft(say("user"), call("x", "x"), result("x"), result("x"), say("assistant"))
        assert repair(d, CTX).draft is d

    def test_an_unanswered_slot_among_shared_ids_gets_its_result(self) -> None:
        """One result for two calls named x: the second call gets a synthetic result."""
        d = draft(say("user"), call("x", "x"), result("x"), say("user"), say("assistant"))
        out = repair(d, CTX)
        assert shape(out.draft) == ["user", "assistant(x,x)", "tool->x", "tool*->x", "user", "assistant"]
        assert [p for p in rendered_problems(out.draft) if not p.startswith("duplicate")] == []

    def test_open_calls_sharing_an_id_stay_open(self) -> None:
        """The last message's second call_0 is still open: the next turn answers it."""
        d = draft(
            say("user"),
            call("call_0"),
            result("call_0"),
            say("user"),
            call("call_0", "call_0"),
            result("call_0"),
        )
        assert open_call_index(d.entries) == 4
        assert repair(d, CTX).draft is d

    def test_an_earlier_turns_id_does_not_answer_this_turn(self) -> None:
        """A turn whose call_1 is answered only in an earlier turn (same id) gets a synthetic result."""
        d = draft(
            say("user"),
            call("call_0", "call_1"),
            result("call_0"),
            result("call_1"),
            say("user"),
            call("call_0", "call_1"),
            result("call_0"),
            say("user"),
        )
        out = repair(d, CTX)
        assert shape(out.draft)[5:9] == ["assistant(call_0,call_1)", "tool->call_0", "tool*->call_1", "user"]
        assert rendered_problems(out.draft) == []

    def test_a_late_result_is_adopted_under_its_own_calls_tool(self) -> None:
        """A result that arrived after other messages keeps its id behind a synthetic call named
        after its own call's tool (a protected tool stays protected), not ``unknown_tool``."""
        skill = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_0", "type": "function", "function": {"name": "skill", "arguments": "{}"}}
            ],
        }
        d = draft(say("user"), skill, say("user"), say("assistant"), result("call_0"))
        out = repair(d, CTX)
        assert shape(out.draft) == [
            "user",
            "assistant(call_0)",
            "tool*->call_0",
            "user",
            "assistant",
            "user*",
            "assistant*(call_0)",
            "tool->call_0",
        ]
        assert out.draft.entries[6].message["tool_calls"][0]["function"]["name"] == "skill"
        assert rendered_problems(out.draft) == []

    def test_provider_problems_count_shared_ids(self) -> None:
        """Calls sharing an id each need a result; the duplicate itself is reported unless allowed."""
        msgs = [say("user"), call("x", "x"), result("x"), result("x")]
        assert provider_problems(msgs) == ["duplicate tool call ids in message 1"]
        assert provider_problems(msgs, unique_call_ids=False) == []
        assert provider_problems(msgs[:3], allow_open_calls_at_end=False, unique_call_ids=False) == [
            "tool calls ['x'] never answered"
        ]
        assert provider_problems([*msgs, result("x")], unique_call_ids=False) == [
            "tool result x at 4 without its call"
        ]


# --- properties over arbitrary (malformed) drafts -------------------------------------------


@st.composite
def messy_drafts(draw: st.DrawFn, unique_ids: bool = True) -> Draft:
    """Any sequence of roles and tool ids from a small pool: orphans, repeats, gaps, leading
    assistants; with ``unique_ids=False`` one message's parallel calls may share an id."""
    ids = st.sampled_from("abc")
    message = st.one_of(
        st.builds(say, st.sampled_from(("user", "assistant", "system"))),
        st.lists(ids, min_size=1, max_size=3, unique=unique_ids).map(lambda cs: call(*cs)),
        ids.map(result),
        st.builds(say, st.sampled_from(("user", "assistant")), st.just("kept"), pinned=st.just(True)),
    )
    messages = draw(st.lists(message, max_size=14))
    gaps = draw(st.lists(st.integers(1, 3), min_size=len(messages), max_size=len(messages)))
    es, n = [], 1
    for m, gap in zip(messages, gaps, strict=True):
        n += gap  # ordinals with holes: what lies between was summarized
        es.append(Entry(n=n, seq=n, message=m, tokens=COUNTER.message(m)))
    chunks = (CHUNK,) if draw(st.booleans()) else ()
    return Draft(chunks, tuple(es))


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=messy_drafts())
def test_repair_makes_any_draft_valid(d: Draft) -> None:
    """Whatever the draft, the repaired one renders valid in both placements (docs/design.md, invariant 4), keeps
    every original entry exactly once, adds only marked synthetic entries, and is a fixed point."""
    out = repair(d, CTX).draft
    if d.chunks or any(e.role != "system" for e in d.entries):
        assert rendered_problems(out) == []
    else:  # nothing to send yet but a system prompt: nothing to repair either
        assert out is d
    assert out.chunks == d.chunks
    originals = [e for e in out.entries if not e.synthetic]
    assert sorted(map(id, originals)) == sorted(map(id, d.entries))
    assert all(e.n == 0 and e.edit == SYNTHETIC for e in out.entries if e.synthetic)
    assert repair(out, CTX).draft is out
    assert ownership_changes(d, out) == []


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(d=messy_drafts(unique_ids=False))
def test_repair_with_ids_shared_by_parallel_calls(d: Draft) -> None:
    """The same where one message's calls share ids: valid but for the shared ids themselves
    (no stage renames calls), and no result answers a call other than its own."""
    out = repair(d, CTX).draft
    history = EffectiveHistory(out.chunks, out.entries)
    if d.chunks or any(e.role != "system" for e in d.entries):
        for placement in PLACEMENTS:
            assert provider_problems(render(history, placement), unique_call_ids=False) == []
    assert repair(out, CTX).draft is out
    assert ownership_changes(d, out) == []


def ownership_changes(before: Draft, after: Draft) -> list[str]:
    """Results of ``after`` that answer a transcript call other than the one they answered in
    ``before`` (by position); a synthetic call may adopt an orphan or a late result."""
    was = pair_results([e.message for e in before.entries])
    owner = {id(before.entries[i]): (id(before.entries[c.owner]), c.slot) for i, c in was.items()}
    now = pair_results([e.message for e in after.entries])
    problems = []
    for i, paired in now.items():
        entry, caller = after.entries[i], after.entries[paired.owner]
        if entry.synthetic or caller.synthetic:
            continue
        if owner.get(id(entry)) != (id(caller), paired.slot):
            problems.append(f"result {entry.n} now answers call {paired.slot} of {caller.n}")
    return problems


class OneLineSummarizer:
    name = "fake"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult("## Current state\n- done", self.name, 5, LlmUsage(calls=1))


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_compact_repairs_what_it_commits(placement: SummaryPlacement) -> None:
    """Reference 004 (repair runs after compaction): pinned assistant messages that meet once their turns are summarized are repaired, within the target."""
    d = draft(
        say("user", "one two three four five six"),
        say("assistant", "pinned one", pinned=True),
        say("user", "seven eight nine ten eleven twelve"),
        say("assistant", "pinned two", pinned=True),
        say("user", "thirteen fourteen fifteen sixteen"),
        say("assistant", "answer"),
        start=1,
    )
    limits = Limits(
        target=130,
        fixed_tokens=0,
        window=1_000,
        tail_max_messages=1,
        tail_max_tokens=200,
        max_summary_tokens=64,
        chunk_budget=500,
        force=True,
    )
    out = asyncio.run(
        compact(
            EffectiveHistory((), d.entries),
            limits,
            [OneLineSummarizer()],
            COUNTER,
            settings=PipelineSettings(summary_placement=placement),
        )
    )
    assert out.outcome is Outcome.COMPACTED
    assert out.stages[-1] == "repair"
    assert shape(out.draft) == ["assistant", "user*", "assistant", "user*", "assistant"]
    assert out.tokens_after <= limits.target
    assert out.tokens_after == CTX.tokens(out.draft) - CTX.limits.fixed_tokens + limits.fixed_tokens
    assert rendered_problems(out.draft) == []
