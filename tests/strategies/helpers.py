"""Small hand-built drafts for the stage tests: the shared counter, texts, a stage context, a chunk."""

from __future__ import annotations

from typing import Any

from compaction_worker.contracts.history import Entry, SummaryChunk
from compaction_worker.settings import PipelineSettings
from compaction_worker.strategies.draft import Counter, Draft, Limits, StageContext, summary_overhead
from compaction_worker.testing import WordCounter, summary_chunk

__all__ = [
    "COUNTER",
    "GENEROUS",
    "IMAGE",
    "IMAGE_TOKENS",
    "by_n",
    "call",
    "chunk",
    "context",
    "lines",
    "result",
    "words",
]

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
IMAGE_TOKENS = WordCounter.PER_IMAGE
COUNTER = WordCounter()

GENEROUS = Limits(
    target=10**9,
    fixed_tokens=0,
    window=10**9,
    tail_max_messages=10,
    tail_max_tokens=10**9,
    max_summary_tokens=2048,
    chunk_budget=10**9,
)
"""Limits no stage has to work for: for tests of what a stage does, not of when."""


def words(count: int, tag: str = "w") -> str:
    """``count`` distinct words; the tag makes two texts of the same length differ."""
    return " ".join(f"{tag}{i}" for i in range(count))


def lines(count: int, tag: str = "line") -> str:
    """``count`` lines of two words each."""
    return "\n".join(f"{tag} {i}" for i in range(count))


def context(
    window: int = 100_000,
    target: int | None = None,
    *,
    counter: Counter = COUNTER,
    limits: Limits | None = None,
    **settings: Any,
) -> StageContext:
    """A stage context over ``window`` (or exactly ``limits``), pipeline settings overridden by ``settings``."""
    limits = limits or Limits(
        target=window // 2 if target is None else target,
        fixed_tokens=0,
        window=window,
        tail_max_messages=6,
        tail_max_tokens=window // 4,
        max_summary_tokens=500,
        chunk_budget=window // 4,
    )
    return StageContext(limits, PipelineSettings(**settings), counter, summary_overhead(counter))


def call(*call_ids: str, **extra: Any) -> dict[str, Any]:
    """An assistant message calling ``read_file`` once per id; ``extra`` fields added (``pinned=True``)."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": c, "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
            for c in call_ids
        ],
        **extra,
    }


def result(call_id: str, **extra: Any) -> dict[str, Any]:
    """The tool result answering ``call_id``; ``extra`` fields added."""
    return {"role": "tool", "tool_call_id": call_id, "content": "output", **extra}


def chunk() -> SummaryChunk:
    """A summary chunk standing for message 1 (build the entries with ``Chat(start=2)``)."""
    return summary_chunk(1)


def by_n(draft: Draft) -> dict[int, Entry]:
    return {e.n: e for e in draft.entries}
