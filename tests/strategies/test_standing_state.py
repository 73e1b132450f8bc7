"""The memory contract through the whole pipeline (strategies/standing_state.py, DESIGN.md invariants 10-12).

A conversation whose user sets rules, constraints, preferences, goals, decisions and facts (and
later changes two of them) is compacted five times in a row, twice with new turns between and
three times with none, on every path: the extractive summary, a summarizer that keeps nothing,
an outage (the LLM fails, the extractive fallback runs), and the sliding window alone. After
every round each current item is in the rendered history word for word, each changed one is
shown as no longer current, and the event's report says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from compaction_worker.bench import standing as canaries
from compaction_worker.contracts.events import LlmUsage, Outcome, StandingStateReport
from compaction_worker.contracts.history import STANDING, EffectiveHistory, Entry, render, text_of
from compaction_worker.settings import PipelineSettings
from compaction_worker.strategies import Limits, compact
from compaction_worker.strategies.standing_state import read_state
from compaction_worker.summaries import schema
from compaction_worker.summaries.contract import Summarizer, SummarizerError, SummaryRequest, SummaryResult
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.summaries.standing import STANDING_HEADER
from compaction_worker.testing import Chat

from .helpers import COUNTER, context

CURRENT = {
    "rule": "Never execute shell commands without explicit approval.",
    "constraint": "Actually, raise the monthly budget cap to $800.",
    "preference": "Actually, use Celsius for every temperature.",
    "goal": "We're migrating auth from sessions to JWT tokens.",
    "decision": "We decided to use Postgres 16 for the new service.",
    "fact": "Our on-call team is called bluefin.",
}
SUPERSEDED = {
    "Keep the monthly budget cap under $500.": "Actually, raise the monthly budget cap to $800.",
    "Use Fahrenheit for every temperature.": "Actually, use Celsius for every temperature.",
}
# (turn, sentence): when the user says each, among filler.
PLANTED = [
    (3, CURRENT["rule"]),
    (5, "Keep the monthly budget cap under $500."),
    (7, "Use Fahrenheit for every temperature."),
    (9, CURRENT["goal"]),
    (11, CURRENT["decision"]),
    (13, CURRENT["fact"]),
    (17, CURRENT["constraint"]),
    (19, CURRENT["preference"]),
]


def filler(turn: int, words: int) -> str:
    return " ".join(f"step{turn}x{i}" for i in range(words))


def conversation(turns: int, start: int = 1) -> Chat:
    """``turns`` exchanges: a user message (a planted sentence on its turn) and a long assistant reply."""
    chat = Chat(start, COUNTER)
    said = dict(PLANTED)
    for turn in range(start, start + 2 * turns, 2):
        words = f"Look at part {turn} please"
        chat.user(f"{said[turn]} {words}" if turn in said else words)
        chat.assistant(filler(turn, 60))
    return chat


class KeepsNothing:
    """A summarizer whose summary states nothing the user said (a weak small model)."""

    name = "keeps-nothing"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        text = "The user and the assistant worked through several parts of the task."
        return SummaryResult(text, self.name, COUNTER.text(text), LlmUsage(calls=1))


class WritesItems:
    """A model that writes checked items (summaries/schema.py) quoting each user message of its span
    as a fact, old values included: items that did not change are carried as they are, so an old value
    would come back in every later rendering (a fold's) unless the state takes it out of the items."""

    name = "items"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        current = [schema.Item.decode(raw) for raw in request.items]
        seqs = request.seqs or range(1, len(request.messages) + 1)
        start = len(current) + 1
        added = [
            schema.Item(f"f{start + k}", "facts", text_of(m), (seq,))
            for k, (m, seq) in enumerate(
                (m, s) for m, s in zip(request.messages, seqs, strict=True) if m["role"] == "user"
            )
        ]
        items = [*current, *added] if request.folds else added
        text = schema.render(items)
        return SummaryResult(
            text, self.name, COUNTER.text(text), LlmUsage(calls=1), items=tuple(i.encode() for i in items)
        )


class Down:
    """An LLM in an outage."""

    name = "llm"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        raise SummarizerError("503 service unavailable")


@dataclass(frozen=True)
class Path:
    name: str
    summarizers: tuple[Summarizer, ...]
    settings: PipelineSettings


PATHS = [
    Path("extractive", (ExtractiveSummarizer(COUNTER.text),), PipelineSettings()),
    Path("keeps nothing", (KeepsNothing(),), PipelineSettings()),
    Path("writes items", (WritesItems(),), PipelineSettings()),
    Path("outage", (Down(), ExtractiveSummarizer(COUNTER.text)), PipelineSettings()),
    Path("sliding window", (), PipelineSettings(summarize=False)),
]


def limits(target: int, force: bool) -> Limits:
    return Limits(
        target=target,
        fixed_tokens=0,
        window=8_000,
        tail_max_messages=4,
        tail_max_tokens=400,
        max_summary_tokens=300,
        chunk_budget=target // 2,
        force=force,
        task_max_tokens=200,
        user_words_max_tokens=100,
    )


def shown(history: EffectiveHistory) -> str:
    return "\n".join(text_of(m) for m in render(history))


def state_text(history: EffectiveHistory) -> str:
    states = [text_of(e.message) for e in history.entries if e.edit == STANDING]
    assert len(states) <= 1
    return states[0] if states else ""


async def rounds(path: Path, target: int) -> list[tuple[EffectiveHistory, StandingStateReport | None]]:
    """Five compactions: after 20 exchanges, after 10 more, then three with no new turn."""
    chat = conversation(20)
    history = EffectiveHistory((), tuple(chat.entries))
    out: list[tuple[EffectiveHistory, StandingStateReport | None]] = []
    for index in range(5):
        if index == 1:
            more = conversation(10, start=41)
            history = history.with_parts(history.chunks, (*history.entries, *more.entries))
        result = await compact(
            history, limits(target, force=index >= 2), path.summarizers, COUNTER, settings=path.settings
        )
        if result.outcome is Outcome.NOOP and index >= 2:
            # The sliding window alone has nothing to do on a forced run under the target.
            assert path.name == "sliding window", result.error
            assert result.error is not None
            assert "nothing dropped" in result.error
            out.append((history, None))
            continue
        assert result.outcome is Outcome.COMPACTED, (index, result.error)
        assert result.tokens_after <= target, (index, result.tokens_after)
        history = history.with_parts(result.draft.chunks, result.draft.entries)
        out.append((history, result.standing))
    return out


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.name)
async def test_every_item_survives_five_compactions_on_every_path(path: Path) -> None:
    """Every current item word for word in every round; each changed one marked as no longer current."""
    for index, (history, report) in enumerate(await rounds(path, target=900)):
        text = shown(history)
        missing = [kind for kind, sentence in CURRENT.items() if sentence not in text]
        assert missing == [], (path.name, index, text)
        state = state_text(history)
        assert state.startswith(STANDING_HEADER), (path.name, index)
        old = state.split("No longer current (superseded):", 1)
        assert len(old) == 2, state
        for sentence in SUPERSEDED:
            assert sentence in old[1], (path.name, index, sentence)
            assert sentence not in old[0], "a superseded value is shown as current"
            # Nor does a summary state it as current (the extractive one quotes the user's sentences).
            assert sentence not in text.partition(old[1])[0], (path.name, index, "stated in a summary")
        for chunk in history.chunks:  # nor do the items a later request lists as current
            current = [i.text for i in map(schema.Item.decode, chunk.items) if not i.resolved]
            assert not [t for t in current for sentence in SUPERSEDED if sentence in t], (path.name, index)
        if report is None:  # a no-op round: the history of the round before, unchanged
            continue
        assert report.let_go == {}
        assert set(report.kept) == set(CURRENT)  # every kind kept, none let go
        assert report.superseded == 2


