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


class PinError(CompactionWorkerError):
    """A pin that cannot be set: no such turn or message, or a summary already replaced it."""


class ProposalError(CompactionWorkerError):
    """An apply or discard of a proposal that is not pending (applied, discarded or replaced already)."""


class RewindError(CompactionWorkerError):
    """A rewind that cannot be done: nothing to undo, or no such compaction version."""


class WaitTimeoutError(CompactionWorkerError, TimeoutError):
    """``Client.wait_for`` gave up: the conversation did not get there within its timeout."""


class ConcurrentUpdateError(CompactionWorkerError):
    """Another writer changed a conversation's meta between every read and write of a turn.

    Transient: the turn is delivered again (runtime/turns.is_outage counts it as an outage).
    """


class LostMessageError(CompactionWorkerError):
    """A compaction's result would leave a message neither an entry nor covered by a chunk: it is not
    committed (docs/design.md, invariant 1), and the failure names the messages."""
