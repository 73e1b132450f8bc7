"""One compaction run: lock, read, pipeline, fenced commit, started/completed events."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from opentelemetry import trace

from compaction_worker import strategies
from compaction_worker.budget.economics import Prices, compaction_cost, rewritten_tokens
from compaction_worker.budget.threshold import calibrated_total, threshold_trigger
from compaction_worker.budget.tokens import TokenCounter, conversation_budget, counter_for
from compaction_worker.contracts.events import (
    CompactionCompleted,
    CompactionProposed,
    Outcome,
    Publish,
    Trigger,
)
from compaction_worker.contracts.history import EffectiveHistory, render, summary_message_text
from compaction_worker.conversation.meta import Job, Meta
from compaction_worker.errors import ProposalNotPending, StaleFenceError
from compaction_worker.observability import metrics
from compaction_worker.observability.logs import bound
from compaction_worker.offload import off_loop
from compaction_worker.runtime.limits import run_limits
from compaction_worker.runtime.payoff import floor_of, paid
from compaction_worker.runtime.pins import apply_asked
from compaction_worker.runtime.reports import Run, context_status, llm_failed
from compaction_worker.settings import Settings
from compaction_worker.state.archive import Archive
from compaction_worker.state.breaker import Breaker, BreakerState, breaker_model
from compaction_worker.state.jobs import Claim, JobQueue
from compaction_worker.state.lock import Lease, Locks
from compaction_worker.state.outbox import Outbox, event_field, pack
from compaction_worker.state.proposals import Proposal, Proposals, replaced_count
from compaction_worker.state.store import Snapshot, Store
from compaction_worker.summaries.factory import Summarizers, configured_summarizers
from compaction_worker.summaries.instructions import applied_instructions

__all__ = ["Compactor", "Summarizers", "applied", "context_status", "llm_failed"]

log = logging.getLogger(__name__)

REACTIVE_UNAPPROVED = (
    "approval is manual, but a reactive compaction (after an overflow) never waits for it: committed at once"
)
AT_WINDOW_UNAPPROVED = (
    "approval is manual, but the history reached what its window leaves for input: committed at once, "
    "without waiting for it"
)


class Compactor:
    """Runs one pending compaction: lock, read, pipeline, commit, events."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        *,
        locks: Locks,
        jobs: JobQueue,
        outbox: Outbox,
        archive: Archive,
        breaker: Breaker,
        publish: Publish,
        summarizers: Summarizers | None = None,
    ) -> None:
        """``summarizers`` replaces the configured ones, every profile's (tests, the demo)."""
        self.settings = settings
        self.proposals = Proposals(store)
        self.store = store
        self.locks = locks
        self.jobs = jobs
        self.outbox = outbox
        self.archive = archive
        self.publish = publish
        self.summarizers = summarizers
        self.breaker = breaker

    async def run(self, claim: Claim) -> CompactionCompleted | None:
        """Run a claimed job under its lock (in the span ``pool.run_job`` opened), finish it, and
        schedule the next run if the conversation is still over its threshold; None past the deadline."""
        with bound(job=claim.job.id, trigger=claim.job.trigger.value):  # every line of the run says which
            cid, job, lease = claim.conversation_id, claim.job, claim.lease
            deadline = self.settings.retry.compactions.deadline_seconds
            span = trace.get_current_span()
            span.set_attribute("compaction.trigger", job.trigger.value)
            completed: CompactionCompleted | None = None
            try:
                async with asyncio.timeout(deadline) as limit:
                    # None: proposed for approval, or a proposal already waits (nothing committed).
                    completed, retry_in = await self._compact(job, lease)
            except TimeoutError:
                if not limit.expired():
                    raise
                # A stuck run must not keep its (renewed) lock forever: it fails, backs off, runs again.
                log.warning("compaction of %s passed its %ss deadline; retried later", cid, deadline)
                span.set_attribute("compaction.outcome", "deadline")
                metrics.record_run(job.trigger.value, Outcome.FAILED.value)
                retry_in = await self._record_failure(cid, await self.store.meta(cid))
            if completed is not None:
                span.set_attributes(
                    {
                        "compaction.outcome": completed.outcome.value,
                        "compaction.tokens.before": completed.tokens_before,
                        "compaction.tokens.after": completed.tokens_after,
                    }
                )
                compacted = completed.outcome is Outcome.COMPACTED
                cost = completed.cost
                if compacted:  # the GenAI conventions set it true only, never false
                    span.set_attribute("gen_ai.conversation.compacted", True)
                if cost is not None and cost.break_even_calls is not None:
                    span.set_attribute("compaction.break_even_calls", cost.break_even_calls)
                metrics.record_run(
                    job.trigger.value,
                    completed.outcome.value,
                    completed.tokens_before if compacted else None,
                    completed.tokens_after if compacted else None,
                    cache_write_cost=cost.cache_write_cost if cost else None,
                    break_even=cost.break_even_calls if cost else None,
                )
            await self.jobs.finish(claim)
            if completed is not None and completed.outcome is Outcome.COMPACTED:
                await self._reschedule_if_still_over(cid)
            elif retry_in is not None:
                # Without this, a failed run's conversation stays over its threshold until a
                # turn happens to arrive after the backoff.
                await self._reschedule_if_still_over(cid, delay=retry_in)
            return completed

    async def _compact(self, job: Job, lease: Lease) -> tuple[CompactionCompleted | None, float | None]:
        """Run the pipeline and commit (or, under ``pipeline.approval: manual``, propose); also
        returns, after a failure, when to try again. None when nothing ended: a proposal was
        made, or one already waits for the runtime."""
        cid = job.conversation_id
        started_at = time.monotonic()
        snapshot = await self.store.snapshot(cid)
        if snapshot.meta.pins:  # pins turns asked for since the lock was last held: first
            await apply_asked(self.store, cid, snapshot.meta.pins)
            snapshot = await self.store.snapshot(cid)
        meta = snapshot.meta
        settings = self.settings.for_profile(meta.profile)  # the conversation's own terms
        full = at_window(meta, settings)
        pending = await self.proposals.get(cid)
        if (
            pending is not None
            and settings.pipeline.approval == "manual"
            and job.trigger is not Trigger.REACTIVE  # an overflow never waits
            and full is None  # nor does a history at its window (invariant 14)
            and (job.trigger is not Trigger.MANUAL or pending.matches(snapshot))
        ):
            # A proposal waits for the runtime: a threshold does not ask again (apply recomputes a
            # stale one); a manual request does, once turns have moved the history past it.
            log.info("compaction of %s waits for proposal %s to be applied", cid, pending.compaction_id)
            return None, None
        counter = counter_for(meta.model, settings.budget)
        planned = run_limits(settings, snapshot, counter, job)
        budget = planned.budget
        summarizers = list((self.summarizers or configured_summarizers(settings))(meta.model, counter))
        # Without a fallback there is nothing to switch to: no breaker then.
        llm = breaker_model(summarizers[0].name, meta.model) if len(summarizers) > 1 else None
        health = await self.breaker.check(llm) if llm else BreakerState()
        circuit_open = health.open
        if circuit_open:  # the model kept failing, for any conversation: only the fallback runs
            summarizers = summarizers[-1:]
        run = Run(
            conversation_id=cid,
            compaction_id=uuid.uuid4(),
            trigger=job.trigger,
            window=budget.window,
            target=planned.target,
            scale=planned.scale,
            tokens_before=int(meta.total_tokens * planned.scale),
            started_at=started_at,
            circuit_open=circuit_open,
            instructions=applied_instructions(meta.instructions, job.instructions),
            with_summary=self.settings.topics.completed_summary,
        )
        await self.publish(
            self.settings.topics.started, run.started(meta, budget.threshold).wire(), cid.encode()
        )
        result: strategies.CompactionResult | None = None
        llm_failures = health.failures
        completed: CompactionCompleted | None
        try:
            originals = await self.store.originals(cid, strategies.edited_ordinals(snapshot.history))
            result = await strategies.compact(
                snapshot.history,
                planned.limits,
                summarizers,
                counter,
                settings=settings.pipeline,
                originals=originals,
                conversation_id=cid,
                conversation_model=meta.model,
                instructions=run.instructions,
            )
            # A threshold run that saves too little is a no-op that says why (invariant 14).
            result = paid(
                result,
                job.trigger,
                before=run.tokens_before,
                scale=run.scale,
                target=run.target,
                budget=budget,
                settings=settings.budget,
            )
            failed = llm_failed(result, len(summarizers), circuit_open)
            if llm is not None and failed is not None:
                llm_failures = await self._record_llm_health(cid, llm, failed)
            completed = await self._settle(
                run,
                snapshot,
                result,
                originals,
                settings,
                lease=lease,
                llm_failures=llm_failures,
                pending=pending,
                full=full,
            )
        except StaleFenceError as e:
            completed = run.unchanged(meta, Outcome.FAILED, result, error=str(e), llm_failures=llm_failures)
        except Exception as e:  # a compaction failure is an event, never a dead worker
            log.exception("compaction of %s failed", cid)
            error = f"{type(e).__name__}: {e}"
            completed = run.unchanged(meta, Outcome.FAILED, None, error=error, llm_failures=llm_failures)
        if completed is None:
            return None, None  # proposed
        retry_in: float | None = None
        # A newer fence means another writer owns the conversation now (it took the lock
        # after ours expired): its state is not ours to stamp, and it reschedules itself.
        if completed.outcome is Outcome.FAILED and not await self._superseded(cid, lease.fence):
            retry_in = await self._record_failure(cid, meta)
        if completed.outcome is not Outcome.COMPACTED:  # a commit publishes through the outbox
            await self.publish(self.settings.topics.completed, completed.wire(), cid.encode())
        log.info(
            "compaction of %s: %s, %s -> %s tokens (window %s, target %s)%s",
            cid,
            completed.outcome.value,
            completed.tokens_before,
            completed.tokens_after,
            planned.info.window,
            planned.target,
            " with the LLM skipped (circuit open)" if circuit_open else "",
        )
        return completed, retry_in

    async def _settle(
        self,
        run: Run,
        snapshot: Snapshot,
        result: strategies.CompactionResult,
        originals: Mapping[int, Mapping[str, Any]],
        settings: Settings,
        *,
        lease: Lease,
        llm_failures: int,
        pending: Proposal | None,
        full: int | None,
    ) -> CompactionCompleted | None:
        """What a run's result becomes: a no-op, a proposal (None) or a commit. ``full``: what the
        window leaves for input, when the history has reached it (:func:`at_window`)."""
        if not result.shrinks:
            return await self._noop(run, snapshot, result, llm_failures)
        manual = settings.pipeline.approval == "manual"
        reactive = run.trigger is Trigger.REACTIVE
        if manual and not reactive and full is None:
            await self._propose(run, snapshot, result, llm_failures, replaces=pending)
            return None
        if manual:  # it did not wait for approval: its event says why
            note = REACTIVE_UNAPPROVED if reactive else AT_WINDOW_UNAPPROVED
            result = replace(result, notes=(*result.notes, note))
        completed = await self._commit(
            run, snapshot, result, originals, settings, lease=lease, llm_failures=llm_failures
        )
        if pending is not None:  # what it proposed no longer applies to the history
            if not manual:
                why = "a compaction without approval"
            elif reactive:
                why = "a reactive compaction, after an overflow,"
            else:
                why = (
                    f"the history reached what its window leaves for input ({run.tokens_before} of "
                    f"{full} tokens): a compaction without approval"
                )
            await self._discarded(run.conversation_id, pending, f"{why} replaced it")
        return completed

    async def _propose(
        self,
        run: Run,
        snapshot: Snapshot,
        result: strategies.CompactionResult,
        llm_failures: int,
        *,
        replaces: Proposal | None,
    ) -> None:
        """Publish ``compaction.proposed`` and store the proposal (``replaces``, stale, is discarded)."""
        cid, meta = run.conversation_id, snapshot.meta
        proposal = Proposal(
            compaction_id=run.compaction_id,
            trigger=run.trigger,
            version=meta.version,
            last_seq=meta.last_seq,
            entry_count=snapshot.entry_count,
            window=run.window,
            target=run.target,
            scale=run.scale,
            tokens_before=run.tokens_before,
            circuit_open=run.circuit_open,
            llm_failures=llm_failures,
            duration_ms=int((time.monotonic() - run.started_at) * 1000),
            result=result,
            instructions=run.instructions,
            replaced=replaced_count(snapshot.history.entries, result.draft.entries),
        )
        if replaces is not None:
            await self._discarded(
                cid, replaces, f"the history changed: replaced by proposal {run.compaction_id}"
            )
        # The event first: stored first, a failed publish would leave a proposal no retry announces.
        await self.publish(
            self.settings.topics.proposed,
            proposed_event(proposal, cid, replaces=replaces.compaction_id if replaces else None).wire(),
            cid.encode(),
        )
        await self.proposals.put(cid, proposal)

    async def apply(self, conversation_id: str, proposal_id: uuid.UUID) -> CompactionCompleted | None:
        """Commit the pending proposal ``proposal_id`` exactly as proposed, under the conversation's
        lock; its ``compaction.completed`` follows. None when the history has changed since
        (turns arrived, or another compaction committed): a manual compaction is scheduled, and
        its new proposal (``compaction.proposed``, ``replaces`` this one) replaces it.

        Raises ProposalNotPending (no such proposal pending), LockNotAcquiredError (a compaction is
        running: try again shortly) or StaleFenceError (the lock was lost before the commit).
        """
        cid = conversation_id
        async with self.locks.exclusive(cid, self.store.keys(cid)) as lease:
            pending = await self._pending(cid, proposal_id)
            snapshot = await self.store.snapshot(cid)
            if not pending.matches(snapshot):
                await self.jobs.schedule(cid, Trigger.MANUAL)
                log.info("proposal %s of %s is stale: recomputed", proposal_id, cid)
                return None
            settings = self.settings.for_profile(snapshot.meta.profile)
            originals = await self.store.originals(cid, strategies.edited_ordinals(snapshot.history))
            completed = await self._commit(
                self._run_of(pending, cid),
                snapshot,
                pending.result,
                originals,
                settings,
                lease=lease,
                llm_failures=pending.llm_failures,
            )
            await self.proposals.remove(cid)
        log.info("proposal %s of %s applied: version %s", proposal_id, cid, completed.version)
        await self._reschedule_if_still_over(cid)
        return completed

    async def discard(self, conversation_id: str, proposal_id: uuid.UUID) -> None:
        """Drop the pending proposal ``proposal_id``; its ``compaction.completed`` says ``discarded``.
        Raises ProposalNotPending or LockNotAcquiredError, as :meth:`apply`."""
        cid = conversation_id
        async with self.locks.exclusive(cid, self.store.keys(cid)):
            await self._discarded(cid, await self._pending(cid, proposal_id), "discarded by the runtime")

    async def _pending(self, cid: str, proposal_id: uuid.UUID) -> Proposal:
        pending = await self.proposals.get(cid)
        if pending is None or pending.compaction_id != proposal_id:
            waiting = f"proposal {pending.compaction_id} is" if pending is not None else "none is"
            raise ProposalNotPending(
                f"{cid}: proposal {proposal_id} is not pending ({waiting}): it was applied, discarded or "
                "replaced by a newer one; Client.proposal shows the one that waits"
            )
        return pending

    async def _discarded(self, cid: str, proposal: Proposal, reason: str) -> None:
        """Remove ``proposal`` and end its run: ``compaction.completed``, outcome ``discarded``."""
        await self.proposals.remove(cid)
        meta = await self.store.meta(cid)
        completed = self._run_of(proposal, cid).unchanged(
            meta, Outcome.DISCARDED, None, error=reason, llm_failures=proposal.llm_failures
        )
        await self.publish(self.settings.topics.completed, completed.wire(), cid.encode())
        log.info("proposal %s of %s %s", proposal.compaction_id, cid, reason)

    def _run_of(self, proposal: Proposal, cid: str) -> Run:
        """The run that computed ``proposal``, to end it with: its events carry its compaction id."""
        return Run(
            conversation_id=cid,
            compaction_id=proposal.compaction_id,
            trigger=proposal.trigger,
            window=proposal.window,
            target=proposal.target,
            scale=proposal.scale,
            tokens_before=proposal.tokens_before,
            started_at=time.monotonic() - proposal.duration_ms / 1000,
            circuit_open=proposal.circuit_open,
            instructions=proposal.instructions,
            with_summary=self.settings.topics.completed_summary,
        )

    async def _noop(
        self, run: Run, snapshot: Snapshot, result: strategies.CompactionResult, llm_failures: int
    ) -> CompactionCompleted:
        """Commit nothing; remember the size that could not shrink (enough), so that it is not retried
        in a loop, and where a compaction would have ended, if over its target (the floor)."""
        meta = snapshot.meta
        error = result.error
        if result.outcome is Outcome.COMPACTED:
            # A forced run (manual, or reactive under our estimate) can turn a short span
            # into a summary turn that costs more than the span did: committing that would
            # grow a history the provider may just have called too long (docs/design.md, invariant 5).
            error = f"the compaction would not shrink the history ({result.tokens_before} -> {result.tokens_after})"
        floor = floor_of(result, scale=run.scale, target=run.target) or meta.floor_tokens
        await self.store.set_meta(
            run.conversation_id, noop_tokens=calibrated_total(meta) or 1, floor_tokens=floor
        )
        return run.unchanged(meta, Outcome.NOOP, result, error=error, llm_failures=llm_failures)

    async def _commit(
        self,
        run: Run,
        snapshot: Snapshot,
        result: strategies.CompactionResult,
        originals: Mapping[int, Mapping[str, Any]],
        settings: Settings,
        *,
        lease: Lease,
        llm_failures: int,
    ) -> CompactionCompleted:
        """Archive what it replaced (idempotent), then the fenced commit with its event in the outbox; publish."""
        cid, meta = run.conversation_id, snapshot.meta
        counter = counter_for(meta.model, settings.budget)
        # Counting a large history is CPU: off the event loop, so other conversations' turns go on.
        history, token_delta = await off_loop(applied, snapshot.history, result, counter)
        placement = settings.pipeline.summary_placement
        rewritten = await off_loop(
            rewritten_tokens, render(snapshot.history, placement), render(history, placement), counter.message
        )
        status = context_status(result.draft)
        dropped = await self.archive.record(cid, snapshot.history, history, originals)
        cost = compaction_cost(
            Prices.of(meta.model),
            tokens_removed=run.tokens_before - int(result.tokens_after * run.scale),
            cache_write_tokens=int(rewritten * run.scale),
            summary_cost=result.usage.cost_usd,
        )
        # The commit succeeds only at exactly this version (the script checks it).
        completed = run.completed(
            Outcome.COMPACTED,
            version=meta.version + 1,
            status=status,
            result=result,
            error=result.error,
            llm_failures=llm_failures,
            artifacts_dropped=dropped,
            cost=cost,
        )
        record: Mapping[str, Any] = {
            "version": meta.version + 1,
            "trigger": run.trigger.value,
            "compaction_id": str(run.compaction_id),
            "at": time.time(),
            "stages": list(result.stages),
            "tokens_before": result.tokens_before,
            "tokens_after": result.tokens_after,
            "chunks_before": [c.to_json() for c in snapshot.history.chunks],
            "covered_through_n": max((c.last_n for c in result.draft.chunks), default=0),
        }
        field = event_field(completed.version, str(run.compaction_id))
        await self.outbox.expect(cid)
        # The verbatim tail the draft kept as the transcript holds it stays there: not written again.
        kept = snapshot.in_transcript(result.draft.entries)
        await self.store.commit(
            cid,
            fence=lease.fence,
            lock_token=lease.token,
            expected_version=meta.version,
            consumed=snapshot.entry_count - kept,
            chunks=result.draft.chunks,
            entries=result.draft.entries[: len(result.draft.entries) - kept],
            tokens=token_delta,
            status=status,
            record=record,
            outbox=(field, pack(self.settings.topics.completed, completed.wire())),
            # The threshold rule's marks: where compactions end, and the turn this one ran on.
            floor_tokens=floor_of(result, scale=run.scale, target=run.target),
            compacted_seq=meta.last_seq,
        )
        await self.outbox.deliver(cid, field)
        return completed

    async def _record_llm_health(self, cid: str, model: str, failed: bool) -> int:
        """Count the run on its model's breaker (shared by every conversation); returns the model's count."""
        health = await self.breaker.record(model, failed=failed)
        if health.open:
            log.warning(
                "%s: %s failed %s runs in a row; using the fallback for a while", cid, model, health.failures
            )
        return health.failures

    async def _superseded(self, cid: str, fence: int) -> bool:
        """Whether another writer acquired the conversation since our fence."""
        return await self.locks.fence(self.store.keys(cid)) != fence

    async def _record_failure(self, cid: str, meta: Meta) -> float:
        """Count the failure and back off (the compactions' retry policy); returns the backoff in seconds."""
        failures = meta.failures + 1
        backoff = self.settings.retry.compactions.backoff(failures)
        await self.store.set_meta(cid, failures=failures, retry_after=time.time() + backoff)
        return backoff

    async def _reschedule_if_still_over(self, cid: str, delay: float = 0.0) -> None:
        """Schedule another run (after ``delay``) if the conversation is over its threshold then.

        After a commit, only if turns appended during the compaction pushed it over again, or it
        is still over its window (the commit's ``compacted_seq``: one run a turn, invariant 14);
        after a failure, if it is still over once the backoff (``delay``) has passed.
        """
        meta = await self.store.meta(cid)
        budget = self.settings.for_profile(meta.profile).budget
        trigger = threshold_trigger(meta, budget, time.time() + delay)
        if trigger is not None:
            await self.jobs.schedule(cid, trigger, delay_seconds=delay)


