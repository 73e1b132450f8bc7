"""Tail selection and the partition: bounds, boundaries, tool pairs, the degrading guard, pinned messages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_worker.contracts.history import SYNTHETIC, Entry
from compaction_worker.contracts.toolpairs import tool_pairs
from compaction_worker.strategies.repair import open_call_index
from compaction_worker.strategies.tail import (
    choose_tail,
    is_filler_message,
    newest_step,
    observations,
    partition,
    pinned_indexes,
    split_points,
    task_index,
    user_words_indexes,
)
from compaction_worker.testing import Chat
from tests.trajectories import load_trajectories

from .conversations import CALL_IDS, Conversation, conversations
from .helpers import COUNTER, call, result


def entries(*specs: tuple[str, int] | dict[str, Any], start: int = 1) -> tuple[Entry, ...]:
    """Entries from ``(role, tokens)`` pairs (content "role n") or whole messages (10 tokens)."""
    out = []
    for i, spec in enumerate(specs, start=start):
        message = spec if isinstance(spec, dict) else {"role": spec[0], "content": f"{spec[0]} {i}"}
        tokens = 10 if isinstance(spec, dict) else spec[1]
        out.append(Entry(n=i, seq=i, message=message, tokens=tokens))
    return tuple(out)


def pinned(role: str, text: str = "remember this") -> dict[str, Any]:
    return {"role": role, "content": text, "pinned": True}


def ns(es: Sequence[Entry]) -> list[int]:
    return [e.n for e in es]


def pairs(es: Sequence[Entry]) -> list[tuple[int, int]]:
    return tool_pairs([e.message for e in es])


class TestSplitPoints:
    def test_never_between_call_and_result(self) -> None:
        """References 000 and 001 (no orphan tool result at the head of the tail): a tail cannot start while a tool call is unanswered."""
        es = entries(("user", 1), call("a"), result("a"), ("assistant", 1), ("user", 1))
        assert split_points(es) == [0, 1, 3, 4]

    def test_parallel_calls_close_after_the_last_result(self) -> None:
        """Two parallel calls keep the boundary closed until both results are in."""
        es = entries(("user", 1), call("a", "b"), result("a"), result("b"), ("user", 1))
        assert split_points(es) == [0, 1, 4]

    def test_a_late_result_keeps_the_boundary_closed(self) -> None:
        """A result that arrives after other messages still stays on its call's side."""
        es = entries(("user", 1), call("a"), ("user", 1), result("a"), ("user", 1))
        assert split_points(es) == [0, 1, 4]

    def test_a_call_never_answered_blocks_nothing(self) -> None:
        """A malformed unanswered call must not keep every later boundary closed."""
        es = entries(("user", 1), call("a"), ("user", 1), ("assistant", 1))
        assert split_points(es) == [0, 1, 2, 3]

    def test_reused_ids_pair_by_position(self) -> None:
        """Runtimes that name every call ``call_0`` still pair each result with its own call."""
        es = entries(("user", 1), call("x"), result("x"), ("user", 1), call("x"), result("x"), ("user", 1))
        assert pairs(es) == [(1, 2), (4, 5)]
        assert split_points(es) == [0, 1, 3, 4, 6]

    def test_an_extra_result_does_not_reach_back_to_an_older_call(self) -> None:
        """A second result for an answered call_0 answers nothing: it must not tie itself to an
        older unanswered call_0 and hold every boundary in between closed."""
        es = entries(
            ("user", 1),
            call("x"),
            ("user", 1),
            ("assistant", 1),
            ("user", 1),
            call("x"),
            result("x"),
            result("x"),
        )
        assert pairs(es) == [(5, 6)]
        assert split_points(es) == [0, 1, 2, 3, 4, 5]

    def test_parallel_calls_sharing_an_id(self) -> None:
        """Two calls named x in one message stay open until both results are in."""
        es = entries(("user", 1), call("x", "x"), result("x"), result("x"), ("user", 1))
        assert pairs(es) == [(1, 2), (1, 3)]
        assert split_points(es) == [0, 1, 4]


