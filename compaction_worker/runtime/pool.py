"""The compaction pool: due compactions run on a bounded set of tasks, each under its conversation's lock."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from compaction_worker.contracts.events import CompactionCompleted
from compaction_worker.observability import tracing
from compaction_worker.observability.health import Liveness
from compaction_worker.observability.logs import bound
from compaction_worker.runtime.compactor import Compactor
from compaction_worker.runtime.sweeper import Chore, Sweeper
from compaction_worker.state.index import Sweep, now_ms
from compaction_worker.state.jobs import JobQueue
from compaction_worker.state.wake import Wake, Wakes

log = logging.getLogger(__name__)


async def run_job(jobs: JobQueue, compactor: Compactor, conversation_id: str) -> CompactionCompleted | None:
    """Claim a conversation's job (its lock) and run it; None when the lock was busy or there was no job.

    One span covers the claim (the lock's wait) and the run, and continues the trace of the turn
    that asked for the job: its context is read before the lock, for the span only (the claim
    reads the job again under the lock).
    """
    parent = tracing.context_of(await jobs.traceparent(conversation_id)) if tracing.enabled() else None
    attributes = {
        "messaging.message.conversation_id": conversation_id,
        "gen_ai.conversation.id": conversation_id,
    }
    with (
        bound(conversation_id=conversation_id),
        tracing.span(tracing.RUN_SPAN, attributes, context=parent) as span,
    ):
        async with jobs.claim(conversation_id) as claim:
            if claim is None:
                span.set_attribute("compaction.outcome", "skipped")
                return None
            return await compactor.run(claim)


@dataclass(eq=False)
class CompactionPool:
    """Runs due compactions on at most ``size`` concurrent tasks, fed by the job index and its wake-ups."""

    compactor: Compactor
    jobs: JobQueue
    size: int
    sweep_interval: float
    """How soon a sweep of an index follows one that found work; the floor of the idle backoff."""
    idle_sweep_max: float = 60.0
    """The idle backoff's ceiling: the safety sweep's period when nothing happens."""
    chores: Sequence[Chore] = ()
    """Other work that rides on the sweeper (the wiring's: expiring turns held behind a gap,
    relaying completion events a dead worker left in the outbox, the backlog gauges)."""
    wakes: Wakes | None = None
    """The wake-up set the pool waits on while it has room; None: sweeps alone."""
    liveness: Liveness | None = None
    """Beaten ("sweep") by the sweeper's loop, failed passes too: /livez watches the loop, not Redis."""
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    completed: int = 0
    failed: int = 0
    _sweeper: Sweeper | None = None
    _stopping: bool = False
    _backlog: bool = False
    """A sweep or a wake-up found a due job with no room for it: sweep again when a slot frees."""
    _again: set[str] = field(default_factory=set)
    """Running jobs found due again (a request came meanwhile): looked at again when they end."""

    def start(self) -> None:
        """Start the sweeper that picks up due jobs (ours, and those of dead workers)."""
        jobs = Chore("jobs", self.sweep, self.look)
        self._sweeper = Sweeper(
            [jobs, *self.chores], self.sweep_interval, self.idle_sweep_max, self.wakes, liveness=self.liveness
        )
        self._update_room()
        self._sweeper.start()

    def submit(self, conversation_id: str) -> None:
        """Fast path after a turn scheduled a job: run it now if the pool runs and a slot is free."""
        if self._sweeper is None or self._stopping or conversation_id in self.tasks:
            return  # its wake-up or a sweep finds it; a running job's finish looks again
        if len(self.tasks) >= self.size:
            self._backlog = True  # sweep when a slot frees, unless a worker with room took it
            return
        self._spawn(conversation_id)

    async def sweep(self) -> Sweep:
        """Start tasks for due jobs while slots are free; returns how many started, and when the next is due."""
        free = self.size - len(self.tasks)
        if free <= 0:
            self._backlog = True
            return Sweep(0, None)
        # Room for our own running jobs in the page (a writer may have made them due again).
        scan = await self.jobs.scan(len(self.tasks) + 2 * free)
        started = 0
        left: list[str] = []
        for cid in scan.due:
            if cid in self.tasks:
                self._again.add(cid)
                continue
            if len(self.tasks) >= self.size:
                left.append(cid)
                continue
            self._spawn(cid)
            started += 1
        await self._pass_on(left)
        return Sweep(started, scan.next_ms)

    async def look(self, conversation_id: str) -> float | None:
        """Run an announced job if it is due and a slot is free; else when to look again (ms), None: never."""
        if self._stopping:
            return None
        if conversation_id in self.tasks:  # running here: due again (a new request), look when it ends
            self._again.add(conversation_id)
            return None
        score = await self.jobs.index.score(conversation_id)
        if score is None or score > now_ms():
            return score
        if len(self.tasks) >= self.size:
            await self._pass_on([conversation_id])
        else:
            self._spawn(conversation_id)
        return None

    async def _pass_on(self, due: list[str]) -> None:
        """Announce due jobs this pool has no room for, so that a worker with room takes them."""
        self._backlog = self._backlog or bool(due)
        if due and self.wakes is not None:
            at = now_ms()
            await self.wakes.announce(*(Wake("jobs", cid, at) for cid in due))

    def _spawn(self, conversation_id: str) -> None:
        # A context of its own: not the turn's that asked for it (its bound log fields, its span).
        task = asyncio.create_task(
            self._run(conversation_id), name=f"compaction:{conversation_id}", context=contextvars.Context()
        )
        self.tasks[conversation_id] = task
        self._update_room()
        task.add_done_callback(lambda _t: self._done(conversation_id))

    def _done(self, conversation_id: str) -> None:
        self.tasks.pop(conversation_id, None)
        self._update_room()
        if self._sweeper is None or self._stopping:
            return
        if conversation_id in self._again:
            self._again.discard(conversation_id)
            self._sweeper.wake_at(Wake("jobs", conversation_id, now_ms()))
        if self._backlog:
            self._backlog = False
            self._sweeper.poke("jobs")

    def _update_room(self) -> None:
        if self._sweeper is None:
            return
        if len(self.tasks) < self.size and not self._stopping:
            self._sweeper.room.set()
        else:
            self._sweeper.room.clear()

    async def _run(self, conversation_id: str) -> None:
        try:
            if await run_job(self.jobs, self.compactor, conversation_id) is not None:
                self.completed += 1
        except asyncio.CancelledError:
            raise
        except Exception:  # one conversation's failure must not stop the pool
            self.failed += 1
            log.exception("compaction task for %s failed", conversation_id)

    async def stop(self, grace: float) -> None:
        """Stop sweeping, let running compactions finish within ``grace``, hand back the rest."""
        self._stopping = True
        if self._sweeper is not None:
            self._update_room()
            await self._sweeper.stop()
        running = list(self.tasks.values())
        if running:
            _, pending = await asyncio.wait(running, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5)
                log.warning("handed back %d unfinished compactions", len(pending))

    def __repr__(self) -> str:
        return f"<CompactionPool running={len(self.tasks)}/{self.size} completed={self.completed} failed={self.failed}>"
