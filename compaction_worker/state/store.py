"""Redis storage of conversations: transcript, effective history, metadata, compaction log.

The per-turn path costs O(new messages): an append pushes the new records and bumps the
running token total; nothing re-reads or re-counts the history. The compaction commit is
one atomic script that checks the fence and the lock, replaces exactly the entries the
compaction read, and keeps every entry appended while it ran (invariants 1 and 3). A
rewind goes through the same checks: it rebuilds the history from before one compaction
out of the preserved transcript and that compaction's log record.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from redis.asyncio import Redis

from compaction_worker.contracts.events import ContextStatus, Trigger
from compaction_worker.contracts.history import EffectiveHistory, Entry, SummaryChunk
from compaction_worker.errors import RewindError, StaleFenceError
from compaction_worker.state.keys import ConversationKeys, conversation_keys

# Lua's unpack() has a C-stack limit, so long lists are pushed in batches.
_LUA_PUSH = """
local function push(key, items, first, last)
  local i = first
  while i <= last do
    local j = math.min(i + 499, last)
    redis.call('RPUSH', key, unpack(items, i, j))
    i = j + 1
  end
end
"""

# Sets the job hash unless a request of equal or higher priority is already pending. The
# error and the estimate are written together, so a job never pairs one request's error
# with another's estimate.
_LUA_SET_JOB = """
local function set_job(key, id, priority, trigger, requested_at, error, estimate)
  local current = redis.call('HGET', key, 'priority')
  if current and tonumber(current) >= tonumber(priority) then return 0 end
  redis.call('HSET', key, 'id', id, 'priority', priority, 'trigger', trigger,
    'requested_at', requested_at, 'error', error, 'estimate', estimate)
  return 1
end
"""

# KEYS: job. ARGV: id, priority, trigger, requested_at, error, estimate.
_SET_JOB = _LUA_SET_JOB + "return set_job(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])"

# KEYS: job. ARGV: id. Deletes the job only if it is the one that ran.
_FINISH_JOB = """
if redis.call('HGET', KEYS[1], 'id') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

# The fingerprint a held turn may carry after its hold-time prefix: "<held_ms>:<fp>:<raw>"
# (see held_value). A held turn's own bytes start with "{" or whitespace, never a hex digit.
_LUA_HELD_FINGERPRINT = """
local function held_fingerprint(value)
  local fp = string.match(value, '^%d+/?%d*:(%x+):')
  if fp and #fp == 32 then return fp end
  return nil
end
"""

# KEYS: meta, transcript, entries, pending, chunks, compactions, job, fence, fingerprints
# ARGV: seq, expected_count, n_new, history_delta, now, retention_ms, meta_json, job_json
#       ("" for none), fingerprint ("" for none), then n_new transcript records, then
#       n_new entries
# A turn stored before fingerprints were kept has none: a redelivery of it is accepted as
# a duplicate, as every redelivery was then. A turn held behind a gap arrived first, so a
# different turn with its seq is refused (it would otherwise replace it unseen).
_APPEND = (
    _LUA_PUSH
    + _LUA_SET_JOB
    + _LUA_HELD_FINGERPRINT
    + """
local meta = KEYS[1]
local seq = tonumber(ARGV[1])
local fp = ARGV[9]
local last = tonumber(redis.call('HGET', meta, 'last_seq') or '0')
if seq <= last then
  local stored = redis.call('HGET', KEYS[9], ARGV[1])
  if fp ~= '' and stored and stored ~= fp then return {'conflicting_duplicate', last} end
  return {'duplicate', last}
end
if seq ~= last + 1 then return {'gap', last} end
local count = tonumber(redis.call('HGET', meta, 'msg_count') or '0')
if count ~= tonumber(ARGV[2]) then return {'conflict', last} end
if fp ~= '' then
  local held = redis.call('HGET', KEYS[4], ARGV[1])
  if held then
    local held_fp = held_fingerprint(held)
    if held_fp and held_fp ~= fp then return {'conflicting_held', last} end
  end
end
local n = tonumber(ARGV[3])
local records, entries = {}, {}
for i = 1, n do
  records[i] = ARGV[9 + i]
  entries[i] = ARGV[9 + n + i]
end
if n > 0 then
  push(KEYS[2], records, 1, n)
  push(KEYS[3], entries, 1, n)
end
local fields = cjson.decode(ARGV[7])
for k, v in pairs(fields) do redis.call('HSET', meta, k, v) end
redis.call('HSET', meta, 'last_seq', seq, 'msg_count', count + n, 'updated_at', ARGV[5])
redis.call('HSETNX', meta, 'created_at', ARGV[5])
redis.call('HSETNX', meta, 'version', 0)
redis.call('HSETNX', meta, 'context_status', 'full')
local history = redis.call('HINCRBY', meta, 'history_tokens', tonumber(ARGV[4]))
redis.call('HDEL', KEYS[4], ARGV[1])
if fp ~= '' then redis.call('HSET', KEYS[9], ARGV[1], fp) end
if ARGV[8] ~= '' then
  local job = cjson.decode(ARGV[8])
  set_job(KEYS[7], job.id, job.priority, job.trigger, job.requested_at, job.error, job.estimate)
end
local ttl = tonumber(ARGV[6])
if ttl > 0 then
  for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], ttl) end
end
return {'appended', seq, history}
"""
)

