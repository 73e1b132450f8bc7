"""Recall: a search over what compaction took out of a conversation's history, for the model to call."""

from compaction_worker.recall.index import RecallHit
from compaction_worker.recall.search import Recall, RecallLimits, RecallResult
from compaction_worker.recall.tools import ANTHROPIC_TOOL, OPENAI_TOOL

__all__ = ["ANTHROPIC_TOOL", "OPENAI_TOOL", "Recall", "RecallHit", "RecallLimits", "RecallResult"]