class TestSelectTail:
    def test_bounded_by_message_count_and_snapped_to_user(self) -> None:
        """References 000, 001 and 003: the tail holds at most N messages and starts at a user message."""
        es = entries(*[(r, 10) for r in ["user", "assistant"] * 5])
        assert choose_tail(es, max_messages=5, max_tokens=10_000)[0] == 6

    def test_bounded_by_tokens(self) -> None:
        """References 000 (whichever is more restrictive) and 003 (last N turns capped at T tokens): the token bound wins when it is tighter."""
        es = entries(("user", 10), ("assistant", 10), ("user", 10), ("assistant", 500))
        assert choose_tail(es, max_messages=6, max_tokens=100)[0] == 4

    def test_single_long_tool_turn_can_still_compact(self) -> None:
        """Reference 000 (single-turn boundary), improved: with one user message, an assistant boundary is used."""
        es = entries(("user", 10), call("a"), result("a"), call("b"), result("b"), ("assistant", 10))
        split = choose_tail(es, max_messages=3, max_tokens=1000)[0]
        assert split == 3
        assert es[split].role == "assistant"

    def test_degrades_to_nothing(self) -> None:
        """Reference 003 (degrading guard): when even the shortest clean tail is over budget, it degrades to empty."""
        es = entries(("user", 10), ("assistant", 10), ("user", 500))
        assert choose_tail(es, max_messages=6, max_tokens=100)[0] == 3

    def test_pinned_tokens_count_against_the_token_bound(self) -> None:
        """Pinned messages before the tail stay verbatim too, so the tail makes room for them."""
        es = entries(pinned("user"), ("assistant", 10), ("user", 30), ("assistant", 30), ("user", 30))
        assert choose_tail(es, max_messages=6, max_tokens=100)[0] == 2
        heavy = (Entry(n=1, seq=1, message=pinned("user"), tokens=50), *es[1:])
        assert choose_tail(heavy, max_messages=6, max_tokens=100)[0] == 4

    def test_pinned_alone_over_the_bound_degrades_the_tail(self) -> None:
        """Pinned messages that fill the budget leave no verbatim tail (they stay regardless)."""
        es = (
            Entry(n=1, seq=1, message=pinned("user"), tokens=200),
            *entries(("assistant", 5), ("user", 5), start=2),
        )
        assert choose_tail(es, max_messages=6, max_tokens=100)[0] == 3

    def test_pinned_messages_do_not_count_against_the_message_bound(self) -> None:
        """The message bound is about recency; pinned messages are kept for what they say."""
        es = entries(
            pinned("user"), pinned("assistant"), ("user", 5), ("assistant", 5), ("user", 5), ("assistant", 5)
        )
        assert choose_tail(es, max_messages=2, max_tokens=1000)[0] == 4

    def test_a_head_of_only_pinned_messages_is_not_a_split(self) -> None:
        """A split that leaves nothing to summarize is no split: the tail degrades past it."""
        es = entries(pinned("user"), ("assistant", 500), ("user", 500))
        assert choose_tail(es, max_messages=6, max_tokens=100)[0] == 3

    def test_open_calls_at_the_end_stay(self) -> None:
        """The last assistant's unanswered calls stay in the tail even when over budget: their
        results arrive with the next turn and would be orphans if the calls were summarized."""
        es = entries(("user", 10), ("assistant", 10), ("user", 10), call("a", "b"), result("a"))
        assert open_call_index(es) == 3
        assert choose_tail(es, max_messages=1, max_tokens=1)[0] == 3
        assert choose_tail(es, max_messages=6, max_tokens=1000)[0] == 2

    def test_synthetic_entries_are_not_worth_a_split(self) -> None:
        """Repair's made-up messages are no reason to compact: they stand for nothing."""
        gap = Entry(n=0, seq=1, message={"role": "user", "content": "[Continue.]"}, tokens=3, edit=SYNTHETIC)
        es = (gap, *entries(("assistant", 10), ("user", 10), start=2))
        assert choose_tail(es, max_messages=6, max_tokens=1000)[0] == 2