async def test_compacting_again_with_no_new_turn_keeps_what_the_first_kept() -> None:
    """Invariant 11: rounds three to five (no new turn) show the same state as round two, word for word."""
    histories = [h for h, _ in await rounds(PATHS[1], target=900)]
    assert state_text(histories[1])
    assert [state_text(h) for h in histories[2:]] == [state_text(histories[1])] * 3


async def test_when_space_is_short_rules_and_constraints_go_last_and_the_report_is_true() -> None:
    """At a budget that holds only part of the state, the rule and the constraint stay; what the report
    says was let go is exactly what the history no longer says."""
    settings = PipelineSettings(standing_state_max_tokens=45)
    chat = conversation(20)
    history = EffectiveHistory((), tuple(chat.entries))
    result = await compact(history, limits(900, force=False), (KeepsNothing(),), COUNTER, settings=settings)
    assert result.outcome is Outcome.COMPACTED, result.error
    after = history.with_parts(result.draft.chunks, result.draft.entries)
    text = shown(after)
    assert CURRENT["rule"] in text
    assert CURRENT["constraint"] in text
    lost = {kind for kind, sentence in CURRENT.items() if sentence not in text}
    assert lost, "the budget was meant to be too small for the whole state"
    assert result.standing is not None
    assert set(result.standing.let_go) == lost
    assert sum(result.standing.let_go.values()) == len(lost)


