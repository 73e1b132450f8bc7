"""Conversations shaped like a real agent runtime's, for the bench: tool call ids reused every turn,
artifacts named in prose, tool outputs of a few KB."""

from __future__ import annotations

import json
import uuid
from typing import Any

from compaction_worker.bench.environment import BenchError
from compaction_worker.budget.tokens import TokenCounter
from compaction_worker.formats import tool_call
from compaction_worker.runtime.components import Components
from compaction_worker.state.scripts import encode
from compaction_worker.testing import turn_payload


def agent_turn(i: int, salt: str = "") -> list[dict[str, Any]]:
    """One agent step: a request naming artifacts, two tool calls (ids reused every turn), outputs of a few KB, a reply.

    ``salt`` makes one conversation's texts its own: no cache may serve one from another's.
    """
    path = f"src/{salt}service_{i % 37}/handler_{i % 11}.py"
    log_lines = "\n".join(
        f"2026-11-23T10:{i % 60:02d}:{k % 60:02d}Z INFO {salt}worker-{k % 7} processed batch {i * 100 + k} "
        f"in {k * 3 % 97} ms from s3://acme-logs-{i % 5}/part-{k}.json"
        for k in range(30)
    )
    source = "\n".join(
        f"def handle_{i}_{k}(event):  # {salt} step {k} of turn {i}\n    return process(event, retries={k % 4})"
        for k in range(25)
    )
    return [
        {
            "role": "user",
            "content": f"Turn {i}: the deploy failed again with ECONNREFUSED 10.0.{i % 250}.7:5012. "
            f"Please read `{path}` and run `kubectl logs deploy/api-{i % 9} -n prod --tail=30`, "
            f"then tell me what https://status.acme.dev/incidents/{1000 + i} says.",
        },
        {
            "role": "assistant",
            "content": "I'll read the handler and the logs.",
            "tool_calls": [
                tool_call("call_0", "read_file", json.dumps({"path": path})),
                tool_call(
                    "call_1",
                    "bash",
                    json.dumps({"command": f"kubectl logs deploy/api-{i % 9} -n prod --tail=30"}),
                ),
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": source},
        {"role": "tool", "tool_call_id": "call_1", "content": log_lines},
        {
            "role": "assistant",
            "content": f"`{path}` retries {i % 4} times; the log shows worker-{i % 7} timing out on "
            f"s3://acme-logs-{i % 5}. I changed the retry budget in commit {uuid.UUID(int=i).hex[:12]}.",
        },
    ]


async def store_turn(
    parts: Components, cid: str, seq: int, messages: list[dict[str, Any]], model: str
) -> None:
    """Store a turn as the worker does (its turn handler), outside what a row times."""
    outcome = await parts.turns.handle(
        encode(turn_payload(cid, seq, messages, model=model)).encode(), cid.encode()
    )
    if outcome.status.value != "appended":
        raise BenchError(f"bench turn {seq} of {cid} not appended: {outcome}")


async def fill(parts: Components, cid: str, tokens: int, model: str, counter: TokenCounter) -> None:
    """Store a conversation of at least ``tokens`` tokens (not timed)."""
    stored, seq = 0, 0
    while stored < tokens:
        seq += 1
        messages = agent_turn(seq, cid)
        await store_turn(parts, cid, seq, messages, model)
        stored += sum(counter.message(m) for m in messages)


def label(tokens: int) -> str:
    """``1K``, ``500K``, ``1M``: a size as the table names it."""
    if tokens >= 1_000_000:
        return f"{tokens / 1_000_000:.3g}M"
    return f"{tokens / 1000:.3g}K" if tokens >= 1000 else str(tokens)