class TestSnapToUserTurn:
    def test_a_turn_that_fits_is_never_cut_after_its_question(self) -> None:
        """Issue 9 (reference 000 snaps to a user turn): a turn within the bounds stays whole,
        even when nothing before it is left to summarize; it used to keep only its last
        assistant messages and summarize the question they answer."""
        es = entries(("user", 10), call("a"), result("a"), call("b"), result("b"), ("assistant", 10))
        assert choose_tail(es, max_messages=10, max_tokens=1000) == (0, None)
        parts = partition(es, max_messages=10, max_tokens=1000)
        assert (parts.head, ns(parts.tail), parts.note) == ((), [1, 2, 3, 4, 5, 6], None)

    def test_the_tail_starts_at_a_user_turn_when_one_fits(self) -> None:
        """An assistant boundary closer to the end is not used while a user turn fits."""
        es = entries(("user", 10), ("assistant", 10), ("user", 10), call("a"), result("a"), ("assistant", 10))
        parts = partition(es, max_messages=4, max_tokens=1000)
        assert (ns(parts.tail), parts.note) == ([3, 4, 5, 6], None)

    def test_a_turn_over_the_token_bound_is_cut_and_the_note_says_so(self) -> None:
        """Issue 9 (the tail says so): when the latest turn alone exceeds the bound, the tail
        starts at an assistant message inside it, and the partition's note tells why."""
        es = entries(
            ("user", 10),
            ("assistant", 10),
            ("user", 10),
            call("a"),
            {"role": "tool", "tool_call_id": "a", "content": "log"},
            ("assistant", 10),
        )
        es = (*es[:4], Entry(n=5, seq=5, message=es[4].message, tokens=300), es[5])
        parts = partition(es, max_messages=6, max_tokens=100)
        assert ns(parts.tail) == [6]
        assert parts.note == (
            "the latest turn alone (4 messages, 330 tokens) exceeds the verbatim tail's bound "
            "(6 messages, 100 tokens): the tail starts at its assistant message"
        )

    def test_a_turn_over_the_message_bound_is_cut_and_the_note_says_so(self) -> None:
        """The message bound counts too: a long tool loop under one question."""
        es = entries(
            ("user", 10), ("assistant", 10), ("user", 10), call("a"), result("a"), call("b"), result("b")
        )
        parts = partition(es, max_messages=3, max_tokens=1000)
        assert ns(parts.tail) == [6, 7]
        assert parts.note is not None
        assert "(5 messages, 50 tokens)" in parts.note

    def test_degrading_to_nothing_says_so(self) -> None:
        """Reference 003's degrading guard is kept, and noted."""
        es = entries(("user", 10), ("assistant", 10), ("user", 500))
        parts = partition(es, max_messages=6, max_tokens=100)
        assert parts.tail == ()
        assert parts.note is not None
        assert parts.note.endswith("the tail is empty")
        assert "(1 message, 500 tokens)" in parts.note

    def test_pinned_messages_that_crowd_out_the_turn_are_named(self) -> None:
        """When pinned messages before the tail use the token bound, the note counts them."""
        es = (
            Entry(n=1, seq=1, message=pinned("user"), tokens=80),
            *entries(("assistant", 5), ("user", 30), ("assistant", 5), start=2),
        )
        parts = partition(es, max_messages=6, max_tokens=100)
        assert ns(parts.tail) == [4]
        assert parts.note is not None
        assert "with 80 tokens of pinned messages before it" in parts.note

    def test_no_note_when_the_snap_works(self) -> None:
        es = entries(*[(r, 10) for r in ["user", "assistant"] * 5])
        assert partition(es, max_messages=5, max_tokens=10_000).note is None


