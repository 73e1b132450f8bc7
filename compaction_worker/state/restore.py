"""Rewind: restore the effective history from before one compaction, as a new version.

The history comes back from the preserved transcript and that compaction's log record, and
is written by the same fenced replace script as a commit (store.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compaction_worker.contracts.events import ContextStatus, Trigger
from compaction_worker.contracts.history import Entry, SummaryChunk
from compaction_worker.conversation.meta import Meta
from compaction_worker.errors import NoSuchVersion, NothingToRewind
from compaction_worker.state.store import Snapshot, Store, snapshot_of

Repair = Callable[[tuple[SummaryChunk, ...], tuple[Entry, ...]], tuple[Entry, ...]]
"""Makes restored entries valid for every provider (see :func:`rewind`)."""


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


async def rewind(
    store: Store,
    conversation_id: str,
    *,
    fence: int,
    lock_token: str,
    version: int | None,
    overhead: int,
    repair: Repair | None = None,
) -> RewindResult:
    """Restore the effective history from before compaction ``version`` (default: the latest in effect).

    The history becomes that compaction's ``chunks_before`` and, verbatim, every transcript
    message they do not cover, including messages appended since; it is committed as a new
    version with a ``rewind`` record in the log. ``overhead`` is what the summary turn costs beyond its chunks (as
    the compaction that wrote them counted it); ``repair``, when given, makes the restored
    entries valid for every provider (verbatim messages next to old chunks can need a
    synthetic turn between them). Raises RewindError (:func:`rewind_target`), and
    StaleFenceError, writing nothing, when the fence moved, the lock expired or the history
    changed version meanwhile.
    """
    keys = store.keys(conversation_id)
    # One transaction, so the transcript and the entries agree on what was appended.
    async with store.redis.pipeline(transaction=True) as pipe:
        pipe.hgetall(keys.meta)
        pipe.lrange(keys.chunks, 0, -1)
        pipe.lrange(keys.entries, 0, -1)
        pipe.lrange(keys.transcript, 0, -1)
        pipe.lrange(keys.compactions, 0, -1)
        raw_meta, raw_chunks, raw_entries, raw_transcript, raw_log = await pipe.execute()
    meta = Meta.from_hash(raw_meta)  # the entries appended since the last replace follow in the transcript
    before = snapshot_of(meta, raw_chunks, raw_entries, raw_transcript[meta.tail :])
    target = rewind_target([json.loads(r) for r in raw_log], version, conversation_id)
    chunks = tuple(SummaryChunk.from_json(c) for c in target["chunks_before"])
    entries = restore_entries(chunks, [json.loads(r) for r in raw_transcript])
    if repair is not None:
        entries = repair(chunks, entries)
    restored_tokens = sum(e.tokens for e in entries) + (
        sum(c.tokens for c in chunks) + overhead if chunks else 0
    )
    status = ContextStatus.SUMMARIZED if chunks else ContextStatus.FULL
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
    result = await store.commit(
        conversation_id,
        writer="rewind",
        fence=fence,
        lock_token=lock_token,
        expected_version=meta.version,
        consumed=before.entry_count,
        chunks=chunks,
        entries=entries,
        tokens=restored_tokens,
        recount=True,
        status=status,
        record=record,
        # No outbox event: the rewind publishes its own.
    )
    return RewindResult(
        version=result.version,
        rewound=int(target["version"]),
        before=before,
        chunks=chunks,
        entries=entries,
        history_tokens=result.history_tokens,
        context_status=status,
        appended_during=result.appended_during,
    )


@dataclass(frozen=True, slots=True)
class Version:
    """One committed version of a conversation's history, from its compaction log."""

    version: int
    trigger: str
    """Why: ``threshold``, ``soft_threshold``, ``manual``, ``reactive`` or ``rewind``."""
    at: float
    """When it was committed (epoch seconds)."""
    tokens_before: int
    tokens_after: int
    replaced_through_n: int
    """The transcript messages 1..n its summary chunks cover (0: it summarized nothing)."""
    stages: tuple[str, ...] = ()
    rewound_version: int | None = None
    """For a rewind: the compaction it undid."""
    in_effect: bool = False
    """A compaction the history still holds: ``rewind`` can undo it (the latest one by default)."""


