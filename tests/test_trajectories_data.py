"""The published agent trajectories under tests/data/trajectories/ and their loader (tests/trajectories.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from compaction_worker.contracts.events import TurnEvent
from compaction_worker.replay.reader import AGENT_MESSAGE_FIELDS as MESSAGE_FIELDS
from tests.trajectories import DATA, Trajectory, load_trajectories, system_prompt, task

RUNS = load_trajectories()


def published(run: Trajectory) -> list[dict[str, Any]]:
    """The run's messages as its file holds them (mini-swe-agent's ``exit`` record left out)."""
    data = json.loads(run.path.read_text(encoding="utf-8"))
    raw = data if isinstance(data, list) else data.get("history") or data["messages"]
    return [m for m in raw if m["role"] != "exit"]


def test_the_data_covers_both_message_styles_and_several_agents() -> None:
    """Some runs act through tool calls, some write commands in their text, from more than one agent."""
    assert 4 <= len(RUNS) <= 6, [r.name for r in RUNS]
    assert {r.function_calling for r in RUNS} == {True, False}
    assert len({r.agent for r in RUNS}) > 1
    assert sum(r.path.stat().st_size for r in RUNS) < 2_000_000


def test_every_agent_folder_ships_its_license_and_the_readme_names_every_run() -> None:
    """Each source project's license sits next to its runs; the README states every file's origin."""
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    for agent in {r.agent for r in RUNS}:
        licenses = [p for p in (DATA / agent).iterdir() if p.name.startswith("LICENSE")]
        assert licenses, agent
        assert all("MIT License" in p.read_text(encoding="utf-8") for p in licenses)
    for run in RUNS:
        assert run.path.name in readme, run.name


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
class TestTrajectory:
    """One run, as loaded and as turns."""

    def test_starts_with_the_system_prompt_then_the_task(self, run: Trajectory) -> None:
        """The system prompt is the first message and the first user message, the task, the second."""
        first, second = run.messages[:2]
        assert first == {"role": "system", "content": system_prompt(run)}
        assert second == {"role": "user", "content": task(run)}
        assert len(task(run)) > 100

    def test_message_texts_are_verbatim(self, run: Trajectory) -> None:
        """Loading keeps every role, content and call as published; it drops only non-message fields."""
        raw = published(run)
        assert [m["role"] for m in run.messages] == [m["role"] for m in raw]
        assert [m.get("content") for m in run.messages] == [m.get("content") for m in raw]
        for loaded, original in zip(run.messages, raw, strict=True):
            assert set(loaded) <= set(MESSAGE_FIELDS)
            calls = original.get("tool_calls") or []
            assert [(c["id"], c["function"]) for c in loaded.get("tool_calls", [])] == [
                (c["id"], {"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
                for c in calls
            ]

    def test_turns_are_agent_steps(self, run: Trajectory) -> None:
        """Turn 1 is the system prompt and the task; every later turn opens with one assistant message."""
        turns = run.turns()
        assert [m["role"] for m in turns[0]] == ["system", "user"]
        assert all(t[0]["role"] == "assistant" for t in turns[1:])
        assert all(m["role"] != "assistant" for t in turns[1:] for m in t[1:])
        assert len(turns) == 1 + sum(m["role"] == "assistant" for m in run.messages)
        assert [m for t in turns for m in t] == list(run.messages)

    def test_every_turn_is_a_valid_turn_event(self, run: Trajectory) -> None:
        """Each turn validates as a ``conversation.turn`` and keeps its messages' contents."""
        payloads = run.payloads(context_window=8000)
        events = [TurnEvent.model_validate(p) for p in payloads]
        assert [e.turn_seq for e in events] == list(range(1, len(run.turns()) + 1))
        sent = [m.to_dict() for e in events for m in e.messages]
        assert [m.get("content") for m in sent] == [m.get("content") for m in run.messages]
        assert sum(len(e.messages) for e in events) == len(run.messages)

    def test_tool_results_answer_the_call_before_them(self, run: Trajectory) -> None:
        """In a function-calling run every tool result follows the assistant step that made its call."""
        for turn in run.turns()[1:]:
            ids = [c["id"] for c in turn[0].get("tool_calls", [])]
            answered = [m["tool_call_id"] for m in turn[1:] if m["role"] == "tool"]
            assert set(answered) <= set(ids), turn[0]
            assert not answered or len(answered) == len(set(answered))