# The shared head of the commit and rewind scripts: refuse a stale writer, then replace
# all chunks and the first ``consumed`` entries, keeping the entries appended since the
# writer's snapshot (``suffix``) after the new ones.
# KEYS: meta, chunks, entries, compactions, lock, fence, outbox
# ARGV: fence, lock_token, expected_version, consumed, n_chunks, n_entries, tokens,
#       status, record, now, then n_chunks chunks, then n_entries entries, then the
#       outbox field and payload ('' and '' for none)
_LUA_REPLACE = """
if redis.call('GET', KEYS[6]) ~= ARGV[1] then return {'stale_fence'} end
if redis.call('GET', KEYS[5]) ~= ARGV[2] then return {'lock_lost'} end
local version = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if version ~= tonumber(ARGV[3]) then return {'stale_version', version} end
local consumed = tonumber(ARGV[4])
local len = redis.call('LLEN', KEYS[3])
if len < consumed then return {'corrupt', len} end
local suffix = {}
if len > consumed then suffix = redis.call('LRANGE', KEYS[3], consumed, -1) end
local nc, ne = tonumber(ARGV[5]), tonumber(ARGV[6])
local chunks, entries = {}, {}
for i = 1, nc do chunks[i] = ARGV[10 + i] end
for i = 1, ne do entries[i] = ARGV[10 + nc + i] end
redis.call('DEL', KEYS[2], KEYS[3])
if nc > 0 then push(KEYS[2], chunks, 1, nc) end
if ne > 0 then push(KEYS[3], entries, 1, ne) end
if #suffix > 0 then push(KEYS[3], suffix, 1, #suffix) end
"""

_LUA_NEW_VERSION = """
redis.call('HSET', KEYS[1], 'version', version + 1, 'context_status', ARGV[8],
  'updated_at', ARGV[10], 'noop_tokens', 0, 'failures', 0, 'retry_after', 0)
redis.call('RPUSH', KEYS[4], ARGV[9])
if ARGV[#ARGV] ~= '' then redis.call('HSET', KEYS[7], ARGV[#ARGV - 1], ARGV[#ARGV]) end
return {'committed', version + 1, history, #suffix}
"""

# ARGV[7] is the change in history tokens: a compaction knows exactly what it replaced.
_COMMIT = (
    _LUA_PUSH
    + _LUA_REPLACE
    + """
local history = redis.call('HINCRBY', KEYS[1], 'history_tokens', tonumber(ARGV[7]))
"""
    + _LUA_NEW_VERSION
)

# ARGV[7] is the tokens of the new chunks and entries; the total is recomputed from them
# and the entries appended meanwhile, so a rewind also repairs any drift in the total.
_REWIND = (
    _LUA_PUSH
    + _LUA_REPLACE
    + """
local history = tonumber(ARGV[7])
for i = 1, #suffix do history = history + tonumber(cjson.decode(suffix[i]).t) end
redis.call('HSET', KEYS[1], 'history_tokens', history)
"""
    + _LUA_NEW_VERSION
)


