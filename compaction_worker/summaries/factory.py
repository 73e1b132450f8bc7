"""The configured summarizer, chosen from the settings."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compaction_worker.budget.tokens import TokenCounter
from compaction_worker.retry import RetryPolicy
from compaction_worker.settings import Settings, SummarizerSettings
from compaction_worker.summaries.contract import CountTokens, Summarizer
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.summaries.llm import LiteLLMSummarizer


def make_summarizer(
    settings: SummarizerSettings, count_tokens: CountTokens, retry: RetryPolicy
) -> Summarizer:
    """The configured summarizer: LiteLLM with a model (its calls retried as ``retry`` says), the extractive one without."""
    if settings.model and settings.model.strip():
        return LiteLLMSummarizer(settings, count_tokens, retry=retry)
    return ExtractiveSummarizer(count_tokens)


Summarizers = Callable[[str, TokenCounter], Sequence[Summarizer]]
"""The summarizers to try, in order, for a conversation's model and token counter."""


def configured_summarizers(settings: Settings) -> Summarizers:
    """The configured summarizer, then the deterministic extractive one as its fallback."""

    def summarizers(_model: str, counter: TokenCounter) -> Sequence[Summarizer]:
        primary = make_summarizer(settings.summarizer, counter.text, settings.retry.llm)
        if isinstance(primary, ExtractiveSummarizer):
            return (primary,)
        return (primary, ExtractiveSummarizer(counter.text))

    return summarizers
