"""The wiring: every component of a worker, built from settings, a Redis client and a publisher.

The worker, the CLI and the tests build their parts here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

from compaction_worker.contracts.events import Publish
from compaction_worker.conversation.apply import Appends
from compaction_worker.observability import metrics
from compaction_worker.observability.health import Liveness
from compaction_worker.recall.search import Recall
from compaction_worker.runtime.compactor import Compactor
from compaction_worker.runtime.deadletters import DeadLetters
from compaction_worker.runtime.pool import CompactionPool
from compaction_worker.runtime.rewind import Rewinder
from compaction_worker.runtime.sweeper import Chore
from compaction_worker.runtime.turns import TurnHandler
from compaction_worker.settings import Settings
from compaction_worker.state.archive import Archive
from compaction_worker.state.breaker import Breaker
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.gaps import GapIndex
from compaction_worker.state.index import Sweep, now_ms
from compaction_worker.state.jobs import JobQueue
from compaction_worker.state.lock import Locks
from compaction_worker.state.outbox import Outbox
from compaction_worker.state.store import Store
from compaction_worker.state.wake import Wakes
from compaction_worker.summaries.factory import Summarizers


@dataclass(frozen=True, slots=True)
class Components:
    """A worker's parts over one Redis client and one publisher, wired together."""

    settings: Settings
    store: Store
    appends: Appends
    """A conversation's turns written (the per-turn script and the job entries it makes due)."""
    jobs: JobQueue
    locks: Locks
    gaps: GapIndex
    outbox: Outbox
    archive: Archive
    breaker: Breaker
    """The summarizer models' breakers (shared by every conversation on a model)."""
    recall: Recall
    """Searches what compaction took out (the client's reads)."""
    dead_letters: DeadLetters
    turns: TurnHandler
    compactor: Compactor
    rewinder: Rewinder
    pool: CompactionPool
    liveness: Liveness
    """Beaten by the consume loop and the pool's sweeper; the health port's /livez reads it."""


def build_components(
    settings: Settings,
    redis: RedisClient,
    publish: Publish,
    *,
    summarizers: Summarizers | None = None,
    store: Store | None = None,
) -> Components:
    """Build the components; ``summarizers`` replaces the configured ones, every profile's (tests, the
    demo); ``store``, one over ``redis`` the caller holds already (a client's)."""
    worker = settings.worker
    store = store or Store(redis, settings.redis.key_prefix, settings.redis.retention_seconds)
    shards = settings.redis.index_shards
    wakes = Wakes(redis, store.prefix)
    locks = Locks(redis, worker.lock_ttl_seconds)
    jobs = JobQueue(redis, store.prefix, locks, shards=shards, wakes=wakes)
    outbox = Outbox(store, publish, locks, worker.lock_ttl_seconds, shards=shards, wakes=wakes)
    archive = Archive(redis, store.prefix)
    breaker = Breaker(redis, store.prefix, settings.summarizer)
    dead_letters = DeadLetters(settings.topics, publish, store)
    gaps = GapIndex(store, worker.gap_timeout_seconds, locks=locks, shards=shards, wakes=wakes)
    liveness = Liveness(settings.health.liveness_timeout_seconds)
    compactor = Compactor(
        settings,
        store,
        locks=locks,
        jobs=jobs,
        outbox=outbox,
        archive=archive,
        breaker=breaker,
        publish=publish,
        summarizers=summarizers,
    )

    async def expire_held() -> Sweep:
        expired = await gaps.expire(dead_letters.held)
        return Sweep(len(expired), gaps.next_due_ms)

    async def backlog() -> Sweep:
        await observe_backlog(jobs, gaps, outbox)
        return Sweep(0, None)

    # Held turns and outbox leftovers are announced when they come due: their sweeps are only the
    # safety net, at the idle period. The jobs' sweep (the pool's own) backs off from sweep_interval.
    idle = worker.idle_sweep_max_seconds
    pool = CompactionPool(
        compactor,
        jobs,
        size=worker.max_concurrent_compactions,
        sweep_interval=worker.sweep_interval_seconds,
        idle_sweep_max=worker.idle_sweep_max_seconds,
        chores=(
            Chore("gaps", expire_held, floor=idle),
            Chore("outbox", outbox.relay, outbox.relay_due, floor=idle),
            Chore("backlog", backlog, floor=idle),
        ),
        wakes=wakes,
        liveness=liveness,
    )
    appends = Appends(redis, store.prefix, settings.redis.retention_seconds, jobs=jobs.index)
    turns = TurnHandler(settings, appends, gaps, dead_letters, on_scheduled=pool.submit)
    rewinder = Rewinder(settings, store, locks=locks, archive=archive, publish=publish)
    return Components(
        settings=settings,
        store=store,
        appends=appends,
        jobs=jobs,
        locks=locks,
        gaps=gaps,
        outbox=outbox,
        archive=archive,
        breaker=breaker,
        recall=Recall(store, archive),
        dead_letters=dead_letters,
        turns=turns,
        compactor=compactor,
        rewinder=rewinder,
        pool=pool,
        liveness=liveness,
    )


async def observe_backlog(jobs: JobQueue, gaps: GapIndex, outbox: Outbox) -> None:
    """Read the queues' sizes for the metrics' gauges (a sweeper chore, at the idle sweep's period)."""
    stats = await jobs.index.stats()
    oldest = stats.lowest_ms
    metrics.record_backlog(
        jobs_pending=stats.count,
        # A lowest score in the future is a delay or a running job's lock end: nothing is overdue then.
        oldest_due_age=max(0.0, now_ms() - oldest) / 1000 if oldest is not None else 0.0,
        held_turns=await gaps.held_count(),
        outbox_backlog=await outbox.index.count(),
    )
