"""The state's Lua scripts: read from package data (``lua/``), called with one JSON header.

Each ``.lua`` file belongs to the module that owns the structure it writes; a script is
library files (shared ``local function`` definitions) followed by its body.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError, ResponseError

from compaction_worker.observability import metrics
from compaction_worker.state.connection import RedisClient, is_cluster


@cache
def source(*files: str) -> str:
    """The text of a script made of these files, in order: ``name.lua`` is the state's (``state/lua``),
    ``package:name.lua`` another package's (``conversation:turn.lua``: ``conversation/lua``)."""
    return "\n".join(_lua(*name.rpartition(":")[::2]) for name in files)


def _lua(package: str, name: str) -> str:
    folder = resources.files(f"compaction_worker.{package or 'state'}").joinpath("lua")
    return folder.joinpath(name).read_text(encoding="utf-8")


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


@dataclass(slots=True)
class _Call:
    script: PositionalScript
    keys: Sequence[str]
    args: Sequence[str | bytes]
    reply: asyncio.Future[Any]

    def evalsha(self) -> tuple[str | bytes | int, ...]:
        return ("EVALSHA", self.script.sha, len(self.keys), *self.keys, *self.args)


class Pipeline:
    """The per-turn calls of one worker on one Redis, sent together, one send in flight.

    At agent pace every stored turn is a call of its own, and on a single Redis most of a
    lone call's cost is reading, dispatching and answering the request, not running the script
    (docs/performance.md, "Redis at agent pace"). So a call is never sent alone while another
    round trip is in flight: it waits for that one's reply and goes with every call made
    meanwhile, on one connection. Idle, a call goes at once (after the coroutines ready in the
    same turn of the loop have made theirs); under load the round trips grow instead of
    multiplying, so a worker keeps at most one connection busy with them and a busy Redis slows
    its workers down rather than queueing more of their requests. Each call keeps its own reply
    or error; an emptied script cache is reloaded and the calls it refused are sent again.
    """

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._waiting: list[_Call] = []
        self._sending: asyncio.Task[None] | None = None
        self.sends = 0
        """Sends of the waiting calls, each one round trip (two after a script reload; the tests count them)."""

    def call(
        self,
        script: PositionalScript,
        keys: Sequence[str],
        args: Sequence[str | bytes],
    ) -> asyncio.Future[Any]:
        """The reply to ``script`` run with ``keys`` and ``args``, once its round trip returns."""
        loop = asyncio.get_running_loop()
        if self._sending is not None and self._sending.get_loop() is not loop:
            # Left by another loop with a round trip in flight (one closed, or not running: its callback never ran).
            self._sending, self._waiting = None, [c for c in self._waiting if c.reply.get_loop() is loop]
        reply: asyncio.Future[Any] = loop.create_future()
        self._waiting.append(_Call(script, keys, args, reply))
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
        self.sends += 1
        started = time.perf_counter()
        try:
            replies = await self._replies(calls)
        except asyncio.CancelledError:
            for call in calls:
                call.reply.cancel()
            raise
        except Exception as e:  # the connection failed: every call of the round trip did
            for call in calls:
                if not call.reply.done():
                    call.reply.set_exception(e)
            return
        metrics.record_round_trip(time.perf_counter() - started, len(calls))
        for call, reply in zip(calls, replies, strict=True):
            if call.reply.done():  # its caller was cancelled meanwhile
                continue
            if isinstance(reply, Exception):
                call.reply.set_exception(reply)
            else:
                call.reply.set_result(reply)

    async def _replies(self, calls: list[_Call]) -> list[Any]:
        """Every call's reply, on one connection of the pool (a failed one is dropped, and the
        calls tried again as the client's retry policy says: each decides on what is stored)."""
        assert isinstance(self._redis, Redis), "a cluster client sends each call itself"
        pool = self._redis.connection_pool
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]  # redis-py's deprecation wrapper
        try:
            replies: list[Any] = await connection.retry.call_with_retry(
                lambda: self._exchanges(connection, calls), lambda _error: connection.disconnect()
            )
            return replies
        except BaseException:
            await connection.disconnect()  # it may be watching, or owe replies
            raise
        finally:
            await pool.release(connection)

    async def _exchanges(self, connection: AbstractConnection, calls: list[_Call]) -> list[Any]:
        """The scripts in one round trip; those a restarted (or flushed) Redis no longer knows are
        loaded and sent again."""
        replies = await self._exchange(connection, [call.evalsha() for call in calls])
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            loads = [("SCRIPT", "LOAD", script.source) for script in {calls[i].script for i in missing}]
            for loaded in await self._exchange(connection, loads):
                if isinstance(loaded, Exception):  # SCRIPT LOAD must not fail
                    raise loaded
            again = await self._exchange(connection, [calls[i].evalsha() for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def _exchange(
        self, connection: AbstractConnection, commands: Sequence[tuple[str | bytes | int, ...]]
    ) -> list[Any]:
        """One round trip: the commands sent together, their replies read in order (an error as its exception)."""
        if not commands:
            return []
        await connection.send_packed_command(connection.pack_commands(commands))
        replies: list[Any] = []
        for _ in commands:
            try:
                replies.append(await connection.read_response())
            except ResponseError as e:
                replies.append(e)
        return replies


class PositionalScript:
    """A registered script called with its keys and arguments by position, no header.

    Only the per-turn script (conversation/apply.py) is: it runs for every stored turn, and decoding a
    JSON header and building the lists' tables is a large share of its Redis time
    (docs/performance.md). Its Lua names every position once, in its header comment.

    On a single Redis the calls go through a :class:`Pipeline` (shared by the scripts given
    the same one). A cluster client sends each call itself (its pipelines split by node).
    """

    def __init__(
        self, redis: RedisClient, *files: str, prelude: str = "", pipeline: Pipeline | None = None
    ) -> None:
        """``prelude``: Lua put before the files (constants that Python defines, such as key names)."""
        self._script = redis.register_script(prelude + source(*files))
        self._cluster = is_cluster(redis)
        self._pipeline = pipeline or Pipeline(redis)

    @property
    def sha(self) -> str:
        return str(self._script.sha)

    @property
    def source(self) -> str:
        return str(self._script.script)

    async def __call__(self, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
        """The script's reply."""
        if self._cluster:
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
