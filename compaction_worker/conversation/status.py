"""A conversation's status, read in one round trip: what the client's waits, its context meter,
the inspector and ``compaction-worker status`` ask, and the one place that reads it.

The status is the meta hash (parsed by ``Meta.from_hash``: no caller names a field), whether the
conversation's lock is held, the job index's score for it, and whether a proposal waits (and,
when asked, the proposal itself, or what is stored of one turn seq: a wait on a turn's receipt). Its pure helpers (:meth:`Status.reached`) say what those
mean together, so that no caller infers "pending" from stored fields.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline

from compaction_worker.contracts.events import ContextStatus, Trigger
from compaction_worker.conversation.keys import ConversationKeys, conversation_keys
from compaction_worker.conversation.meta import JOB_PRIORITY, Meta
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.index import ShardedIndex
from compaction_worker.state.proposals import Proposal
from compaction_worker.state.refusals import Rejection, asks_field, not_applied_of
from compaction_worker.state.scripts import as_text

_TRIGGER_OF = {priority: trigger for trigger, priority in JOB_PRIORITY.items()}
"""A job's trigger by its priority (one priority per trigger: the meta keeps the priority)."""

_LONG = frozenset({"system_prompt", "tools", "instructions", "pins", "job_instructions"})
LISTED = tuple(f.name for f in fields(Meta) if f.name not in _LONG)
"""What a list of many statuses reads of each meta (:func:`read_statuses`): all but its long
texts (the system prompt, the tool schemas, instructions, pins). A meta's attributes are its
hash's field names (``Meta.from_hash``)."""


@dataclass(frozen=True, slots=True)
class PendingJob:
    """The compaction a conversation has pending: why, whether a run holds it, and when it is due."""

    id: str
    trigger: Trigger
    running: bool
    """The conversation's lock is held: a run has it under way."""
    due_at: float | None
    """When the job index looks at it next (Unix seconds); None when it is not indexed (yet)."""
    retry_after: float
    """Until when a failed run's retry waits (Unix seconds; 0.0: no run failed)."""

    def backing_off(self, now: float) -> bool:
        """Whether it waits out a failed run's backoff at ``now``: no run holds it, and it is
        neither due nor retried before then."""
        return not self.running and self.due_at is not None and self.due_at > now and self.retry_after > now

    def backing_off_until(self, now: float) -> float | None:
        """When its backoff ends (Unix seconds), if it is backing off at ``now``."""
        return self.retry_after if self.backing_off(now) else None


@dataclass(frozen=True, slots=True)
class WaitingProposal:
    """A compaction proposed for approval (``pipeline.approval: manual``) and neither applied nor discarded."""

    proposal: Proposal
    stale: bool
    """The history has moved past it (turns arrived, or another commit): applying it recomputes it."""
    turns_since: int
    """Turns stored after it was computed."""

    @property
    def compaction_id(self) -> uuid.UUID:
        return self.proposal.compaction_id

    @property
    def trigger(self) -> Trigger:
        return self.proposal.trigger

    @property
    def tokens_before(self) -> int:
        return self.proposal.tokens_before

    @property
    def tokens_after(self) -> int:
        """What its history would count (provider tokens, as ``tokens_before``)."""
        return int(self.proposal.result.tokens_after * self.proposal.scale)


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """What is stored of one turn seq, read with the status for a wait on a turn (``Client.wait_for``)."""

    seq: int
    fingerprint: str | None
    """The stored turn's content fingerprint (None: no turn with this seq is stored)."""
    rejection: Rejection | None
    """The latest event with this seq the worker dead-lettered (state/refusals.py)."""
    not_applied: tuple[str, ...]
    """The pins the stored turn asked for that could not be applied, and why."""


@dataclass(frozen=True, slots=True)
class Status:
    """One conversation's status: its meta, its pending job, whether its lock is held, its proposal."""

    conversation_id: str
    meta: Meta
    """The meta as stored (all zero for an unknown conversation): the token totals the meter counts."""
    locked: bool
    """The conversation's lock is held: a compaction, rewind or pin is under way."""
    job: PendingJob | None
    proposal_waits: bool
    """A proposal waits for approval."""
    proposal: WaitingProposal | None = None
    """The waiting proposal, when the read asked for it (``read_status(..., proposal=True)``)."""
    turn: TurnRecord | None = None
    """What is stored of a turn seq, when the read asked for one (``read_status(..., turn=seq)``)."""

    @property
    def stored(self) -> bool:
        """Whether a turn of the conversation is stored (a settings write alone stores none)."""
        return self.meta.last_seq > 0

    @property
    def version(self) -> int:
        return self.meta.version

    @property
    def last_seq(self) -> int:
        """The last turn stored."""
        return self.meta.last_seq

    @property
    def context_status(self) -> ContextStatus:
        return self.meta.context_status

    @property
    def profile(self) -> str:
        """The settings profile it compacts under ("": the deployment's settings)."""
        return self.meta.profile

    def settled(self, now: float | None = None) -> bool:
        """Whether no compaction is under way or due: no job, and the lock free (a run finishes its
        job, may schedule the next, then lets the lock go); or the job waits out a failed run's
        backoff (no run is under way or due until then)."""
        if self.job is None:
            return not self.locked
        return self.job.backing_off(time.time() if now is None else now)

    def reached(self, version: int | None, seq: int, now: float | None = None) -> int | None:
        """The current version if a wait for ``version`` (None: for no compaction pending) after
        turn ``seq`` is over, else None. Turn ``seq`` must be stored first, so a compaction request
        just published counts as pending."""
        if self.last_seq < seq:
            return None
        if version is not None:
            return self.version if self.version >= version else None
        return self.version if self.settled(now) else None


