"""Issue 21 point 3, black-box: after a compaction the files and plan the agent was working with come back.

Through the real broker and Redis, with the extractive summarizer: a coding agent keeps a
TodoWrite plan, reads two modules and a large build log, edits one module, then starts a
new user turn and reads a test file. A forced compaction summarizes everything before that
turn. The effective history must carry, marked as restored state inside the summary turn
and within its budget: the latest plan (not the first one), the edited module as it is
after the edit, the other module verbatim, the build log as a pointer with its size (too
large), and not the test file, which is still verbatim in the tail.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionCompleted, Outcome
from compaction_worker.contracts.history import RESTORED, RESTORED_HEADER, SUMMARY_HEADER
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.worker import build_worker
from compaction_worker.strategies import provider_problems
from compaction_worker.testing import turn_event
from tests.orchestration import make_settings

from .helpers import coverage_problems, read_topic

pytestmark = pytest.mark.integration

CID = "coding-agent"
WINDOW = 64_000
"""Room for the whole conversation: only the forced compaction runs."""
APP = "def total(items):\n    return sum(items)\n\n\ndef mean(items):\n    return total(items) / 0  # bug\n"
UTIL = "\n".join(f"def helper_{i}(x):\n    return x + {i}" for i in range(8))
TEST = "from app import mean\n\n\ndef test_mean():\n    assert mean([1, 2]) == 1.5\n"
LOG = "\n".join(f"[build] step {i}: compiling module_{i}.c with -O2 ... ok" for i in range(700))
"""About 11,000 tokens: over the per-file limit, so it comes back as a pointer."""


def todos(*statuses: str) -> dict[str, Any]:
    steps = ("Reproduce the failing test", "Fix mean() in src/app.py", "Run the suite")
    return {
        "todos": [
            {"content": s, "status": st, "activeForm": s} for s, st in zip(steps, statuses, strict=True)
        ]
    }


def step(call: str, name: str, args: dict[str, Any], result: str) -> list[dict[str, Any]]:
    """One tool step of the loop: the call and its result."""
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            ],
        },
        {"role": "tool", "tool_call_id": call, "content": result},
    ]


def turns() -> list[list[dict[str, Any]]]:
    return [
        [{"role": "user", "content": "tests/test_app.py::test_mean fails with ZeroDivisionError. Fix it."}],
        step(
            "t1",
            "TodoWrite",
            todos("in_progress", "pending", "pending"),
            "Todos have been modified successfully",
        ),
        step("r1", "Read", {"file_path": "src/app.py"}, APP),
        step("r2", "Read", {"file_path": "src/util.py"}, UTIL),
        step("b1", "Bash", {"command": "cat build/build.log"}, LOG),
        step(
            "e1",
            "Edit",
            {"file_path": "src/app.py", "old_string": "/ 0  # bug", "new_string": "/ len(items)"},
            "ok",
        ),
        step(
            "t2",
            "TodoWrite",
            todos("completed", "completed", "in_progress"),
            "Todos have been modified successfully",
        ),
        [{"role": "assistant", "content": "Fixed mean(); running the suite next."}],
        [{"role": "user", "content": "Also check the test file itself."}],
        [
            *step("r3", "Read", {"file_path": "tests/test_app.py"}, TEST),
            {"role": "assistant", "content": "It is fine."},
        ],
    ]


async def test_files_and_plan_come_back_after_a_compaction(
    kafka_bootstrap: str, redis_url: str, make_topics: Any
) -> None:
    """The restored state: latest plan, edited file, read file, a pointer for the large one; not the tail's file."""
    topics = await make_topics("turn", "started", "completed", "dlq")
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        topics,
        pipeline={"working_state_max_tokens": 2_000, "working_state_file_max_tokens": 1_000},
    )
    await ensure_topics(settings)
    published = turns()
    async with build_worker(settings).running(), Client.connect(settings) as client:
        for seq, messages in enumerate(published, 1):
            await client.publish_turn(turn_event(CID, seq, messages, "gpt-4o-mini", context_window=WINDOW))
        await client.request_compaction(CID, len(published) + 1, "gpt-4o-mini")
        await client.wait_for(CID)
        history = (await client.snapshot(CID)).history
        messages = await client.messages(CID)
        stats = await client.context_stats(CID)
        completed = [
            CompactionCompleted.model_validate_json(raw)
            for raw in await read_topic(settings, settings.topics.completed)
        ]

    assert [c.outcome for c in completed] == [Outcome.COMPACTED]
    assert "working_state" in completed[0].stages
    state = [e for e in history.entries if e.edit == RESTORED]
    assert len(state) == 1
    assert state[0].tokens <= 2_000
    assert stats.tokens <= stats.target
    assert coverage_problems(history, sum(map(len, published))) == []
    assert provider_problems(messages) == []

    summary = next(m["content"] for m in messages if str(m.get("content")).startswith(SUMMARY_HEADER))
    restored = summary[summary.index(RESTORED_HEADER) :]
    assert (
        "## Plan (TodoWrite, turn 7)\n- [x] Reproduce the failing test\n- [x] Fix mean() in src/app.py\n"
        in restored
    )
    assert "- [~] Run the suite (in progress)" in restored
    assert APP.replace("/ 0  # bug", "/ len(items)").rstrip() in restored  # after the edit
    assert "/ 0  # bug" not in restored
    assert f"## File src/util.py (read at turn 4)\n```\n{UTIL}\n```" in restored
    assert "## File build/build.log (read at turn 5): 700 lines, " in restored
    assert "step 699" not in restored
    assert "tests/test_app.py" not in restored  # still verbatim in the tail
    assert any(m.get("content") == TEST for m in messages)
