"""The compaction pool: due compactions run on a bounded set of tasks, fed by the job index."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from compaction_worker.observability.health import Liveness
from compaction_worker.runtime.compactor import Compactor
from compaction_worker.state.jobs import JobQueue

log = logging.getLogger(__name__)

Chore = Callable[[], Awaitable[object]]
"""Periodic work the sweeper runs after each sweep; its errors are logged, never raised."""


@dataclass
class CompactionPool:
    """Runs due compactions on at most ``size`` concurrent tasks, fed by the job index."""

    compactor: Compactor
    jobs: JobQueue
    size: int
    sweep_interval: float
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    chores: Sequence[Chore] = ()
    """Other periodic work that rides on the sweeper's loop (the wiring's: expiring turns held
    behind a gap, publishing completion events that a dead worker left in the outbox)."""
    liveness: Liveness | None = None
    """Beaten ("sweep") after every pass, failed ones too: /livez watches the loop, not Redis."""
    completed: int = 0
    failed: int = 0
    _sweeper: asyncio.Task[None] | None = None
    _stopping: bool = False

    def start(self) -> None:
        """Start the sweeper that picks up due jobs (ours, and those of dead workers)."""
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="compaction-sweeper")

    def submit(self, conversation_id: str) -> None:
        """Fast path after a turn scheduled a job: run it now if the pool runs and a slot is free."""
        busy = conversation_id in self.tasks or len(self.tasks) >= self.size
        if self._sweeper is None or self._stopping or busy:
            return  # the sweeper will find it
        self._spawn(conversation_id)

    def _spawn(self, conversation_id: str) -> None:
        task = asyncio.create_task(self._run(conversation_id), name=f"compaction:{conversation_id}")
        self.tasks[conversation_id] = task
        task.add_done_callback(lambda _t: self.tasks.pop(conversation_id, None))

    async def _run(self, conversation_id: str) -> None:
        try:
            claim = await self.jobs.claim(conversation_id)
            if claim is None:
                return
            try:
                completed = await self.compactor.run(claim)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.jobs.hand_back(claim))
                raise
            if completed is not None:
                self.completed += 1
        except asyncio.CancelledError:
            raise
        except Exception:  # one conversation's failure must not stop the pool
            self.failed += 1
            log.exception("compaction task for %s failed", conversation_id)

    async def _sweep_forever(self) -> None:
        while not self._stopping:
            for work in (self.sweep, *self.chores):
                try:
                    await work()
                except Exception:  # Redis or Kafka away: try again next interval
                    log.warning("sweep failed", exc_info=True)
            if self.liveness is not None:
                self.liveness.beat("sweep")
            await asyncio.sleep(self.sweep_interval)

    async def sweep(self) -> int:
        """Start tasks for due jobs while slots are free; returns how many started."""
        free = self.size - len(self.tasks)
        if free <= 0:
            return 0
        started = 0
        for cid in await self.jobs.due(free * 2):
            if len(self.tasks) >= self.size:
                break
            if cid not in self.tasks:
                self._spawn(cid)
                started += 1
        return started

    async def stop(self, grace: float) -> None:
        """Stop sweeping, let running compactions finish within ``grace``, hand back the rest."""
        self._stopping = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
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
