"""The state's Lua scripts: read from package data (``lua/``), called with one JSON header.

Each ``.lua`` file belongs to the module that owns the structure it writes; a script is
library files (shared ``local function`` definitions) followed by its body.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

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


class PositionalScript:
    """A registered script called with its keys and arguments by position, no header.

    Only the per-turn scripts (appends.py) are: they run for every stored turn, and decoding a
    JSON header and building the lists' tables was a fifth of their Redis time (measured in
    docs/performance.md). Their Lua names every position once, in its header comment.

    On a single Redis, the calls made in one turn of the event loop (the conversations of a
    batch whose turns are ready together) travel in one pipeline, one round trip: at agent
    pace every turn is a call of its own, and Redis spent most of a call's CPU reading,
    dispatching and answering the request, not running the script (docs/performance.md). A
    cluster client sends each call itself (its pipelines split by node).
    """

    def __init__(self, redis: RedisClient, *files: str) -> None:
        self._script = redis.register_script(source(*files))
        self._redis = redis
        self._waiting: list[tuple[Sequence[str], Sequence[str | bytes], asyncio.Future[Any]]] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def __call__(self, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
        if is_cluster(self._redis):
            return await self._script(keys=list(keys), args=list(args))
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Any] = loop.create_future()
        self._waiting.append((keys, args, reply))
        if len(self._waiting) == 1:
            # After every coroutine ready in this turn of the loop has made its call.
            loop.call_soon(self._send_waiting)
        return await reply

    def _send_waiting(self) -> None:
        calls, self._waiting = self._waiting, []
        task = asyncio.ensure_future(self._send(calls))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(
        self, calls: list[tuple[Sequence[str], Sequence[str | bytes], asyncio.Future[Any]]]
    ) -> None:
        try:
            replies = await self._pipelined([(keys, args) for keys, args, _ in calls])
            missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
            if missing:  # a restarted (or flushed) Redis: load the script, then send those again
                await self._redis.script_load(self._script.script)
                again = await self._pipelined([(calls[i][0], calls[i][1]) for i in missing])
                for i, reply in zip(missing, again, strict=True):
                    replies[i] = reply
        except asyncio.CancelledError:
            for _, _, future in calls:
                future.cancel()
            raise
        except Exception as e:  # the connection failed: every call of the round trip did
            for _, _, future in calls:
                if not future.done():
                    future.set_exception(e)
            return
        for (_, _, future), reply in zip(calls, replies, strict=True):
            if future.done():  # its caller was cancelled meanwhile
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    async def _pipelined(self, calls: Sequence[tuple[Sequence[str], Sequence[str | bytes]]]) -> list[Any]:
        sha = self._script.sha
        async with self._redis.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                pipe.evalsha(sha, len(keys), *keys, *args)
            return list(await pipe.execute(raise_on_error=False))


def encode(value: object) -> str:
    """Compact JSON, non-ASCII text kept as is (what every stored JSON value uses)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def as_text(value: object) -> str:
    """A Redis reply as text (clients may or may not decode responses)."""
    return value.decode() if isinstance(value, bytes) else str(value)
