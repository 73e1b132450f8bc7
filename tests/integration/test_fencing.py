"""Fencing against real Redis: a worker whose lock expired during its LLM call cannot commit (docs/design.md, invariant 3).

Worker A's event loop freezes inside its summarizer call (a blocking call: what a GC
pause, a CPU-bound step or a stopped VM does to a process), so its lock renewal cannot
run and the lock (its claim on the job) expires. Nothing in A is faked: the lock, the
renewal task, the job claim, the pipeline and the fenced commit script are the production
ones, against a real Redis server. Worker B, in another thread with its own event loop and Redis connection,
is a second worker process in all but name.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import redis.asyncio

from compaction_worker.contracts.events import CompactionCompleted, CompactionStarted, LlmUsage, Outcome
from compaction_worker.runtime.compactor import Compactor
from compaction_worker.runtime.pool import run_job
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.jobs import JobQueue
from compaction_worker.state.lock import Locks
from compaction_worker.state.store import Store
from compaction_worker.summaries.contract import SummaryRequest, SummaryResult
from tests.orchestration import Published, connect, conversation, make_parts, make_settings

from .helpers import coverage_problems

pytestmark = pytest.mark.integration

PREFIX = "fencing"
CID = "c"  # tests.orchestration.conversation's conversation
TURNS = 24
"""Enough turns of that conversation (window 2048) to cross its threshold."""
LOCK_TTL = 0.3
"""A's lock TTL, in seconds: renewed every 0.1 s while A's event loop runs."""
FREEZE_TIMEOUT = 30.0


@dataclass
class Scripted:
    """A summarizer whose summary names its writer; ``pause`` runs (blocking) inside each call."""

    writer: str
    count: Callable[[str], int]
    pause: Callable[[], None] = lambda: None
    name: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = f"summarizer-{self.writer}"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.pause()  # deliberately blocking: the event loop, renewal included, stands still
        text = f"Summary by worker {self.writer}: {len(request.messages)} messages of questions and answers."
        return SummaryResult(text, self.name, self.count(text), LlmUsage())


# A job whose lock is busy is looked at again when that lock would expire: soon, with this TTL.
SETTINGS = make_settings(redis={"key_prefix": PREFIX}, worker={"lock_ttl_seconds": LOCK_TTL})


def compactor(
    client: RedisClient, published: Published, summarizer: Callable[[Callable[[str], int]], Scripted]
) -> tuple[Compactor, Store, JobQueue]:
    """A worker's compaction side over ``client``, with the production lock, job queue and store."""
    parts = make_parts(client, SETTINGS, published, lambda _m, c: [summarizer(c.text)])
    return parts.compactor, parts.store, parts.jobs


async def over_threshold(client: RedisClient) -> Store:
    """The conversation, stored through the turn path, with its threshold job scheduled."""
    parts = make_parts(client, SETTINGS, Published())
    for event in conversation(TURNS):
        await parts.turns.handle(event, CID.encode())
    assert await parts.jobs.job(CID) is not None
    return parts.store


def completed_events(published: Published) -> list[CompactionCompleted]:
    return [CompactionCompleted.model_validate(e) for e in published.on("compaction.completed")]


