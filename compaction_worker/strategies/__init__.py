"""The compaction pipeline: plain functions over plain data, cheapest stage first.

Each stage module holds one strategy; :func:`compact` runs the enabled stages in cost order
and stops as soon as the draft is under the target. The only I/O is the injected summarizer.
"""

from compaction_worker.strategies.draft import (
    CompactionResult,
    Draft,
    Limits,
    Stage,
    StageContext,
    StageKind,
    StageOutcome,
    StageReport,
    draft_tokens,
    summary_overhead,
)
from compaction_worker.strategies.pipeline import build_stages, compact, edited_ordinals
from compaction_worker.strategies.repair import provider_problems, repair

__all__ = [
    "CompactionResult",
    "Draft",
    "Limits",
    "Stage",
    "StageContext",
    "StageKind",
    "StageOutcome",
    "StageReport",
    "build_stages",
    "compact",
    "draft_tokens",
    "edited_ordinals",
    "provider_problems",
    "repair",
    "summary_overhead",
]
