"""The client for runtimes that are not async: :class:`Client`'s methods, blocking.

A :class:`SyncClient` runs one private event loop in a background thread and hands each
call to it; the caller's thread blocks until the result is back. The loop owns the Redis
connection and the Kafka producer, which are bound to the loop that made them, so every
call goes through it (from any thread). Closing the client stops the loop and its thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, overload

from compaction_worker.client.client import Client
from compaction_worker.client.receipts import Receipt, TurnResult
from compaction_worker.formats.anthropic import AnthropicMessages
from compaction_worker.formats.gemini import GeminiContents
from compaction_worker.formats.rendering import HistoryFormat, Rendered
from compaction_worker.settings import Settings

T = TypeVar("T")
P = ParamSpec("P")


def _blocking(
    method: Callable[Concatenate[Client, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[SyncClient, P], T]:
    """``method`` of :class:`Client` as a :class:`SyncClient` method: the same arguments, run on its loop."""

    def call(self: SyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._call(method(self.client, *args, **kwargs))

    functools.update_wrapper(call, method)  # its signature, for help() and IDEs
    call.__qualname__ = f"SyncClient.{method.__name__}"
    call.__doc__ = f"See :meth:`Client.{method.__name__}`."
    return call


class SyncClient:
    """:class:`Client` for synchronous code; open it with :meth:`connect`."""

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self._loop = loop

    @classmethod
    @contextlib.contextmanager
    def connect(cls, settings: Settings, *, kafka: bool = True) -> Iterator[SyncClient]:
        """Start the loop's thread, open the connections on it; close both on exit."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="compaction-client", daemon=True)
        thread.start()
        opened = Client.connect(settings, kafka=kafka)
        try:
            client = asyncio.run_coroutine_threadsafe(opened.__aenter__(), loop).result()
            try:
                yield cls(client, loop)
            finally:
                asyncio.run_coroutine_threadsafe(opened.__aexit__(None, None, None), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def settings(self) -> Settings:
        return self.client.settings

    @overload
    def messages(
        self, conversation_id: str, format: Literal["openai", "responses"] = "openai", *, cache: bool = False
    ) -> list[dict[str, Any]]: ...
    @overload
    def messages(
        self, conversation_id: str, format: Literal["anthropic"], *, cache: bool = False
    ) -> AnthropicMessages: ...
    @overload
    def messages(
        self, conversation_id: str, format: Literal["gemini"], *, cache: bool = False
    ) -> GeminiContents: ...
    def messages(
        self, conversation_id: str, format: HistoryFormat = "openai", *, cache: bool = False
    ) -> Rendered:
        """See :meth:`Client.messages`."""
        # mypy joins the overloads' results for a union argument into a Sequence: each is a Rendered.
        return self._call(self.client.messages(conversation_id, format, cache=cache))  # type: ignore[return-value]

    @overload
    def wait_for(
        self,
        target: str,
        version: int | None = None,
        *,
        timeout: float = 30.0,
        after_seq: int | None = None,
    ) -> int: ...
    @overload
    def wait_for(
        self,
        target: Receipt,
        version: int | None = None,
        *,
        timeout: float = 30.0,
        after_seq: int | None = None,
    ) -> TurnResult: ...
    def wait_for(
        self,
        target: str | Receipt,
        version: int | None = None,
        *,
        timeout: float = 30.0,
        after_seq: int | None = None,
    ) -> int | TurnResult:
        """See :meth:`Client.wait_for` (it raises TurnRejected and WaitTimeoutError as Client's does)."""
        if isinstance(target, Receipt):
            return self._call(self.client.wait_for(target, version, timeout=timeout, after_seq=after_seq))
        return self._call(self.client.wait_for(target, version, timeout=timeout, after_seq=after_seq))

    # Every other method: Client's, blocking.
    publish_turn = _blocking(Client.publish_turn)
    publish_raw = _blocking(Client.publish_raw)
    request_compaction = _blocking(Client.request_compaction)
    set_instructions = _blocking(Client.set_instructions)
    proposal = _blocking(Client.proposal)
    apply = _blocking(Client.apply)
    discard = _blocking(Client.discard)
    set_profile = _blocking(Client.set_profile)
    next_turn_seq = _blocking(Client.next_turn_seq)
    snapshot = _blocking(Client.snapshot)
    span_attributes = _blocking(Client.span_attributes)
    meta = _blocking(Client.meta)
    status = _blocking(Client.status)
    exists = _blocking(Client.exists)
    context_stats = _blocking(Client.context_stats)
    fit_files = _blocking(Client.fit_files)
    job = _blocking(Client.job)
    transcript = _blocking(Client.transcript)
    compactions = _blocking(Client.compactions)
    pin = _blocking(Client.pin)
    unpin = _blocking(Client.unpin)
    preview_compaction = _blocking(Client.preview_compaction)
    versions = _blocking(Client.versions)
    rewind = _blocking(Client.rewind)
    artifacts = _blocking(Client.artifacts)
    recall = _blocking(Client.recall)