async def test_no_state_is_added_where_nothing_was_summarized() -> None:
    """A run whose cheap stages reach the target leaves every user message verbatim: no state entry."""
    chat = conversation(4)
    history = EffectiveHistory((), tuple(chat.entries))
    result = await compact(history, limits(10_000, force=False), (KeepsNothing(),), COUNTER)
    assert result.outcome is Outcome.NOOP
    assert all(e.edit != STANDING for e in result.draft.entries)


async def test_a_forced_run_under_the_target_whose_summary_fails_drops_nothing() -> None:
    """Issue 33: a manual compaction with no summary to write never falls to the sliding window, which
    would drop the user's recent words from a history already under its target."""
    chat = conversation(20)
    history = EffectiveHistory((), tuple(chat.entries))
    result = await compact(history, limits(50_000, force=True), (Down(),), COUNTER)
    assert result.outcome is Outcome.NOOP
    assert result.draft.entries == history.entries
    assert result.error is not None
    assert "nothing dropped" in result.error


@pytest.mark.parametrize(("window", "share"), [(4_096, 0.3), (8_192, 0.2), (128_000, 0.1)])
@pytest.mark.parametrize("summarizer", ["extractive", "lossy"])
async def test_typed_canaries_hold_rules_constraints_and_changes_over_five_rounds(
    window: int, share: float, summarizer: str
) -> None:
    """The benchmark's generated sessions (seed 7): every rule and constraint in every round, every
    changed value resolved, the output at or under its target."""
    rounds, made = await canaries.run_case(7, window, share, summarizer)
    assert len(rounds) == 5
    for r in rounds:
        for kind in ("rule", "constraint"):
            assert r.kept.get(kind, 0) == r.planted[kind], (kind, r)
        assert r.resolved == r.changed > 0
        assert r.used <= 1.0
    assert made.read > 0  # the summarizer read the turns it replaced


def test_an_agents_observations_are_not_read_as_what_the_user_set() -> None:
    """A text-protocol agent (SWE-agent, mini-swe-agent) sends a command's output back as a user message
    in the step that ran it: pip's "Requirement already satisfied" is no constraint the user set."""
    said = [
        (1, "user", "Never push to main. Fix the failing test."),
        (2, "assistant", "pip install -e ."),
        (2, "user", "Requirement already satisfied: pytz in /opt/env (2024.1)\nMust be run as root."),
        (3, "user", "Keep the budget under 500 dollars."),
    ]
    entries = tuple(
        Entry(n=n, seq=seq, message={"role": role, "content": text}, tokens=COUNTER.text(text))
        for n, (seq, role, text) in enumerate(said, 1)
    )
    standing = read_state(entries, context(window=8_000))
    assert [i.text for i in standing.items] == ["Never push to main.", "Keep the budget under 500 dollars."]