class TestPartition:
    def test_pinned_messages_are_lifted_out_of_the_head(self) -> None:
        """Reference 003 (Alternative B, pinned messages): pinned messages before the tail are kept, in order, between summary and tail."""
        es = entries(
            ("user", 10), pinned("assistant"), ("user", 10), pinned("user"), ("assistant", 10), ("user", 10)
        )
        parts = partition(es, max_messages=1, max_tokens=1000)
        assert ns(parts.head) == [1, 3, 5]
        assert ns(parts.pinned) == [2, 4]
        assert ns(parts.tail) == [6]

    def test_a_pinned_result_brings_its_call_and_siblings(self) -> None:
        """A pinned tool result keeps its call, and so the call's other parallel results."""
        es = entries(
            ("user", 10),
            call("a", "b"),
            result("a"),
            result("b", pinned=True),
            ("assistant", 10),
            ("user", 10),
        )
        parts = partition(es, max_messages=1, max_tokens=1000)
        assert ns(parts.pinned) == [2, 3, 4]
        assert ns(parts.head) == [1, 5]

    def test_a_pinned_call_brings_its_results(self) -> None:
        """A pinned tool-calling message keeps every result of its calls."""
        es = entries(("user", 10), call("a", "b", pinned=True), result("a"), result("b"), ("user", 10))
        assert ns(partition(es, max_messages=1, max_tokens=1000).pinned) == [2, 3, 4]

    def test_a_pinned_message_in_the_tail_just_stays(self) -> None:
        """Nothing is lifted from the tail: it is verbatim already."""
        es = entries(("user", 10), ("assistant", 10), pinned("user"), ("assistant", 10))
        parts = partition(es, max_messages=6, max_tokens=1000)
        assert (ns(parts.head), ns(parts.pinned), ns(parts.tail)) == ([1, 2], [], [3, 4])

    def test_synthetic_entries_in_the_head_are_dropped(self) -> None:
        """An earlier repair's made-up messages are not summarized (they stand for no message)."""
        gap = Entry(n=0, seq=2, message={"role": "user", "content": "[Continue.]"}, tokens=3, edit=SYNTHETIC)
        es = (
            *entries(("user", 10), ("assistant", 10)),
            gap,
            *entries(("assistant", 10), ("user", 10), start=3),
        )
        parts = partition(es, max_messages=1, max_tokens=1000)
        assert ns(parts.head) == [1, 2, 3]
        assert ns(parts.tail) == [4]

    def test_pinned_indexes_with_reused_ids(self) -> None:
        """A pinned result keeps its own call, not another call that reused the id."""
        es = entries(("user", 1), call("x"), result("x", pinned=True), ("user", 1), call("x"), result("x"))
        assert pinned_indexes(es) == {1, 2}


# --- properties over generated conversations ------------------------------------------------


def _pairs_by_part(parts: Sequence[Sequence[Entry]], es: Sequence[Entry]) -> list[str]:
    part_of = {id(e): k for k, part in enumerate(parts) for e in part}
    return [
        f"pair {es[c].n}->{es[r].n} split"
        for c, r in pairs(es)
        if part_of.get(id(es[c]), -1) != part_of.get(id(es[r]), -2)
    ]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    conversation=st.sampled_from(CALL_IDS).flatmap(lambda ids: conversations(COUNTER, call_ids=ids)),
    max_messages=st.integers(1, 12),
    max_tokens=st.sampled_from((0, 10, 100, 1_000, 10_000, 100_000)),
)
def test_partition_properties(conversation: Conversation, max_messages: int, max_tokens: int) -> None:
    """For any valid conversation: nothing is lost, no tool pair is split, pinned messages and the
    open call at the end stay, and the bounds hold unless the degrading guard or the open call forced them."""
    es = conversation.entries
    parts = partition(es, max_messages, max_tokens)
    split = len(es) - len(parts.tail)
    kept = [e for e in es[:split] if e not in parts.head and e not in parts.pinned]
    assert all(e.synthetic for e in kept)  # only synthetic entries may be dropped
    assert sorted(map(id, (*parts.head, *parts.pinned, *kept))) == sorted(map(id, es[:split]))
    assert _pairs_by_part((parts.head, parts.pinned, parts.tail), es) == []
    assert split == len(es) or split in split_points(es)
    assert all(e.n in conversation.must_keep for e in parts.pinned)
    for e in parts.head:
        assert e.n not in conversation.must_keep
    open_index = open_call_index(es)
    if open_index is not None:
        assert split <= open_index
    forced = open_index is not None and split == max(p for p in split_points(es) if p <= open_index)
    if parts.tail and not forced:
        assert len(parts.tail) <= max_messages
        assert sum(e.tokens for e in (*parts.pinned, *parts.tail)) <= max_tokens
    # Issue 9: the tail starts at a user turn (or holds every entry), or the note says why not.
    if parts.note is None:
        assert parts.tail
        assert split == 0 or es[split].role == "user"
    else:
        assert not parts.tail or es[split].role != "user"
        last_user = max((i for i in split_points(es) if es[i].role == "user" and i <= split), default=0)
        turn = es[last_user:]
        within = (
            len(turn) <= max_messages
            and sum(e.tokens for e in (*turn, *(e for e in es[:last_user] if e in parts.pinned)))
            <= max_tokens
        )
        assert not within or forced