class AppendStatus(StrEnum):
    """What an append did."""

    APPENDED = "appended"
    DUPLICATE = "duplicate"
    """The seq is stored with the same fingerprint (or one stored before fingerprints were kept)."""
    CONFLICTING_DUPLICATE = "conflicting_duplicate"
    """The seq is stored with another fingerprint: the turn is not the one stored."""
    CONFLICTING_HELD = "conflicting_held"
    """A different turn with this seq is held behind a gap; it arrived first and is kept."""
    GAP = "gap"
    CONFLICT = "conflict"
    """Another writer appended since the caller read the message count."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The outcome of one turn's append, with the conversation's totals after it."""

    status: AppendStatus
    last_seq: int
    history_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Meta:
    """Per-conversation metadata, as stored."""

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
    estimate_at_last_call: int = 0
    noop_tokens: int = 0
    failures: int = 0
    retry_after: float = 0.0
    llm_failures: int = 0
    """Failed LLM summarizer runs in a row (the circuit breaker's count)."""
    breaker_until: float = 0.0
    """Until when (epoch seconds) the LLM summarizer is skipped for this conversation."""
    window: int = 0
    threshold: int = 0
    system_prompt: str | None = None
    tools: tuple[Mapping[str, Any], ...] | None = None
    max_output_tokens: int | None = None
    context_window: int | None = None
    observed_window: int | None = None
    """The maximum a provider's overflow error stated, when below the window we knew."""
    updated_at: float = 0.0

    @property
    def fixed_tokens(self) -> int:
        """Tokens of what every request repeats: the system prompt, the tool schemas, the request's framing."""
        return self.system_tokens + self.tools_tokens + self.overhead_tokens

    @property
    def total_tokens(self) -> int:
        """Estimated prompt tokens of the effective history, before calibration."""
        return self.history_tokens + self.fixed_tokens

    @classmethod
    def from_hash(cls, raw: Mapping[bytes | str, bytes | str]) -> Meta:
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
            estimate_at_last_call=i("estimate_at_last_call"),
            noop_tokens=i("noop_tokens"),
            failures=i("failures"),
            retry_after=f("retry_after"),
            llm_failures=i("llm_failures"),
            breaker_until=f("breaker_until"),
            window=i("window"),
            threshold=i("threshold"),
            system_prompt=data.get("system_prompt") or None,
            tools=tuple(json.loads(tools)) if tools else None,
            max_output_tokens=opt_int("max_output_tokens"),
            context_window=opt_int("context_window"),
            observed_window=opt_int("observed_window"),
            updated_at=f("updated_at"),
        )


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


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A compaction request carried by a turn, recorded by the append script with the turn."""

    trigger: Trigger
    error: str | None = None
    estimate: int = 0
    """See :attr:`Job.estimate`."""


def _job_args(request: JobRequest) -> list[str]:
    return [
        secrets.token_hex(8),
        str(JOB_PRIORITY[request.trigger]),
        request.trigger.value,
        repr(time.time()),
        request.error or "",
        str(request.estimate),
    ]


# A held turn is stored as ``<held_ms>:<raw>``, or ``<held_ms>/<lease_ms>:<raw>`` while a
# sweeper dead-letters it (gaps.py, whose scripts read the same prefix): the hold time makes
# the gap timeout per turn, the lease keeps two sweepers from dead-lettering one turn twice.
# The turn's fingerprint may follow the prefix (``<held_ms>:<fp>:<raw>``), for the append
# script to refuse a different turn with the same seq. A held turn was a JSON object, so its
# own first byte is never a digit, nor a hex digit.
_HELD_PREFIX = re.compile(rb"(\d+)(?:/(\d+))?:")
_HELD_FINGERPRINT = re.compile(rb"([0-9a-f]{32}):")


@dataclass(frozen=True, slots=True)
class HeldTurn:
    """A turn held behind a gap: its original bytes and when it was held."""

    turn_seq: int
    held_ms: int
    raw: bytes
    lease_ms: int = 0
    """While a sweeper dead-letters it: until when (epoch ms) no other sweeper may."""
    fingerprint: str | None = None
    """The turn's content fingerprint; None for a turn held before fingerprints were kept."""


