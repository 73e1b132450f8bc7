"""Redis's own figures for what its clients cost it: commands sent, commands scripts ran, command time, CPU.

Two sources, each exact for what it gives:

- ``INFO commandstats`` (and ``INFO cpu``), read before and after a run: every command Redis
  executed, by name, with its time. It counts the commands a script calls as well as the
  ``EVALSHA`` that ran it, and a script's time includes theirs.
- ``MONITOR``: one line per executed command, those a script calls tagged ``[0 lua]`` and the
  others with the client's address. Counting its lines splits what clients *sent* from
  what ran *inside scripts*. It slows Redis, so its runs are never timed.

The meter's own connection is left out of both (its ``INFO``, the ``ECHO`` that ends a
``MONITOR`` count); nothing else must use Redis during a counted run.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

SCRIPT_CALLS = frozenset({"eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro"})
"""Commands that run a script: sent by a client, never inside a script."""
TRANSACTION = "exec"
"""Runs the commands queued since ``MULTI``: its time includes theirs, which ``commandstats`` also
counts under their own names (and ``MONITOR`` shows as sent)."""
OWN = frozenset({"info"})
"""What the meter's snapshots send (the first snapshot's ``INFO`` shows in the second)."""
_LINE = re.compile(rb'\[\d+ (.*?)\] "([^"]*)"')


@dataclass(frozen=True, slots=True)
class Snapshot:
    """``INFO commandstats`` and the process's CPU (user + system) at one moment, or the difference of two."""

    calls: Counter[str]
    usec: Counter[str]
    cpu_seconds: float

    def cpu_per_turn(self, seconds: float, turns: int, idle_cpu: float) -> float:
        """Redis process CPU µs per stored turn over this phase (a difference), less an idle worker's
        ``idle_cpu`` seconds per second over its ``seconds``."""
        return max(0.0, self.cpu_seconds - idle_cpu * seconds) * 1e6 / turns

    def __sub__(self, before: Snapshot) -> Snapshot:
        calls, usec = Counter(self.calls), Counter(self.usec)
        calls.subtract(before.calls)
        usec.subtract(before.usec)
        for name in OWN:
            calls.pop(name, None)
            usec.pop(name, None)
        return Snapshot(+calls, +usec, self.cpu_seconds - before.cpu_seconds)


def parse_info(info: Mapping[str, Any]) -> Snapshot:
    """A snapshot from ``INFO cpu commandstats`` as redis-py parses it (``cmdstat_hget: {calls, usec}``)."""
    calls: Counter[str] = Counter()
    usec: Counter[str] = Counter()
    for key, value in info.items():
        if key.startswith("cmdstat_") and isinstance(value, Mapping):
            name = key.removeprefix("cmdstat_")
            calls[name], usec[name] = int(value["calls"]), int(value["usec"])
    # The process's CPU, user and system, every thread (what a Redis core has to give).
    cpu = float(info.get("used_cpu_sys", 0.0)) + float(info.get("used_cpu_user", 0.0))
    return Snapshot(calls, usec, cpu)


@dataclass(slots=True)
class Monitored:
    """The commands executed while a ``MONITOR`` count was open, by name (lower case, no subcommand)."""

    sent: Counter[str] = field(default_factory=Counter)
    """Sent by a client (other than the meter)."""
    inside: Counter[str] = field(default_factory=Counter)
    """Called by a script (``[0 lua]``)."""
    clients: set[str] = field(default_factory=set)
    """The addresses that sent them."""

    def count(self, line: bytes, own: str, end: bytes) -> bool:
        """Count one ``MONITOR`` line; False once it is the meter's ``end`` marker (the meter's others are skipped)."""
        match = _LINE.search(line, 0, 400)
        if match is None:
            return True
        client, name = match.group(1).decode(), match.group(2).decode().lower()
        if client == "lua":
            self.inside[name] += 1
        elif client == own:
            return end not in line
        else:
            self.sent[name] += 1
            self.clients.add(client)
        return True


class Meter:
    """Reads a single Redis's counters over one connection of its own (``async with``)."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self.own = redis.client()  # one connection: its address is known, and left out
        self.address = ""

    async def __aenter__(self) -> Meter:
        self.address = str((await self.own.client_info())["addr"])
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.own.aclose()

    async def snapshot(self) -> Snapshot:
        """The command counts and times so far (one ``INFO`` call)."""
        return parse_info(await self.own.info("cpu", "commandstats"))

    async def spent(self, work: Awaitable[object]) -> tuple[Snapshot, float]:
        """What Redis spent while ``work`` ran (the difference of two snapshots), and the seconds it took."""
        before, started = await self.snapshot(), time.monotonic()
        await work
        return await self.snapshot() - before, time.monotonic() - started

    @contextlib.asynccontextmanager
    async def monitor(self) -> AsyncIterator[Monitored]:
        """Count the commands executed inside the block; every one of them is counted on leaving it."""
        counted, end = Monitored(), f"end-of-count-{uuid.uuid4().hex}"
        async with self.redis.monitor() as monitor:
            connection: Any = monitor.connection  # redis-py: the monitor's own connection

            async def read() -> None:
                while True:
                    line = await connection.read_response(disable_decoding=True)
                    if not counted.count(line, self.address, end.encode()):
                        return

            reader = asyncio.create_task(read())
            try:
                yield counted
                # Redis runs this after every command before it, and feeds them to the monitor in that order.
                await self.own.echo(end)
                await reader
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
