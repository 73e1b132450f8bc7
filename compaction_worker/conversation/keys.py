"""Every Redis key the service writes, and how each is named.

A conversation's keys share its hash tag ``{<conversation_id>}``: the atomic scripts that touch
several of them stay on one Redis Cluster slot. The global keys (the three indexes' buckets,
the wake-up set, the per-model breakers) each have a hash tag of their own, so that on a
cluster they spread over the slots. What a key holds is documented beside it; the module
that reads and writes it is named there (state/ unless it says conversation/).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, fields

from compaction_worker.settings import DEFAULT_PREFIX


@dataclass(frozen=True, slots=True)
class ConversationKeys:
    """The Redis keys of one conversation."""

    meta: str
    """Hash: last seq, message count, running token totals, model, version, status, and the pending
    compaction request, if any: its ``job_*`` fields (conversation/meta.py)."""
    transcript: str
    """List: every message ever appended, as JSON records; never rewritten (store.py)."""
    chunks: str
    """List: the effective history's summary chunks, oldest first (store.py)."""
    entries: str
    """List: the effective history's messages a compaction, rewind or pin wrote, as entries; the
    messages appended since follow in the transcript, from the meta's ``tail`` (store.py)."""
    pending: str
    """Hash: turns that arrived ahead of a gap, by seq, with when they were held (gaps.py)."""
    lock: str
    """String: the lock holder's token, with a TTL (lock.py)."""
    fence: str
    """String: the fencing counter, incremented on every lock acquisition (lock.py)."""
    compactions: str
    """List: a record of every committed compaction, for audit and rewind (store.py, restore.py)."""
    outbox: str
    """Hash: events written with a commit and not yet published, by compaction id (outbox.py)."""
    artifacts: str
    """Hash: every artifact ever extracted from a compacted span, by ledger item (archive.py)."""
    fingerprints: str
    """Hash: each stored turn's content fingerprint, by seq (store.py; tells a redelivery from a conflict)."""
    seq: str
    """String: the last turn seq handed out to a runtime that does not track its own (store.py: ``next_turn_seq``)."""
    proposal: str
    """String: a compaction proposed and not yet applied or discarded, as JSON (proposals.py)."""
    refused: str
    """Hash: what the worker refused of a turn, by seq: the event it dead-lettered, and (field
    ``<seq>:asks``) the pins it asked that were not applied; written only when it refuses (refusals.py)."""

    def all(self) -> tuple[str, ...]:
        """All keys, for deletion."""
        return tuple(getattr(self, f.name) for f in fields(self))

    def lasting(self, *first: str) -> tuple[str, ...]:
        """The keys that live as long as the conversation, meta first (or ``first`` first, as a script
        names them): all but the lock (its own TTL).

        They expire together, at the deadline the meta keeps (lua/expiry.lua).
        """
        return (*first, *(k for k in self.all() if k != self.lock and k not in first))


def conversation_keys(conversation_id: str, prefix: str = DEFAULT_PREFIX) -> ConversationKeys:
    """Build the keys of one conversation, all under its hash tag; each key ends in its field's name."""
    base = f"{prefix}:{{{conversation_id}}}"
    return ConversationKeys(**{f.name: f"{base}:{f.name}" for f in fields(ConversationKeys)})


def meta_key_pattern(prefix: str = DEFAULT_PREFIX, contains: str = "") -> str:
    """A SCAN pattern for the meta hashes of the conversations whose id contains ``contains``."""
    return f"{_glob(prefix)}:{{*{_glob(contains)}*}}:meta" if contains else f"{_glob(prefix)}:{{*}}:meta"


def is_meta_key(key: str, prefix: str = DEFAULT_PREFIX) -> bool:
    """Whether ``key`` is a conversation's meta hash under ``prefix``."""
    return key.startswith(f"{prefix}:{{") and key.endswith("}:meta")


def _glob(text: str) -> str:
    """``text`` matched literally in a SCAN pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


# --- global keys ----------------------------------------------------------------------------


def jobs_index_key(prefix: str = DEFAULT_PREFIX) -> str:
    """The job index's name (its buckets: :func:`bucket_keys`): conversations with a pending compaction,
    scored by when to look next (ms; jobs.py)."""
    return f"{prefix}:jobs"


def gaps_index_key(prefix: str = DEFAULT_PREFIX) -> str:
    """The held-turn index's name (its buckets: :func:`bucket_keys`): conversations with turns held
    behind a gap, scored by the oldest held turn's hold time (ms; gaps.py)."""
    return f"{prefix}:gaps"


def outbox_index_key(prefix: str = DEFAULT_PREFIX) -> str:
    """The outbox index's name (its buckets: :func:`bucket_keys`): conversations that may have
    unpublished events, scored by when to look (ms; outbox.py)."""
    return f"{prefix}:outbox"


def shard_of(conversation_id: str, shards: int) -> int:
    """The bucket of a conversation: CRC-32 of its id, so every process and version agrees."""
    return zlib.crc32(conversation_id.encode()) % shards


def bucket_keys(base: str, shards: int) -> tuple[str, ...]:
    """The bucket keys of the index named ``base``; each is its own hash tag (its own slot; index.py)."""
    return tuple(f"{{{base}:{n}}}" for n in range(shards))


def wake_key(prefix: str = DEFAULT_PREFIX) -> str:
    """The wake-up set: its own hash tag (one slot; a blocking pop names one key; wake.py)."""
    return f"{{{prefix}:wake}}"


def breaker_key(model: str, prefix: str = DEFAULT_PREFIX) -> str:
    """A model's circuit-breaker hash, under its own hash tag (one slot per model; breaker.py)."""
    return f"{prefix}:breaker:{{{model}}}"
