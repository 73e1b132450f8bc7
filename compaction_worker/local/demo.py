"""The demo: a synthetic agent holds long tool-using conversations while the worker compacts them.

Also the source of realistic synthetic conversations for tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import ChatMessage, CompactionCompleted, TurnEvent
from compaction_worker.formats import tool_call
from compaction_worker.runtime.connections import kafka_client_args
from compaction_worker.runtime.worker import build_worker
from compaction_worker.settings import Settings

TOPICS = (
    ("the CI pipeline", "ci/pipeline.yml", "make test", "ERROR: job 'lint' exited with code 2"),
    (
        "the flaky login test",
        "tests/test_login.py",
        "pytest tests/test_login.py -x",
        "AssertionError: expected 302, got 500",
    ),
    (
        "the database migration",
        "migrations/0042_add_orders.sql",
        "alembic upgrade head",
        "psycopg.errors.UndefinedColumn: column orders.customer_id does not exist",
    ),
    (
        "the slow search endpoint",
        "src/search/query.py",
        "py-spy record -o search.svg -- python bench.py",
        "TimeoutError: search took 8.2s (budget 2s)",
    ),
    (
        "the release notes",
        "docs/releases/v2.4.md",
        "git log v2.3..HEAD --oneline",
        "fatal: ambiguous argument 'v2.3..HEAD'",
    ),
    (
        "the Redis cache layer",
        "src/cache/redis_cache.py",
        "redis-cli --latency",
        "ConnectionResetError: [Errno 104] Connection reset by peer",
    ),
)

# The filler prose's vocabulary, kept as text (a repeated word is drawn that much more often).
_VOCABULARY = """
    the request handler reads the configuration once and passes it down to every worker so that
    retries use the same timeout budget while the scheduler keeps the queue short and each batch
    is written atomically with its offsets committed only after storage