class TestTheTask:
    """The task, the conversation's first user message, stays out of what is summarized."""

    def test_the_task_is_lifted_out_of_the_head_with_the_system_prompt(self) -> None:
        es = entries(("system", 5), ("user", 5), ("assistant", 5), ("user", 5), ("assistant", 5), ("user", 5))
        parts = partition(es, 2, 1_000, task=True)
        assert ns(parts.pinned) == [1, 2]
        assert ns(parts.head) == [3, 4, 5]
        without = partition(es, 2, 1_000)
        assert ns(without.pinned) == [1]
        assert ns(without.head) == [2, 3, 4, 5]

    def test_an_agent_run_with_one_user_message_keeps_it(self) -> None:
        """The tail starts inside the only turn; its question, the task, stays verbatim."""
        steps = [m for i in range(6) for m in (call(f"c{i}"), result(f"c{i}"))]
        es = entries(("system", 5), ("user", 5), *steps)
        parts = partition(es, 4, 1_000, task=True)
        assert ns(parts.pinned) == [1, 2]
        assert parts.head
        assert all(e.role in ("assistant", "tool") for e in parts.head)

    def test_task_index_skips_synthetic_users(self) -> None:
        es = entries(("system", 5), ("assistant", 5), ("user", 5))
        synthetic = Entry(
            n=0, seq=1, message={"role": "user", "content": "[continue]"}, tokens=1, edit="synthetic"
        )
        assert task_index([es[0], synthetic, *es[1:]]) == 3
        assert task_index(es[:2]) is None

    def test_a_demonstration_before_the_task_is_not_the_task(self) -> None:
        """SWE-agent's demonstrations (its template's words, marked ``is_demo`` in its history or not)
        come before the issue: the issue is the task."""
        demo = (
            "Here is a demonstration of how to correctly accomplish this task.\n"
            "It is included to show you how to correctly use the interface.\n"
            "You do not need to follow exactly what is done in the demonstration.\n"
            "--- DEMONSTRATION ---\n[the demonstration's own issue and steps]\n--- END OF DEMONSTRATION ---"
        )
        issue = "We're currently solving the following issue within our repository. Here's the issue text:"
        system = {"role": "system", "content": "SETTING: You are an autonomous programmer."}
        for shown in (
            {"role": "user", "content": demo},
            {"role": "user", "content": "[demo]", "is_demo": True},
        ):
            es = entries(system, shown, {"role": "user", "content": issue}, ("assistant", 5))
            assert task_index(es) == 2

    def test_a_message_the_runtime_marks_task_is_the_task(self) -> None:
        es = entries(("system", 5), ("user", 5), {"role": "user", "content": "the real work", "task": True})
        assert task_index(es) == 2


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    conversation=st.sampled_from(CALL_IDS).flatmap(lambda ids: conversations(COUNTER, call_ids=ids)),
    max_messages=st.integers(1, 12),
    max_tokens=st.sampled_from((0, 10, 100, 1_000)),
)
def test_the_task_and_system_messages_are_never_in_the_head(
    conversation: Conversation, max_messages: int, max_tokens: int
) -> None:
    """For any valid conversation: the first user message and every system message stay verbatim."""
    es = conversation.entries
    parts = partition(es, max_messages, max_tokens, task=True)
    task = task_index(es)
    assert all(e.role != "system" for e in parts.head)
    assert task is None or es[task] not in parts.head
    assert _pairs_by_part((parts.head, parts.pinned, parts.tail), es) == []


class TestTheUsersWords:
    """The user's most recent messages stay verbatim within a budget, before assistant prose."""

    def test_most_recent_first_within_the_budget_passing_over_a_paste(self) -> None:
        es = entries(
            ("user", 10), ("assistant", 50), ("user", 30), ("assistant", 50), ("user", 500), ("user", 20)
        )
        assert user_words_indexes(es, 60) == {5, 2, 0}
        assert user_words_indexes(es, 60, skip=0) == {5, 2}
        assert user_words_indexes(es, 0) == set()

    def test_the_current_request_stays_when_the_tail_starts_inside_its_turn(self) -> None:
        """An agent turn with many tool steps: the tail cannot hold it, the request is still kept."""
        steps = [m for i in range(6) for m in (call(f"c{i}"), result(f"c{i}"))]
        es = entries(("user", 5), ("assistant", 5), ("user", 8), *steps)
        without = partition(es, 4, 1_000)
        assert 3 in ns(without.head)
        parts = partition(es, 4, 1_000, user_words=20)
        assert ns(parts.pinned) == [1, 3]
        assert all(e.role in ("assistant", "tool") for e in parts.head)


