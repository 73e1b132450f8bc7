"""Run a compaction's synchronous CPU off the event loop, on one shared thread."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# One thread, not asyncio.to_thread's pool: the work is mostly pure Python and holds the GIL,
# so more threads do not finish sooner, and the event loop would wait for each of them in turn
# (a switch interval apiece) whenever it needs the GIL back: turns' latency grows with them.
# The executor starts its thread on the first call, not at import.
_CPU = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compaction-cpu")


async def off_loop(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on the compaction thread, with the caller's context (span parents)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_CPU, call)
