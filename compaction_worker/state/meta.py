"""A conversation's metadata hash: sequence, counts, running token totals, budget, status."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from operator import attrgetter
from typing import Any

from compaction_worker.contracts.events import MAX_INSTRUCTIONS_CHARS, ContextStatus
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
    """Pins and unpins turns asked for and not applied yet (runtime/pins.py), as JSON ("": none)."""
    job_id: str = ""
    """The pending compaction's id ("": none). A job is the hash's ``job_*`` fields (jobs.py): a
    turn planned on this meta knows the job it may replace or add its instructions to."""
    job_priority: int = 0
    """The pending job's priority (jobs.JOB_PRIORITY), when there is one."""
    job_instructions: str = ""
    """What the pending job asks the summary to keep first ("": nothing)."""
    updated_at: float = 0.0
    tail: int = 0
    """Where the effective history's verbatim tail starts in the transcript (a list index): the
    history is the ``entries`` list, then the transcript's records from here (store.py)."""
    rev: int = 0
    """The revision: every write of the hash bumps it (the per-turn script checks it: appends.py)."""

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
        """This meta with the job fields a write sets (``jobs.recorded``): those the meta keeps."""
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


_NO_JOB = {"job_id": "", "job_priority": 0, "job_instructions": ""}
_JOB_KEPT = frozenset(_NO_JOB)
"""The job's fields a meta keeps (the others are read only by the claim: jobs.py)."""
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
    meta before it is planned again (appends.py). A conversation with no turn yet gets a meta
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
