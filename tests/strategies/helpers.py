"""Small hand-built drafts for the stage tests: a word-counting counter and a chat builder."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from compaction_worker.contracts.history import Entry, SummaryChunk
from compaction_worker.settings import PipelineSettings
from compaction_worker.strategies.draft import Draft, Limits, StageContext, summary_overhead

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
IMAGE_TOKENS = 100


class WordCounter:
    """One token per whitespace-separated word, four per message, a hundred per image."""

    def text(self, text: str) -> int:
        return len(text.split())

    def message(self, message: Mapping[str, Any]) -> int:
        content = message.get("content")
        tokens = 4
        if isinstance(content, str):
            tokens += self.text(content)
        elif isinstance(content, list):
            for part in content:
                tokens += self.text(part["text"]) if part.get("type") == "text" else IMAGE_TOKENS
        for call in message.get("tool_calls") or ():
            tokens += self.text(call["function"]["name"]) + self.text(call["function"]["arguments"])
        return tokens


COUNTER = WordCounter()


def words(count: int, tag: str = "w") -> str:
    """``count`` distinct words; the tag makes two texts of the same length differ."""
    return " ".join(f"{tag}{i}" for i in range(count))


def lines(count: int, tag: str = "line") -> str:
    """``count`` lines of two words each."""
    return "\n".join(f"{tag} {i}" for i in range(count))


class Chat:
    """Builds entries one message at a time: ordinals, seqs and token counts as the store would."""

    def __init__(self, start: int = 1) -> None:
        self.start = start
        self.entries: list[Entry] = []

    def add(self, message: dict[str, Any], *, edit: str | None = None) -> Chat:
        n = self.start + len(self.entries)
        self.entries.append(Entry(n=n, seq=n, message=message, tokens=COUNTER.message(message), edit=edit))
        return self

    def user(self, text: str = "please go on", **kw: Any) -> Chat:
        return self.add({"role": "user", "content": text}, **kw)

    def assistant(self, text: str = "done", **kw: Any) -> Chat:
        return self.add({"role": "assistant", "content": text}, **kw)

    def calls(self, *calls: tuple[str, str, Mapping[str, Any]]) -> Chat:
        """An assistant message making (id, tool, arguments) calls, in parallel when several."""
        return self.add(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                    for i, name, args in calls
                ],
            }
        )

    def result(self, call_id: str, content: str | list[Any], *, pinned: bool = False, **kw: Any) -> Chat:
        message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": content}
        if pinned:
            message["pinned"] = True
        return self.add(message, **kw)

    def tool(
        self, call_id: str, name: str, args: Mapping[str, Any], output: str | list[Any], **kw: Any
    ) -> Chat:
        """A call and its result."""
        return self.calls((call_id, name, args)).result(call_id, output, **kw)

    def draft(self, chunks: tuple[SummaryChunk, ...] = ()) -> Draft:
        return Draft(chunks, tuple(self.entries))


def context(window: int = 100_000, target: int | None = None, **settings: Any) -> StageContext:
    """A stage context over ``window`` with pipeline settings overridden by ``settings``."""
    limits = Limits(
        target=window // 2 if target is None else target,
        fixed_tokens=0,
        window=window,
        tail_max_messages=6,
        tail_max_tokens=window // 4,
        max_summary_tokens=500,
        chunk_budget=window // 4,
    )
    return StageContext(limits, PipelineSettings(**settings), COUNTER, summary_overhead(COUNTER))


def chunk() -> SummaryChunk:
    """A summary chunk standing for message 1 (build the entries with ``Chat(start=2)``)."""
    return SummaryChunk(
        id="c1",
        text="earlier work",
        first_seq=1,
        last_seq=1,
        first_n=1,
        last_n=1,
        tokens=2,
        created_at="2024-01-01T00:00:00+00:00",
        model="fake",
    )


def by_n(draft: Draft) -> dict[int, Entry]:
    return {e.n: e for e in draft.entries}
