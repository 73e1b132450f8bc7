"""Recall: search what compaction took out of a conversation's history, and its artifact archive.

What is searched is every transcript message the effective history no longer carries
verbatim (covered by a summary, or pruned, de-duplicated or cut since) and every archived
artifact (state/archive.py). The transcript is read in pages, newest first, only up to
the last message that left the history, and at most ``max_scan_bytes`` of it. The index
is built once per effective-history version (off the event loop) and kept in process for
the last few conversations: a compaction bumps the version, and only a new archive entry
or a new version can change what is searchable, so one round trip tells whether it still
holds. Docs: docs/design.md, "Recall".
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from compaction_worker.conversation.meta import VERSION_FIELD
from compaction_worker.offload import off_loop
from compaction_worker.recall.index import Passage, RecallHit, RecallIndex, passages
from compaction_worker.state.archive import Archive, ArchivedArtifact
from compaction_worker.state.store import Store

__all__ = ["Recall", "RecallLimits", "RecallResult"]


@dataclass(frozen=True, slots=True)
class RecallLimits:
    """How much a recall returns and reads: its bounds in size (and so in time)."""

    default_limit: int = 5
    max_limit: int = 20
    """A caller's (or a model's) ``limit`` is clamped to this."""
    snippet_chars: int = 600
    max_result_chars: int = 4000
    """The snippets' texts together: what a recall tool result adds to the prompt, at most ~1K tokens."""
    max_query_chars: int = 1000
    """A longer query is cut: a model that pastes a page into it gets the page's start searched."""
    page_size: int = 500
    """Transcript records per read."""
    max_scan_bytes: int = 64 << 20
    """Transcript bytes read at most (newest first): ~16M tokens. Past it the oldest are not searched."""
    cache_size: int = 8
    """Conversations whose index is kept in process."""


@dataclass(frozen=True, slots=True)
class RecallResult:
    """A recall's hits, best first, and what was searched."""

    hits: list[RecallHit]
    version: int
    """The effective-history version searched against."""
    messages: int
    """Transcript messages searched (those the history no longer carries verbatim)."""
    artifacts: int
    """Archived artifacts searched."""
    partial: bool = False
    """The transcript went past ``max_scan_bytes``: its oldest messages were not searched."""


@dataclass(frozen=True, slots=True)
class _Built:
    index: RecallIndex
    version: int
    messages: int
    artifacts: int
    partial: bool


class Recall:
    """Searches conversations in one Redis (a :class:`~compaction_worker.client.Client` holds one)."""

    def __init__(self, store: Store, archive: Archive, limits: RecallLimits | None = None) -> None:
        self.store = store
        self.archive = archive
        self.limits = limits or RecallLimits()
        self._cache: OrderedDict[str, _Built] = OrderedDict()
        self._building: dict[str, asyncio.Task[_Built]] = {}

    async def search(self, conversation_id: str, query: str, limit: int | None = None) -> RecallResult:
        """The passages that best match ``query`` (BM25), as verbatim snippets with their turn."""
        limits = self.limits
        wanted = max(1, min(limit or limits.default_limit, limits.max_limit))
        built = await self._index(conversation_id)
        hits = built.index.search(
            query[: limits.max_query_chars],
            wanted,
            snippet_chars=limits.snippet_chars,
            max_chars=limits.max_result_chars,
        )
        return RecallResult(hits, built.version, built.messages, built.artifacts, built.partial)

    def forget(self, conversation_id: str | None = None) -> None:
        """Drop a conversation's cached index (all of them with None): the next recall rebuilds it."""
        if conversation_id is None:
            self._cache.clear()
        else:
            self._cache.pop(conversation_id, None)

    async def _index(self, conversation_id: str) -> _Built:
        keys = self.store.keys(conversation_id)
        async with self.store.redis.pipeline(transaction=False) as pipe:
            pipe.hget(keys.meta, VERSION_FIELD)
            pipe.hlen(keys.artifacts)
            raw_version, archived = await pipe.execute()
        cached = self._cache.get(conversation_id)
        if cached and (cached.version, cached.artifacts) == (int(float(raw_version or 0)), archived):
            self._cache.move_to_end(conversation_id)
            return cached
        # Concurrent recalls of one conversation share one build.
        task = self._building.get(conversation_id)
        if task is None:
            task = asyncio.create_task(self._build(conversation_id))
            self._building[conversation_id] = task
            task.add_done_callback(lambda _: self._building.pop(conversation_id, None))
        built = await asyncio.shield(task)
        self._cache[conversation_id] = built
        self._cache.move_to_end(conversation_id)
        while len(self._cache) > self.limits.cache_size:
            self._cache.popitem(last=False)
        return built

    async def _build(self, conversation_id: str) -> _Built:
        snapshot = await self.store.snapshot(conversation_id)
        # Read the archive after the history: an artifact archived by a commit after the
        # snapshot is searched, and the next recall sees its new version and rebuilds.
        artifacts = await self.archive.all(conversation_id)
        verbatim = {e.n for e in snapshot.history.entries if e.edit is None and not e.synthetic}
        gone = [n for n in range(1, snapshot.meta.msg_count + 1) if n not in verbatim]
        records, partial = await self._read(conversation_id, gone)
        items = [p for n, seq, message in records for p in passages(n, seq, message)]
        items.extend(_artifact_passage(a) for a in artifacts)
        index = await off_loop(RecallIndex, items)
        return _Built(index, snapshot.meta.version, len(records), len(artifacts), partial)

    async def _read(
        self, conversation_id: str, gone: Sequence[int]
    ) -> tuple[list[tuple[int, int, dict[str, object]]], bool]:
        """The ``gone`` messages as (n, seq, message), newest first; whether the byte cap cut them short."""
        if not gone:
            return [], False
        wanted = set(gone)
        key = self.store.keys(conversation_id).transcript
        out: list[tuple[int, int, dict[str, object]]] = []
        read = 0
        first, end = gone[0] - 1, gone[-1] - 1  # message n is at list index n - 1
        while end >= first:
            start = max(first, end - self.limits.page_size + 1)
            page = await self.store.redis.lrange(key, start, end)
            for raw in reversed(page):
                read += len(raw)
                record = json.loads(raw)
                if record["n"] in wanted:
                    out.append((int(record["n"]), int(record["seq"]), record["m"]))
                if read > self.limits.max_scan_bytes:
                    return out, True
            end = start - 1
        return out, False


def _artifact_passage(artifact: ArchivedArtifact) -> Passage:
    return Passage("archive", artifact.seq, artifact.n, "artifact", artifact.text, 0, artifact.item)
