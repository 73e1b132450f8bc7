"""validate_summary: what is not a summary never passes."""

from __future__ import annotations

import pytest

from compaction_worker.summaries.contract import ERROR_TEXT_PATTERNS, SummarizerError, validate_summary
from tests.summaries.helpers import GOOD_SUMMARY, count, request

ERROR_TEXTS = [
    "Error: upstream request failed",
    "An error occurred while processing your request.",
    "I'm sorry, but I can't help with that.",
    "Sorry, something went wrong.",
    "I cannot summarize this conversation.",
    "As an AI language model, I do not have access to the transcript.",
    "502 Bad Gateway",
    "Rate limit reached for requests",
    "Too Many Requests",
    "You exceeded your current quota.",
    "This model's context length was exceeded.",
    "The maximum context was reached.",
    "Internal Server Error",
    "Service Unavailable: the server is temporarily unavailable",
    "Gateway Timeout",
    "The model is overloaded. Please try again later.",
    "Request timed out.",
    "Invalid API key provided",
    "<html><body><h1>503</h1></body></html>",
    '{"error": {"message": "bad request"}}',
]


class TestValidation:
    """validate_summary: what is not a summary never passes."""

    @pytest.mark.parametrize("text", ERROR_TEXTS)
    def test_error_texts_are_rejected(self, text: str) -> None:
        """An LLM or proxy error returned as content is rejected."""
        with pytest.raises(SummarizerError, match="error text"):
            validate_summary(text, count(text), request())

    def test_every_error_pattern_is_exercised(self) -> None:
        """Each pattern of ERROR_TEXT_PATTERNS matches at least one sample error text."""
        unused = [p.pattern for p in ERROR_TEXT_PATTERNS if not any(p.search(t) for t in ERROR_TEXTS)]
        assert unused == []

    def test_summary_that_mentions_errors_is_valid(self) -> None:
        """A structured summary quoting a rate limit and a 500 in its Errors section passes."""
        text = (
            "## Errors\n- `curl /api` returned 500 Internal Server Error; rate limit exceeded at 14:02\n"
            "## Current state\n- Retrying with backoff."
        )
        validate_summary(text, count(text), request())

    def test_long_html_page_is_rejected(self) -> None:
        """An HTML page is an error whatever its length."""
        text = "<!DOCTYPE html><html>" + "<p>proxy error</p>" * 200 + "</html>"
        with pytest.raises(SummarizerError, match="error text"):
            validate_summary(text, count(text), request())

    @pytest.mark.parametrize("text", ["", "   \n\t "])
    def test_empty_summary_is_rejected(self, text: str) -> None:
        """An empty or whitespace-only summary is rejected."""
        with pytest.raises(SummarizerError, match="empty"):
            validate_summary(text, 0, request())

    def test_oversized_summary_is_rejected(self) -> None:
        """Reference 003 (a bounded summary size): a summary over max_summary_tokens is rejected."""
        with pytest.raises(SummarizerError, match="over its budget of 100"):
            validate_summary(GOOD_SUMMARY, 101, request(max_summary_tokens=100))

    def test_summary_not_smaller_than_what_it_replaces_is_rejected(self) -> None:
        """Reference 000 (no-op rejection): a summary as large as what it replaces is rejected; one token less passes."""
        with pytest.raises(SummarizerError, match="not smaller"):
            validate_summary(GOOD_SUMMARY, 50, request(replaced_tokens=50))
        validate_summary(GOOD_SUMMARY, 49, request(replaced_tokens=50))

    def test_unknown_replaced_size_is_not_checked(self) -> None:
        """replaced_tokens=0 means unknown: only the budget applies."""
        validate_summary(GOOD_SUMMARY, 2000, request(replaced_tokens=0))
