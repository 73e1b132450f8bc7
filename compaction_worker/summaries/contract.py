"""The summarizer contract: what a summary request holds, what a summarizer returns or raises.

The pipeline, the LiteLLM and extractive summarizers and the prompts all depend on this
module; it depends on none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from compaction_worker.contracts.events import LlmUsage
from compaction_worker.errors import CompactionWorkerError

CountTokens = Callable[[str], int]


class SummarizerError(CompactionWorkerError):
    """The summarizer produced nothing usable: a failed call or an invalid summary.

    ``usage`` is what the LLM calls made before giving up cost (None when none were made):
    failed attempts are paid for too, and the completion event reports them.
    """

    def __init__(self, message: str, *, usage: LlmUsage | None = None) -> None:
        super().__init__(message)
        self.usage = usage


class InputTooLargeError(SummarizerError):
    """The span does not fit the summarizer's input, even with long tool outputs cut.

    ``transcript_limit`` is what the summarizer now knows it takes (for instance from the
    provider's overflow error), None when it cannot tell: split the span and ask again.
    """

    def __init__(self, message: str, *, transcript_limit: int | None, usage: LlmUsage | None = None) -> None:
        super().__init__(message, usage=usage)
        self.transcript_limit = transcript_limit


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """A span of a conversation to summarize, and the limits its summary must meet."""

    conversation_id: str
    messages: Sequence[Mapping[str, Any]]
    """The span: OpenAI-style message dicts, in order."""
    previous_summaries: Sequence[str] = ()
    """Earlier summaries folded into this one (recursive fold), oldest first."""
    max_summary_tokens: int = 2048
    replaced_tokens: int = 0
    """Tokens of what the summary replaces; a valid summary is strictly smaller."""
    conversation_model: str = ""
    ledger: Sequence[str] = ()
    """Artifact ledger items stored verbatim next to the summary (``"<kind>: <text>"``).

    A summary need not spend its budget repeating them; the LLM prompt does not show them
    (its instructions still ask for exact identifiers), the extractive summary skips them.
    """
    instructions: str | None = None
    """What the runtime asked this summary to keep first (``summaries.instructions``); None: nothing."""


@dataclass(frozen=True, slots=True)
class SummaryResult:
    """A validated summary, who wrote it, its size, and what the LLM calls cost."""

    text: str
    model: str
    tokens: int
    usage: LlmUsage


class Summarizer(Protocol):
    """Turns a :class:`SummaryRequest` into a valid summary, or raises SummarizerError.

    One whose input is bounded also implements :class:`InputLimited`; that part is optional,
    so a summarizer without a bound (the extractive one, a test's fake) needs nothing more.
    """

    name: str
    """Shown in events and the CLI: a model string or ``extractive``."""

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Summarize the request's span; raises SummarizerError when no valid summary results."""
        ...


@runtime_checkable
class InputLimited(Protocol):
    """A summarizer whose input is bounded: it says how much transcript one request may carry."""

    def transcript_limit(self, request: SummaryRequest) -> int | None:
        """Tokens of transcript that fit around the request's frame; None when unbounded.

        Counted as :func:`compaction_worker.summaries.prompts.transcript_costs` counts them, with the
        summarizer's own counter; the request's messages are ignored, its earlier
        summaries and summary budget are not (they take room too).
        """
        ...


def transcript_limit(summarizer: Summarizer, request: SummaryRequest) -> int | None:
    """How much transcript ``summarizer`` takes in one request; None when it declares no bound."""
    return summarizer.transcript_limit(request) if isinstance(summarizer, InputLimited) else None
