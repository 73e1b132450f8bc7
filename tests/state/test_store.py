"""The conversation store: idempotent appends, incremental totals, fingerprints, the fenced commit."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.exceptions

from compaction_worker.contracts.events import ContextStatus
from compaction_worker.contracts.history import Entry
from compaction_worker.errors import StaleFenceError
from compaction_worker.state.lock import Lease, Locks
from compaction_worker.state.store import PinWrite, Store
from tests.state.helpers import append, chunk, msg

pytestmark = pytest.mark.integration


class TestCommit:
    async def _setup(self, store: Store, locks: Locks) -> tuple[int, str]:
        await append(store, "c", 1, msg("q1"), msg("a1", "assistant"))
        await append(store, "c", 2, msg("q2"), msg("a2", "assistant"))
        lease = await locks.acquire("c", store.keys("c"))
        assert isinstance(lease, Lease)
        return lease.fence, lease.token

    async def test_commit_keeps_messages_appended_meanwhile(
        self, store: Store, redis_client: redis.asyncio.Redis
    ) -> None:
        """Reference 000 (history and originals stay in sync): entries appended after the snapshot survive the commit (docs/design.md, invariant 1)."""
        locks = Locks(redis_client, 30)
        fence, token = await self._setup(store, locks)
        snapshot = await store.snapshot("c")
        entries = snapshot.history.entries
        await append(store, "c", 3, msg("q3"), msg("a3", "assistant"))  # during the "LLM call"
        result = await store.commit(
            "c",
            fence=fence,
            lock_token=token,
            expected_version=0,
            consumed=len(entries),
            chunks=[chunk(entries[0], entries[1])],
            entries=entries[2:],
            tokens=5 - 20,
            status=ContextStatus.SUMMARIZED,
            record={"v": 1},
        )
        assert (result.version, result.appended_during) == (1, 2)
        after = await store.snapshot("c")
        assert [e.message["content"] for e in after.history.entries] == ["q2", "a2", "q3", "a3"]
        assert [c.id for c in after.history.chunks] == ["c1"]
        assert after.meta.history_tokens == 60 - 15
        assert after.meta.context_status is ContextStatus.SUMMARIZED
        assert len(await store.transcript("c")) == 6  # the transcript is never rewritten

    async def test_the_verbatim_tail_stays_in_the_transcript_across_commits(
        self, store: Store, redis_client: redis.asyncio.Redis
    ) -> None:
        """An append pushes to the transcript alone: the history's entries are the list a commit
        wrote, then the transcript from the meta's ``tail``. A commit consuming into that tail moves
        ``tail`` past what it consumed; one consuming less than the list keeps the list's rest."""
        locks = Locks(redis_client, 30)
        fence, token = await self._setup(store, locks)
        keys = store.keys("c")

        async def commit(consumed: int, entries: Sequence[Entry], version: int) -> int:
            return await _replaced(store, (fence, token), consumed, entries, version)

        async def layout() -> tuple[list[str], int, int]:
            snapshot = await store.snapshot("c")
            words = [e.message["content"] for e in snapshot.history.entries]
            return words, await store.redis.llen(keys.entries), snapshot.meta.tail

        first = (await store.snapshot("c")).history.entries
        assert await layout() == (["q1", "a1", "q2", "a2"], 0, 0)
        await append(store, "c", 3, msg("q3"), msg("a3", "assistant"))  # during the "LLM call"
        assert await commit(4, first[2:], 0) == 2
        assert await layout() == (["q2", "a2", "q3", "a3"], 2, 4)
        await append(store, "c", 4, msg("q4"), msg("a4", "assistant"))
        assert await layout() == (["q2", "a2", "q3", "a3", "q4", "a4"], 2, 4)  # the list untouched
        assert await commit(3, [], 1) == 3  # into the tail: a3 is the transcript's 6th record
        assert await layout() == (["a3", "q4", "a4"], 0, 5)
        await append(store, "c", 5, msg("q5"))
        assert await commit(0, first[:1], 2) == 4  # nothing consumed: all of it kept after q1
        assert await layout() == (["q1", "a3", "q4", "a4", "q5"], 1, 5)
        assert await commit(1, [], 3) == 4  # the list's first entry alone
        assert await layout() == (["a3", "q4", "a4", "q5"], 0, 5)
        assert len(await store.transcript("c")) == 9  # the transcript is never rewritten

    async def test_a_pin_moves_the_transcript_up_to_it_into_the_list(
        self, store: Store, redis_client: redis.asyncio.Redis
    ) -> None:
        """A message of the tail read from the transcript is flagged by moving the records up to it
        into the list (with the conversation's deadline) and ``tail`` past them; the history reads
        the same but for the flag. One a commit replaced is refused, and nothing is written."""
        fence, token = await self._setup(store, Locks(redis_client, 30))
        keys = store.keys("c")
        deadline = int(await store.redis.hget(keys.meta, "expires_at") or 0)
        assert deadline > 0

        assert await store.set_pinned("c", [2], True) == PinWrite((), (2,))
        snapshot = await store.snapshot("c")
        assert [(e.n, e.message.get("pinned")) for e in snapshot.history.entries] == [
            (1, None),
            (2, True),
            (3, None),
            (4, None),
        ]
        assert (await store.redis.llen(keys.entries), snapshot.meta.tail) == (2, 2)
        assert await store.redis.pexpiretime(keys.entries) == deadline
        pinned = [await store.redis.dump(k) for k in keys.all()]
        assert await store.set_pinned("c", [2], True) == PinWrite((), ())  # flagged already: nothing written
        assert [await store.redis.dump(k) for k in keys.all()] == pinned
        # One in the list, one in the transcript; only the pinned one changes.
        assert await store.set_pinned("c", [2, 3], False) == PinWrite((), (2,))
        assert [e.message.get("pinned") for e in (await store.snapshot("c")).history.entries] == [
            None,
            False,
            False,
            None,
        ]
        await _replaced(store, (fence, token), 1, [], 0)
        before = [await store.redis.dump(k) for k in keys.all()]
        assert await store.set_pinned("c", [1, 4], True) == PinWrite((1,), ())
        assert [await store.redis.dump(k) for k in keys.all()] == before

    async def test_a_pin_over_a_history_changed_since_its_read_writes_nothing(
        self, store: Store, redis_client: redis.asyncio.Redis, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A pinner whose lock expired while it pinned, and whose history another holder committed
        meanwhile, is refused (lua/pin.lua): nothing of the pin is written over the commit."""
        lease = await self._setup(store, Locks(redis_client, 30))
        keys = store.keys("c")
        script = store._pin
        before: list[Any] = []

        async def committed_first(*args: Any, **header: Any) -> Any:
            await _replaced(store, lease, 1, [], 0)  # another holder's commit, after the pin's read
            nonlocal before
            before = [await store.redis.dump(k) for k in keys.all()]
            return await script(*args, **header)

        monkeypatch.setattr(store, "_pin", committed_first)
        with pytest.raises(StaleFenceError, match="pin refused"):
            await store.set_pinned("c", [3], True)
        assert [await store.redis.dump(k) for k in keys.all()] == before
        assert [e.n for e in (await store.snapshot("c")).history.entries] == [2, 3, 4]

    async def test_stale_fence_is_refused(self, store: Store, redis_client: redis.asyncio.Redis) -> None:
        """A writer whose lock expired and was taken over cannot commit (docs/design.md, invariant 3)."""
        locks = Locks(redis_client, 0.2)
        fence, token = await self._setup(store, locks)
        snapshot = await store.snapshot("c")
        await asyncio.sleep(0.3)
        assert await locks.acquire("c", store.keys("c")) is not None  # another worker takes over
        with pytest.raises(StaleFenceError, match="stale_fence"):
            await store.commit(
                "c",
                fence=fence,
                lock_token=token,
                expected_version=0,
                consumed=4,
                chunks=[],
                entries=snapshot.history.entries[2:],
                tokens=-20,
                status=ContextStatus.FULL,
                record={},
            )
        assert (await store.snapshot("c")).history.entries == snapshot.history.entries

    async def test_expired_lock_is_refused_even_without_a_new_holder(
        self, store: Store, redis_client: redis.asyncio.Redis
    ) -> None:
        """The commit checks the lock itself, not only the fence."""
        locks = Locks(redis_client, 0.2)
        fence, token = await self._setup(store, locks)
        await asyncio.sleep(0.3)
        with pytest.raises(StaleFenceError, match="lock_lost"):
            await store.commit(
                "c",
                fence=fence,
                lock_token=token,
                expected_version=0,
                consumed=4,
                chunks=[],
                entries=[],
                tokens=-40,
                status=ContextStatus.FULL,
                record={},
            )
        assert (await store.meta("c")).history_tokens == 40

    async def test_version_mismatch_is_refused(self, store: Store, redis_client: redis.asyncio.Redis) -> None:
        """A commit based on an old version of the effective history is refused."""
        locks = Locks(redis_client, 30)
        fence, token = await self._setup(store, locks)
        with pytest.raises(StaleFenceError, match="stale_version"):
            await store.commit(
                "c",
                fence=fence,
                lock_token=token,
                expected_version=7,
                consumed=4,
                chunks=[],
                entries=[],
                tokens=0,
                status=ContextStatus.FULL,
                record={},
            )


async def _replaced(
    store: Store, lease: tuple[int, str], consumed: int, entries: Sequence[Entry], version: int
) -> int:
    """Commit no chunk and ``entries`` over the first ``consumed`` entries of ``version``: the
    entries kept after them (``appended_during``)."""
    fence, token = lease
    result = await store.commit(
        "c",
        fence=fence,
        lock_token=token,
        expected_version=version,
        consumed=consumed,
        chunks=[],
        entries=entries,
        tokens=0,
        status=ContextStatus.SUMMARIZED,
        record={"v": version + 1},
    )
    return result.appended_during
