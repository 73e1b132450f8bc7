"""Published agent runs (tests/data/trajectories/) replayed through the real broker and Redis.

Five runs of SWE-agent and mini-swe-agent, in both message styles, are played as their
runtimes would: one ``conversation.turn`` per agent step, each runtime waiting for the
worker before its next step, all five at once. Each run gets a window small enough that it
compacts (through the fake LLM summarizer) after a few steps. Afterwards the effective
history of every run must still open with the published system prompt, still carry the
task verbatim, account for every message exactly once, and be valid for any provider.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

import pytest

from compaction_worker.budget.tokens import counter_for
from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionCompleted, Outcome, TurnEvent
from compaction_worker.contracts.history import EffectiveHistory, text_of
from compaction_worker.runtime.topics import create_topics, ensure_topics
from compaction_worker.runtime.worker import build_worker
from compaction_worker.settings import Settings
from compaction_worker.strategies import provider_problems
from compaction_worker.summaries.carry import distinctive_terms
from compaction_worker.testing import FakeLLMServer
from tests.orchestration import fake_summarizer, fresh_topics, make_settings
from tests.trajectories import Trajectory, load_trajectories, system_prompt, task

from .helpers import compaction_events, coverage_problems, read_topic, settle

pytestmark = pytest.mark.integration

MODEL = "gpt-4o-mini"
MAX_WINDOW = 8000
TASK_SHARE = 0.2
"""The share of the window a task may take and still be kept verbatim (the default ``task_max_fraction``)."""
RUNS = load_trajectories()


def window_for(run: Trajectory) -> int:
    """A window whose compaction threshold lies halfway between turn 1 and the whole run, at most 8,000.

    So every run compacts, and none before its first steps (the default threshold is the
    trigger fraction of the window less its output reserve); yet the window is never so
    small that the task outgrows the share of it that is kept verbatim.
    """
    settings = Settings()
    counter = counter_for(MODEL, settings.budget)
    first = sum(counter.message(m) for m in run.turns()[0])
    total = sum(counter.message(m) for m in run.messages)
    share = settings.budget.trigger_fraction * (1 - settings.budget.max_output_reserve_fraction)
    floor = 1.1 * counter.message(run.messages[1]) / TASK_SHARE
    return min(MAX_WINDOW, math.ceil(max((first + total) / 2 / share, floor)))


@dataclass(frozen=True)
class Replayed:
    """What one replayed run left: its compactions, transcript and effective history."""

    run: Trajectory
    completed: list[CompactionCompleted]
    transcript: list[dict[str, Any]]
    history: EffectiveHistory
    rendered: list[dict[str, Any]]

    @property
    def compacted(self) -> bool:
        return any(c.outcome is Outcome.COMPACTED for c in self.completed)


async def replay(client: Client, run: Trajectory, window: int) -> None:
    """The run's steps as its runtime publishes them, waiting for the worker before each next step."""
    for payload in run.payloads(context_window=window, model=MODEL):
        await client.publish_turn(TurnEvent.model_validate(payload))
        await client.wait_for(run.name, timeout=30)


async def replay_all(
    kafka_bootstrap: str, redis_url: str, llm: FakeLLMServer, runs: list[Trajectory], windows: dict[str, int]
) -> dict[str, Replayed]:
    """``runs`` replayed at once through one worker, each on its window; what each left, by name."""
    llm.reset()
    topics = fresh_topics()
    await create_topics(kafka_bootstrap, topics, 2)
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        summarizer=fake_summarizer(llm),
    )
    await ensure_topics(settings)
    worker = build_worker(settings)
    outcomes: dict[str, Replayed] = {}
    async with worker.running(), Client.connect(settings) as client:
        await asyncio.gather(*(replay(client, run, windows[run.name]) for run in runs))
        await settle([worker], sum(len(run.turns()) for run in runs))
        _, completed = compaction_events((), await read_topic(settings, settings.topics.completed))
        assert await read_topic(settings, settings.topics.dlq, idle=0.5) == []
        for run in runs:
            outcomes[run.name] = Replayed(
                run=run,
                completed=completed[run.name],
                transcript=[r["m"] for r in await client.transcript(run.name)],
                history=(await client.snapshot(run.name)).history,
                rendered=await client.messages(run.name),
            )
    assert llm.requests, "the LLM summarizer was never called"
    return outcomes


