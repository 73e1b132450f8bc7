"""Where the verbatim tail starts, and what else stays verbatim: pinned messages and the task.

The tail is bounded by messages and tokens, snapped to a user turn, and never parts a
tool call from its results; open tool calls at the end always stay in it. Before the tail,
pinned messages (the runtime's, and every system message) and the task (the conversation's
first user message, see :func:`task_index`) stay verbatim with their tool pairs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from compaction_worker.contracts.history import Entry, text_of
from compaction_worker.contracts.toolpairs import tool_pairs
from compaction_worker.strategies.draft import plural
from compaction_worker.strategies.repair import call_ids, open_call_index
from compaction_worker.summaries.prompts import piece_boundaries
from compaction_worker.summaries.sentences import says_nothing_new


def split_points(entries: Sequence[Entry]) -> list[int]:
    """Indexes where a verbatim tail may start without splitting a tool call from its result.

    A user or assistant message is a clean boundary unless some tool call before it has
    its result at or after it (an assistant boundary lets a single long tool-calling turn
    compact, which a user-only rule cannot). A call that is never answered constrains
    nothing: it cannot be split from a result it does not have, and letting it block
    every later boundary would keep a malformed conversation from ever compacting.
    """
    points = piece_boundaries([e.message for e in entries])
    return [i for i in points if i < len(entries) and entries[i].role in ("user", "assistant")]


def newest_step(entries: Sequence[Entry]) -> int | None:
    """Where the newest step starts: its assistant message (with the tool results or the observation
    after it, and the reply that reads them), at the last clean boundary; None when that is the whole
    history or there is none."""
    points = split_points(entries)
    start = max((p for p in points if entries[p].role == "assistant"), default=max(points, default=0))
    if start and not entries[start].message.get("tool_calls") and entries[start - 1].role == "tool":
        # A reply right after tool results ends the step that called them: the call is the action.
        start = max((p for p in points if p < start and entries[p].role == "assistant"), default=start)
    return start or None


def observations(entries: Sequence[Entry]) -> set[int]:
    """Indexes of user messages that are an agent's observations, not the user speaking: a user
    message after an assistant message of the same turn (text-protocol agents, such as SWE-agent and
    mini-swe-agent, send a command's output back as a user message in the step that ran it)."""
    out: set[int] = set()
    replied = False  # an assistant message came earlier in the current turn
    for i, entry in enumerate(entries):
        replied = replied and entry.seq == entries[i - 1].seq
        if entry.role == "user" and replied:
            out.add(i)
        replied = replied or entry.role == "assistant"
    return out


def is_filler_message(entry: Entry) -> bool:
    """Whether a message says nothing a later call needs: no tool call or result, and every sentence
    filler (an acknowledgment, a remark with nothing named: ``summaries.sentences.is_filler``)."""
    if entry.role not in ("user", "assistant") or entry.pinned or entry.message.get("tool_calls"):
        return False
    return says_nothing_new(text_of(entry.message))


def task_index(entries: Sequence[Entry]) -> int | None:
    """Where the task is: the message the runtime marked ``task``; else the earliest user message that
    says something (a request, a report, a spec: not a remark with nothing named, such as "The webhook
    retries three times before dead-lettering.", ``summaries.standing.says_nothing_new``) and is no
    synthetic message and no demonstration (:func:`is_demonstration`); None if there is none.

    Kept from the first compaction on, it is the conversation's statement of what the agent is
    to do. In a history compacted before the task was kept, it is the earliest such user message
    the history still holds.
    """
    marked = next(
        (i for i, e in enumerate(entries) if e.message.get("task") is True and not e.synthetic), None
    )
    if marked is not None:
        return marked
    return next(
        (
            i
            for i, e in enumerate(entries)
            if e.role == "user"
            and not e.synthetic
            and not is_demonstration(e)
            and not says_nothing_new(text_of(e.message))
        ),
        None,
    )


_DEMONSTRATION = re.compile(
    r"^\W*(?:here is|here's|below is|the following is) an? (?:demonstration|example (?:of|trajectory))\b"
    r"|-{2,}\s*(?:begin )?demonstration\s*-{2,}",
    re.IGNORECASE,
)


def is_demonstration(entry: Entry) -> bool:
    """Whether a user message shows the agent how a task is done rather than giving it one: marked
    ``is_demo`` (SWE-agent's field), or opening as SWE-agent's and similar agents' demonstrations do
    ("Here is a demonstration of how to correctly accomplish this task", "--- DEMONSTRATION ---")."""
    if entry.message.get("is_demo") is True:
        return True
    return _DEMONSTRATION.search(text_of(entry.message)[:600]) is not None


def user_words_indexes(
    entries: Sequence[Entry], budget: int, *, skip: int | None = None, carried: bool = False
) -> set[int]:
    """The user's own messages that stay verbatim: the most recent first, while ``budget`` tokens last
    (an agent's observations sent as user messages are not the user's words, :func:`observations`).

    A message too large for what is left is passed over for older, smaller ones: a pasted
    log must not cost the user's short instructions their place. ``skip`` (the task) has a
    budget of its own. A message that says nothing new is filler and gives way: every sentence an
    acknowledgment or a remark with nothing named, or, when the standing state is ``carried``, one
    of its items (the state keeps those word for word, by value, for less).
    """
    kept: set[int] = set()
    left = budget
    observed = observations(entries) if budget > 0 else set()
    for i in range(len(entries) - 1, -1, -1):
        entry = entries[i]
        if left <= 0:
            break
        if i in observed:
            continue
        if entry.role != "user" or entry.synthetic or i == skip or entry.tokens > left:
            continue
        if not says_nothing_new(text_of(entry.message), items=carried):
            kept.add(i)
            left -= entry.tokens
    return kept


def choose_tail(
    entries: Sequence[Entry],
    max_messages: int,
    max_tokens: int,
    *,
    task: bool = False,
    user_words: int = 0,
    carried: bool = False,
) -> tuple[int, str | None]:
    """Where the verbatim tail starts, and a note when it could not start at a user turn.

    The longest clean tail within both bounds that starts at a user message: a tail that
    opens on an assistant reply or a tool result whose question was summarized reads as
    an answer to nothing (reference 000 snaps to a user turn). ``max_tokens`` bounds the
    tail plus the pinned entries before it (see the module docstring). Only when the
    latest turn alone exceeds the bounds does the tail start inside it, at an assistant
    boundary, or degrade to nothing (reference 003's degrading guard); the note says so.
    The last assistant message's open tool calls, and the results already in, always stay:
    their remaining results arrive with the next turn and would be orphans without them.
    """
    n = len(entries)
    keep = pinned_indexes(entries, task=task, user_words=user_words, carried=carried)
    suffix = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        suffix[i] = suffix[i + 1] + entries[i].tokens
    pinned_before = [0] * (n + 1)
    summarizable_before = [0] * (n + 1)
    for i, entry in enumerate(entries):
        kept = i in keep
        pinned_before[i + 1] = pinned_before[i] + (entry.tokens if kept else 0)
        summarizable_before[i + 1] = summarizable_before[i] + (not kept and not entry.synthetic)
    points = split_points(entries)
    floor = n
    if (open_index := open_call_index(entries)) is not None:
        floor = max((p for p in points if p <= open_index), default=0)

    def within(i: int) -> bool:
        return n - i <= max_messages and suffix[i] + pinned_before[i] <= max_tokens

    fits = [i for i in points if i <= floor and summarizable_before[i] > 0 and within(i)]
    users = [i for i in fits if entries[i].role == "user"]
    if users:
        return min(users), None
    # The latest turn: from the last user boundary (the entries' start when there is none).
    turn = max((i for i in points if i <= floor and entries[i].role == "user"), default=0)
    if within(turn):
        # The whole latest turn fits but nothing before it is worth summarizing: keep it
        # whole rather than summarize its question and keep the answer.
        return turn, None
    split = min(fits or [floor])
    return split, _inside_turn_note(
        entries[turn:], pinned_before[turn], entries[split:], max_messages, max_tokens
    )


def _inside_turn_note(
    turn: Sequence[Entry], pinned: int, tail: Sequence[Entry], max_messages: int, max_tokens: int
) -> str:
    """Why the verbatim tail does not start at a user turn, in words."""
    size = f"{plural(len(turn), 'message')}, {plural(sum(e.tokens for e in turn), 'token')}"
    if pinned:
        size += f", with {plural(pinned, 'token')} of pinned messages before it"
    bound = f"{plural(max_messages, 'message')}, {plural(max_tokens, 'token')}"
    where = f"starts at its {tail[0].role} message" if tail else "is empty"
    if turn and tail and tail[0] is turn[0]:
        where = "starts at its first message"
    return f"the latest turn alone ({size}) exceeds the verbatim tail's bound ({bound}): the tail {where}"


@dataclass(frozen=True, slots=True)
class Partition:
    """The entries split three ways: to summarize, kept because pinned, and the verbatim tail."""

    head: tuple[Entry, ...]
    """What the summary replaces: transcript messages before the tail, not pinned."""
    pinned: tuple[Entry, ...]
    """Pinned entries from before the tail (with their tool calls/results), in order."""
    tail: tuple[Entry, ...]
    note: str | None = None
    """Set when the tail could not start at a user turn (the latest turn alone exceeds the
    bounds): what happened instead, for the ``compaction.completed`` event."""


def partition(
    entries: Sequence[Entry],
    max_messages: int,
    max_tokens: int,
    *,
    task: bool = False,
    user_words: int = 0,
    carried: bool = False,
) -> Partition:
    """Choose the tail, then lift pinned messages, the task when ``task``, and the most recent user
    messages within ``user_words`` tokens out of the head.

    Their tool pairs come with them. Synthetic entries (made up by an earlier repair)
    before the tail are dropped rather than summarized: they stand for no transcript
    message, and what they paired with is summarized too (or kept, and then they stay with it).
    """
    split, note = choose_tail(
        entries, max_messages, max_tokens, task=task, user_words=user_words, carried=carried
    )
    keep = pinned_indexes(entries[:split], task=task, user_words=user_words, carried=carried)
    head = entries[:split]
    return Partition(
        head=tuple(e for i, e in enumerate(head) if i not in keep and not e.synthetic),
        pinned=tuple(e for i, e in enumerate(head) if i in keep),
        tail=tuple(entries[split:]),
        note=note,
    )


def pinned_indexes(
    entries: Sequence[Entry], *, task: bool = False, user_words: int = 0, carried: bool = False
) -> set[int]:
    """Indexes of pinned entries, the task when ``task``, the user's words within ``user_words``
    tokens (:func:`user_words_indexes`), plus their tool calls and results.

    A pinned tool result brings its call, and so the call's other (parallel) results; a
    pinned tool-calling message brings its results. Pairs are found by position, so
    reused call ids and synthetic entries from an earlier repair pair correctly.
    """
    results_of: dict[int, list[int]] = {}
    call_of: dict[int, int] = {}
    for call, result in tool_pairs([e.message for e in entries]):
        results_of.setdefault(call, []).append(result)
        call_of[result] = call
    keep: set[int] = set()
    task_at = task_index(entries) if task else None
    words = user_words_indexes(entries, user_words, skip=task_at, carried=carried)
    for i, entry in enumerate(entries):
        if not entry.pinned and i != task_at and i not in words:
            continue
        caller = call_of.get(i, i)
        keep.add(i)
        keep.add(caller)
        if call_ids(entries[caller].message):
            keep.update(results_of.get(caller, ()))
    return keep