def step_entries(*steps: tuple[int, list[tuple[str, int]]]) -> tuple[Entry, ...]:
    """Entries turn by turn: ``(seq, [(role, tokens), ...])``."""
    out: list[Entry] = []
    for seq, messages in steps:
        for role, tokens in messages:
            n = len(out) + 1
            out.append(Entry(n=n, seq=seq, message={"role": role, "content": f"{role} {n}"}, tokens=tokens))
    return tuple(out)


class TestTheNewestStep:
    """The newest step (issue 33): the last assistant message and what follows it."""

    def test_an_agent_step_starts_at_its_assistant_message(self) -> None:
        es = step_entries((1, [("system", 5), ("user", 50)]), (2, [("assistant", 5), ("user", 90)]))
        assert newest_step(es) == 2  # the observation belongs to the step that ran its command
        calls = entries(("user", 5), call("a"), result("a"), call("b"), result("b"))
        assert newest_step(calls) == 3

    def test_a_chat_ends_with_the_reply_and_a_lone_message_has_no_step(self) -> None:
        assert newest_step(entries(("user", 5), ("assistant", 5), ("user", 5), ("assistant", 5))) == 3
        assert newest_step(entries(("user", 5))) is None


class TestObservations:
    """A text-protocol agent's observations are user messages, but not the user speaking."""

    def test_a_user_message_after_the_assistant_in_its_turn_is_an_observation(self) -> None:
        es = step_entries(
            (1, [("system", 5), ("user", 50)]),
            (2, [("assistant", 5), ("user", 90)]),
            (3, [("user", 8), ("assistant", 5)]),
        )
        assert observations(es) == {3}
        # The user's words are their own messages: the task, and the turn-3 request; not the output.
        assert user_words_indexes(es, 1_000) == {1, 4}


def test_the_task_of_every_published_trajectory_is_its_first_request_even_after_a_demonstration() -> None:
    """Two agents' runs (tests/data/trajectories): the task is the first user message; with SWE-agent's
    demonstration put before it, as its default configuration sends one, still that message."""
    demo = {
        "role": "user",
        "content": "Here is a demonstration of how to correctly accomplish this task.\n...",
    }
    for run in load_trajectories():
        first = list(run.turns()[0])
        es = entries(*first, ("assistant", 5))
        at = task_index(es)
        assert at is not None, run.name
        assert es[at].message is first[at], run.name
        shown = entries(*first[:at], demo, *first[at:], ("assistant", 5))
        assert task_index(shown) == at + 1, run.name


class TestFiller:
    """Issue 53: a remark that names nothing, or an acknowledgment, is no task, no words and no step."""

    def test_a_remark_is_no_task_the_first_message_that_says_something_is(self) -> None:
        chat = Chat()
        chat.user("The webhook retries three times before dead-lettering.").assistant("Acknowledged.")
        chat.user("Please move the billing exports onto the new queue.").assistant("On it.")
        assert task_index(chat.entries) == 2

    def test_the_users_words_pass_over_remarks_and_with_a_state_its_items(self) -> None:
        chat = Chat()
        chat.user("Please port the exporter.").assistant("ok")
        chat.user("Never push to main. Cache invalidation is event-driven.").assistant("Noted.")
        chat.user("Dashboards refresh every few minutes anyway.").assistant("Acknowledged.")
        chat.user("Why did the smoke test fail on run 12?").assistant("Looking.")
        words = user_words_indexes(chat.entries, 10_000)
        assert words == {0, 2, 6}
        assert user_words_indexes(chat.entries, 10_000, carried=True) == {0, 6}

    def test_an_acknowledgment_is_filler_a_reply_with_code_is_not(self) -> None:
        chat = Chat().assistant("Acknowledged. Continuing with the plan.")
        chat.assistant("Flag found. Submitting it now.\n```\nsubmit 'HTB{x}'\n```")
        chat.calls(("call_0", "read_file", {"path": "a.py"}))
        first, code, call = chat.entries
        assert is_filler_message(first)
        assert not is_filler_message(code)
        assert not is_filler_message(call)

    def test_the_newest_step_is_the_call_its_results_and_the_reply(self) -> None:
        chat = Chat().user("Please check a.py.").calls(("call_0", "read_file", {"path": "a.py"}))
        chat.add({"role": "tool", "tool_call_id": "call_0", "content": "print(1)"}).assistant("It prints 1.")
        assert newest_step(chat.entries) == 1
