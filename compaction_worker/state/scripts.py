"""The state's Lua scripts: read from package data (``lua/``), called with one JSON header.

Each ``.lua`` file belongs to the module that owns the structure it writes; a script is
library files (shared ``local function`` definitions) followed by its body.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

from compaction_worker.state.connection import RedisClient


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

    Only the per-turn script (appends.py) is: it runs for every stored turn, and decoding a
    JSON header and building the lists' tables was a fifth of its Redis time (measured in
    docs/performance.md). Its Lua names every position once, in its header comment.
    """

    def __init__(self, redis: RedisClient, *files: str) -> None:
        self._script = redis.register_script(source(*files))

    async def __call__(self, keys: Sequence[str], args: Sequence[str | bytes]) -> Any:
        return await self._script(keys=list(keys), args=list(args))


def encode(value: object) -> str:
    """Compact JSON, non-ASCII text kept as is (what every stored JSON value uses)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def as_text(value: object) -> str:
    """A Redis reply as text (clients may or may not decode responses)."""
    return value.decode() if isinstance(value, bytes) else str(value)
