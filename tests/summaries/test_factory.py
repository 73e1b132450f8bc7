"""make_summarizer: LiteLLM with a model, the extractive summary without."""

from __future__ import annotations

import pytest

from compaction_worker.settings import SummarizerSettings
from compaction_worker.summaries.extractive import ExtractiveSummarizer
from compaction_worker.summaries.factory import make_summarizer
from compaction_worker.summaries.llm import LiteLLMSummarizer
from tests.summaries.helpers import count, llm_retry


class TestMakeSummarizer:
    """make_summarizer picks LiteLLM with a model and the extractive summary without."""

    @pytest.mark.parametrize("model", [None, "", "   "])
    def test_no_model_is_extractive(self, model: str | None) -> None:
        """No model configured means the extractive summarizer."""
        chosen = make_summarizer(SummarizerSettings(model=model), count, llm_retry())
        assert isinstance(chosen, ExtractiveSummarizer)
        assert chosen.name == "extractive"

    @pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "conversation"])
    def test_model_is_litellm(self, model: str) -> None:
        """References 001 and 004 (a configurable summary model): a model string, or 'conversation', means the LiteLLM summarizer named after it."""
        chosen = make_summarizer(SummarizerSettings(model=model), count, llm_retry())
        assert isinstance(chosen, LiteLLMSummarizer)
        assert chosen.name == model
