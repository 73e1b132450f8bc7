"""The root exception and the kinds every package may raise.

An error that carries a contract type lives with that type and subclasses the root:
``BadEventError`` in :mod:`compaction_worker.contracts.events`, ``SummarizerError`` in
:mod:`compaction_worker.summaries.contract`. This module imports nothing of the package.
"""

from __future__ import annotations


class CompactionWorkerError(Exception):
    """Root of every exception this package raises on purpose."""


class ConfigError(CompactionWorkerError):
    """The settings cannot work (a missing binary, an impossible budget)."""


class StaleFenceError(CompactionWorkerError):
    """A commit was refused because another writer holds a newer fence (docs/design.md, invariant 3)."""


class LockNotAcquiredError(CompactionWorkerError):
    """Another worker holds the conversation's lock."""


class ConversationNotFound(CompactionWorkerError, LookupError):
    """No turn of the conversation is stored: a wrong id, a conversation whose first turn has not been
    stored yet, or one that expired after ``redis.retention_seconds``."""

    def __init__(self, conversation_id: str) -> None:
        super().__init__(
            f"no conversation {conversation_id!r} is stored (none of its turns was, or it expired after "
            "redis.retention_seconds): check the id, or publish its first turn and wait_for it"
        )
        self.conversation_id = conversation_id


class TurnRejected(CompactionWorkerError):
    """The worker refused a turn: it went to the dead-letter topic with ``reason``, and nothing of it
    was stored. ``Client.wait_for(receipt)`` raises it with the dead letter's reason and detail."""

    def __init__(
        self, conversation_id: str, turn_seq: int, reason: str, detail: str, advice: str = ""
    ) -> None:
        super().__init__(
            f"{conversation_id}: turn {turn_seq} was rejected ({reason}): {detail}"
            + (f"; {advice}" if advice else "")
        )
        self.conversation_id = conversation_id
        self.turn_seq = turn_seq
        self.reason = reason
        """The dead letter's reason code (``DeadLetterReason``: ``conflicting_duplicate``, ...)."""
        self.detail = detail


class PinError(CompactionWorkerError):
    """A pin or unpin that cannot be done; each condition is a subclass."""


class NoSuchMessage(PinError):
    """The turn, or the message index in it, that a pin names is not stored."""


class AlreadySummarized(PinError):
    """A summary already replaced the message a pin names: only a rewind brings it back."""


class NotPinned(PinError):
    """An unpin of messages none of which is pinned: there is nothing to undo."""


class ProposalError(CompactionWorkerError):
    """An apply or discard that cannot be done; each condition is a subclass."""


class InvalidProposalId(ProposalError, ValueError):
    """A proposal id that is not a UUID (a ValueError too, as the bare one it replaces)."""


class ProposalNotPending(ProposalError):
    """No proposal with that id waits: applied, discarded or replaced already."""


class RewindError(CompactionWorkerError):
    """A rewind that cannot be done; each condition is a subclass."""


class NothingToRewind(RewindError):
    """A rewind past the first version: no compaction is in effect (none was committed, or every one
    is undone already), so the history is the transcript's already."""


class NoSuchVersion(RewindError):
    """A rewind of a version that is not a committed compaction: none has that number, or it is a rewind."""


class WaitTimeoutError(CompactionWorkerError, TimeoutError):
    """``Client.wait_for`` gave up: the conversation did not get there within its timeout."""


class ConcurrentUpdateError(CompactionWorkerError):
    """Another writer changed a conversation's meta between every read and write of a turn.

    Transient: the turn is delivered again (runtime/turns.is_outage counts it as an outage).
    """


class LostMessageError(CompactionWorkerError):
    """A compaction's result would leave a message neither an entry nor covered by a chunk: it is not
    committed (docs/design.md, invariant 1), and the failure names the messages."""