@pytest.fixture(scope="module")
async def replayed(
    kafka_bootstrap: str, redis_url: str, fake_llm_server: FakeLLMServer
) -> dict[str, Replayed]:
    """Every run replayed once for the module's tests, by run name."""
    windows = {run.name: window_for(run) for run in RUNS}
    return await replay_all(kafka_bootstrap, redis_url, fake_llm_server, RUNS, windows)


def compacted(outcomes: dict[str, Replayed]) -> list[Replayed]:
    return [o for o in outcomes.values() if o.compacted]


def test_every_run_compacts(replayed: dict[str, Replayed]) -> None:
    """Each run's window is small enough that it compacted at least once, and no compaction failed."""
    assert {o.run.name for o in compacted(replayed)} == {r.name for r in RUNS}, {
        name: [(c.outcome, c.error) for c in o.completed] for name, o in replayed.items()
    }
    failed = {n: [c.error for c in o.completed if c.outcome is Outcome.FAILED] for n, o in replayed.items()}
    assert not any(failed.values()), failed


def test_the_system_prompt_stays_first_verbatim(replayed: dict[str, Replayed]) -> None:
    """The rendered history opens with the published system prompt, unchanged."""
    wrong = {
        o.run.name: f"{o.rendered[0]['role']}: {text_of(o.rendered[0])[:120]!r}"
        for o in compacted(replayed)
        if o.rendered[0] != {"role": "system", "content": system_prompt(o.run)}
    }
    assert wrong == {}


def test_the_task_stays_verbatim(replayed: dict[str, Replayed]) -> None:
    """The first user message's text (the task) is still in the effective history, whole."""
    lost = [o.run.name for o in compacted(replayed) if not any(task(o.run) in text_of(m) for m in o.rendered)]
    assert lost == []


def test_nothing_is_lost_or_doubled(replayed: dict[str, Replayed]) -> None:
    """Every published message is stored once and is in the history once or covered by a summary."""
    for o in compacted(replayed):
        sent = [m.to_dict() for p in o.run.payloads() for m in TurnEvent.model_validate(p).messages]
        assert o.transcript == sent, o.run.name
        assert coverage_problems(o.history, len(o.transcript)) == [], o.run.name


def test_the_rendered_history_is_provider_valid(replayed: dict[str, Replayed]) -> None:
    """What the runtime sends next breaks no provider's rules on roles and tool pairs."""
    problems = {o.run.name: provider_problems(o.rendered) for o in compacted(replayed)}
    assert problems == {name: [] for name in problems}


# --- a task larger than its budget -------------------------------------------------------

CUT_RUNS = [r for r in RUNS if r.agent == "mini-swe-agent" and len(r.turns()) <= 20] + [
    r for r in RUNS if r.name.endswith("function_calling_replace")
]


def cut_window(run: Trajectory) -> int:
    """A window on which the task is half again its verbatim budget, and the first turn still fits."""
    counter = counter_for(MODEL, Settings().budget)
    return math.ceil(counter.message(run.messages[1]) / TASK_SHARE / 1.5)


@pytest.fixture(scope="module")
async def cut(kafka_bootstrap: str, redis_url: str, fake_llm_server: FakeLLMServer) -> dict[str, Replayed]:
    """The short runs of both styles replayed on windows where their task is over its budget."""
    windows = {run.name: cut_window(run) for run in CUT_RUNS}
    return await replay_all(kafka_bootstrap, redis_url, fake_llm_server, CUT_RUNS, windows)


def test_a_task_over_its_budget_keeps_its_distinctive_terms(cut: dict[str, Replayed]) -> None:
    """Past the budget its head and tail stay verbatim and at least 95% of its distinctive terms stay."""
    assert len(CUT_RUNS) == 2
    assert {o.run.function_calling for o in cut.values()} == {True, False}
    for o in cut.values():
        assert o.compacted, [(c.outcome, c.error) for c in o.completed]
        shown = "\n".join(text_of(m) for m in o.rendered)
        assert task(o.run) not in shown, "the task was not over its budget: nothing to test"
        terms = distinctive_terms(task(o.run))
        kept = [t for t in terms if t in shown]
        assert len(kept) >= 0.95 * len(terms), (o.run.name, sorted(set(terms) - set(kept)))
        lines = task(o.run).strip().splitlines()
        assert lines[0] in shown
        assert lines[-1] in shown
        assert coverage_problems(o.history, len(o.transcript)) == [], o.run.name
        assert provider_problems(o.rendered) == [], o.run.name
        assert o.rendered[0] == {"role": "system", "content": system_prompt(o.run)}
