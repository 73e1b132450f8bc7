"""The one place that loads LiteLLM, set up for a process without internet access.

Importing this module is cheap: it fixes the environment LiteLLM and tiktoken read (the
local model map, the bundled tokenizer files) without importing LiteLLM, which takes
seconds. ``model_map()`` reads LiteLLM's bundled model map without importing it (the window
registry needs nothing else); ``load()`` imports LiteLLM the first time an LLM call needs it,
and ``loaded()`` waits for that import off the event loop. A worker imports it at its first LLM
summary, never before: consuming turns needs none of it, and a worker started under a backlog
would otherwise share its CPU with the import (``bench --only cold_backlog``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import gc
import importlib
import importlib.util
import json
import os
import threading
from pathlib import Path
from typing import Any

# LiteLLM fetches its model map from the network on import unless this is set.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _package_dir() -> Path:
    """LiteLLM's installed package directory, found without importing LiteLLM."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:  # pragma: no cover - a dependency
        raise ModuleNotFoundError("litellm")
    return Path(spec.submodule_search_locations[0])


# What LiteLLM's default_encoding module sets on import (a custom directory wins, else its
# bundled files), set here before tiktoken is first asked for an encoding, so counting works
# offline without LiteLLM.
os.environ["TIKTOKEN_CACHE_DIR"] = os.environ.get("CUSTOM_TIKTOKEN_CACHE_DIR") or str(
    _package_dir() / "litellm_core_utils" / "tokenizers"
)

TIKTOKEN_CACHE_DIR = Path(os.environ["TIKTOKEN_CACHE_DIR"])
"""Where tiktoken reads its encodings from in this process."""


MODEL_MAP_FILE = "model_prices_and_context_window_backup.json"
"""LiteLLM's bundled model map: what ``litellm.model_cost`` holds offline."""


@functools.cache
def model_map() -> dict[str, dict[str, Any]]:
    """LiteLLM's bundled model map (name to limits and prices), read without importing LiteLLM.

    Its ``alias_of`` entries ("claude-haiku-latest") are resolved to the entry they name.
    ~30 ms, against seconds for importing LiteLLM: the window registry reads this, so a
    worker consumes before LiteLLM has loaded.
    """
    raw = json.loads((_package_dir() / MODEL_MAP_FILE).read_text(encoding="utf-8"))
    entries = {k: v for k, v in raw.items() if isinstance(v, dict) and k != "sample_spec"}
    for name in list(entries):
        entry, seen = entries[name], {name}
        while isinstance(target := entry.get("alias_of"), str) and target not in seen:
            seen.add(target)
            entry = entries.get(target, {})
        entries[name] = entry
    return {k: v for k, v in entries.items() if "alias_of" not in v and v}


class _Import:
    """The one import of LiteLLM in this process, on a thread of its own, once :func:`loaded` asks for it."""

    lock = threading.Lock()
    future: concurrent.futures.Future[Any] | None = None


@functools.cache
def load() -> Any:
    """LiteLLM, imported on first use (seconds: off the event loop, see :func:`loaded`).

    A process that froze what it held (a serving worker, ``runtime.worker.tune_gc``) freezes
    LiteLLM's objects too: ~300K that live as long as it, which full collections then skip.
    """
    module = importlib.import_module("litellm")
    # "Provider List: ..." banners on stdout for every unmapped model otherwise.
    module.suppress_debug_info = True  # type: ignore[attr-defined]  # LiteLLM's flag, not in ModuleType
    if gc.get_freeze_count():
        gc.freeze()
    return module


async def loaded() -> Any:
    """LiteLLM, imported on a thread the first time so that the event loop keeps running.

    Every caller waits for the same import, on a thread of its own: a summary due in many
    conversations at once does not fill the loop's default executor with threads waiting on
    the import lock. A caller cancelled while it waits leaves the import running for the others.
    """
    if load.cache_info().currsize:
        return load()
    with _Import.lock:
        started = _Import.future
        if started is None or (started.done() and started.exception() is not None):
            started = _Import.future = concurrent.futures.Future()
            started.set_running_or_notify_cancel()  # a waiter's cancellation does not cancel it
            threading.Thread(target=_run_import, args=(started,), name="load-litellm", daemon=True).start()
    return await asyncio.wrap_future(started)


def _run_import(future: concurrent.futures.Future[Any]) -> None:
    try:
        future.set_result(load())
    except BaseException as e:  # the waiting summary reports it (and falls back)
        future.set_exception(e)


def __getattr__(name: str) -> Any:
    # ``from compaction_worker._litellm import litellm`` loads it on first use.
    if name == "litellm":
        return load()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MODEL_MAP_FILE", "TIKTOKEN_CACHE_DIR", "load", "loaded", "model_map"]