"""
_WORDS = _VOCABULARY.split()


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def synthetic_turns(
    conversation_id: str,
    turns: int,
    *,
    model: str = "gpt-4o-mini",
    seed: int = 0,
    context_window: int | None = None,
    tool_output_words: tuple[int, int] = (120, 400),
) -> list[TurnEvent]:
    """A long multi-topic conversation with tool calls, one TurnEvent per turn (seq 1..turns).

    Odd turns are the user's requests; even turns are the assistant's work: a tool call,
    its result and an answer. Each topic plants exact paths, commands and error texts.
    """
    rng = random.Random(f"{conversation_id}:{seed}")
    events: list[TurnEvent] = []
    for seq in range(1, turns + 1):
        topic, path, command, error = TOPICS[((seq - 1) // 8) % len(TOPICS)]
        messages: list[dict[str, Any]]
        if seq % 2 == 1:
            messages = [
                {
                    "role": "user",
                    "content": f"About {topic}: {_prose(rng, rng.randint(12, 40))} Please look at {path}.",
                }
            ]
        else:
            call_id = f"call_{seq}_{rng.randrange(10**6)}"
            tool = rng.choice(("read_file", "run_command"))
            args = {"path": path} if tool == "read_file" else {"command": command}
            output = (
                f"$ {command}\n{_prose(rng, rng.randint(*tool_output_words))}\n{error}"
                if tool == "run_command"
                else (f"# {path}\n{_prose(rng, rng.randint(*tool_output_words))}")
            )
            messages = [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [tool_call(call_id, tool, json.dumps(args))],
                },
                {"role": "tool", "tool_call_id": call_id, "content": output},
                {"role": "assistant", "content": f"I checked {path}. {_prose(rng, rng.randint(20, 60))}"},
            ]
        events.append(
            TurnEvent(
                conversation_id=conversation_id,
                turn_seq=seq,
                model=model,
                messages=[ChatMessage.model_validate(m) for m in messages],
                system_prompt="You are a careful coding agent. Use the tools; keep exact paths."
                if seq == 1
                else None,
                tools=_TOOLS if seq == 1 else None,
                context_window=context_window,
            )
        )
    return events


def _tool(name: str, description: str, parameter: str) -> dict[str, Any]:
    """A function tool that takes one string, ``parameter``."""
    schema = {"type": "object", "properties": {parameter: {"type": "string"}}, "required": [parameter]}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


_TOOLS = [
    _tool("read_file", "Read a file of the repository.", "path"),
    _tool("run_command", "Run a shell command in the repository.", "command"),
]


@dataclass
class DemoReport:
    """What the demo saw."""

    turns_published: int = 0
    turns_handled: int = 0
    compactions: list[CompactionCompleted] = field(default_factory=list)
    seconds: float = 0.0


async def run_demo(
    settings: Settings,
    turns: int = 80,
    conversations: int = 2,
    context_window: int = 8192,
    *,
    say: Callable[[str], None] = print,
    within: float = 120.0,
) -> DemoReport:
    """Run the worker and a synthetic agent against the configured broker and Redis; narrate."""
    report = DemoReport()
    start = time.monotonic()
    worker = build_worker(settings)
    summarizer = (
        settings.summarizer.model
        or "extractive (no LLM configured: set COMPACTION_SUMMARIZER__MODEL to use one)"
    )
    say(f"summarizer: {summarizer}")
    say(
        f"conversations: {conversations} x {turns} turns, context window {context_window} tokens (set on the events)"
    )
    consumer = AIOKafkaConsumer(
        settings.topics.completed,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        group_id=f"demo-watch-{time.time_ns()}",
        auto_offset_reset="latest",
        **kafka_client_args(settings.kafka),
    )
    async with worker.running():
        await consumer.start()
        watcher = asyncio.create_task(_watch(consumer, report, say))
        try:
            async with Client.connect(settings) as client:
                streams = [
                    synthetic_turns(f"demo-{i + 1}", turns, context_window=context_window, seed=i)
                    for i in range(conversations)
                ]
                for batch in zip(*streams, strict=True):
                    for event in batch:
                        await client.publish_turn(event)
                        report.turns_published += 1
                    await asyncio.sleep(0.02)
                await _settle(worker, report.turns_published, within)
                for i in range(conversations):
                    cid = f"demo-{i + 1}"
                    meta = await client.meta(cid)
                    transcript = await client.transcript(cid)
                    messages = await client.messages(cid)
                    say(
                        f"{cid}: {len(transcript)} messages in the transcript, {len(messages)} in the effective history "
                        f"(version {meta.version}, {meta.context_status.value}), ~{meta.total_tokens} tokens of {context_window}"
                    )
        finally:
            await asyncio.sleep(0.5)
            watcher.cancel()
            await consumer.stop()
    report.turns_handled = worker.handled
    report.seconds = time.monotonic() - start
    say(
        f"done in {report.seconds:.1f}s: {len(report.compactions)} compactions, {report.turns_handled} turns handled"
    )
    return report


async def _watch(consumer: AIOKafkaConsumer, report: DemoReport, say: Callable[[str], None]) -> None:
    async for record in consumer:
        event = CompactionCompleted.model_validate_json(record.value)
        report.compactions.append(event)
        kept = event.messages_after
        say(
            f"[{event.conversation_id}] compaction v{event.version} ({event.trigger.value}, {event.outcome.value}): "
            f"{event.tokens_before} -> {event.tokens_after} tokens (window {event.window}, target {event.target}); "
            f"{event.messages_before} -> {kept} messages; stages {', '.join(event.stages) or '-'}; "
            f"summary {event.summary_tokens} tokens by {event.summarizer_model or '-'}"
            + (f"; note: {event.error}" if event.error else "")
        )


async def _settle(worker: Any, expected_turns: int, within: float) -> None:
    """Wait until every turn is handled and no compaction is pending or running."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        idle = not worker.pool.tasks and await worker.pool.jobs.pending_count() == 0
        if worker.handled >= expected_turns and idle:
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"demo did not settle in {within}s: {worker!r}")
