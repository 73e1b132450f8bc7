"""Every Redis key and default topic name, in one place.

All keys of one conversation share the hash tag ``{<conversation_id>}`` so that the
atomic scripts that touch several of them also run on Redis Cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

TURNS_TOPIC = "conversation.turn"
STARTED_TOPIC = "compaction.started"
COMPLETED_TOPIC = "compaction.completed"
DLQ_TOPIC = "conversation.turn.dlq"

DEFAULT_PREFIX = "cw"


@dataclass(frozen=True, slots=True)
class ConversationKeys:
    """The Redis keys of one conversation."""

    meta: str
    """Hash: last seq, message count, running token totals, model, version, status."""
    transcript: str
    """List: every message ever appended, as JSON records; never rewritten."""
    chunks: str
    """List: the effective history's summary chunks, oldest first."""
    entries: str
    """List: the effective history's verbatim (or non-LLM-edited) messages."""
    pending: str
    """Hash: turns that arrived ahead of a gap, by seq, with when they were held (store.HeldTurn)."""
    lock: str
    """String: the lock holder's token, with a TTL."""
    fence: str
    """String: the fencing counter, incremented on every lock acquisition."""
    job: str
    """Hash: the pending compaction request, if any."""
    compactions: str
    """List: a record of every committed compaction, for audit and rewind."""
    outbox: str
    """Hash: events written with a commit and not yet published, by compaction id (outbox.py)."""
    artifacts: str
    """Hash: every artifact ever extracted from a compacted span, by ledger item (archive.py)."""
    fingerprints: str
    """Hash: each stored turn's content fingerprint, by seq (tells a redelivery from a conflict)."""

    def all(self) -> tuple[str, ...]:
        """All keys, for retention (EXPIRE) and deletion."""
        return (
            self.meta,
            self.transcript,
            self.chunks,
            self.entries,
            self.pending,
            self.lock,
            self.fence,
            self.job,
            self.compactions,
            self.outbox,
            self.artifacts,
            self.fingerprints,
        )


def conversation_keys(conversation_id: str, prefix: str = DEFAULT_PREFIX) -> ConversationKeys:
    """Build the keys of one conversation, all under its hash tag."""
    base = f"{prefix}:{{{conversation_id}}}"
    return ConversationKeys(
        meta=f"{base}:meta",
        transcript=f"{base}:transcript",
        chunks=f"{base}:chunks",
        entries=f"{base}:entries",
        pending=f"{base}:pending",
        lock=f"{base}:lock",
        fence=f"{base}:fence",
        job=f"{base}:job",
        compactions=f"{base}:compactions",
        outbox=f"{base}:outbox",
        artifacts=f"{base}:artifacts",
        fingerprints=f"{base}:fingerprints",
    )


def jobs_index_key(prefix: str = DEFAULT_PREFIX) -> str:
    """Sorted set of conversations with a pending compaction, scored by when to look next."""
    return f"{prefix}:jobs"


def gaps_index_key(prefix: str = DEFAULT_PREFIX) -> str:
    """Sorted set of conversations with turns held behind a gap, scored by the oldest one's hold time (ms)."""
    return f"{prefix}:gaps"


def conversations_index_key(prefix: str = DEFAULT_PREFIX) -> str:
    """Sorted set of known conversations, scored by last activity (for listing and retention)."""
    return f"{prefix}:conversations"


def outbox_index_key(prefix: str = DEFAULT_PREFIX) -> str:
    """Sorted set of conversations that may have unpublished events, scored by when to look (ms)."""
    return f"{prefix}:outbox"
