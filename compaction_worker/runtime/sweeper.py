"""When a worker looks at the indexes: announced wake-ups, timers, and a safety sweep that backs off.

An idle worker sends Redis almost nothing. While it has room it blocks on the wake-up set
(state/wake.py), which every write that arms an index entry also writes; what it pops
becomes a timer, and the chore of that index acts on the one conversation when the timer
comes due. Each chore (jobs, held turns, outbox, backlog gauges) also sweeps its index: at
once when it did something last time or when its next entry is due, else after a backoff that
doubles from ``sweep_interval`` to ``idle_max`` (docs/design.md, "Waking"). A sweep that fails
(Redis away) waits the retry driver's backoff instead (retry.py: full jitter, so that the
workers that lost Redis together do not sweep together when it is back).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from compaction_worker.observability.health import Liveness
from compaction_worker.retry import RetryPolicy
from compaction_worker.state.index import Sweep
from compaction_worker.state.wake import Wake, Wakes

log = logging.getLogger(__name__)

WAKE_WAIT_SECONDS = 10.0
"""How long one blocking pop waits: well under the Redis client's socket timeout (30 s)."""
HEARTBEAT_SECONDS = 5.0
"""The loop beats liveness at least this often, idle or not (no Redis command involved)."""

Look = Callable[[str], Awaitable[float | None]]
"""Acts on one announced conversation; returns when to look at it again (epoch ms), None: not at all."""


@dataclass(eq=False)
class Chore:
    """Work over one index: a sweep of it, and what to do about one announced conversation."""

    name: str
    """The index's kind in its wake-ups (``jobs``, ``gaps``, ``outbox``), or a name of its own."""
    sweep: Callable[[], Awaitable[Sweep]]
    look: Look | None = None
    """None: an announcement of this kind runs the sweep instead."""
    floor: float | None = None
    """The first interval after a sweep that did nothing; default: the sweeper's ``interval``."""
    next_at: float = 0.0
    backoff: float = 0.0
    failures: int = 0
    """Sweeps in a row that failed."""


