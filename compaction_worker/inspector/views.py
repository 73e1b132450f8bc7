"""What the inspector's pages show, read from Redis through the client's and the store's readers.

Read-only: nothing here writes. The conversations list walks the meta keys with ``SCAN``
(there is no index of all conversations, and the per-turn path should not pay for one); it
reads at most ``inspector.scan_limit`` of them and says when it stopped short.
"""

from __future__ import annotations

import shlex
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from compaction_worker.client.client import Artifact, Client, ContextStats, context_stats
from compaction_worker.contracts.events import Trigger
from compaction_worker.contracts.history import Entry, SummaryChunk, render
from compaction_worker.conversation.keys import is_meta_key, meta_key_pattern
from compaction_worker.conversation.meta import Meta
from compaction_worker.conversation.status import Status, read_statuses
from compaction_worker.inspector.counts import TranscriptCounts
from compaction_worker.settings import Settings
from compaction_worker.state.restore import versions
from compaction_worker.state.store import Snapshot
from compaction_worker.summaries.artifacts import item_kind

ARTIFACTS_SHOWN = 500
"""Archived artifacts a conversation page lists, newest first seen (the archive is unbounded)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One conversation in a list: its status (its meta without the long texts) and its meter,
    computed under the conversation's settings profile."""

    conversation_id: str
    status: Status
    stats: ContextStats

    @property
    def meta(self) -> Meta:
        return self.status.meta


@dataclass(frozen=True, slots=True)
class Listing:
    recent: list[Row]
    largest: list[Row]
    matched: int
    """Conversations read (those matching the search, if any)."""
    complete: bool
    """False when the scan stopped at ``inspector.scan_limit``."""


@dataclass(frozen=True, slots=True)
class TranscriptItem:
    """A transcript message, or a run of them that one chunk summarized (shown collapsed)."""

    records: list[Mapping[str, Any]]
    chunk: int | None = None
    """The index of the chunk that covers them (1-based, as the page numbers chunks); None: verbatim."""
    edits: Mapping[int, str] = field(default_factory=dict)
    """The non-LLM edits of verbatim messages, by ordinal (pruned, de-duplicated, truncated)."""


@dataclass(frozen=True, slots=True)
class Page:
    """Which transcript messages one page shows: ``first``..``last`` of ``total`` (ordinals).

    A page is ``size`` messages from ``?at=N``; without it, the newest ``size``. A link to a
    message elsewhere goes to the page that starts at a multiple of ``size`` (plus one) and holds
    it, so such links to one message all lead to the same page.
    """

    path: str
    """The conversation page's path, escaped for a URL."""
    first: int
    last: int
    total: int
    size: int
    newest: bool

    @classmethod
    def of(cls, path: str, total: int, size: int, at: str | None) -> Page:
        start = int(at) if at is not None and at.isascii() and at.isdigit() and len(at) < 19 else None
        if start is None or start + size > total:
            return cls(path, max(1, total - size + 1), total, total, size, newest=True)
        start = max(1, start)
        return cls(path, start, start + size - 1, total, size, newest=False)

    def at(self, first: int) -> str:
        return f"{self.path}?at={first}"

    def href(self, n: int) -> str:
        """A link to transcript message ``n``: on this page, or on the page that holds it."""
        if self.first <= n <= self.last:
            return f"#msg-{n}"
        if n > self.total - self.size:
            return f"{self.path}#msg-{n}"
        return f"{self.at((n - 1) // self.size * self.size + 1)}#msg-{n}"

    @property
    def older(self) -> str | None:
        return self.at(max(1, self.first - self.size)) if self.first > 1 else None

    @property
    def newer(self) -> str | None:
        if self.newest:
            return None
        return self.path if self.last + self.size >= self.total else self.at(self.last + 1)


@dataclass(frozen=True, slots=True)
class ConversationView:
    conversation_id: str
    meta: Meta
    stats: ContextStats
    snapshot: Snapshot
    messages: list[dict[str, Any]]
    """The effective history as the model receives it (rendered as the client renders it)."""
    page: Page
    counts: list[dict[str, Any]]
    """Every transcript record's ``seq``, ``t`` and ``at``, for the sawtooth (``counts.TranscriptCounts``)."""
    transcript: list[TranscriptItem]
    """The page's transcript records, grouped."""
    chunks: list[tuple[SummaryChunk, dict[str, list[str]]]]
    """Each chunk with its ledger by kind (``term`` items are those carried by shape)."""
    log: list[dict[str, Any]]
    artifacts: list[Artifact]
    status: Status
    """Its pending job (running or not) and its waiting proposal, if any."""
    rewinds: list[tuple[int, str, str]]
    """(version, trigger, the command that rewinds it), newest first."""

    @property
    def shown_artifacts(self) -> list[Artifact]:
        """The newest ``ARTIFACTS_SHOWN`` of the archive (it grows with the conversation)."""
        return self.artifacts[-ARTIFACTS_SHOWN:]


