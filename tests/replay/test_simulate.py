"""Replaying a recorded conversation through the worker's budget, threshold rule and pipeline."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from compaction_worker import strategies
from compaction_worker.budget.tokens import budget_for, counter_for
from compaction_worker.contracts.events import Outcome, Trigger
from compaction_worker.contracts.history import EffectiveHistory, render
from compaction_worker.conversation.meta import Meta
from compaction_worker.replay.reader import Conversation, ReplayInputError, read_file
from compaction_worker.replay.simulate import (
    DEFAULT_MODEL,
    Compaction,
    ConversationReport,
    Replay,
    Tally,
    TurnPoint,
    split_turns,
)
from compaction_worker.runtime.pool import run_job
from compaction_worker.settings import BudgetSettings, Settings, SummarizerSettings
from compaction_worker.summaries.factory import configured_summarizers
from compaction_worker.testing import FakeLLMServer, turn_bytes
from tests.orchestration import Parts

FIXTURE = Path(__file__).parent / "fixtures" / "agent_session.jsonl"
PUBLISHED = sorted((Path(__file__).parents[1] / "data" / "trajectories").glob("*/*.traj*"))
WINDOW = 4000
"""Small enough for the fixture (48 turns, ~11K tokens) to compact several times."""


def _conversation() -> Conversation:
    (conversation,) = read_file(FIXTURE).conversations
    return conversation


async def _replay(settings: Settings, window: int | None = WINDOW, **kw: str) -> ConversationReport:
    replay = Replay(_conversation(), settings, configured_summarizers(settings), context_window=window, **kw)
    return await replay.run()


def test_a_user_message_or_a_step_after_a_tool_result_starts_a_turn_and_leading_system_messages_are_the_prompt() -> (
    None
):
    system, turns = split_turns(
        [
            {"role": "system", "content": "a"},
            {"role": "system", "content": "b"},
            {"role": "assistant", "content": "greeting"},
            {"role": "user", "content": "1"},
            {"role": "assistant", "content": "x"},
            {"role": "system", "content": "mid"},
            {"role": "user", "content": "2"},
            {"role": "assistant", "content": "call", "tool_calls": [{"id": "c", "type": "function"}]},
            {"role": "tool", "tool_call_id": "c", "content": "out"},
            {"role": "assistant", "content": "next step"},
        ]
    )
    assert system == "a\n\nb"
    assert [[m["content"] for m in t] for t in turns] == [
        ["greeting"],
        ["1", "x", "mid"],
        ["2", "call", "out"],
        ["next step"],  # an agent's step after a tool result is a turn of its own
    ]


async def test_the_fixture_compacts_at_each_threshold_crossing_down_to_the_target() -> None:
    settings = Settings()
    report = await _replay(settings)
    budget = report.budget
    assert (budget.window, budget.threshold, budget.target) == (4000, 2400, 1500)
    assert len(report.points) == 48  # 24 requests, each a tool call and the answer after it
    compactions = report.compactions
    assert len(compactions) >= 2
    assert report.by_trigger() == {"threshold": len(compactions)}
    # One compaction for each turn whose append crossed the threshold; each lands at or under the target.
    crossings = [p.turn for p in report.points if p.tokens >= budget.threshold]
    assert [c.turn for c in compactions] == crossings
    assert all(c.tokens_before >= budget.threshold and c.tokens_after <= budget.target for c in compactions)
    assert all(p.after < budget.threshold for p in report.points)
    assert report.tokens_saved == sum(p.tokens - p.after for p in report.points) > 0
    # The peak prompt: the largest call, after the compactions; under the threshold, as every call is here.
    assert report.peak == max(p.after for p in report.points) == report.cache[0].peak_tokens
    assert report.peak < budget.threshold < max(p.tokens for p in report.points)
    assert (report.usage.prompt_tokens, report.usage.completion_tokens) == (0, 0)  # extractive
    # Each ran a stage; pruning alone reaches the target at the first, a summary after it.
    assert all(c.stages for c in compactions)
    assert sum("summarize" in c.stages for c in compactions) >= len(compactions) - 1


async def test_the_totals_are_the_worker_s_counts_of_what_the_history_holds() -> None:
    """The running total (appends, then each commit's delta) equals a recount of the final history."""
    report = await _replay(Settings())
    counter = counter_for(report.model, Settings().budget)
    first_turn = split_turns(_conversation().messages)[1][0]
    meta = report.meta
    assert report.points[0].tokens == meta.fixed_tokens + counter.messages(first_turn)
    overhead = strategies.summary_overhead(counter)
    history = report.history
    recount = strategies.draft_tokens(strategies.Draft(history.chunks, history.entries), overhead)
    assert meta.total_tokens == meta.fixed_tokens + recount == report.points[-1].after
    assert meta.version == len(report.compactions)
    assert history.chunks  # the summaries are in the history the runtime would send
    assert strategies.provider_problems(render(history)) == []


async def test_a_lower_trigger_compacts_more_often() -> None:
    default = await _replay(Settings())
    eager = Settings(budget=BudgetSettings(trigger_fraction=0.6, target_fraction=0.5))
    report = await _replay(eager)
    assert (report.budget.threshold, report.budget.target) == (1800, 1500)
    assert len(report.compactions) > len(default.compactions)


async def test_a_window_too_big_to_reach_compacts_nothing() -> None:
    report = await _replay(Settings(), window=None)  # gpt-4o-mini: 128K tokens
    assert report.runs == []
    assert report.points[-1].after == report.peak


def test_an_unknown_model_without_a_window_is_refused() -> None:
    """As the worker dead-letters its turns when no fallback window is configured."""
    strict = Settings(budget=BudgetSettings(fallback_window=None))
    with pytest.raises(ReplayInputError, match="no known context window"):
        Replay(_conversation(), strict, configured_summarizers(strict), model="acme/unknown")


def test_a_turn_the_worker_would_refuse_is_the_input_s_error() -> None:
    """Replay decides each turn as the worker does, on the event a runtime would publish: a turn of
    more messages than a ``conversation.turn`` holds is named, before anything is replayed."""
    tool_loop = [{"role": "user", "content": "go"}] + [{"role": "assistant", "content": "step"}] * 10_000
    settings = Settings()
    with pytest.raises(ReplayInputError, match=r"long: turn 1 is not a valid conversation.turn \(messages"):
        Replay(Conversation("long", tuple(tool_loop)), settings, configured_summarizers(settings))


async def test_an_llm_summarizer_s_tokens_are_counted(fake_llm: FakeLLMServer) -> None:
    settings = Settings(
        summarizer=SummarizerSettings(model="openai/fake", api_base=fake_llm.url, api_key="fake"),
        retry={"llm_attempts": 1},
    )
    report = await _replay(settings)
    assert report.compactions
    assert report.usage.prompt_tokens > 0
    assert report.usage.completion_tokens > 0
    # A compaction that pruning alone brings to its target calls no summarizer.
    assert len(fake_llm.requests) >= sum("summarize" in c.stages for c in report.compactions) > 0
    assert all(c.trigger is Trigger.THRESHOLD and c.outcome is Outcome.COMPACTED for c in report.compactions)


async def _fed_to_the_worker(
    parts: Parts, recorded: Conversation, window: int
) -> tuple[list[tuple[int, int, int]], list[Outcome]]:
    """The conversation's turns through the real per-turn path and compactor over Redis, each
    compaction run before the next turn: the context after each turn, and every run's outcome."""
    system, turns = split_turns(recorded.messages)
    cid, points, outcomes = "agent_session", [], []
    for seq, messages in enumerate(turns, start=1):
        system_prompt = system if seq == 1 else None  # None: left out of the event
        await parts.turns.handle(
            turn_bytes(cid, seq, list(messages), context_window=window, system_prompt=system_prompt),
            cid.encode(),
        )
        tokens = (await parts.store.meta(cid)).total_tokens
        while cid in await parts.jobs.due(10):
            completed = await run_job(parts.jobs, parts.compactor, cid)
            assert completed is not None
            outcomes.append(completed.outcome)
        points.append((seq, tokens, (await parts.store.meta(cid)).total_tokens))
    return points, outcomes


@pytest.mark.integration
async def test_the_worker_fed_the_same_turns_ends_in_the_same_places(
    parts: Parts, settings: Settings
) -> None:
    """The real per-turn path and compactor over Redis, each compaction run before the next turn:
    the same context after every turn, the same compactions, the same final history."""
    report = await _replay(settings)
    points, outcomes = await _fed_to_the_worker(parts, _conversation(), WINDOW)
    assert [(p.turn, p.tokens, p.after) for p in report.points] == points
    assert len(report.compactions) == outcomes.count(Outcome.COMPACTED) >= 2
    snapshot = await parts.store.snapshot("agent_session")
    assert render(report.history) == render(snapshot.history)


@pytest.mark.integration
async def test_the_worker_and_the_replay_settle_what_does_not_pay_alike(
    parts: Parts, settings: Settings
) -> None:
    """Invariant 14 on BabyEncryption at 4K: the no-ops that saved too little, the commits, the
    floor and the moved threshold are the worker's and the replay's alike, turn by turn."""
    (baby,) = [p for p in PUBLISHED if p.name == "BabyEncryption.traj"]
    (recorded,) = read_file(baby).conversations
    report = await Replay(recorded, settings, configured_summarizers(settings), context_window=4096).run()
    points, outcomes = await _fed_to_the_worker(parts, recorded, 4096)
    assert [(p.turn, p.tokens, p.after) for p in report.points] == points
    assert [c.outcome for c in report.runs] == outcomes
    assert Outcome.NOOP in outcomes
    meta = await parts.store.meta("agent_session")
    assert (meta.floor_tokens, meta.compacted_seq) == (report.meta.floor_tokens, report.meta.compacted_seq)


async def test_a_soft_threshold_compacts_first_in_the_background() -> None:
    settings = Settings(budget=BudgetSettings(soft_trigger_fraction=0.6))
    report = await _replay(settings)
    assert report.budget.soft_threshold == 1800
    assert set(report.by_trigger()) == {"soft_threshold"}
    assert max(p.tokens for p in report.points) < report.budget.threshold


async def test_tools_and_the_system_prompt_are_fixed_tokens_that_stay() -> None:
    tools = ({"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}},)
    conversation = _conversation()
    with_tools = Conversation(conversation.name, conversation.messages, tools=tools)
    settings = Settings()
    counter = counter_for(DEFAULT_MODEL, settings.budget)
    replay = Replay(with_tools, settings, configured_summarizers(settings), context_window=WINDOW)
    report = await replay.run()
    assert report.meta.tools_tokens == counter.tools(tools) > 0
    assert report.meta.system_tokens == counter.text(report.history.system_prompt or "") + 4
    assert report.history.tools == tools
    assert render(report.history)[0]["content"].startswith("You are a coding agent")


async def test_the_replay_reports_the_calls_with_its_history_beside_the_peers() -> None:
    """Issue 36: one call per turn with the effective history, and the same turns through the simple
    strategies: the product first, and with no compaction nothing ever breaks the cache."""
    report = await _replay(Settings())

    assert [f.strategy for f in report.cache] == [
        "compaction-worker",
        "none",
        "sliding window",
        "summarize everything",
    ]
    ours, none = report.cache[0], report.cache[1]
    assert ours.calls == none.calls == len(report.points)
    assert none.breaks == 0
    assert none.peak_tokens > report.budget.window
    assert ours.breaks >= 1
    assert ours.peak_tokens < none.peak_tokens
    assert ours.dollars is not None
    assert none.dollars is not None


def test_the_tally_counts_small_compactions_turns_of_several_runs_and_summary_calls() -> None:
    """Small: a commit saving under 10% of a history within what the window leaves (over it, any
    commit that brings it under pays); several runs: a turn that set off more than one, of any outcome."""
    _, budget = budget_for(DEFAULT_MODEL, BudgetSettings(), 4096, None)
    assert budget.available == 3072
    runs = [
        Compaction(1, Trigger.THRESHOLD, Outcome.COMPACTED, 2649, 2455, summary_calls=1),  # 7% saved: small
        Compaction(2, Trigger.THRESHOLD, Outcome.COMPACTED, 3280, 3070, summary_calls=1),  # over the window
        Compaction(2, Trigger.THRESHOLD, Outcome.NOOP, 3070, 3070, summary_calls=2),
        Compaction(3, Trigger.THRESHOLD, Outcome.COMPACTED, 3000, 2700, summary_calls=1),  # exactly 10%
    ]
    report = ConversationReport("c", DEFAULT_MODEL, budget, Meta(), EffectiveHistory((), ()), runs=runs)
    report.points = [TurnPoint(n, 0, 0) for n in range(1, 5)]
    tally = report.tally()
    assert tally == Tally(
        turns=4, compactions=3, small_compactions=1, multi_run_turns=1, summary_calls=5, cache_breaks=0
    )
    assert tally.per_100_turns()["summary_calls"] == 125
    assert (tally + tally).per_100_turns() == tally.per_100_turns()


async def test_every_request_to_the_summarizer_is_a_summary_call() -> None:
    report = await _replay(Settings())
    summarized = [c for c in report.compactions if "summarize" in c.stages]
    assert summarized
    assert all(c.summary_calls >= 1 for c in summarized)
    assert all(c.summary_calls == 0 for c in report.compactions if "summarize" not in c.stages)
    assert report.tally().cache_breaks == report.cache[0].breaks


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda path: path.name.split(".")[0])
async def test_on_a_published_agent_run_every_threshold_compaction_pays(path: Path) -> None:
    """docs/design.md, invariant 14, at a 4K window, where the system prompts (1-2K tokens) leave
    compactions little room: each commit saves its share or brings the history under its window,
    no turn runs a second one, and no turn ends over the window."""
    settings = Settings()
    (recorded,) = read_file(path).conversations
    replay = Replay(recorded, settings, configured_summarizers(settings), context_window=4096)
    report = await replay.run()
    available, share = report.budget.available, settings.budget.min_saving_fraction
    for c in report.compactions:
        assert c.tokens_before > available or c.tokens_before - c.tokens_after >= share * c.tokens_before, c
    runs = Counter(c.turn for c in report.runs)
    assert max(runs.values(), default=0) <= 1
    assert all(p.after <= available for p in report.points)
    assert report.tally().small_compactions == 0


async def test_a_floor_over_the_target_compacts_less_often_than_every_turn() -> None:
    """BabyEncryption's 1,987-token system prompt is over a 4K window's target: compactions end just
    under the threshold. They compacted on every turn (16 in 15, two turns twice); from the floor's
    level, on every other."""
    (baby,) = [p for p in PUBLISHED if p.name == "BabyEncryption.traj"]
    settings = Settings()
    (recorded,) = read_file(baby).conversations
    report = await Replay(recorded, settings, configured_summarizers(settings), context_window=4096).run()
    assert report.meta.floor_tokens > report.budget.target
    assert len(report.compactions) <= len(report.points) // 2
    noop = next(c for c in report.runs if c.outcome is Outcome.NOOP)
    assert noop.error is not None
    assert noop.error.startswith("it would save ")
