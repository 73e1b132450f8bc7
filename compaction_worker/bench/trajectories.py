"""Published agent trajectories (SWE-agent, mini-swe-agent runs) as OpenAI chat messages and runtime turns.

Each file is kept as its project published it (see the README there); loading keeps every
message's content verbatim and drops only what is not an OpenAI chat message field, which
the agents record alongside (SWE-agent's ``agent``, ``message_type``, ``thought``,
``action``; mini-swe-agent's ``extra`` with the raw provider response). mini-swe-agent's
closing ``exit`` record holds the submitted patch, not a message the model saw, so it is
not a message here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compaction_worker.replay.reader import agent_message
from compaction_worker.testing import turn_payload


@dataclass(frozen=True)
class Trajectory:
    """One published agent run: its OpenAI chat messages, system prompt first, then the task."""

    name: str
    agent: str
    path: Path
    messages: tuple[dict[str, Any], ...]

    @property
    def function_calling(self) -> bool:
        """Whether the agent acted through tool calls (else it wrote its commands in the text)."""
        return any(m.get("tool_calls") for m in self.messages)

    def turns(self) -> list[list[dict[str, Any]]]:
        """The messages as a runtime publishes them, one ``conversation.turn`` per agent step.

        Turn 1 is everything before the first assistant message (the system prompt and the
        task); every later turn is one assistant message with the tool results or the
        observation that follow it.
        """
        turns: list[list[dict[str, Any]]] = [[]]
        for message in self.messages:
            if message["role"] == "assistant":
                turns.append([])
            turns[-1].append(message)
        return turns

    def payloads(self, conversation_id: str | None = None, **fields: Any) -> list[dict[str, Any]]:
        """The turns as validated ``conversation.turn`` events (``fields``: other TurnEvent fields)."""
        cid = conversation_id or self.name
        return [turn_payload(cid, seq, turn, **fields) for seq, turn in enumerate(self.turns(), 1)]


def load_trajectories(root: Path) -> list[Trajectory]:
    """Every run under ``root`` (``<agent>/<run>.traj`` or ``.traj.json``), sorted by name."""
    paths = sorted({*root.glob("*/*.traj"), *root.glob("*/*.traj.json")})
    runs = [load(path) for path in paths]
    for run in runs:
        run.payloads()  # every turn must be a valid event, or the data is unusable
    return runs


def load(path: Path) -> Trajectory:
    """One run: SWE-agent's ``history``, mini-swe-agent's ``messages`` (or a bare list of them)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, list):
        raw = data
    elif "history" in data:
        raw = data["history"]
    else:
        raw = data["messages"]
    messages = tuple(agent_message(m) for m in raw if m["role"] != "exit")
    stem = path.name.removesuffix(".json").removesuffix(".traj")
    agent = path.parent.name
    return Trajectory(name=f"{agent}.{stem}", agent=agent, path=path, messages=messages)
