"""The summarizer contract: what a summary request holds, what a summarizer returns or raises.

The pipeline, the LiteLLM and extractive summarizers and the prompts all depend on this
module; it depends on none of them. It also says what a summary must be before it replaces
anything (docs/design.md, invariant 6): not empty, not an LLM's or a proxy's error text
returned as content, within its token budget, and smaller than what it replaces. Every
summarizer checks its result with :func:`validate_summary` or :func:`summary_problem`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

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
    items: Sequence[str] = ()
    """The memory's current items (``summaries.schema.Item``, encoded), which a summarizer that writes
    items changes rather than rewrites; one that does not reads them in ``previous_summaries``."""
    itemized: Sequence[bool] = ()
    """For each of ``previous_summaries``: whether it is the rendering of items among ``items``."""
    folds: bool = False
    """Whether the summary replaces the chunks that hold ``items`` (a fold): then its items are all of
    them; else (an additive chunk) the items it adds or changes, the others staying where they are."""
    seqs: Sequence[int] = ()
    """The ``turn_seq`` of each of ``messages`` (the turns an item cites); empty: their positions."""


@dataclass(frozen=True, slots=True)
class SummaryResult:
    """A validated summary, who wrote it, its size, and what the LLM calls cost."""

    text: str
    model: str
    tokens: int
    usage: LlmUsage
    items: tuple[str, ...] = ()
    """The memory's items after this summary (``summaries.schema.Item``, encoded), when it wrote items:
    ``text`` is their rendering; an item that did not change has the bytes it had."""
    refused: int = 0
    """Items the reply stated that the turns they cite do not support: dropped, never stored."""
    let_go: int = 0
    """Items that did not fit the summary's budget (the oldest resolved first): dropped."""


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


# --- what a valid summary is --------------------------------------------------------------

ERROR_TEXT_PATTERNS: Final[tuple[re.Pattern[str], ...]] = tuple(
    re.compile(p, re.IGNORECASE)
    for p in (
        r"^\W*error\b",
        r"^\W*(?:an? )?(?:unexpected |internal )?error (?:has )?occurred",
        r"^(?:i'?m|i am) sorry\b",
        r"^sorry\b",
        r"^(?:unfortunately,? )?i (?:cannot|can'?t|am unable|'m unable|was unable)\b",
        r"^as an ai\b",
        r"^\d{3} [a-z]",  # "429 Too Many Requests", "502 Bad Gateway"
        r"rate.?limit",
        r"too many requests",
        r"quota",
        r"context (?:length|window)",
        r"maximum context",
        r"internal server error",
        r"service unavailable|temporarily unavailable",
        r"bad gateway|gateway time-?out",
        r"overloaded",
        r"timed? ?out",
        r"invalid api key|unauthori[sz]ed",
        r"<html|<!doctype",
        r"\{\s*[\"']error[\"']\s*:",
    )
)
"""What an LLM or proxy error returned as reply content looks like (checked on short replies)."""

_ERROR_TEXT_MAX_CHARS: Final = 400
_MARKUP: Final = re.compile(r"^\s*(?:<!doctype html|<html|<\?xml)", re.IGNORECASE)
_HEADING: Final = re.compile(r"^#{1,6} \S", re.MULTILINE)


def looks_like_error_text(text: str) -> bool:
    """Whether a reply is an error message rather than a summary.

    Only a short, unstructured reply is judged by ``ERROR_TEXT_PATTERNS``: a real summary
    may well quote "rate limit exceeded" in its Errors section or among its points. An HTML page is an error
    whatever its length.
    """
    stripped = text.strip()
    if _MARKUP.match(stripped):
        return True
    if len(stripped) > _ERROR_TEXT_MAX_CHARS or _HEADING.search(stripped) or stripped.count("\n") > 3:
        return False
    if all(line.lstrip().startswith(("- ", "* ")) for line in stripped.splitlines() if line.strip()):
        return False  # a list of points is structured: no provider's error reads as one
    return any(p.search(stripped) for p in ERROR_TEXT_PATTERNS)


def summary_problem(text: str, tokens: int, request: SummaryRequest) -> tuple[str, bool] | None:
    """What is wrong with a summary, and whether asking again could help; None if nothing."""
    if not text.strip():
        return "the summary is empty", True
    if looks_like_error_text(text):
        return f"the reply is an error text, not a summary: {text.strip()[:120]!r}", True
    if tokens > request.max_summary_tokens:
        return (
            f"the summary has {tokens} tokens, over its budget of {request.max_summary_tokens}",
            False,
        )
    if request.replaced_tokens > 0 and tokens >= request.replaced_tokens:
        return (
            f"the summary ({tokens} tokens) is not smaller than what it replaces "
            f"({request.replaced_tokens} tokens)"
        ), False
    return None


def validate_summary(text: str, tokens: int, request: SummaryRequest) -> None:
    """Raise SummarizerError when a summary is empty, an error text, too big, or not smaller."""
    problem = summary_problem(text, tokens, request)
    if problem is not None:
        raise SummarizerError(problem[0])
