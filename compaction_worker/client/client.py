"""The client for agent runtimes: publish turns, read the effective history back.

A runtime publishes each turn with :meth:`Client.publish_turn` and, before each model
call, sends :meth:`Client.messages` (the rendered effective history) instead of its own
copy. Both sides only need the same settings as the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

from aiokafka import AIOKafkaProducer

from compaction_worker.budget.attachments import FittedFile, file_budget, fit_files
from compaction_worker.budget.threshold import (
    calibrated_total,
    effective_threshold,
    moved_threshold,
    scale_of,
)
from compaction_worker.budget.tokens import conversation_budget, counter_for
from compaction_worker.client.announcements import FIRST_RECHECK, LAST_RECHECK, Announcements
from compaction_worker.client.receipts import ADVICE, Receipt, TurnResult, stored, timed_out
from compaction_worker.contracts.events import (
    CompactionCompleted,
    CompactionMode,
    CompactionRequest,
    ContextStatus,
    DeadLetterReason,
    TurnEvent,
)
from compaction_worker.conversation.meta import Job, Meta, write_field, write_instructions
from compaction_worker.conversation.status import Status, is_stored, read_status
from compaction_worker.errors import (
    ConfigError,
    ConversationNotFound,
    InvalidProposalId,
    LockNotAcquiredError,
    TurnRejected,
    WaitTimeoutError,
)
from compaction_worker.formats.anthropic import AnthropicMessages
from compaction_worker.formats.gemini import GeminiContents
from compaction_worker.formats.rendering import HistoryFormat, Rendered, rendered
from compaction_worker.observability.tracing import inject
from compaction_worker.recall.search import RecallResult
from compaction_worker.runtime.components import Components, build_components
from compaction_worker.runtime.connections import connect_redis, kafka_client_args
from compaction_worker.runtime.pins import apply_asked, asks_pending, set_pinned
from compaction_worker.runtime.preview import Preview, preview, proposal_preview
from compaction_worker.runtime.rewind import Rewound
from compaction_worker.settings import Settings
from compaction_worker.state.archive import carried
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.restore import Version, versions
from compaction_worker.state.store import Snapshot, Store


@dataclass(frozen=True, slots=True)
class ContextStats:
    """A conversation's context meter: how full its window is, of what, and whether it will compact.

    Tokens are calibrated estimates (provider units when usage reports came in).
    """

    conversation_id: str
    model: str
    window: int
    available: int
    """The window less the output reserve: what the prompt may use."""
    threshold: int
    soft_threshold: int | None
    target: int
    tokens: int
    """The whole next prompt: system prompt, tool schemas, framing and the effective history."""
    breakdown: dict[str, int]
    """``tokens`` by part: ``system``, ``tools``, ``framing``, ``history``."""
    usage_ratio: float
    """``tokens`` over ``window``: the meter a UI shows."""
    should_compact: bool
    """At or over the threshold (as a floor moved it): the next turn schedules a compaction
    (automatic compaction on)."""
    version: int
    context_status: str
    floor_tokens: int = 0
    """Where compactions ended when that was over the target (0: none found): what never compacts
    takes that much."""
    moved_threshold: int | None = None
    """The threshold the floor moved up to, where a compaction saves ``budget.min_saving_fraction``
    of the history (at most what the window leaves); None when it moved nothing."""
    threshold_note: str | None = None
    """Why it moved, with the numbers (the words of the compaction's event)."""


@dataclass(frozen=True, slots=True)
class Artifact:
    """An artifact archived for a conversation (see :mod:`compaction_worker.state.archive`)."""

    kind: str
    """``error``, ``cmd``, ``path``, ``url``, ``id``, ``host``, ``name`` or ``fact``."""
    text: str
    seq: int
    """The turn that first named it (of those compacted)."""
    n: int
    """That message's transcript ordinal (0: known only from a folded summary's ledger)."""
    in_history: bool
    """Whether the effective history still carries it verbatim (else the archive alone has it)."""


def context_stats(conversation_id: str, meta: Meta, settings: Settings) -> ContextStats:
    """The context meter of a conversation from its stored metadata (pure; no I/O), under its
    settings profile."""
    settings = settings.for_profile(meta.profile)
    _, budget = conversation_budget(meta, settings.budget)
    scale = scale_of(meta)
    parts = {
        "system": meta.system_tokens,
        "tools": meta.tools_tokens,
        "framing": meta.overhead_tokens,
        "history": meta.history_tokens,
    }
    breakdown = {name: int(tokens * scale) for name, tokens in parts.items()}
    tokens = calibrated_total(meta)
    threshold = effective_threshold(meta.floor_tokens, settings.budget, budget)
    return ContextStats(
        conversation_id=conversation_id,
        model=meta.model,
        window=budget.window,
        available=budget.available,
        threshold=budget.threshold,
        soft_threshold=budget.soft_threshold,
        target=budget.target,
        tokens=tokens,
        breakdown=breakdown,
        usage_ratio=round(tokens / budget.window, 4) if budget.window else 0.0,
        should_compact=settings.budget.auto_compact and tokens >= threshold,
        version=meta.version,
        context_status=meta.context_status.value,
        floor_tokens=meta.floor_tokens,
        moved_threshold=threshold if threshold > budget.threshold else None,
        threshold_note=moved_threshold(meta.floor_tokens, settings.budget, budget),
    )


class Client:
    """Publishes turns to Kafka and reads conversations from Redis."""

    def __init__(self, settings: Settings, store: Store, producer: AIOKafkaProducer | None) -> None:
        self.settings = settings
        self.store = store
        self.producer = producer
        self._published: dict[str, int] = {}
        """The highest turn seq this client published, by conversation (``wait_for`` waits for it, and
        ``next_turn_seq`` hands out none up to it)."""
        self._latest: dict[str, Receipt] = {}
        """The receipt of the turn this client published last, by conversation, until a wait reported its
        rejection (``wait_for(conversation_id)`` raises it)."""
        self._parts: Components | None = None

    @property
    def parts(self) -> Components:
        """The worker's parts over this client's store and producer (runtime/components.py), built on
        first use; what they publish needs the producer (:meth:`_components` says so first)."""
        if self._parts is None:
            self._parts = build_components(self.settings, self.store.redis, self._publish, store=self.store)
        return self._parts

    async def _publish(self, topic: str, payload: bytes, key: bytes | None) -> None:
        if self.producer is None:
            raise ConfigError(
                "publishing compaction events needs the broker: connect the client with kafka=True"
            )
        await self.producer.send_and_wait(topic, payload, key=key)

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, settings: Settings, *, kafka: bool = True) -> AsyncIterator[Client]:
        """Open the Redis connection (and a Kafka producer unless ``kafka=False``)."""
        redis: RedisClient = connect_redis(settings.redis)
        producer: AIOKafkaProducer | None = None
        try:
            if kafka:
                if not settings.kafka.bootstrap_servers:
                    raise ConfigError(
                        "no Kafka bootstrap servers configured (COMPACTION_KAFKA__BOOTSTRAP_SERVERS)"
                    )
                producer = AIOKafkaProducer(
                    bootstrap_servers=settings.kafka.bootstrap_servers,
                    enable_idempotence=settings.kafka.enable_idempotence,
                    acks="all",
                    max_request_size=max(settings.kafka.max_event_bytes * 2, 1_048_576),
                    **kafka_client_args(settings.kafka),
                )
                await producer.start()
            yield cls(
                settings, Store(redis, settings.redis.key_prefix, settings.redis.retention_seconds), producer
            )
        finally:
            if producer is not None:
                await producer.stop()
            await redis.aclose()

    async def publish_turn(self, event: TurnEvent) -> Receipt:
        """Publish one turn, keyed by its conversation so the conversation stays ordered; returns its
        receipt, for :meth:`wait_for`.

        A runtime that does not track ``turn_seq`` draws it from :meth:`next_turn_seq`::

            seq = await client.next_turn_seq(cid)
            receipt = await client.publish_turn(TurnEvent(conversation_id=cid, turn_seq=seq, model=m, messages=[...]))
            await client.wait_for(receipt)   # stored, or TurnRejected with the reason

        Publish every seq drawn: a missing one is a gap that holds the later turns back.
        The current trace context travels in a ``traceparent`` header: the worker continues it.
        A turn over ``kafka.max_event_bytes`` is not published: TurnRejected (``oversized``).
        """
        headers: list[tuple[str, bytes]] = []
        inject(headers)
        payload = event.model_dump_json(exclude_none=True).encode()
        limit = self.settings.kafka.max_event_bytes
        if len(payload) > limit:  # the worker would dead-letter it unread: no answer would come
            raise TurnRejected(
                event.conversation_id,
                event.turn_seq,
                DeadLetterReason.OVERSIZED.value,
                f"{len(payload)} bytes, over the {limit}-byte limit; not published",
                ADVICE[DeadLetterReason.OVERSIZED],
            )
        await self._send(payload, event.conversation_id.encode(), headers)
        return self._sent(Receipt.of(payload) or Receipt.of_event(event))

    async def publish_raw(
        self, payload: bytes, key: bytes | None, headers: Sequence[tuple[str, bytes]] = ()
    ) -> Receipt | None:
        """Publish bytes as they are to the turns topic (tools and tests use this for bad input); their
        receipt when they name a conversation and a seq (a rejection of bytes that name neither is
        on the dead-letter topic only)."""
        await self._send(payload, key, headers)
        receipt = Receipt.of(payload)
        return None if receipt is None else self._sent(receipt)

    async def _send(self, payload: bytes, key: bytes | None, headers: Sequence[tuple[str, bytes]]) -> None:
        if self.producer is None:
            raise ConfigError("this client was opened without Kafka")
        await self.producer.send_and_wait(
            self.settings.topics.turns, payload, key=key, headers=list(headers) or None
        )

    def _sent(self, receipt: Receipt) -> Receipt:
        """A turn published: what later waits on its conversation wait for."""
        cid = receipt.conversation_id
        self._published[cid] = max(self._published.get(cid, 0), receipt.turn_seq)
        self._latest[cid] = receipt
        return receipt

    async def request_compaction(
        self,
        conversation_id: str,
        turn_seq: int | None,
        model: str,
        error: str | None = None,
        *,
        instructions: str | None = None,
    ) -> Receipt:
        """Publish a turn with no messages that asks for a manual or (with ``error``) reactive compaction;
        returns its receipt (:meth:`wait_for` it).

        ``turn_seq`` None draws it (:meth:`next_turn_seq`); a runtime that counts its own seqs passes
        the next one of its count (docs/integration.md: one counter per conversation).
        ``instructions`` say what its summary keeps first (added to the standing ones).
        """
        seq = turn_seq if turn_seq is not None else await self.next_turn_seq(conversation_id)
        mode = CompactionMode.OVERFLOW if error else CompactionMode.FORCE
        event = TurnEvent(
            conversation_id=conversation_id,
            turn_seq=seq,
            model=model,
            compaction=CompactionRequest(mode=mode, error=error, instructions=instructions),
        )
        return await self.publish_turn(event)

    async def next_turn_seq(self, conversation_id: str) -> int:
        """The next unused turn seq, atomically: concurrent callers never get the same one.

        One past the largest of the last seq handed out, the last one stored and the last one this
        client published (``Store.next_turn_seq``): a turn this client published that the worker has
        not stored yet never gets its seq handed out again.
        """
        return await self.store.next_turn_seq(
            conversation_id, at_least=self._published.get(conversation_id, 0)
        )

    @overload
    async def wait_for(
        self,
        target: str,
        version: int | None = None,
        *,
        timeout: float = 30.0,  # noqa: ASYNC109  # as the implementation's
        after_seq: int | None = None,
    ) -> int: ...
    @overload
    async def wait_for(
        self,
        target: Receipt,
        version: int | None = None,
        *,
        timeout: float = 30.0,  # noqa: ASYNC109  # as the implementation's
        after_seq: int | None = None,
    ) -> TurnResult: ...
    async def wait_for(
        self,
        target: str | Receipt,
        version: int | None = None,
        *,
        timeout: float = 30.0,  # noqa: ASYNC109  # one call for sync callers too (SyncClient), its error ours
        after_seq: int | None = None,
    ) -> int | TurnResult:
        """Wait until a turn is stored and no compaction is pending (or the history reaches ``version``).

        Given a :class:`Receipt` (what :meth:`publish_turn` and :meth:`request_compaction` return), it
        waits for that turn: returns a :class:`TurnResult` (the version, and the ``problems`` of pins
        the turn asked for that could not be applied: the wait applies them if no one has), or raises
        :class:`TurnRejected` with the reason the worker dead-lettered it for. Given a conversation id,
        it waits until every turn this client published for it (and ``after_seq``) is stored, raises
        TurnRejected if the last one was dead-lettered, and returns the version. A run still holding
        the conversation's lock counts as pending; a job waiting out a failure's backoff does not.
        Raises :class:`WaitTimeoutError`.
        """
        receipt = target if isinstance(target, Receipt) else self._latest.get(target)
        cid = receipt.conversation_id if receipt is not None else str(target)
        seq = max(after_seq or 0, receipt.turn_seq if receipt is not None else 0)
        if not isinstance(target, Receipt):
            seq = max(seq, self._published.get(cid, 0))
        try:
            result = await self._check(cid, version, seq, receipt)
            if result is None:
                try:
                    async with asyncio.timeout(timeout):
                        result = await self._await_checked(cid, version, seq, receipt)
                except TimeoutError as e:
                    raise WaitTimeoutError(timed_out(cid, version, receipt, timeout)) from e
        except TurnRejected:
            if receipt is not None:
                self._reported(receipt)
            raise
        return result if isinstance(target, Receipt) else result.version

    def _reported(self, receipt: Receipt) -> None:
        """A rejection reported: later waits on the conversation no longer wait for (or raise) it."""
        cid = receipt.conversation_id
        if self._latest.get(cid) == receipt:
            del self._latest[cid]
        if self._published.get(cid) == receipt.turn_seq:
            self._published[cid] = receipt.turn_seq - 1

    async def _await_checked(
        self, conversation_id: str, version: int | None, seq: int, receipt: Receipt | None
    ) -> TurnResult:
        # Woken by compaction.completed and the dead-letter topic (client/announcements.py), positioned
        # before the Redis read that follows, so a change committed before it is read and one after it
        # is announced. Redis is read again now and then too, because some changes publish no event:
        # a turn's append, and the job's removal (just after its completion event).
        announcements = Announcements(self.settings)
        try:
            await announcements.start()
            recheck = FIRST_RECHECK
            while (result := await self._check(conversation_id, version, seq, receipt)) is None:
                announced = await announcements.seen(conversation_id.encode(), recheck)
                recheck = FIRST_RECHECK if announced else min(recheck * 2, LAST_RECHECK)
            return result
        finally:
            await announcements.stop()

    async def _check(
        self, conversation_id: str, version: int | None, seq: int, receipt: Receipt | None
    ) -> TurnResult | None:
        """The result if the wait is over, else None (:meth:`Status.reached`); TurnRejected when the
        receipt's turn was dead-lettered. Pins the receipt's turn asked for that no one applied yet
        are applied here, when no one holds the lock (the next holder applies them: runtime/pins.py)."""
        keys = self.store.keys(conversation_id)
        status = await read_status(
            self.store.redis,
            conversation_id,
            keys,
            self.parts.jobs.index,
            turn=receipt.turn_seq if receipt is not None else None,
        )
        record = status.turn
        if receipt is not None and record is not None:
            if not stored(receipt, record):
                return None
            if receipt.asks_pins and asks_pending(status.meta.pins, receipt.turn_seq):
                if not status.locked:
                    await self._apply_asked(conversation_id)
                return None
        reached = status.reached(version, seq)
        if reached is None:
            return None
        problems = record.not_applied if record is not None else ()
        return TurnResult(conversation_id, seq, reached, status.context_status, problems)

    async def _apply_asked(self, conversation_id: str) -> None:
        """Apply the pins turns asked for, as the next holder of the lock (a compaction may take it first)."""
        keys = self.store.keys(conversation_id)
        try:
            async with self.parts.locks.exclusive(conversation_id, keys):
                asked = (await self.store.meta(conversation_id)).pins
                if asked:
                    await apply_asked(self.store, conversation_id, asked)
        except LockNotAcquiredError:
            pass  # its holder applies them

    async def status(self, conversation_id: str, *, proposal: bool = False) -> Status:
        """The conversation's status in one round trip: its meta (version, last seq, context status,
        profile, token totals), its pending job (trigger, running, due, backing off), whether a
        proposal waits; with ``proposal``, the waiting proposal itself and whether it is stale
        (:mod:`compaction_worker.conversation.status`). ConversationNotFound when no turn of it is stored.
        """
        keys = self.store.keys(conversation_id)
        status = await read_status(
            self.store.redis, conversation_id, keys, self.parts.jobs.index, proposal=proposal
        )
        if not status.stored:
            raise ConversationNotFound(conversation_id)
        return status

    async def exists(self, conversation_id: str) -> bool:
        """Whether a turn of the conversation is stored (one field read): what the reads that raise
        ConversationNotFound require."""
        return await is_stored(self.store.redis, self.store.keys(conversation_id))

    async def _require(self, conversation_id: str) -> None:
        if not await self.exists(conversation_id):
            raise ConversationNotFound(conversation_id)

    async def snapshot(self, conversation_id: str) -> Snapshot:
        """Metadata and the effective history, read consistently."""
        return await self.store.snapshot(conversation_id)

    @overload
    async def messages(
        self, conversation_id: str, format: Literal["openai", "responses"] = "openai", *, cache: bool = False
    ) -> list[dict[str, Any]]: ...
    @overload
    async def messages(
        self, conversation_id: str, format: Literal["anthropic"], *, cache: bool = False
    ) -> AnthropicMessages: ...
    @overload
    async def messages(
        self, conversation_id: str, format: Literal["gemini"], *, cache: bool = False
    ) -> GeminiContents: ...
    async def messages(
        self, conversation_id: str, format: HistoryFormat = "openai", *, cache: bool = False
    ) -> Rendered:
        """The provider-ready messages to send to the model next (with the summary placement of the
        conversation's settings profile).

        ``format`` is the runtime's own: ``openai`` chat messages, ``anthropic`` (``system``
        and ``messages``), ``responses`` input items or ``gemini`` contents. The verbatim
        tail's thinking blocks, reasoning items and signatures come back exactly as
        published (:mod:`compaction_worker.formats.rendering`). ``cache`` places Anthropic's
        prompt-cache breakpoints after the system prompt, the summary and the last message
        (the Messages API caches nothing unless told; OpenAI and Gemini cache a prompt's
        prefix unasked, and for OpenAI ``prompt_cache_key=conversation_id`` keeps a
        conversation's calls on one cache). ConversationNotFound when no turn of it is stored.
        """
        snapshot = await self.store.snapshot(conversation_id)
        if not snapshot.meta.last_seq:
            raise ConversationNotFound(conversation_id)
        placement = self.settings.for_profile(snapshot.meta.profile).pipeline.summary_placement
        return rendered(snapshot.history, format, placement, cache=cache)

    async def set_instructions(self, conversation_id: str, text: str | None) -> None:
        """Set the conversation's standing compaction instructions (None or "" clears them).

        Every later compaction's summary keeps first what they name; a request's own
        ``instructions`` add to them. A turn's ``compaction_instructions`` sets them too, in
        the turn's order; this call takes effect at once.
        """
        keys = self.store.keys(conversation_id)
        await write_instructions(self.store.redis, keys.meta, text, self.store.retention_ms)

    async def set_profile(self, conversation_id: str, name: str | None) -> None:
        """Choose the settings profile the conversation compacts under (None or "": the deployment's).

        A profile (the settings' ``profiles``) sets its own threshold, target, tail, budgets,
        summarizer and approval, so that a sub-agent's conversation compacts on its own terms
        beside its parent's. The next turn's budget check and every later compaction use it; a
        turn's ``profile`` field sets it too, in the turn's order. ValueError for a name the
        settings do not have.
        """
        name = name or ""
        if name and name not in self.settings.profiles:
            known = ", ".join(sorted(self.settings.profiles)) or "none"
            raise ValueError(f"profile {name!r} is not one of the settings' profiles ({known})")
        keys = self.store.keys(conversation_id)
        await write_field(self.store.redis, keys.meta, "profile", name, self.store.retention_ms)

    async def span_attributes(self, conversation_id: str) -> dict[str, str | bool]:
        """The GenAI conventions' attributes for the runtime's own inference span of this
        conversation: ``gen_ai.conversation.id``, and ``gen_ai.conversation.compacted`` (true,
        never false) once the history it sends has been compacted."""
        attributes: dict[str, str | bool] = {"gen_ai.conversation.id": conversation_id}
        if (await self.store.meta(conversation_id)).context_status is ContextStatus.SUMMARIZED:
            attributes["gen_ai.conversation.compacted"] = True
        return attributes

    async def meta(self, conversation_id: str) -> Meta:
        """The conversation's metadata (last seq, token totals, version)."""
        return await self.store.meta(conversation_id)

    async def context_stats(self, conversation_id: str) -> ContextStats:
        """The context meter: window, tokens by part, usage ratio, whether it will compact;
        ConversationNotFound when no turn of it is stored."""
        return context_stats(conversation_id, (await self.status(conversation_id)).meta, self.settings)

    async def fit_files(self, conversation_id: str, files: Mapping[str, str]) -> list[FittedFile]:
        """Files (text by name) fitted to the room the conversation's next turn has (reference 004).

        The budget is 60% of what its window has left after the next prompt and the output
        reserve; see :mod:`compaction_worker.budget.attachments` for how files are previewed, cut or
        dropped. A conversation not stored yet (the first message) gets the fallback window.
        """
        meta = await self.store.meta(conversation_id)
        stats = context_stats(conversation_id, meta, self.settings)
        budget = file_budget(stats.window, stats.tokens, stats.window - stats.available)
        counter = counter_for(stats.model, self.settings.budget)
        # The meter's tokens are calibrated to the provider's; the counter's are not, so the
        # budget goes back into the counter's units and a TokenCounter's bound (its
        # multiplier: tiktoken never exceeds a token per byte) stays valid for the fast path.
        scaled = math.floor(budget / scale_of(meta))
        return fit_files(files, scaled, counter.text, max_tokens_per_byte=counter.multiplier)

    async def job(self, conversation_id: str) -> Job | None:
        """The conversation's pending compaction, if any."""
        return await self.parts.jobs.job(conversation_id)

    async def transcript(self, conversation_id: str) -> list[dict[str, Any]]:
        """Every message ever appended, as records ``{"n", "seq", "m", "at"}``; ConversationNotFound when
        no turn of it is stored."""
        records = await self.store.transcript(conversation_id)
        if not records:  # a stored conversation's turns may all be requests without messages
            await self._require(conversation_id)
        return records

    async def compactions(self, conversation_id: str) -> list[dict[str, Any]]:
        """The log of committed compactions; ConversationNotFound when no turn of it is stored."""
        log = await self.store.compactions(conversation_id)
        if not log:
            await self._require(conversation_id)
        return log

    async def versions(self, conversation_id: str) -> list[Version]:
        """Every committed version, oldest first: what each compaction replaced (transcript
        messages ``1..replaced_through_n``), when, why (its trigger), the tokens before and
        after, and whether it is still in effect (what :meth:`rewind` can undo). ConversationNotFound
        when no turn of it is stored."""
        return versions(await self.compactions(conversation_id))

    async def rewind(self, conversation_id: str, version: int | None = None) -> Rewound:
        """Undo a compaction (default: the latest one in effect): the history from before it,
        verbatim from the transcript, committed as a new version; ``compaction.started`` and
        ``.completed`` (trigger ``rewind``) are published. ``compaction-worker rewind`` is this.

        Needs the broker (a client connected with ``kafka=True``). Raises NothingToRewind (no
        compaction is in effect: the history is the transcript's), NoSuchVersion (``version`` is no
        compaction), ConversationNotFound, LockNotAcquiredError (a compaction is running: try again)
        or StaleFenceError (the lock was lost before the commit; nothing written).
        """
        await self._require(conversation_id)
        return await self._components("a rewind").rewinder.rewind(conversation_id, version)

    async def proposal(self, conversation_id: str) -> Preview | None:
        """The compaction waiting for approval (``pipeline.approval: manual``), as a preview of what
        applying it commits: the history it leaves, its summary and standing state, tokens before
        and after; None when none waits. Its ``compaction_id`` is the one ``compaction.proposed``
        carries. It is shown as proposed, counts and messages alike, also once turns have moved the
        history past it: then ``stale`` is set, ``turns_since`` counts them, and apply recomputes it.
        ConversationNotFound when no turn of it is stored."""
        waiting = (await self.status(conversation_id, proposal=True)).proposal
        if waiting is None:
            return None
        snapshot = await self.store.snapshot(conversation_id)
        settings = self.settings.for_profile(snapshot.meta.profile)
        return proposal_preview(conversation_id, waiting.proposal, snapshot, settings)

    async def apply(self, conversation_id: str, proposal_id: uuid.UUID | str) -> CompactionCompleted | None:
        """Apply a proposed compaction (``compaction.proposed``): while the conversation is as it was,
        the proposed history is committed exactly and its ``compaction.completed`` published, which
        this returns. After new turns (or another commit) it is not applied stale: it is recomputed
        and proposed again (a new ``compaction.proposed`` whose ``replaces`` names it), and this
        returns None.

        Needs the broker (``kafka=True``). Raises InvalidProposalId (``proposal_id`` is no UUID),
        ProposalNotPending (no such proposal waits: applied, discarded or replaced already),
        ConversationNotFound, LockNotAcquiredError (a compaction is running: try again).
        """
        proposal = _proposal_id(conversation_id, proposal_id)
        await self._require(conversation_id)
        return await self._components("an approval").compactor.apply(conversation_id, proposal)

    async def discard(self, conversation_id: str, proposal_id: uuid.UUID | str) -> None:
        """Discard a proposed compaction; its ``compaction.completed`` says ``discarded``. The next
        threshold crossing proposes again. Raises as :meth:`apply`."""
        proposal = _proposal_id(conversation_id, proposal_id)
        await self._require(conversation_id)
        await self._components("a discard").compactor.discard(conversation_id, proposal)

    def _components(self, what: str) -> Components:
        """:attr:`parts`, for what publishes compaction events: a clear error without the broker."""
        if self.producer is None:
            raise ConfigError(f"{what} publishes compaction events: connect the client with kafka=True")
        return self.parts

    async def pin(self, conversation_id: str, turn_seq: int, index: int | None = None) -> list[int]:
        """Pin the messages of turn ``turn_seq`` (or only its ``index``-th, from 0) after the fact:
        every later compaction keeps them verbatim (:mod:`compaction_worker.runtime.pins`).
        Returns their transcript ordinals. Raises NoSuchMessage (no such turn or message),
        AlreadySummarized (a summary already replaced it: rewind first), ConversationNotFound,
        LockNotAcquiredError (a compaction is running: try again), or StaleFenceError (the lock
        expired while pinning and another holder changed the history: nothing was written; try again)."""
        await self._require(conversation_id)
        return await set_pinned(
            self.store, self.parts.locks, conversation_id, turn_seq, index=index, pinned=True
        )

    async def unpin(self, conversation_id: str, turn_seq: int, index: int | None = None) -> list[int]:
        """Undo :meth:`pin` (or a pin the turn was published with): the messages compact as any other.
        Returns the ordinals it unpinned; raises NotPinned when none of them was pinned, else as :meth:`pin`."""
        await self._require(conversation_id)
        return await set_pinned(
            self.store, self.parts.locks, conversation_id, turn_seq, index=index, pinned=False
        )

    async def preview_compaction(self, conversation_id: str, instructions: str | None = None) -> Preview:
        """What a manual compaction would do now, computed and not applied: the history it would
        leave, the summary and standing state it would write, the tokens before and after and the
        messages it would replace (:mod:`compaction_worker.runtime.preview`). Nothing is written;
        with the extractive summarizer a manual compaction then commits exactly this history
        while no turn arrives; an LLM summarizer is called for it. ``compact --dry-run`` is this.
        ConversationNotFound when no turn of it is stored.
        """
        return await preview(self.store, self.settings, conversation_id, instructions=instructions)

    async def artifacts(self, conversation_id: str) -> list[Artifact]:
        """Every artifact ever extracted from the conversation's compacted spans, first seen first.

        Summaries paraphrase and ledgers are bounded; what they let go stays here, with
        whether the effective history still carries it verbatim. ConversationNotFound when no turn
        of it is stored.
        """
        archived = await self.parts.archive.all(conversation_id)
        snapshot = await self.store.snapshot(conversation_id)
        if not snapshot.meta.last_seq:
            raise ConversationNotFound(conversation_id)
        history = snapshot.history
        present = carried([a.item for a in archived], history)
        return [Artifact(a.kind, a.text, a.seq, a.n, a.item in present) for a in archived]

    async def recall(self, conversation_id: str, query: str, *, limit: int | None = None) -> RecallResult:
        """Search what compaction took out of the history, and the artifact archive (BM25, best first).

        Each hit is a verbatim snippet with its ``turn_seq`` (and ``artifact_id`` for an archive
        hit); bounded by :class:`~compaction_worker.recall.RecallLimits`. The tool a model calls
        for it: :mod:`compaction_worker.recall.tools`; ``complete(..., recall=True)`` answers it.
        """
        return await self.parts.recall.search(conversation_id, query, limit)


def _proposal_id(conversation_id: str, proposal_id: uuid.UUID | str) -> uuid.UUID:
    """The proposal id as a UUID, or InvalidProposalId naming the conversation and where ids come from."""
    try:
        return proposal_id if isinstance(proposal_id, uuid.UUID) else uuid.UUID(proposal_id)
    except (ValueError, TypeError, AttributeError) as e:
        raise InvalidProposalId(
            f"{conversation_id}: {proposal_id!r} is not a proposal id (a UUID): use the compaction_id of "
            "its compaction.proposed event, or of Client.proposal"
        ) from e