async def read_status(
    redis: RedisClient,
    conversation_id: str,
    keys: ConversationKeys,
    jobs: ShardedIndex,
    *,
    proposal: bool = False,
    turn: int | None = None,
) -> Status:
    """The conversation's status, in one round trip; with ``proposal``, the waiting proposal too
    (its stored JSON holds the proposed history: read it only to show it); with ``turn``, what is
    stored of that turn seq (:class:`TurnRecord`: two field reads more)."""
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.meta)
        _queue(pipe, conversation_id, keys, jobs, proposal=proposal)
        if turn is not None:
            pipe.hget(keys.fingerprints, str(turn))
            pipe.hmget(keys.refused, [str(turn), asks_field(turn)])
        raw_meta, *replies = await pipe.execute()
    record = None
    if turn is not None:
        *replies, fingerprint, (rejected, asks) = replies
        record = TurnRecord(
            turn,
            None if fingerprint is None else as_text(fingerprint),
            None if rejected is None else Rejection.from_json(rejected),
            not_applied_of(asks),
        )
    status = _status(conversation_id, Meta.from_hash(raw_meta), replies, proposal=proposal)
    return status if record is None else replace(status, turn=record)


async def is_stored(redis: RedisClient, keys: ConversationKeys) -> bool:
    """Whether a turn of the conversation is stored (:attr:`Status.stored`), in one field read."""
    return bool(int(await redis.hget(keys.meta, "last_seq") or 0))


async def read_statuses(
    redis: RedisClient, conversation_ids: Sequence[str], prefix: str, jobs: ShardedIndex
) -> list[Status]:
    """The statuses of many conversations, in one round trip, each meta without its long texts
    (:data:`LISTED`) and without the proposal (``proposal_waits`` says whether one waits)."""
    if not conversation_ids:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for cid in conversation_ids:
            keys = conversation_keys(cid, prefix)
            pipe.hmget(keys.meta, list(LISTED))
            _queue(pipe, cid, keys, jobs, proposal=False)
        replies = await pipe.execute()
    per = len(replies) // len(conversation_ids)
    statuses = []
    for i, cid in enumerate(conversation_ids):
        raw_meta, *rest = replies[i * per : (i + 1) * per]
        meta = Meta.from_hash({f: v for f, v in zip(LISTED, raw_meta, strict=True) if v is not None})
        statuses.append(_status(cid, meta, rest, proposal=False))
    return statuses


def _queue(
    pipe: Pipeline | ClusterPipeline,
    conversation_id: str,
    keys: ConversationKeys,
    jobs: ShardedIndex,
    *,
    proposal: bool,
) -> None:
    """Queue what a status reads besides the meta (:func:`_status` reads the replies in this order)."""
    pipe.exists(keys.lock)
    pipe.zscore(jobs.key_of(conversation_id), conversation_id)
    if proposal:
        pipe.get(keys.proposal)
        pipe.llen(keys.entries)
    else:
        pipe.exists(keys.proposal)


def _status(conversation_id: str, meta: Meta, replies: Sequence[Any], *, proposal: bool) -> Status:
    locked, due_ms, *rest = replies
    job = None
    if meta.job_id:
        job = PendingJob(
            id=meta.job_id,
            trigger=_TRIGGER_OF[meta.job_priority],
            running=bool(locked),
            due_at=None if due_ms is None else float(due_ms) / 1000,
            retry_after=meta.retry_after,
        )
    if not proposal:
        return Status(conversation_id, meta, bool(locked), job, proposal_waits=bool(rest[0]))
    raw, listed = rest
    waiting = None
    if raw is not None:
        stored = Proposal.from_json(as_text(raw))
        # The history's verbatim entries: the listed ones, then the transcript's from the meta's
        # tail (state/store.py, Store.snapshot).
        entry_count = int(listed) + max(0, meta.msg_count - meta.tail)
        waiting = WaitingProposal(
            stored,
            stale=not stored.made_from(meta, entry_count),
            turns_since=max(0, meta.last_seq - stored.last_seq),
        )
    return Status(conversation_id, meta, bool(locked), job, waiting is not None, waiting)