async def test_worker_whose_lock_expired_cannot_commit_over_the_new_holder(
    redis_client: redis.asyncio.Redis, redis_url: str
) -> None:
    """A freezes in its LLM call; B takes the job and the lock, commits; A's commit is refused: B's history stands."""
    store = await over_threshold(redis_client)
    before = await store.snapshot(CID)
    a_in_call = threading.Event()
    b_committed = threading.Event()

    def freeze() -> None:
        a_in_call.set()
        assert b_committed.wait(FREEZE_TIMEOUT), "worker B never committed"

    published_a = Published()
    compactor_a, _, jobs_a = compactor(redis_client, published_a, lambda count: Scripted("A", count, freeze))
    b_result: list[CompactionCompleted | BaseException] = []
    published_b = Published()

    async def worker_b() -> CompactionCompleted:
        client = connect(redis_url)
        try:
            compactor_b, _, jobs_b = compactor(client, published_b, lambda count: Scripted("B", count))
            # B starts once A is inside its call; while A's lock stands, B cannot claim the job.
            assert await asyncio.to_thread(a_in_call.wait, FREEZE_TIMEOUT), "A never reached its summarizer"
            deadline = time.monotonic() + FREEZE_TIMEOUT
            while time.monotonic() < deadline:
                if (done := await run_job(jobs_b, compactor_b, CID)) is not None:
                    return done
                await asyncio.sleep(0.05)
            raise AssertionError("B never got the job and the lock")
        finally:
            await client.aclose()

    def run_b() -> None:
        try:
            b_result.append(asyncio.run(worker_b()))
        except BaseException as e:  # reported by the test thread
            b_result.append(e)
        finally:
            b_committed.set()

    thread_b = threading.Thread(target=run_b, name="worker-b")
    thread_b.start()
    done_a = await run_job(jobs_a, compactor_a, CID)
    thread_b.join(FREEZE_TIMEOUT)
    (done_b,) = b_result
    if isinstance(done_b, BaseException):
        raise done_b

    # B compacted and committed the next version, with the next fence.
    assert (done_b.outcome, done_b.version) == (Outcome.COMPACTED, 1), done_b.error
    assert done_b.summarizer_model == "summarizer-B"
    assert await Locks(redis_client, LOCK_TTL).fence(store.keys(CID)) == 2  # A's acquisition was 1
    # A got its summary but the commit was refused, and A's completion event says so.
    assert a_in_call.is_set()
    assert done_a is not None
    assert (done_a.outcome, done_a.version) == (Outcome.FAILED, 0)
    assert done_a.error is not None
    assert "stale_fence" in done_a.error, done_a.error
    (started_a,) = [CompactionStarted.model_validate(e) for e in published_a.on("compaction.started")]
    assert completed_events(published_a) == [done_a]
    assert started_a.compaction_id == done_a.compaction_id
    # The stored history is B's, whole and valid; A left no trace in it.
    after = await store.snapshot(CID)
    assert after.meta.version == 1
    assert after.history.chunks
    assert all(c.text.startswith("Summary by worker B") for c in after.history.chunks)
    assert not any("worker A" in c.text for c in after.history.chunks)
    assert [r["version"] for r in await store.compactions(CID)] == [1]
    assert coverage_problems(after.history, before.meta.msg_count) == []
    # The refused writer leaves the new holder's metadata alone (no failure, no backoff).
    assert (after.meta.failures, after.meta.retry_after) == (0, 0.0)


async def test_worker_whose_lock_expired_cannot_commit_even_if_nobody_took_it(
    redis_client: redis.asyncio.Redis,
) -> None:
    """A freezes past its lock's TTL and nobody takes over: its fence is still current, yet the commit is refused."""
    store = await over_threshold(redis_client)
    before = await store.snapshot(CID)
    published = Published()
    frozen: list[float] = []

    def freeze() -> None:
        frozen.append(time.monotonic())
        time.sleep(LOCK_TTL * 3)

    compactor_a, _, jobs = compactor(redis_client, published, lambda count: Scripted("A", count, freeze))
    done = await run_job(jobs, compactor_a, CID)

    assert frozen, "A never reached its summarizer"
    assert done is not None
    assert done.outcome is Outcome.FAILED
    assert done.error is not None
    assert "lock_lost" in done.error, done.error
    assert completed_events(published) == [done]
    # The fence did not move (nobody acquired since), so the lock check alone refused it.
    assert await Locks(redis_client, LOCK_TTL).fence(store.keys(CID)) == 1
    after = await store.snapshot(CID)
    assert after.meta.version == 0
    assert (after.history.chunks, after.history.entries) == (before.history.chunks, before.history.entries)
    assert await store.compactions(CID) == []
    # Still over its threshold: a retry is pending (after the backoff), not left to the next turn.
    assert int(after.meta.total_tokens * after.meta.calibration) >= after.meta.threshold
    assert await jobs.pending_count() == 1
