"""Issue 9, black-box: a runtime that names its calls ``call_0``, ``call_1`` in every turn.

Through the real broker and Redis, with the extractive summarizer (no LLM configured):
every turn reads a small new module as ``call_0`` and re-reads a large config as
``call_1``. Pairing calls by id across the history used to point old module reads at the
newest module ("[File /src/mod16.py - refer to the latest read below]") and drop their
content. After every turn the stored effective history must hold each tool result under
its own call, with its own content or a placeholder about its own call, and the
compactions must report savings from pruning and de-duplication, committed without a
summary where those two reach the target.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionCompleted, Outcome, TurnEvent
from compaction_worker.contracts.history import Entry
from compaction_worker.contracts.toolpairs import ToolCall, pair_results
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.worker import build_worker
from compaction_worker.testing import turn_event
from tests.orchestration import make_settings

from .helpers import coverage_problems, read_topic, settle

pytestmark = pytest.mark.integration

TURNS = 16
WINDOW = 12_000
CID = "reused-ids"
CONFIG = "\n".join(f"setting_{i} = {i * 7}  # tuned for the staging cluster" for i in range(110))
"""About 1,500 tokens: re-read every turn, so de-duplication has something to save."""
FILE_POINTER = re.compile(r"\[File (?P<path>.+) - refer to the latest read below\]")


def module(seq: int) -> str:
    """A module's source (about 260 tokens): different for every turn."""
    return "\n".join(f"def step_{seq}_{i}(x):\n    return x * {i} + {seq}  # mod{seq}" for i in range(12))


def call(call_id: str, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def turn(seq: int) -> TurnEvent:
    """Turn ``seq``: call_0 reads /src/mod<seq>.py, call_1 re-reads /src/config.py."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"Step {seq}: check /src/mod{seq}.py against the config."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                call("call_0", "read_file", {"path": f"/src/mod{seq}.py"}),
                call("call_1", "read_file", {"path": "/src/config.py"}),
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": module(seq)},
        {"role": "tool", "tool_call_id": "call_1", "content": CONFIG},
        {"role": "assistant", "content": f"/src/mod{seq}.py matches the config."},
    ]
    return turn_event(CID, seq, messages, context_window=WINDOW)


def tool_of(call: ToolCall) -> tuple[str, str | None]:
    """A call's tool and the path it reads, if any."""
    path = json.loads(call.arguments).get("path")
    return call.name, path if isinstance(path, str) else None


def misattributed(transcript: Sequence[Mapping[str, Any]], entries: Sequence[Entry]) -> list[str]:
    """Tool results of the effective history that answer, or speak for, a call other than their own."""
    own = {n + 1: call for n, call in pair_results(transcript).items()}  # ordinals are 1-based
    owner_n = {n: call.owner + 1 for n, call in own.items()}
    problems: list[str] = []
    paired = pair_results([e.message for e in entries])
    for i, entry in enumerate(entries):
        if entry.role != "tool" or entry.synthetic:
            continue
        tool, path = tool_of(own[entry.n])
        caller = entries[paired[i].owner] if i in paired else None
        if caller is None or (not caller.synthetic and caller.n != owner_n[entry.n]):
            problems.append(f"result {entry.n} ({tool} {path}) follows the wrong call")
        content = str(entry.message.get("content"))
        if entry.edit == "deduplicated":
            pointer = FILE_POINTER.fullmatch(content)
            ok = (
                pointer["path"] == path
                if pointer
                else content == f"[Identical to a later {tool} output below]"
            )
        elif entry.edit == "pruned":
            ok = content.startswith(f"[Old tool result cleared: {tool},")
        else:
            ok = entry.edit is not None or entry.message == transcript[entry.n - 1]
        if not ok:
            problems.append(f"result {entry.n} ({tool} {path}) holds {content[:70]!r}")
    return problems


async def test_reused_call_ids_over_the_real_broker(
    kafka_bootstrap: str, redis_url: str, make_topics: object
) -> None:
    """Every tool result stays under its own call, turn after turn, while pruning and de-duplication save tokens."""
    topics = await make_topics("turn", "started", "completed", "dlq")  # type: ignore[operator]
    # Pruning protects half the window: more than the target, so de-duplication runs too.
    settings = make_settings(kafka_bootstrap, redis_url, topics, pipeline={"prune_protect_fraction": 0.5})
    assert settings.summarizer.model is None  # the extractive summarizer
    await ensure_topics(settings)
    worker = build_worker(settings)
    pointers: set[str] = set()
    async with worker.running(), Client.connect(settings) as client:
        for seq in range(1, TURNS + 1):
            await client.publish_turn(turn(seq))
            await settle([worker], seq)
            transcript = [r["m"] for r in await client.transcript(CID)]
            history = (await client.snapshot(CID)).history
            assert misattributed(transcript, history.entries) == [], f"after turn {seq}"
            assert coverage_problems(history, len(transcript)) == []
            pointers |= {str(e.message["content"]) for e in history.entries if e.edit == "deduplicated"}

        completed = [
            CompactionCompleted.model_validate_json(raw)
            for raw in await read_topic(settings, settings.topics.completed)
        ]
    compacted = [c for c in completed if c.outcome is Outcome.COMPACTED]
    assert len(compacted) >= 2, [(c.outcome, c.error) for c in completed]
    assert sum(c.stage_savings.get("prune", 0) for c in compacted) > 0, [c.stage_savings for c in compacted]
    assert sum(c.stage_savings.get("deduplicate", 0) for c in compacted) > 0, [
        c.stage_savings for c in compacted
    ]
    # De-duplication pointed re-reads at their own file (the config), never at a module.
    assert "[File /src/config.py - refer to the latest read below]" in pointers
    assert not any("/src/mod" in p for p in pointers), pointers
