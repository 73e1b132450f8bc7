"""The Redis keys of one conversation, all under its hash tag ``{<conversation_id>}``.

One hash tag keeps the atomic scripts that touch several of them on one Redis Cluster slot.
Each key's format belongs to the module named beside it; the global indexes are their
owners' (jobs.py, gaps.py, outbox.py).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from compaction_worker.settings import DEFAULT_PREFIX


@dataclass(frozen=True, slots=True)
class ConversationKeys:
    """The Redis keys of one conversation."""

    meta: str
    """Hash: last seq, message count, running token totals, model, version, status (meta.py)."""
    transcript: str
    """List: every message ever appended, as JSON records; never rewritten (store.py)."""
    chunks: str
    """List: the effective history's summary chunks, oldest first (store.py)."""
    entries: str
    """List: the effective history's verbatim (or non-LLM-edited) messages (store.py)."""
    pending: str
    """Hash: turns that arrived ahead of a gap, by seq, with when they were held (gaps.py)."""
    lock: str
    """String: the lock holder's token, with a TTL (lock.py)."""
    fence: str
    """String: the fencing counter, incremented on every lock acquisition (lock.py)."""
    job: str
    """Hash: the pending compaction request, if any (jobs.py)."""
    compactions: str
    """List: a record of every committed compaction, for audit and rewind (store.py, restore.py)."""
    outbox: str
    """Hash: events written with a commit and not yet published, by compaction id (outbox.py)."""
    artifacts: str
    """Hash: every artifact ever extracted from a compacted span, by ledger item (archive.py)."""
    fingerprints: str
    """Hash: each stored turn's content fingerprint, by seq (store.py; tells a redelivery from a conflict)."""
    seq: str
    """String: the last turn seq handed out to a runtime that does not track its own (sequence.py)."""

    def all(self) -> tuple[str, ...]:
        """All keys, for deletion."""
        return tuple(getattr(self, f.name) for f in fields(self))

    def lasting(self) -> tuple[str, ...]:
        """The keys that live as long as the conversation, meta first: all but the lock (its own TTL).

        They expire together, at the deadline the meta keeps (lua/expiry.lua).
        """
        return tuple(k for k in self.all() if k != self.lock)


def conversation_keys(conversation_id: str, prefix: str = DEFAULT_PREFIX) -> ConversationKeys:
    """Build the keys of one conversation, all under its hash tag; each key ends in its field's name."""
    base = f"{prefix}:{{{conversation_id}}}"
    return ConversationKeys(**{f.name: f"{base}:{f.name}" for f in fields(ConversationKeys)})
