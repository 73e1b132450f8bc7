"""A conversation's metadata hash: sequence, counts, running token totals, budget, status, and its job.

The only module that names the hash's fields: the rest of the package reads a :class:`Meta` or a
:class:`Job`, and writes through the functions here or the per-turn script (apply.py). A job lives
in the ``job_*`` fields (what to do; a turn decided on the meta knows the job it may replace:
:func:`recorded`) and in the jobs index (when to look: state/jobs.py).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from operator import attrgetter
from typing import Any

from compaction_worker.contracts.events import MAX_INSTRUCTIONS_CHARS, ContextStatus, Trigger
from compaction_worker.state.connection import RedisClient
from compaction_worker.state.scripts import as_text


@dataclass(slots=True)
class Meta:
    """Per-conversation metadata, as stored; treated as a value (a change makes a new one: :meth:`changed`).

    Not frozen: the per-turn path makes one from another on every turn, and a frozen
    dataclass's constructor sets each of its fields through ``object.__setattr__``
    (~3 us of a turn; docs/performance.md).

    The append and replace scripts (store.py) write the sequence, counts, totals and
    version; ``Store.set_meta`` writes the fields no script owns (budget, calibration,
    failures).
    """

    last_seq: int = 0
    msg_count: int = 0
    model: str = ""
    history_tokens: int = 0
    system_tokens: int = 0
    tools_tokens: int = 0
    overhead_tokens: int = 0
    """The request's own framing, counted once (``budget.conversation_overhead_tokens``)."""
    version: int = 0
    context_status: ContextStatus = ContextStatus.FULL
    calibration: float = 1.0
    noop_tokens: int = 0
    floor_tokens: int = 0
    """Where the last compaction ended when that was over its target (provider tokens; 0: it reached
    the target): the threshold moves up to where one saves ``budget.min_saving_fraction`` of the
    history (budget/threshold.py)."""
    compacted_seq: int = 0
    """The last turn the last committed compaction saw: another threshold run waits for a later one."""
    failures: int = 0
    retry_after: float = 0.0
    window: int = 0
    threshold: int = 0
    system_prompt: str | None = None
    tools: tuple[Mapping[str, Any], ...] | None = None
    max_output_tokens: int | None = None
    context_window: int | None = None
    observed_window: int | None = None
    """The maximum a provider's overflow error stated, when below the window we knew."""
    instructions: str = ""
    """Standing compaction instructions: what every compaction's summary keeps first ("": none)."""
    profile: str = ""
    """The settings profile the conversation compacts under ("": the deployment's settings)."""
    pins: str = ""
    """Pins and unpins asked for by turns and not applied yet (runtime/pins.py), as JSON ("": none)."""
    job_id: str = ""
    """The pending compaction's id ("": none). A job is the hash's ``job_*`` fields (:class:`Job`): a
    turn decided on this meta knows the job it may replace or add its instructions to."""
    job_priority: int = 0
    """The pending job's priority (:data:`JOB_PRIORITY`), when there is one."""
    job_instructions: str = ""
    """What the pending job asks the summary to keep first ("": nothing)."""
    updated_at: float = 0.0
    tail: int = 0
    """Where the effective history's verbatim tail starts in the transcript (a list index): the
    history is the ``entries`` list, then the transcript's records from here (store.py)."""
    rev: int = 0
    """The revision: every write of the hash bumps it (the per-turn script checks it: apply.py)."""

    @property
    def fixed_tokens(self) -> int:
        """Tokens of what every request repeats: the system prompt, the tool schemas, the request's framing."""
        return self.system_tokens + self.tools_tokens + self.overhead_tokens

    @property
    def total_tokens(self) -> int:
        """Estimated prompt tokens of the effective history, before calibration."""
        return self.history_tokens + self.fixed_tokens

    def changed(self, changes: Mapping[str, Any], **more: Any) -> Meta:
        """This meta with ``changes`` and ``more`` applied, as ``dataclasses.replace`` makes it.

        The per-turn path makes one a turn: this takes ~40% of ``replace``'s time (3.6 against
        8.4 us), which checks and looks up every field by name.
        """
        values = list(_VALUES(self))
        for name, value in (*changes.items(), *more.items()):
            values[_INDEX[name]] = value  # a name that is no field: KeyError
        return Meta(*values)

    def with_job(self, fields: Mapping[str, str]) -> Meta:
        """This meta with the job fields a write sets (:func:`recorded`): those the meta keeps."""
        kept = {k: int(v) if k == "job_priority" else v for k, v in fields.items() if k in _JOB_KEPT}
        return self.changed(kept) if kept else self

    def without_job(self) -> Meta:
        """This meta once its job is done."""
        return self.changed(_NO_JOB)

    @classmethod
    def from_hash(
        cls, raw: Mapping[bytes, bytes] | Mapping[str, str] | Mapping[bytes | str, bytes | str]
    ) -> Meta:
        """Read the stored hash (every field optional: an unknown conversation is all zero)."""
        data = {as_text(k): as_text(v) for k, v in raw.items()}

        def i(name: str) -> int:
            return int(float(data.get(name) or 0))

        def f(name: str, default: float = 0.0) -> float:
            return float(data[name]) if data.get(name) else default

        def opt_int(name: str) -> int | None:
            return int(data[name]) if data.get(name) else None

        tools = data.get("tools")
        return cls(
            last_seq=i("last_seq"),
            msg_count=i("msg_count"),
            model=data.get("model", ""),
            history_tokens=i("history_tokens"),
            system_tokens=i("system_tokens"),
            tools_tokens=i("tools_tokens"),
            overhead_tokens=i("overhead_tokens"),
            version=i("version"),
            context_status=ContextStatus(data.get("context_status") or "full"),
            calibration=f("calibration", 1.0),
            noop_tokens=i("noop_tokens"),
            floor_tokens=i("floor_tokens"),
            compacted_seq=i("compacted_seq"),
            failures=i("failures"),
            retry_after=f("retry_after"),
            window=i("window"),
            threshold=i("threshold"),
            system_prompt=data.get("system_prompt") or None,
            tools=tuple(json.loads(tools)) if tools else None,
            max_output_tokens=opt_int("max_output_tokens"),
            context_window=opt_int("context_window"),
            observed_window=opt_int("observed_window"),
            instructions=data.get("instructions", ""),
            profile=data.get("profile", ""),
            pins=data.get("pins", ""),
            job_id=data.get("job_id", ""),
            job_priority=i("job_priority"),
            job_instructions=data.get("job_instructions", ""),
            updated_at=f("updated_at"),
            tail=i("tail"),
            rev=i("rev"),
        )