@dataclass(eq=False)
class Sweeper:
    """Runs the chores when due, and the timers of the wake-ups it pops while there is room."""

    chores: Sequence[Chore]
    interval: float
    idle_max: float
    wakes: Wakes | None = None
    room: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while the pool can take a job: only then does the sweeper take wake-ups."""
    liveness: Liveness | None = None
    _timers: list[tuple[float, int, Wake]] = field(default_factory=list)
    _earliest: dict[str, float] = field(default_factory=dict)
    """Each entry's earliest timer (by wake-up member): a later one for the same entry is not kept."""
    _order: itertools.count[int] = field(default_factory=itertools.count)
    _event: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _stopped: bool = False

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._loop(), name="sweeper"))
        if self.wakes is not None:
            self._tasks.append(asyncio.create_task(self._listen(), name="sweeper-wakes"))

    async def stop(self) -> None:
        """Stop, and hand the wake-ups it held back to the other workers.

        The loops also stop on a flag: a cancellation can be lost inside a Redis call
        (Python 3.11's ``asyncio.wait_for``, see state/lock.py), and must not leave them running.
        """
        self._stopped = True
        self._event.set()
        self.room.set()
        for task in self._tasks:
            while not task.done():  # again if a cancellation was lost (a blocking pop would wait it out)
                task.cancel()
                await asyncio.wait([task], timeout=0.1)
        self._tasks.clear()
        held = [wake for _, _, wake in self._timers if self._earliest.get(wake.member) == wake.at_ms]
        self._timers.clear()
        self._earliest.clear()
        if held and self.wakes is not None:
            try:
                await self.wakes.announce(*held)
            except Exception:  # the safety sweeps of the others find them
                log.warning("could not hand back %d wake-ups", len(held), exc_info=True)

    def poke(self, name: str) -> None:
        """Run the named chore's sweep at once."""
        for chore in self.chores:
            if chore.name == name:
                chore.next_at = 0.0
        self._event.set()

    def wake_at(self, wake: Wake) -> None:
        """Act on ``wake`` when its time comes (unless a timer for the same entry comes sooner:
        that one looks, and sets the next if the entry is due later)."""
        earliest = self._earliest.get(wake.member)
        if earliest is not None and earliest <= wake.at_ms:
            return
        self._earliest[wake.member] = wake.at_ms
        heapq.heappush(self._timers, (wake.at_ms / 1000, next(self._order), wake))
        self._event.set()

    def _failed(self, floor: float) -> RetryPolicy:
        """How long a failed look at Redis waits: from ``floor``, doubling to ``idle_max``, jittered."""
        return RetryPolicy(0, floor, max(self.idle_max, floor))

    async def _loop(self) -> None:
        while not self._stopped:
            self._event.clear()
            now = time.time()
            for chore in self.chores:
                if chore.next_at <= now:
                    await self._sweep(chore)
            while self._timers and self._timers[0][0] <= time.time():
                _, _, wake = heapq.heappop(self._timers)
                if self._earliest.get(wake.member) != wake.at_ms:
                    continue  # an earlier timer of the same entry looked already
                del self._earliest[wake.member]
                await self._look(wake)
            if self.liveness is not None:
                self.liveness.beat("sweep")
            upcoming = min([c.next_at for c in self.chores] + [t[0] for t in self._timers[:1]] + [math.inf])
            wait = min(max(0.0, upcoming - time.time()), HEARTBEAT_SECONDS)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._event.wait()

    async def _sweep(self, chore: Chore) -> None:
        started = time.time()
        floor = self.interval if chore.floor is None else chore.floor
        try:
            swept = await chore.sweep()
        except Exception:  # Redis or Kafka away: the driver's backoff, jittered
            chore.failures += 1
            log.warning("sweep of %s failed", chore.name, exc_info=chore.failures == 1)
            chore.backoff = self._failed(floor).backoff(chore.failures)
            chore.next_at = started + chore.backoff
            return
        recovered, chore.failures = chore.failures > 0, 0
        if swept.done or recovered:  # idle after failures: the doubling starts again from the floor
            chore.backoff = floor
        else:
            chore.backoff = min(max(chore.backoff * 2, floor), max(self.idle_max, floor))
        chore.next_at = started + chore.backoff
        # The next entry's time, unless the pass did nothing and that time has come already
        # (what it could not act on must not make a hot loop).
        if swept.next_ms is not None and (swept.done or swept.next_ms / 1000 > started):
            chore.next_at = min(chore.next_at, swept.next_ms / 1000)

    async def _look(self, wake: Wake) -> None:
        chore = next((c for c in self.chores if c.name == wake.kind), None)
        if chore is None:  # an index this worker does not serve
            return
        if chore.look is None:
            chore.next_at = 0.0
            self._event.set()
            return
        try:
            again = await chore.look(wake.conversation_id)
        except Exception:  # Redis away: the chore's sweep finds it later
            log.warning("looking at %s of %s failed", wake.kind, wake.conversation_id, exc_info=True)
            chore.next_at = min(chore.next_at, time.time() + self.interval)
            return
        if again is not None:
            self.wake_at(Wake(wake.kind, wake.conversation_id, again))

    async def _listen(self) -> None:
        assert self.wakes is not None
        failures = 0
        while not self._stopped:
            await self.room.wait()
            if self._stopped:
                return
            try:
                wake = await self.wakes.next(WAKE_WAIT_SECONDS)
            except Exception:  # Redis away: wait a while, the sweeps go on
                failures += 1
                log.warning("waiting for wake-ups failed", exc_info=failures == 1)
                # Full jitter: the workers that lost Redis together do not come back together.
                await asyncio.sleep(self._failed(self.interval).backoff(failures))
                continue
            failures = 0
            if wake is not None:
                self.wake_at(wake)  # popped while stopping: stop() hands it back