def versions(log: Sequence[Mapping[str, Any]]) -> list[Version]:
    """Every committed version in the log, oldest first, each marked in effect or not."""
    effective = {int(r["version"]) for r in _in_effect(log)}
    return [
        Version(
            version=int(r["version"]),
            trigger=str(r.get("trigger", "")),
            at=float(r.get("at", 0.0)),
            tokens_before=int(r.get("tokens_before", 0)),
            tokens_after=int(r.get("tokens_after", 0)),
            replaced_through_n=int(r.get("covered_through_n", 0)),
            stages=tuple(r.get("stages", ())),
            rewound_version=int(r["rewound_version"]) if "rewound_version" in r else None,
            in_effect=int(r["version"]) in effective,
        )
        for r in log
    ]


def _in_effect(log: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The compactions the history holds now, in order: after a rewind, those that were before
    the compaction it undid."""
    in_effect: list[Mapping[str, Any]] = []
    before: dict[int, list[Mapping[str, Any]]] = {}
    for record in log:
        if record.get("trigger") == Trigger.REWIND.value:
            in_effect = list(before.get(int(record["rewound_version"]), []))
        else:
            before[int(record["version"])] = list(in_effect)
            in_effect.append(record)
    return in_effect


def rewind_target(
    log: Sequence[Mapping[str, Any]], version: int | None, conversation_id: str = "the conversation"
) -> Mapping[str, Any]:
    """The compaction record a rewind undoes: ``version``'s, or the latest one still in effect.

    Restoring the history from before compaction V also restores which compactions are in
    effect: those that were just before V. So after "compact v1, compact v2, rewind", the
    next default rewind undoes v1, like a repeated undo. Raises NothingToRewind past the first
    version (none in effect, or a version under 1), NoSuchVersion for a version that is no
    compaction (none has it, or it is a rewind).
    """
    cid = conversation_id
    listed = "; Client.versions (compaction-worker versions) lists them"
    in_effect = _in_effect(log)
    if version is None:
        if not in_effect:
            raise NothingToRewind(
                f"{cid}: nothing to undo: no committed compaction is in effect (none was committed, or "
                "every one is undone already), so its history is the transcript's already" + listed
            )
        return in_effect[-1]
    if version < 1:
        raise NothingToRewind(
            f"{cid}: nothing to undo before version 1, its first compaction: rewind version 1 to restore "
            "the history from before every compaction"
        )
    for record in log:
        if record.get("version") == version:
            if record.get("trigger") == Trigger.REWIND.value:
                raise NoSuchVersion(
                    f"{cid}: version {version} is a rewind, not a compaction; rewind the compaction "
                    f"it undid (version {record['rewound_version']}) or one before it"
                )
            return record
    versions = ", ".join(str(r["version"]) for r in log if r.get("trigger") != Trigger.REWIND.value)
    raise NoSuchVersion(
        f"{cid}: no compaction version {version}"
        + (f" (compactions: {versions})" if versions else " (none yet)")
        + listed
    )


def restore_entries(
    chunks: Sequence[SummaryChunk],
    records: Sequence[Mapping[str, Any]],
) -> tuple[Entry, ...]:
    """Every transcript record no chunk covers, as a verbatim entry (any non-LLM edit undone),
    with the token count its append stored."""
    entries = []
    for r in records:
        n = int(r["n"])
        if any(c.covers(n) for c in chunks):
            continue
        entries.append(Entry(n=n, seq=int(r["seq"]), message=r["m"], tokens=int(r["t"])))
    return tuple(entries)