def proposed_event(proposal: Proposal, cid: str, *, replaces: uuid.UUID | None = None) -> CompactionProposed:
    """The ``compaction.proposed`` event of ``proposal`` (in the event's units, as the completion's)."""
    result, scale = proposal.result, proposal.scale
    chunks = result.draft.chunks
    return CompactionProposed(
        conversation_id=cid,
        compaction_id=proposal.compaction_id,
        trigger=proposal.trigger,
        version=proposal.version,
        last_seq=proposal.last_seq,
        stages=list(result.stages),
        tokens_before=proposal.tokens_before,
        tokens_after=int(result.tokens_after * scale),
        messages_before=result.messages_before,
        messages_after=result.messages_after,
        summary=summary_message_text(chunks) if chunks else None,
        summarizer_model=result.summarizer,
        llm_usage=result.usage,
        standing_state=result.standing,
        notes=list(result.notes),
        instructions=proposal.instructions,
        replaces=replaces,
    )


def applied(
    history: EffectiveHistory, result: strategies.CompactionResult, counter: TokenCounter
) -> tuple[EffectiveHistory, int]:
    """The history a commit of ``result`` leaves, and the change in history tokens it stores (replay uses it too)."""
    overhead = strategies.summary_overhead(counter)
    old = strategies.draft_tokens(strategies.Draft(history.chunks, history.entries), overhead)
    new = strategies.draft_tokens(result.draft, overhead)
    return history.with_parts(result.draft.chunks, result.draft.entries), new - old


def at_window(meta: Meta, settings: Settings) -> int | None:
    """What the conversation's window leaves for input (the budget's ``available``) when its
    calibrated total has reached it, else None: a history there cannot wait for an approval.

    ``available``, not the window: a prompt past it leaves the reply less than its output reserve,
    and the provider refuses the call (or cuts the reply short) before the window itself is full.
    """
    available = conversation_budget(meta, settings.budget)[1].available
    return available if calibrated_total(meta) >= available else None