def held_value(raw: bytes, held_ms: int, fingerprint: str | None = None) -> bytes:
    """The stored form of a held turn."""
    if fingerprint is None:
        return b"%d:%s" % (held_ms, raw)
    if re.fullmatch(r"[0-9a-f]{32}", fingerprint) is None:
        raise ValueError(f"not a turn fingerprint: {fingerprint!r}")
    return b"%d:%s:%s" % (held_ms, fingerprint.encode(), raw)


def split_fingerprint(body: bytes) -> tuple[str | None, bytes]:
    """A held turn's fingerprint (None if it has none) and its original bytes, from what follows the prefix."""
    match = _HELD_FINGERPRINT.match(body)
    if match is None:
        return None, body
    return match.group(1).decode(), body[match.end() :]


def parse_held(turn_seq: int, value: bytes | str) -> HeldTurn:
    """Read a stored held turn; a value without the prefix (held before it existed) counts as held at 0."""
    data = value.encode() if isinstance(value, str) else value
    match = _HELD_PREFIX.match(data)
    if match is None:
        return HeldTurn(turn_seq, 0, data)
    held, lease = match.groups()
    fingerprint, raw = split_fingerprint(data[match.end() :])
    return HeldTurn(turn_seq, int(held), raw, int(lease or 0), fingerprint)


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to append, with its token count (computed once, by the caller)."""

    message: Mapping[str, Any]
    tokens: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A consistent read of a conversation: metadata plus its effective history."""

    meta: Meta
    history: EffectiveHistory
    chunk_tokens: int = field(default=0)

    @property
    def entry_count(self) -> int:
        return len(self.history.entries)


@dataclass(frozen=True, slots=True)
class CommitResult:
    """A committed compaction: the new version and the token total after it."""

    version: int
    history_tokens: int
    appended_during: int


@dataclass(frozen=True, slots=True)
class RewindResult:
    """A committed rewind: which compaction it undid, and the history before and after."""

    version: int
    """The new version (the one before it plus one; versions never go back)."""
    rewound: int
    """The version of the compaction whose prior history was restored."""
    before: Snapshot
    """The conversation as the rewind read it."""
    chunks: tuple[SummaryChunk, ...]
    entries: tuple[Entry, ...]
    """The restored entries, repaired (without those appended while the rewind ran)."""
    history_tokens: int
    """The recomputed total of the history after the rewind, appended entries included."""
    context_status: ContextStatus
    appended_during: int


JOB_PRIORITY = {
    Trigger.SOFT_THRESHOLD: 0,
    Trigger.THRESHOLD: 1,
    Trigger.MANUAL: 2,
    Trigger.REACTIVE: 3,
}


def _job_json(request: JobRequest | None) -> str:
    if request is None:
        return ""
    job_id, priority, trigger, requested_at, error, estimate = _job_args(request)
    return json.dumps(
        {
            "id": job_id,
            "priority": priority,
            "trigger": trigger,
            "requested_at": requested_at,
            "error": error,
            "estimate": estimate,
        }
    )


def rewind_target(log: Sequence[Mapping[str, Any]], version: int | None) -> Mapping[str, Any]:
    """The compaction record a rewind undoes: ``version``'s, or the latest one still in effect.

    Restoring the history from before compaction V also restores which compactions are in
    effect: those that were just before V. So after "compact v1, compact v2, rewind", the
    next default rewind undoes v1, like a repeated undo. Raises RewindError when there is
    nothing to undo, no such version, or the version is itself a rewind.
    """
    in_effect: list[Mapping[str, Any]] = []
    before: dict[int, list[Mapping[str, Any]]] = {}
    for record in log:
        if "version" not in record:
            continue  # not a record this module wrote
        if record.get("trigger") == Trigger.REWIND.value:
            in_effect = list(before.get(int(record["rewound_version"]), []))
        else:
            before[int(record["version"])] = list(in_effect)
            in_effect.append(record)
    if version is None:
        if not in_effect:
            raise RewindError("nothing to undo: no committed compaction is in effect")
        return in_effect[-1]
    for record in log:
        if record.get("version") == version:
            if record.get("trigger") == Trigger.REWIND.value:
                raise RewindError(
                    f"version {version} is a rewind, not a compaction; rewind the compaction "
                    f"it undid (version {record['rewound_version']}) or one before it"
                )
            return record
    versions = ", ".join(
        str(r["version"]) for r in log if "version" in r and r.get("trigger") != Trigger.REWIND.value
    )
    raise RewindError(
        f"no compaction version {version}" + (f" (compactions: {versions})" if versions else " (none yet)")
    )


