"""The state's Lua scripts: read from package data (``lua/``), called with one JSON header.

Each ``.lua`` file belongs to the module that owns the structure it writes; a script is
library files (shared ``local function`` definitions) followed by its body.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any, TypeAlias

from redis.exceptions import NoScriptError

from compaction_worker.observability import metrics
from compaction_worker.state.connection import RedisClient, is_cluster


@cache
def source(*files: str) -> str:
    """The text of a script made of these files, in order."""
    folder = resources.files("compaction_worker.state").joinpath("lua")
    return "\n".join(folder.joinpath(name).read_text(encoding="utf-8") for name in files)


class Script:
    """A registered script, called with its keys, a header of named fields, and lists of strings.

    The header is ``ARGV[1]`` (JSON); the lists follow it, and ``args.lua`` hands them to
    the script as fields of the header, so neither side counts argument positions. Lists
    carry payloads (records, entries) as they are, without a second JSON encoding. cjson
    reads JSON numbers as doubles and a script writes them back with 14 significant digits:
    a number the script stores, or compares with stored text, travels as a string.
    """

    def __init__(self, redis: RedisClient, *files: str) -> None:
        self._script = redis.register_script(source("args.lua", *files))

    async def __call__(
        self, keys: Sequence[str], lists: Mapping[str, Sequence[str | bytes]] | None = None, /, **header: Any
    ) -> Any:
        if lists:
            header["lists"] = [[name, len(items)] for name, items in lists.items()]
        payload = [item for items in (lists or {}).values() for item in items]
        return await self._script(keys=list(keys), args=[encode(header), *payload])


_Call: TypeAlias = tuple["PositionalScript", Sequence[str], Sequence["str | bytes"], "asyncio.Future[Any]"]


class Pipeline:
    """The per-turn script calls of one worker on one Redis, sent together, one round trip in flight.

    At agent pace every stored turn is a script call of its own, and on a single Redis most of a
    lone call's cost is reading, dispatching and answering the request, not running the script
    (docs/performance.md, "Redis at agent pace"). So a call is never sent alone while another
    round trip is in flight: it waits for that one's reply and goes with every call made
    meanwhile, in one pipeline on one connection. Idle, a call goes at once (after the
    coroutines ready in the same turn of the loop have made theirs); under load the round trips
    grow instead of multiplying, so a worker keeps at most one connection busy with them and a
    busy Redis slows its workers down rather than queueing more of their requests.
    Each call keeps its own reply or error; an emptied script cache is reloaded and the calls
    it refused are sent again.
    """

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._waiting: list[_Call] = []
        self._sending: asyncio.Task[None] | None = None
        self.round_trips = 0
        """Round trips sent (the tests count them)."""

    def call(
        self, script: PositionalScript, keys: Sequence[str], args: Sequence[str | bytes]
    ) -> asyncio.Future[Any]:
        """The reply to ``script`` run with ``keys`` and ``args``, once its round trip returns."""
        loop = asyncio.get_running_loop()
        if self._sending is not None and self._sending.get_loop() is not loop:
            # Left by a loop that closed with a round trip in flight (its callback never ran).
            self._sending, self._waiting = None, [c for c in self._waiting if c[3].get_loop() is loop]
        reply: asyncio.Future[Any] = loop.create_future()
        self._waiting.append((script, keys, args, reply))
        if len(self._waiting) == 1 and self._sending is None:
            loop.call_soon(self._send_waiting)
        return reply

    def _send_waiting(self) -> None:
        if self._sending is not None or not self._waiting:
            return
        calls, self._waiting = self._waiting, []
        self._sending = asyncio.ensure_future(self._send(calls))
        self._sending.add_done_callback(self._sent)

    def _sent(self, _task: asyncio.Task[None]) -> None:
        self._sending = None
        self._send_waiting()  # the calls made meanwhile, together

    async def _send(self, calls: list[_Call]) -> None:
        self.round_trips += 1
        started = time.perf_counter()
        try:
            replies = await self._pipelined(calls)
            missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
            if missing:  # a restarted (or flushed) Redis: load the scripts, then send those again
                for script in {calls[i][0] for i in missing}:
                    await self._redis.script_load(script.source)
                again = await self._pipelined([calls[i] for i in missing])
                for i, reply in zip(missing, again, strict=True):
                    replies[i] = reply
        except asyncio.CancelledError:
            for *_, future in calls:
                future.cancel()
            raise
        except Exception as e:  # the connection failed: every call of the round trip did
            for *_, future in calls:
                if not future.done():
                    future.set_exception(e)
            return
        metrics.record_round_trip(time.perf_counter() - started, len(calls))
        for (*_, future), reply in zip(calls, replies, strict=True):
            if future.done():  # its caller was cancelled meanwhile
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _pipelined(self, calls: Sequence[_Call]) -> list[Any]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for script, keys, args, _ in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            return list(await pipe.execute(raise_on_error=False))


class PositionalScript:
    """A registered script called with its keys and arguments by position, no header.

    Only the per-turn scripts (appends.py) are: they run for every stored turn, and decoding a
    JSON header and building the lists' tables was a fifth of their Redis time (measured in
    docs/performance.md). Their Lua names every position once, in its header comment.

    On a single Redis the calls go through a :class:`Pipeline` (shared by the scripts given
    the same one). A cluster client sends each call itself (its pipelines split by node).
    """

    def __init__(self, redis: RedisClient, *files: str, pipeline: Pipeline | None = None) -> None:
        self._script = redis.register_script(source(*files))
        self._redis = redis
        self._pipeline = pipeline or Pipeline(redis)

    @property
    def sha(self) -> str:
        return str(self._script.sha)

    @property
    def source(self) -> str:
        return str(self._script.script)

    async def __call__(self, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
        if is_cluster(self._redis):
            started = time.perf_counter()
            reply = await self._script(keys=list(keys), args=list(args))
            metrics.record_round_trip(time.perf_counter() - started, 1)
            return reply
        return await self._pipeline.call(self, keys, args)


def encode(value: object) -> str:
    """Compact JSON, non-ASCII text kept as is (what every stored JSON value uses)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def as_text(value: object) -> str:
    """A Redis reply as text (clients may or may not decode responses)."""
    return value.decode() if isinstance(value, bytes) else str(value)
