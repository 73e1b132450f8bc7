"""The project's exceptions: one root, a few documented kinds."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # events imports this module; the annotation is all that is needed here
    from compaction_worker.contracts.events import LlmUsage


class CompactionWorkerError(Exception):
    """Root of every exception this package raises on purpose."""


class ConfigError(CompactionWorkerError):
    """The settings cannot work (a missing binary, an impossible budget)."""


class DeadLetterReason(StrEnum):
    """Why an input event went to the dead-letter topic instead of the store."""

    MALFORMED_JSON = "malformed_json"
    SCHEMA_VIOLATION = "schema_violation"
    OVERSIZED = "oversized"
    KEY_MISMATCH = "key_mismatch"
    UNKNOWN_MODEL = "unknown_model"
    SEQUENCE_GAP = "sequence_gap"
    CONFLICTING_DUPLICATE = "conflicting_duplicate"


class BadEventError(CompactionWorkerError):
    """An input event that can never be processed; it belongs on the dead-letter topic."""

    def __init__(self, reason: DeadLetterReason, detail: str, conversation_id: str | None = None):
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
        self.conversation_id = conversation_id


class StaleFenceError(CompactionWorkerError):
    """A commit was refused because another writer holds a newer fence (invariant 3)."""


class LockNotAcquiredError(CompactionWorkerError):
    """Another worker holds the conversation's lock."""


class SummarizerError(CompactionWorkerError):
    """The summarizer produced nothing usable: a failed call or an invalid summary.

    ``usage`` is what the LLM calls made before giving up cost (None when none were made):
    failed attempts are paid for too, and the completion event reports them.
    """

    def __init__(self, message: str, *, usage: LlmUsage | None = None) -> None:
        super().__init__(message)
        self.usage = usage


class StoreUnavailableError(CompactionWorkerError):
    """Redis could not be reached; the caller retries, nothing was half-written."""


class RewindError(CompactionWorkerError):
    """A rewind that cannot be done: nothing to undo, or no such compaction version."""