JOB_PRIORITY = {
    Trigger.SOFT_THRESHOLD: 0,
    Trigger.THRESHOLD: 1,
    Trigger.MANUAL: 2,
    Trigger.REACTIVE: 3,
}
"""A pending job is replaced only by a request of higher priority."""


@dataclass(frozen=True, slots=True)
class Job:
    """A pending compaction of one conversation."""

    conversation_id: str
    id: str
    trigger: Trigger
    requested_at: float
    error: str | None = None
    estimate: int = 0
    """Our estimate (uncalibrated) of the prompt a reactive request's error is about; 0 if unknown."""
    traceparent: str | None = None
    """The W3C trace context of the turn that asked for it: the compaction continues that trace."""
    instructions: str | None = None
    """What the request asked the summary to keep first (added to the conversation's standing ones)."""


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A compaction request, recorded as a new job unless a stronger one is pending."""

    trigger: Trigger
    error: str | None = None
    estimate: int = 0
    """See :attr:`Job.estimate`."""
    traceparent: str | None = None
    """See :attr:`Job.traceparent`."""
    instructions: str | None = None
    """See :attr:`Job.instructions`."""

    @property
    def asked(self) -> bool:
        """Whether someone asked for it (a turn's request: manual or reactive), not a threshold."""
        return self.trigger in (Trigger.MANUAL, Trigger.REACTIVE)

    @property
    def priority(self) -> int:
        return JOB_PRIORITY[self.trigger]

    def fields(self, now: float | None = None) -> dict[str, str]:
        """The meta fields a new job writes (strings, as stored), at ``now`` (else the clock's)."""
        return {
            "job_id": secrets.token_hex(8),
            "job_priority": str(self.priority),
            "job_trigger": self.trigger.value,
            "job_requested_at": repr(time.time() if now is None else now),
            "job_error": self.error or "",
            "job_estimate": str(self.estimate),
            "job_traceparent": self.traceparent or "",
            "job_instructions": self.instructions or "",
        }


VERSION_FIELD = "version"
"""The meta field that holds the effective history's version (what recall's cache is keyed by)."""

JOB_FIELDS = tuple(JobRequest(Trigger.MANUAL).fields())
"""The meta fields a job is (every one written when it is recorded, and deleted when it ends)."""


MAX_MERGED_INSTRUCTIONS = 2 * MAX_INSTRUCTIONS_CHARS
"""The most a pending job's instructions grow to when a turn's request adds its own."""


def merged_instructions(own: str, other: str, newest: str) -> str:
    """A job's instructions once another request's are added: a request's instructions are never
    dropped while a job is pending. Whichever request's job stays carries the other's after its
    own; past :data:`MAX_MERGED_INSTRUCTIONS`, the newest request's alone."""
    if not other or other in own:
        return own
    if not own or own in other:
        return other
    if len(own) + len(other) + 2 > MAX_MERGED_INSTRUCTIONS:
        return newest
    return f"{own}\n\n{other}"


def recorded(request: JobRequest, pending: Meta, now: float) -> tuple[dict[str, str], bool]:
    """What a turn's request writes onto the job pending in ``pending`` (a meta), and whether it is
    the job now: a new job when none of equal or higher priority is pending, else at most the
    pending job's instructions with the request's added."""
    asked = request.instructions or ""
    if pending.job_id and pending.job_priority >= request.priority:
        kept = merged_instructions(pending.job_instructions, asked, asked)
        return ({"job_instructions": kept} if kept != pending.job_instructions else {}), False
    fields = request.fields(now)
    fields["job_instructions"] = merged_instructions(asked, pending.job_instructions, asked)
    return fields, True


_NO_JOB = {"job_id": "", "job_priority": 0, "job_instructions": ""}
_JOB_KEPT = frozenset(_NO_JOB)
"""The job's fields a meta keeps (the others are read only by the claim: :func:`read_job`)."""
_FIELDS = tuple(f.name for f in fields(Meta))
_INDEX = {name: i for i, name in enumerate(_FIELDS)}
_VALUES = attrgetter(*_FIELDS)


def stored_text(value: object) -> str:
    """A meta field's value as the hash stores it (what :meth:`Meta.from_hash` reads back)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):  # the tool schemas
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, StrEnum):
        return value.value
    return str(value)


async def write_instructions(redis: RedisClient, key: str, text: str | None, retention_ms: int) -> None:
    """Set (or, with None or blank text, clear) a conversation's standing compaction instructions."""
    text = (text or "").strip()
    if len(text) > MAX_INSTRUCTIONS_CHARS:
        raise ValueError(f"instructions of {len(text)} characters; at most {MAX_INSTRUCTIONS_CHARS}")
    await write_field(redis, key, "instructions", text, retention_ms)


async def write_field(redis: RedisClient, key: str, name: str, value: str, retention_ms: int) -> None:
    """Set a meta field a conversation keeps until it is changed (its instructions, its profile).

    It bumps the revision, as every write of the hash does, so that a turn planned from the
    meta before it is decided again (apply.py). A conversation with no turn yet gets a meta
    hash that expires after the retention, unless a turn gives it its deadline first
    (lua/expiry.lua); an existing deadline is left as it is, shared with the other keys.
    """
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, name, value)
        pipe.hincrby(key, "rev", 1)
        if retention_ms > 0:
            pipe.pexpire(key, retention_ms, nx=True)
        await pipe.execute()