def restore_entries(
    chunks: Sequence[SummaryChunk],
    records: Sequence[Mapping[str, Any]],
    count: Callable[[Mapping[str, Any]], int],
) -> tuple[Entry, ...]:
    """Every transcript record no chunk covers, as a verbatim entry (any non-LLM edit undone).

    Token counts come from the record, where the append stored the count it used; records
    written before counts were stored are counted again with ``count``.
    """
    entries = []
    for r in records:
        n = int(r["n"])
        if any(c.covers(n) for c in chunks):
            continue
        tokens = int(r["t"]) if "t" in r else count(r["m"])
        entries.append(Entry(n=n, seq=int(r["seq"]), message=r["m"], tokens=tokens))
    return tuple(entries)


def as_text(value: object) -> str:
    """A Redis reply as text (clients may or may not decode responses)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _now() -> float:
    return time.time()


class Store:
    """Conversation state in Redis; every multi-key write is one atomic script."""

    def __init__(self, redis: Redis, prefix: str, retention_seconds: int | None) -> None:
        self.redis = redis
        self.prefix = prefix
        self.retention_ms = (retention_seconds or 0) * 1000
        self._append = redis.register_script(_APPEND)
        self._commit = redis.register_script(_COMMIT)
        self._rewind = redis.register_script(_REWIND)
        self._set_job = redis.register_script(_SET_JOB)
        self._finish_job = redis.register_script(_FINISH_JOB)

    def keys(self, conversation_id: str) -> ConversationKeys:
        return conversation_keys(conversation_id, self.prefix)

    async def fence(self, conversation_id: str) -> int:
        """The conversation's current fencing token (0 before its first lock)."""
        return int(await self.redis.get(self.keys(conversation_id).fence) or 0)

    async def meta(self, conversation_id: str) -> Meta:
        """The conversation's metadata (all zero for an unknown conversation)."""
        return Meta.from_hash(await self.redis.hgetall(self.keys(conversation_id).meta))

    async def set_meta(self, conversation_id: str, **fields: str | int | float) -> None:
        """Update metadata fields that no script owns (budget, calibration, breaker)."""
        await self.redis.hset(self.keys(conversation_id).meta, mapping=fields)  # type: ignore[arg-type]  # redis-py's mapping type is invariant

    async def append_turn(
        self,
        conversation_id: str,
        turn_seq: int,
        messages: Sequence[NewMessage],
        meta_fields: Mapping[str, str | int | float],
        *,
        expected_count: int,
        request: JobRequest | None = None,
        fingerprint: str | None = None,
    ) -> tuple[str, int, int]:
        """Append one turn if it is the next in sequence; returns (status, last_seq, history_tokens).

        The status is an :class:`AppendStatus` value. ``expected_count`` is the message
        count the caller read: ordinals are assigned from it, and the script refuses
        (``conflict``) if another writer appended since. A compaction ``request`` carried
        by the turn is recorded in the same script, so a crash can never keep the turn and
        lose the request. ``fingerprint`` (the turn's content, see turns.turn_fingerprint)
        is stored with the turn; a later turn with this seq and another fingerprint is
        refused as ``conflicting_duplicate``.
        """
        keys = self.keys(conversation_id)
        now = _now()
        records = []
        entries = []
        for i, new in enumerate(messages, start=expected_count + 1):
            records.append(
                json.dumps(
                    # "t": the count the entry gets, so a rewind restores it exactly.
                    {"n": i, "seq": turn_seq, "m": new.message, "at": now, "t": new.tokens},
                    separators=(",", ":"),
                    ensure_ascii=False,
                )
            )
            entries.append(Entry(n=i, seq=turn_seq, message=new.message, tokens=new.tokens).to_json())
        delta = sum(m.tokens for m in messages)
        result = await self._append(
            keys=[
                keys.meta,
                keys.transcript,
                keys.entries,
                keys.pending,
                keys.chunks,
                keys.compactions,
                keys.job,
                keys.fence,
                keys.fingerprints,
                # Only its expiry is refreshed here: the archive lives as long as the conversation.
                keys.artifacts,
            ],
            args=[
                turn_seq,
                expected_count,
                len(messages),
                delta,
                now,
                self.retention_ms,
                # Strings only: cjson would print large numbers in exponent notation.
                json.dumps(
                    {k: str(v) for k, v in meta_fields.items()}, separators=(",", ":"), ensure_ascii=False
                ),
                _job_json(request),
                fingerprint or "",
                *records,
                *entries,
            ],
        )
        status = as_text(result[0])
        last = int(result[1])
        history = int(result[2]) if len(result) > 2 else 0
        return status, last, history

    async def set_job(
        self, conversation_id: str, trigger: Trigger, error: str | None = None, estimate: int = 0
    ) -> bool:
        """Record a compaction request; True if it is new or stronger than the pending one."""
        args = _job_args(JobRequest(trigger, error, estimate))
        changed = await self._set_job(keys=[self.keys(conversation_id).job], args=args)
        return bool(changed)

    async def job(self, conversation_id: str) -> Job | None:
        """The pending compaction request of a conversation, if any."""
        raw = await self.redis.hgetall(self.keys(conversation_id).job)
        if not raw:
            return None
        data = {as_text(k): as_text(v) for k, v in raw.items()}
        return Job(
            conversation_id=conversation_id,
            id=data["id"],
            trigger=Trigger(data["trigger"]),
            requested_at=float(data.get("requested_at") or 0),
            error=data.get("error") or None,
            estimate=int(data.get("estimate") or 0),
        )

    async def finish_job(self, conversation_id: str, job_id: str) -> bool:
        """Drop the job that ran; False when a newer request replaced it meanwhile."""
        return bool(await self._finish_job(keys=[self.keys(conversation_id).job], args=[job_id]))

    async def buffer_pending(
        self,
        conversation_id: str,
        turn_seq: int,
        raw: bytes,
        held_ms: int | None = None,
        fingerprint: str | None = None,
    ) -> bool:
        """Hold a turn that arrived ahead of a gap; False if that seq was already held.

        The hold time (epoch ms, default now) is kept with the bytes so that each held turn
        times out on its own (gaps.py); a redelivery keeps the first hold time, and the
        first turn's bytes and fingerprint.
        """
        keys = self.keys(conversation_id)
        at = int(_now() * 1000) if held_ms is None else held_ms
        value = held_value(raw, at, fingerprint)
        added = await self.redis.hsetnx(keys.pending, str(turn_seq), value)
        if self.retention_ms:
            await self.redis.pexpire(keys.pending, self.retention_ms)
        return bool(added)

    async def pending_turn(self, conversation_id: str, turn_seq: int) -> bytes | None:
        """A held turn with this seq, if one arrived ahead of its predecessor."""
        held = await self.held_turn(conversation_id, turn_seq)
        return None if held is None else held.raw

    async def held_turn(self, conversation_id: str, turn_seq: int) -> HeldTurn | None:
        """The held turn with this seq, with its hold time and fingerprint, if there is one."""
        value = await self.redis.hget(self.keys(conversation_id).pending, str(turn_seq))
        return None if value is None else parse_held(turn_seq, value)

    async def fingerprint(self, conversation_id: str, turn_seq: int) -> str | None:
        """The stored turn's content fingerprint; None if it has none (stored before they were kept)."""
        value = await self.redis.hget(self.keys(conversation_id).fingerprints, str(turn_seq))
        return None if value is None else as_text(value)

    async def held_turns(self, conversation_id: str) -> list[HeldTurn]:
        """Every turn held behind a gap, by ascending seq, with when it was held."""
        raw = await self.redis.hgetall(self.keys(conversation_id).pending)
        return sorted((parse_held(int(seq), value) for seq, value in raw.items()), key=lambda h: h.turn_seq)

    async def pending_seqs(self, conversation_id: str) -> list[int]:
        """The seqs held behind a gap, ascending."""
        return sorted(int(s) for s in await self.redis.hkeys(self.keys(conversation_id).pending))

    async def drop_pending(self, conversation_id: str, turn_seq: int) -> None:
        """Forget a held turn (it went to the dead-letter topic)."""
        await self.redis.hdel(self.keys(conversation_id).pending, str(turn_seq))

    async def snapshot(self, conversation_id: str) -> Snapshot:
        """Read metadata, chunks and entries in one transaction (a consistent view)."""
        keys = self.keys(conversation_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.meta)
            pipe.lrange(keys.chunks, 0, -1)
            pipe.lrange(keys.entries, 0, -1)
            raw_meta, raw_chunks, raw_entries = await pipe.execute()
        return _snapshot(raw_meta, raw_chunks, raw_entries)

    async def transcript(self, conversation_id: str, start: int = 0, end: int = -1) -> list[dict[str, Any]]:
        """Transcript records ``{"n", "seq", "m", "at", "t"}`` in order (list indexes, inclusive).

        ``t`` (the message's token count) is absent from records appended before it was stored.
        """
        raw = await self.redis.lrange(self.keys(conversation_id).transcript, start, end)
        return [json.loads(r) for r in raw]

    async def originals(self, conversation_id: str, ordinals: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Transcript messages by ordinal (message ``n`` is at list index ``n - 1``), in one round trip."""
        if not ordinals:
            return {}
        key = self.keys(conversation_id).transcript
        async with self.redis.pipeline(transaction=False) as pipe:
            for n in ordinals:
                pipe.lindex(key, n - 1)
            raw = await pipe.execute()
        found: dict[int, dict[str, Any]] = {}
        for n, record in zip(ordinals, raw, strict=True):
            if record is not None and (data := json.loads(record))["n"] == n:
                found[n] = data["m"]
        return found

    async def compactions(self, conversation_id: str) -> list[dict[str, Any]]:
        """The log of committed compactions, oldest first."""
        raw = await self.redis.lrange(self.keys(conversation_id).compactions, 0, -1)
        return [json.loads(r) for r in raw]

    async def commit(
        self,
        conversation_id: str,
        *,
        fence: int,
        lock_token: str,
        expected_version: int,
        consumed: int,
        chunks: Sequence[SummaryChunk],
        entries: Sequence[Entry],
        token_delta: int,
        status: ContextStatus,
        record: Mapping[str, Any],
        outbox: tuple[str, bytes] | None = None,
    ) -> CommitResult:
        """Replace the first ``consumed`` entries and all chunks, keeping later appends.

        ``outbox`` is an event (field, payload) stored with the commit, in the same
        script: it is published afterwards and, if the worker dies first, by another
        (see :mod:`compaction_worker.state.outbox`). Raises StaleFenceError when the fence moved,
        the lock expired, or another compaction committed since the snapshot: nothing is
        written then.
        """
        keys = self.keys(conversation_id)
        field, payload = outbox or ("", b"")
        result = await self._commit(
            keys=[keys.meta, keys.chunks, keys.entries, keys.compactions, keys.lock, keys.fence, keys.outbox],
            args=[
                fence,
                lock_token,
                expected_version,
                consumed,
                len(chunks),
                len(entries),
                token_delta,
                status.value,
                json.dumps(dict(record), separators=(",", ":"), ensure_ascii=False, default=str),
                _now(),
                *(c.to_json() for c in chunks),
                *(e.to_json() for e in entries),
                field,
                payload,
            ],
        )
        status_text = as_text(result[0])
        if status_text != "committed":
            raise StaleFenceError(f"commit refused for {conversation_id}: {status_text}")
        return CommitResult(
            version=int(result[1]), history_tokens=int(result[2]), appended_during=int(result[3])
        )

    async def rewind(
        self,
        conversation_id: str,
        *,
        fence: int,
        lock_token: str,
        version: int | None,
        count: Callable[[Mapping[str, Any]], int],
        overhead: int,
        repair: Callable[[tuple[SummaryChunk, ...], tuple[Entry, ...]], tuple[Entry, ...]] | None = None,
    ) -> RewindResult:
        """Restore the effective history from before compaction ``version`` (default: the latest in effect).

        The history becomes that compaction's ``chunks_before`` and, verbatim, every
        transcript message they do not cover, including messages appended since; it is
        committed as a new version with a ``rewind`` record in the log. ``count`` counts a
        transcript message that has no stored count; ``overhead`` is what the summary turn
        costs beyond its chunks (the same as the compaction that wrote them used);
        ``repair``, when given, makes the restored entries valid for every provider
        (verbatim messages next to old chunks can need a synthetic turn between them). Raises
        RewindError when there is nothing to rewind, and StaleFenceError, writing nothing,
        when the fence moved, the lock expired or the history changed version meanwhile.
        """
        keys = self.keys(conversation_id)
        # One transaction, so the transcript and the entries agree on what was appended.
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(keys.meta)
            pipe.lrange(keys.chunks, 0, -1)
            pipe.lrange(keys.entries, 0, -1)
            pipe.lrange(keys.transcript, 0, -1)
            pipe.lrange(keys.compactions, 0, -1)
            raw_meta, raw_chunks, raw_entries, raw_transcript, raw_log = await pipe.execute()
        before = _snapshot(raw_meta, raw_chunks, raw_entries)
        target = rewind_target([json.loads(r) for r in raw_log], version)
        if "chunks_before" not in target:
            raise RewindError(
                f"the log record of version {target['version']} cannot be rewound (no chunks_before)"
            )
        chunks = tuple(SummaryChunk.from_json(c) for c in target["chunks_before"])
        entries = restore_entries(chunks, [json.loads(r) for r in raw_transcript], count)
        if repair is not None:
            entries = repair(chunks, entries)
        restored_tokens = sum(e.tokens for e in entries) + (
            sum(c.tokens for c in chunks) + overhead if chunks else 0
        )
        status = ContextStatus.SUMMARIZED if chunks else ContextStatus.FULL
        meta = before.meta
        record = {
            "version": meta.version + 1,
            "trigger": Trigger.REWIND.value,
            "at": time.time(),
            "rewound_version": int(target["version"]),
            "stages": [],
            "tokens_before": meta.total_tokens,
            "tokens_after": restored_tokens + meta.fixed_tokens,
            "chunks_before": [c.to_json() for c in before.history.chunks],
            "covered_through_n": max((c.last_n for c in chunks), default=0),
        }
        result = await self._rewind(
            keys=[keys.meta, keys.chunks, keys.entries, keys.compactions, keys.lock, keys.fence, keys.outbox],
            args=[
                fence,
                lock_token,
                meta.version,
                before.entry_count,
                len(chunks),
                len(entries),
                restored_tokens,
                status.value,
                json.dumps(record, separators=(",", ":"), ensure_ascii=False),
                _now(),
                *(c.to_json() for c in chunks),
                *(e.to_json() for e in entries),
                "",  # no outbox event: the rewind publishes its own
                "",
            ],
        )
        status_text = as_text(result[0])
        if status_text != "committed":
            raise StaleFenceError(f"rewind refused for {conversation_id}: {status_text}")
        return RewindResult(
            version=int(result[1]),
            rewound=int(target["version"]),
            before=before,
            chunks=chunks,
            entries=entries,
            history_tokens=int(result[2]),
            context_status=status,
            appended_during=int(result[3]),
        )

    async def delete(self, conversation_id: str) -> int:
        """Remove every key of a conversation (operator command); returns keys removed."""
        return int(await self.redis.delete(*self.keys(conversation_id).all()))


def _snapshot(
    raw_meta: Mapping[bytes | str, bytes | str], raw_chunks: Sequence[bytes], raw_entries: Sequence[bytes]
) -> Snapshot:
    meta = Meta.from_hash(raw_meta)
    chunks = tuple(SummaryChunk.from_json(c) for c in raw_chunks)
    entries = tuple(Entry.from_json(e) for e in raw_entries)
    history = EffectiveHistory(
        chunks=chunks,
        entries=entries,
        version=meta.version,
        system_prompt=meta.system_prompt,
        tools=meta.tools,
    )
    return Snapshot(meta=meta, history=history, chunk_tokens=sum(c.tokens for c in chunks))
