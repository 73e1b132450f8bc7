"""The configured summarizer, chosen from the settings."""

from __future__ import annotations

from compaction_worker.retry import RetryPolicy
from compaction_worker.settings import SummarizerSettings
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