_CLEAR_IF = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], '')
  redis.call('HINCRBY', KEYS[1], 'rev', 1)
  return 1
end
return 0
"""


async def clear_field_if(redis: RedisClient, key: str, name: str, expected: str) -> bool:
    """Empty meta field ``name`` if it still holds ``expected`` (bumping the revision); whether it did.
    A writer that added to the field meanwhile keeps what it added."""
    return bool(await redis.eval(_CLEAR_IF, 1, key, name, expected))


async def read_meta(redis: RedisClient, key: str) -> Meta:
    """The stored meta (all zero for an unknown conversation)."""
    return Meta.from_hash(await redis.hgetall(key))


async def write_fields(redis: RedisClient, key: str, fields: Mapping[str, str | int | float]) -> None:
    """Set fields no script owns (a no-op's size, a failure's backoff), bumping the revision."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hset(key, mapping=fields)  # type: ignore[arg-type]  # redis-py's mapping type is invariant
        pipe.hincrby(key, "rev", 1)
        await pipe.execute()


async def read_job(redis: RedisClient, key: str, conversation_id: str) -> Job | None:
    """The pending compaction request of a conversation, if any."""
    raw = await redis.hmget(key, JOB_FIELDS)
    return job_of(conversation_id, raw)


def job_of(conversation_id: str, raw: Sequence[bytes | str | None]) -> Job | None:
    """The job the meta's :data:`JOB_FIELDS` hold (read in that order), if any."""
    data = dict(zip(JOB_FIELDS, (as_text(v) if v is not None else "" for v in raw), strict=True))
    if not data["job_id"]:
        return None
    return Job(
        conversation_id=conversation_id,
        id=data["job_id"],
        trigger=Trigger(data["job_trigger"]),
        requested_at=float(data["job_requested_at"] or 0),
        error=data["job_error"] or None,
        estimate=int(data["job_estimate"] or 0),
        traceparent=data["job_traceparent"] or None,
        instructions=data["job_instructions"] or None,
    )


async def has_job(redis: RedisClient, key: str) -> bool:
    """Whether a job is pending."""
    return bool(await redis.hexists(key, "job_id"))


async def job_traceparent(redis: RedisClient, key: str) -> str | None:
    """The trace context the pending job keeps (the turn's that asked for it), if any."""
    value = await redis.hget(key, "job_traceparent")
    return as_text(value) if value else None
