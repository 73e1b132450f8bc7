"""Fake summarizers, and the small chats and contexts the summary-stage tests give them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from compaction_worker.contracts.events import LlmUsage
from compaction_worker.contracts.history import SummaryChunk
from compaction_worker.strategies import summarize as stage
from compaction_worker.strategies.draft import Draft, StageContext
from compaction_worker.summaries.contract import (
    InputTooLargeError,
    SummarizerError,
    SummaryRequest,
    SummaryResult,
)
from compaction_worker.summaries.prompts import transcript_costs
from compaction_worker.testing import Chat

from .helpers import COUNTER, context, words

FILLER = words(50)


class Scripted:
    """A summarizer that answers with ``words`` words (or its whole cap), or fails with a usage."""

    def __init__(
        self,
        words: int | None = 20,
        *,
        name: str = "scripted",
        usage: LlmUsage | None = None,
        fail: bool = False,
    ) -> None:
        self.words, self.name, self.fail = words, name, fail
        self.usage = usage or LlmUsage()
        self.requests: list[SummaryRequest] = []

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.requests.append(request)
        if self.fail:
            raise SummarizerError(f"{self.name} failed", usage=self.usage)
        size = request.max_summary_tokens if self.words is None else self.words
        text = " ".join(f"s{i}" for i in range(size))
        return SummaryResult(text, self.name, COUNTER.text(text), self.usage)


class Fixed:
    """A summarizer that always answers with the same text."""

    name = "fixed"

    def __init__(self, text: str) -> None:
        self.text = text

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        return SummaryResult(self.text, self.name, COUNTER.text(self.text), LlmUsage())


def chat(turns: int, start: int = 1, say: str = FILLER) -> Chat:
    """``turns`` user/assistant pairs of about 55 tokens each."""
    c = Chat(start=start)
    for i in range(turns):
        c.user(f"u{start + 2 * i} {say}").assistant(f"a{start + 2 * i} {say}")
    return c


def old_chunk(first: int, last: int, tokens: int, text: str = "earlier", **kw: Any) -> SummaryChunk:
    """A stored chunk standing for messages ``first..last``."""
    return SummaryChunk(
        id=f"c{first}",
        text=text,
        first_seq=first,
        last_seq=last,
        first_n=first,
        last_n=last,
        tokens=tokens,
        created_at="2024-01-01T00:00:00+00:00",
        model="fake",
        **kw,
    )


def ctx_with(**limits: Any) -> StageContext:
    """The helpers' context over a 4,000-token window, with some limits overridden.

    Target 2,000; the reserve for a new summary is min(500, 0.3 * 2,000) = 500 and for its
    ledger min(400, 500) = 400, so chunks fold once they exceed 1,000 - 900 = 100 tokens.
    """
    ctx = context(window=4_000, target=2_000)
    return replace(ctx, limits=replace(ctx.limits, **{"chunk_budget": 1_000, **limits}))


ARTIFACTS = (
    "Run `pytest tests/test_orders.py -k total` please; the code is in src/orders/total.py.",
    "$ pytest tests/test_orders.py -k total\nValueError: order 4412 total is negative\n1 failed",
    "I pushed commit 3f9a2c1d7e and opened https://ci.example.com/builds/9001 for it.",
)


def artifact_chat(start: int = 1, texts: tuple[str, ...] = ARTIFACTS) -> Chat:
    """Turns that mention exact paths, commands, errors, ids and URLs, then filler turns."""
    c = Chat(start=start)
    for i, text in enumerate(texts):
        (c.user if i % 2 == 0 else c.assistant)(text)
    if len(texts) % 2:
        c.assistant("noted")
    for i in range(8):
        c.user(f"filler {i} {FILLER}").assistant(f"reply {i} {FILLER}")
    return c


class Limited(Scripted):
    """A Scripted summarizer that declares a transcript limit and refuses what is over ``refuses_over``."""

    def __init__(
        self, limit: int | None, *, refuses_over: int | None = None, told: int | None = None, **kw: Any
    ):
        super().__init__(**{"name": "limited", **kw})
        self.limit, self.told = limit, told
        self.refuses_over = refuses_over if refuses_over is not None else limit
        self.refused: list[SummaryRequest] = []

    def transcript_limit(self, request: SummaryRequest) -> int | None:
        return self.limit

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        size = sum(transcript_costs(request.messages, COUNTER.text))
        if self.refuses_over is not None and size > self.refuses_over:
            self.refused.append(request)
            raise InputTooLargeError(f"{size} tokens over {self.refuses_over}", transcript_limit=self.told)
        return await super().summarize(request)


def sent(*summarizers: Scripted) -> list[str]:
    """Every message content the summarizers were asked to summarize (refused requests aside)."""
    return [str(m["content"]) for s in summarizers for r in s.requests for m in r.messages]


def head_of(draft: Draft, out: Any) -> list[str]:
    """What the outcome's new chunks cover: the contents of the summarized entries."""
    chunks = out.draft.chunks
    return [str(e.message["content"]) for e in draft.entries if any(c.covers(e.n) for c in chunks)]


async def summarize(draft: Draft, ctx: StageContext, summarizers: Any, **fields: Any) -> Any:
    """The summary stage's function with ``summarizers`` (and ``originals``, ``conversation_id``) put in ``ctx``."""
    return await stage.summarize(draft, replace(ctx, summarizers=tuple(summarizers), **fields))