def test_pasted_output_in_a_users_message_sets_nothing_but_prose_rules() -> None:
    """A long user message is pasted material (here a command's output sent before the agent's next
    call, as the client publishes it): its prose rule counts, its output lines are no constraints."""
    log = "\n".join(
        f"Requirement already satisfied: pkg{i} in /opt/env/lib/python3.9/site-packages (from tox) ({i}.0)"
        for i in range(60)
    )
    text = f"{log}\nNever install packages globally."
    entries = (Entry(n=1, seq=1, message={"role": "user", "content": text}, tokens=COUNTER.text(text)),)
    standing = read_state(entries, context(window=8_000))
    assert [i.text for i in standing.items] == ["Never install packages globally."]


async def test_a_decision_the_user_accepted_survives_compactions_that_keep_nothing() -> None:
    """The assistant proposes, the user says "ok": the proposal is a decision of the state, kept in the
    assistant's words through three compactions by a summarizer that keeps nothing."""
    chat = Chat(1, COUNTER)
    chat.user("Which database should the orders service use? Look at part 1 please")
    chat.assistant(f"{filler(1, 60)}\n\nI compared both. I'll use Postgres 16 for the orders service.")
    chat.user("ok, go ahead")
    for turn in range(2, 14):
        chat.assistant(filler(turn, 60))
        chat.user(f"Look at part {turn} please")
    history = EffectiveHistory((), tuple(chat.entries))
    for index in range(3):
        result = await compact(history, limits(900, force=index > 0), (KeepsNothing(),), COUNTER)
        assert result.outcome is Outcome.COMPACTED, result.error
        history = history.with_parts(result.draft.chunks, result.draft.entries)
        assert "I'll use Postgres 16 for the orders service." in state_text(history), index
        assert result.standing is not None
        assert result.standing.kept.get("decision") == 1


class Quoting:
    """A model that quotes the user's standing sentences as the prompt asks: one it was told, one it made up."""

    name = "quoting"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        text = (
            "## Goals and constraints\n"
            '- [preference] "Write all dates as ISO 8601."\n'
            '- [rule] "Never deploy without a second review."\n'
            "## Current state\nThe report is half done."
        )
        return SummaryResult(text, self.name, COUNTER.text(text), LlmUsage(calls=1))


async def test_a_sentence_the_model_quotes_joins_the_state_only_when_the_user_wrote_it() -> None:
    """No pattern reads "Write all dates as ISO 8601." as a preference; the model does, and the
    transcript holds it word for word, so the state keeps it through compactions that keep nothing.
    The rule the model made up is in no user message: dropped, and out of the summary too."""
    chat = Chat(1, COUNTER)
    chat.user("Fix the quarterly report. Look at part 1 please")
    chat.assistant(filler(1, 60))
    chat.user("Write all dates as ISO 8601. Look at part 2 please")
    for turn in range(3, 16):
        chat.assistant(filler(turn, 60))
        chat.user(f"Look at part {turn} please")
    history = EffectiveHistory((), tuple(chat.entries))
    result = await compact(history, limits(900, force=False), (Quoting(),), COUNTER)
    assert result.outcome is Outcome.COMPACTED, result.error
    for index in range(3):
        history = history.with_parts(result.draft.chunks, result.draft.entries)
        text = shown(history)
        assert "- [turn 3] Write all dates as ISO 8601." in state_text(history), index
        assert "second review" not in text
        assert "[preference]" not in text  # the quotes live in the state, not twice in the summary
        result = await compact(history, limits(900, force=True), (KeepsNothing(),), COUNTER)
        assert result.outcome is Outcome.COMPACTED, result.error
