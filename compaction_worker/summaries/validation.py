"""What a summary must be before it replaces anything (docs/design.md, invariant 6).

Not empty, not an LLM's or a proxy's error text returned as content, within its token
budget, and smaller than what it replaces. Every summarizer checks its result here.
"""

from __future__ import annotations

import re
from typing import Final

from compaction_worker.summaries.contract import SummarizerError, SummaryRequest

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
    may well quote "rate limit exceeded" in its Errors section. An HTML page is an error
    whatever its length.
    """
    stripped = text.strip()
    if _MARKUP.match(stripped):
        return True
    if len(stripped) > _ERROR_TEXT_MAX_CHARS or _HEADING.search(stripped) or stripped.count("\n") > 3:
        return False
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
