"""Rewind: an operator's undo of a committed compaction, from the preserved transcript.

It takes the conversation's lock and commits through the same fence as a compaction.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from compaction_worker import strategies
from compaction_worker.budget.threshold import scale_of
from compaction_worker.budget.tokens import conversation_budget, counter_for
from compaction_worker.contracts.events import (
    CompactionCompleted,
    CompactionStarted,
    Outcome,
    Publish,
    Trigger,
)
from compaction_worker.contracts.history import Entry, SummaryChunk, render
from compaction_worker.runtime.limits import limits_for
from compaction_worker.settings import Settings
from compaction_worker.state import restore
from compaction_worker.state.archive import Archive, let_go
from compaction_worker.state.lock import Locks
from compaction_worker.state.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Rewound:
    """A committed rewind: the event it published and what it restored."""

    completed: CompactionCompleted
    rewound_version: int
    chunks: int
    """Summary chunks in the restored history (those that existed before the undone compaction)."""
    restored_messages: int
    """Transcript messages that are entries again, verbatim."""
    over_threshold: bool
    """The restored history is over the threshold: the next turn schedules a compaction."""


class Rewinder:
    """Undoes a committed compaction from the preserved transcript, under the conversation's lock."""

    def __init__(
        self, settings: Settings, store: Store, *, locks: Locks, archive: Archive, publish: Publish
    ) -> None:
        self.settings = settings
        self.store = store
        self.locks = locks
        self.archive = archive
        self.publish = publish

    async def rewind(self, conversation_id: str, version: int | None = None) -> Rewound:
        """Restore the history from before compaction ``version`` (default: the latest in effect).

        The rewind commits a new version and publishes ``compaction.started`` and
        ``.completed`` (trigger ``rewind``, outcome ``rewound``) together once it is committed: it makes no LLM
        call, so there is nothing to wait for, and consumers that pair the two still can.
        It does not schedule a compaction: the next turn's budget check decides that.
        Raises RewindError (nothing to rewind), LockNotAcquiredError (a compaction is
        running) or StaleFenceError (the lock was lost before the commit).
        """
        cid = conversation_id
        started_at = time.monotonic()
        async with self.locks.exclusive(cid, self.store.keys(cid)) as lease:
            meta = await self.store.meta(cid)
            settings = self.settings.for_profile(meta.profile)
            _, budget = conversation_budget(meta, settings.budget)
            scale = scale_of(meta)
            counter = counter_for(meta.model, settings.budget)
            overhead = strategies.summary_overhead(counter)
            limits = limits_for(settings, meta, budget, budget.target, scale, force=False)
            ctx = strategies.StageContext(limits, settings.pipeline, counter, overhead)

            def repair(chunks: tuple[SummaryChunk, ...], entries: tuple[Entry, ...]) -> tuple[Entry, ...]:
                # The pipeline's last stage, as on every compaction commit: verbatim messages
                # next to old chunks may need a synthetic turn to stay valid (docs/design.md, invariant 4).
                return strategies.repair(strategies.Draft(chunks, entries), ctx).draft.entries

            result = await restore.rewind(
                self.store,
                cid,
                fence=lease.fence,
                lock_token=lease.token,
                version=version,
                overhead=overhead,
                repair=repair,
            )
        before = result.before
        restored = before.history.with_parts(result.chunks, result.entries)
        placement = settings.pipeline.summary_placement
        archived = await self.archive.items(cid)
        compaction_id = uuid.uuid4()
        tokens_before = int(before.meta.total_tokens * scale)
        # The whole total after the rewind, messages appended while it ran included.
        tokens_after = int((result.history_tokens + before.meta.fixed_tokens) * scale)
        started = CompactionStarted(
            conversation_id=cid,
            compaction_id=compaction_id,
            trigger=Trigger.REWIND,
            model=meta.model,
            tokens_before=tokens_before,
            window=budget.window,
            threshold=budget.threshold,
            target=budget.target,
            version=before.meta.version,
        )
        completed = CompactionCompleted(
            conversation_id=cid,
            compaction_id=compaction_id,
            trigger=Trigger.REWIND,
            outcome=Outcome.REWOUND,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
            messages_before=len(render(before.history, placement)),
            messages_after=len(render(restored, placement)),
            window=budget.window,
            target=budget.target,
            version=result.version,
            context_status=result.context_status,
            duration_ms=int((time.monotonic() - started_at) * 1000),
            # As a compaction counts it: what the history carried and the restored one does not (a rewind
            # brings messages back, so mostly nothing).
            artifacts_dropped=len(let_go(archived, before.history, restored)),
        )
        await self.publish(self.settings.topics.started, started.wire(), cid.encode())
        await self.publish(self.settings.topics.completed, completed.wire(), cid.encode())
        log.info(
            "rewound compaction %s of %s: version %s, %s -> %s tokens",
            result.rewound,
            cid,
            result.version,
            tokens_before,
            tokens_after,
        )
        return Rewound(
            completed=completed,
            rewound_version=result.rewound,
            chunks=len(result.chunks),
            restored_messages=sum(1 for e in result.entries if not e.synthetic),
            over_threshold=tokens_after >= budget.threshold,
        )
