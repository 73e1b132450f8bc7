"""The client for runtimes that are not async: :class:`Client`'s methods, blocking.

A :class:`SyncClient` runs one private event loop in a background thread and hands each
call to it; the caller's thread blocks until the result is back. The loop owns the Redis
connection and the Kafka producer, which are bound to the loop that made them, so every
call goes through it (from any thread). Closing the client stops the loop and its thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any, Literal, TypeVar, overload

from compaction_worker.budget.attachments import FittedFile
from compaction_worker.client.client import Artifact, Client, ContextStats
from compaction_worker.contracts.events import CompactionCompleted, TurnEvent
from compaction_worker.formats.anthropic import AnthropicMessages
from compaction_worker.formats.gemini import GeminiContents
from compaction_worker.formats.rendering import HistoryFormat, Rendered
from compaction_worker.recall.search import RecallResult
from compaction_worker.runtime.preview import Preview
from compaction_worker.runtime.rewind import Rewound
from compaction_worker.settings import Settings
from compaction_worker.state.jobs import Job
from compaction_worker.state.meta import Meta
from compaction_worker.state.restore import Version
from compaction_worker.state.store import Snapshot

T = TypeVar("T")


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

    def publish_turn(self, event: TurnEvent) -> None:
        """See :meth:`Client.publish_turn`."""
        self._call(self.client.publish_turn(event))

    def publish_raw(self, payload: bytes, key: bytes | None) -> None:
        """See :meth:`Client.publish_raw`."""
        self._call(self.client.publish_raw(payload, key))

    def request_compaction(
        self,
        conversation_id: str,
        turn_seq: int,
        model: str,
        error: str | None = None,
        *,
        instructions: str | None = None,
    ) -> TurnEvent:
        """See :meth:`Client.request_compaction`."""
        return self._call(
            self.client.request_compaction(conversation_id, turn_seq, model, error, instructions=instructions)
        )

    def set_instructions(self, conversation_id: str, text: str | None) -> None:
        """See :meth:`Client.set_instructions`."""
        self._call(self.client.set_instructions(conversation_id, text))

    def proposal(self, conversation_id: str) -> Preview | None:
        """See :meth:`Client.proposal`."""
        return self._call(self.client.proposal(conversation_id))

    def apply(self, conversation_id: str, proposal_id: uuid.UUID | str) -> CompactionCompleted | None:
        """See :meth:`Client.apply`."""
        return self._call(self.client.apply(conversation_id, proposal_id))

    def discard(self, conversation_id: str, proposal_id: uuid.UUID | str) -> None:
        """See :meth:`Client.discard`."""
        self._call(self.client.discard(conversation_id, proposal_id))

    def set_profile(self, conversation_id: str, name: str | None) -> None:
        """See :meth:`Client.set_profile`."""
        self._call(self.client.set_profile(conversation_id, name))

    def next_turn_seq(self, conversation_id: str) -> int:
        """See :meth:`Client.next_turn_seq`."""
        return self._call(self.client.next_turn_seq(conversation_id))

    def wait_for(
        self,
        conversation_id: str,
        version: int | None = None,
        *,
        timeout: float = 30.0,
        after_seq: int | None = None,
    ) -> int:
        """See :meth:`Client.wait_for` (raises :class:`~compaction_worker.errors.WaitTimeoutError`)."""
        return self._call(
            self.client.wait_for(conversation_id, version, timeout=timeout, after_seq=after_seq)
        )

    def snapshot(self, conversation_id: str) -> Snapshot:
        """See :meth:`Client.snapshot`."""
        return self._call(self.client.snapshot(conversation_id))

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

    def span_attributes(self, conversation_id: str) -> dict[str, str | bool]:
        """See :meth:`Client.span_attributes`."""
        return self._call(self.client.span_attributes(conversation_id))

    def meta(self, conversation_id: str) -> Meta:
        """See :meth:`Client.meta`."""
        return self._call(self.client.meta(conversation_id))

    def context_stats(self, conversation_id: str) -> ContextStats:
        """See :meth:`Client.context_stats`."""
        return self._call(self.client.context_stats(conversation_id))

    def fit_files(self, conversation_id: str, files: Mapping[str, str]) -> list[FittedFile]:
        """See :meth:`Client.fit_files`."""
        return self._call(self.client.fit_files(conversation_id, files))

    def job(self, conversation_id: str) -> Job | None:
        """See :meth:`Client.job`."""
        return self._call(self.client.job(conversation_id))

    def transcript(self, conversation_id: str) -> list[dict[str, Any]]:
        """See :meth:`Client.transcript`."""
        return self._call(self.client.transcript(conversation_id))

    def compactions(self, conversation_id: str) -> list[dict[str, Any]]:
        """See :meth:`Client.compactions`."""
        return self._call(self.client.compactions(conversation_id))

    def pin(self, conversation_id: str, turn_seq: int, index: int | None = None) -> list[int]:
        """See :meth:`Client.pin`."""
        return self._call(self.client.pin(conversation_id, turn_seq, index))

    def unpin(self, conversation_id: str, turn_seq: int, index: int | None = None) -> list[int]:
        """See :meth:`Client.unpin`."""
        return self._call(self.client.unpin(conversation_id, turn_seq, index))

    def preview_compaction(self, conversation_id: str, instructions: str | None = None) -> Preview:
        """See :meth:`Client.preview_compaction`."""
        return self._call(self.client.preview_compaction(conversation_id, instructions))

    def versions(self, conversation_id: str) -> list[Version]:
        """See :meth:`Client.versions`."""
        return self._call(self.client.versions(conversation_id))

    def rewind(self, conversation_id: str, version: int | None = None) -> Rewound:
        """See :meth:`Client.rewind`."""
        return self._call(self.client.rewind(conversation_id, version))

    def artifacts(self, conversation_id: str) -> list[Artifact]:
        """See :meth:`Client.artifacts`."""
        return self._call(self.client.artifacts(conversation_id))

    def recall(self, conversation_id: str, query: str, *, limit: int | None = None) -> RecallResult:
        """See :meth:`Client.recall`."""
        return self._call(self.client.recall(conversation_id, query, limit=limit))