async def listing(client: Client, settings: Settings, search: str | None) -> Listing:
    """The most recently updated and the largest conversations (those whose id contains ``search``)."""
    prefix = client.store.prefix
    pattern = meta_key_pattern(prefix, search or "")
    redis = client.store.redis
    limit = settings.inspector.scan_limit
    keys: list[str] = []
    complete = True
    async for key in redis.scan_iter(match=pattern, count=1000):
        text = key.decode() if isinstance(key, bytes) else key
        if is_meta_key(text, prefix):
            keys.append(text)
        if len(keys) >= limit:
            complete = False
            break
    cids = [key[len(prefix) + 2 : -len("}:meta")] for key in keys]
    rows = [
        Row(status.conversation_id, status, context_stats(status.conversation_id, status.meta, settings))
        for status in await read_statuses(redis, cids, prefix, client.parts.jobs.index)
        # not stored: expired between the scan and the read, or a sequence handed out and never used
        if status.stored
    ]
    shown = settings.inspector.list_limit
    return Listing(
        recent=sorted(rows, key=lambda r: r.meta.updated_at, reverse=True)[:shown],
        largest=sorted(rows, key=lambda r: r.stats.tokens, reverse=True)[:shown],
        matched=len(rows),
        complete=complete,
    )


async def conversation(
    client: Client, settings: Settings, conversation_id: str, counts: TranscriptCounts, at: str | None = None
) -> ConversationView | None:
    """What the conversation page shows, one page of its transcript; None when Redis holds no such conversation.

    Bounded whatever the conversation's length: the effective history (bounded by the context
    window), one page of the transcript (``at``: the first message's ordinal; the newest page
    without it) and, for the sawtooth, each record's counts without its message.
    """
    snapshot = await client.snapshot(conversation_id)
    meta = snapshot.meta
    if meta.last_seq == 0:
        return None
    path = f"/c/{quote(conversation_id, safe='')}"
    page = Page.of(path, meta.msg_count, settings.inspector.page_messages, at)
    records = await client.store.transcript(conversation_id, page.first - 1, page.last - 1)
    log = await client.compactions(conversation_id)
    chunks = snapshot.history.chunks
    return ConversationView(
        conversation_id=conversation_id,
        meta=meta,
        stats=context_stats(conversation_id, meta, settings),
        snapshot=snapshot,
        messages=render(snapshot.history, settings.for_profile(meta.profile).pipeline.summary_placement),
        page=page,
        counts=await counts.read(conversation_id),
        transcript=transcript_items(records, chunks, history_marks(snapshot.history.entries)),
        chunks=[(c, ledger_by_kind(c.artifacts)) for c in chunks],
        log=log,
        artifacts=await client.artifacts(conversation_id),
        status=await client.status(conversation_id, proposal=True),
        rewinds=rewind_commands(conversation_id, log),
    )


def history_marks(entries: Sequence[Entry]) -> dict[int, str]:
    """What the effective history did with each verbatim message, by ordinal: its non-LLM edit
    (pruned, de-duplicated, truncated) and whether it is pinned (published so, or ``Client.pin``)."""
    marks: dict[int, str] = {}
    for e in entries:
        pinned = e.role != "system" and bool(e.message.get("pinned"))
        if e.edit or pinned:
            marks[e.n] = ", ".join(m for m in (e.edit, "pinned" if pinned else None) if m)
    return marks


def transcript_items(
    records: Sequence[Mapping[str, Any]], chunks: Sequence[SummaryChunk], edits: Mapping[int, str]
) -> list[TranscriptItem]:
    """The transcript in order, each run of messages one chunk covers grouped behind that chunk (pure)."""
    items: list[TranscriptItem] = []
    for r in records:
        n = int(r["n"])
        chunk = next((i for i, c in enumerate(chunks, 1) if c.covers(n)), None)
        if chunk is not None and items and items[-1].chunk == chunk:
            items[-1].records.append(r)
        elif chunk is not None:
            items.append(TranscriptItem([r], chunk))
        else:
            items.append(TranscriptItem([r], None, {n: edits[n]} if n in edits else {}))
    return items


def ledger_by_kind(items: Sequence[str]) -> dict[str, list[str]]:
    """A chunk's verbatim ledger grouped by kind, in the ledger's order."""
    grouped: dict[str, list[str]] = defaultdict(list)
    for item in items:
        grouped[item_kind(item)].append(item.partition(": ")[2] or item)
    return dict(grouped)


def rewind_commands(conversation_id: str, log: Sequence[Mapping[str, Any]]) -> list[tuple[int, str, str]]:
    """Each committed compaction of the log (``restore.versions``), newest first, with the CLI command
    that undoes it (never run from here)."""
    return [
        (
            v.version,
            v.trigger,
            f"compaction-worker conversation rewind {shlex.quote(conversation_id)} --version {v.version}",
        )
        for v in reversed(versions(log))
        if v.trigger != Trigger.REWIND.value
    ]
