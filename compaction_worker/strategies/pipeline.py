"""The pipeline: the enabled stages in cost order, stopping once the history is under its target."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from compaction_worker.contracts.events import LlmUsage, Outcome
from compaction_worker.contracts.history import EffectiveHistory, render
from compaction_worker.errors import LostMessageError
from compaction_worker.observability import tracing
from compaction_worker.offload import off_loop
from compaction_worker.settings import PipelineSettings
from compaction_worker.strategies.dedup import DEDUPLICATE
from compaction_worker.strategies.draft import (
    CompactionResult,
    Counter,
    Draft,
    Limits,
    Stage,
    StageContext,
    StageKind,
    StageOutcome,
    add_usage,
    summary_overhead,
)
from compaction_worker.strategies.oversized import TRUNCATE_OVERSIZED
from compaction_worker.strategies.prune import PRUNE
from compaction_worker.strategies.repair import reaches_target, repair
from compaction_worker.strategies.standing_state import (
    Standing,
    read_items,
    read_state,
    report,
    restore_state,
    unsay_changed,
    without_state,
)
from compaction_worker.strategies.summarize import SUMMARIZE
from compaction_worker.strategies.truncate import SLIDING_WINDOW
from compaction_worker.strategies.working_state import restore_working_state, stale
from compaction_worker.summaries.contract import Summarizer
from compaction_worker.summaries.ledger import ledger_need
from compaction_worker.summaries.standing import merge

NO_STAGE_REACHES = "no stage can reach the target (system prompt, tools and what must stay are too large)"
UNDER_THE_TARGET = "the history is under the target and no summary was worth writing: nothing dropped"


def build_stages(settings: PipelineSettings) -> list[Stage]:
    """The enabled stages, cheapest first: what :func:`compact` runs."""
    candidates: list[tuple[bool, Stage]] = [
        (settings.prune, PRUNE),
        (settings.deduplicate, DEDUPLICATE),
        (settings.truncate_oversized, TRUNCATE_OVERSIZED),
        (settings.summarize, SUMMARIZE),
        (settings.sliding_window, SLIDING_WINDOW),
    ]
    return [stage for enabled, stage in candidates if enabled]


async def compact(
    history: EffectiveHistory,
    limits: Limits,
    summarizers: Sequence[Summarizer],
    counter: Counter,
    *,
    settings: PipelineSettings | None = None,
    originals: Mapping[int, Mapping[str, Any]] | None = None,
    conversation_id: str = "",
    conversation_model: str = "",
    instructions: str | None = None,
) -> CompactionResult:
    """Run the pipeline over a history; the result says whether to commit and what.

    ``originals`` are the transcript messages of entries that an earlier compaction
    edited (pruned, de-duplicated, truncated), by ordinal: a summary covering them reads
    what they said, not their placeholders (see :func:`edited_ordinals`). ``instructions``
    say what the summaries and ledgers keep first (``summaries.instructions``).

    When what must stay (system prompt, tools, the task, pinned messages, the standing state)
    leaves no way to the target, the run aims at each of ``limits.ceilings`` in turn and says
    so in a note: a history brought under its window beats one left over it (invariant 5).
    """
    # What this run's editing stages change is still verbatim in ``history``; what earlier runs
    # changed, in ``originals``.
    verbatim = {e.n: e.message for e in history.entries if e.edit is None and not e.synthetic}
    ctx = StageContext(
        limits,
        settings or PipelineSettings(),
        counter,
        summary_overhead(counter),
        summarizers=tuple(summarizers),
        originals={**verbatim, **(originals or {})},
        conversation_id=conversation_id,
        conversation_model=conversation_model,
        instructions=instructions,
    )
    result = await _compact(history, ctx)
    if result.outcome is not Outcome.NOOP or result.tokens_before <= limits.target:
        return result
    spent = result.usage
    for ceiling in limits.ceilings:
        if ceiling <= limits.target or result.tokens_before <= ceiling:
            continue
        relaxed = await _compact(history, replace(ctx, limits=replace(limits, target=ceiling)))
        spent = add_usage(spent, relaxed.usage)
        if relaxed.outcome is Outcome.COMPACTED:
            note = (
                f"the target ({limits.target} tokens) is out of reach ({result.error}); "
                f"compacted under {ceiling} tokens instead"
            )
            return replace(relaxed, usage=spent, notes=(*relaxed.notes, note))
    tried = [c for c in limits.ceilings if c > limits.target and result.tokens_before > c]
    under = [c for c in limits.ceilings if result.tokens_before <= c]
    why = [result.error or NO_STAGE_REACHES]
    if tried:
        why.append(f"nor can it get under {', '.join(map(str, tried))} tokens")
    if under:
        why.append(f"the history ({result.tokens_before} tokens) stays under {min(under)}, within the window")
    return replace(result, usage=spent, error="; ".join(why))


async def _compact(history: EffectiveHistory, ctx: StageContext) -> CompactionResult:
    """One run of the pipeline towards ``ctx.limits.target``."""
    limits = ctx.limits
    # The sync parts (counting, editing, repair) run in threads: on a large history each takes
    # long enough to stall every other conversation's turns on the event loop.
    run = await off_loop(_Run, history, ctx)
    ctx = run.ctx  # with what the identifiers ask for
    if run.tokens_before <= limits.target and not limits.force:
        return await off_loop(run.result, Outcome.NOOP, run.start, ["already under the target"])
    if (fixed := instruction_tokens(history, limits)) >= limits.target:
        # Nothing may cut the instructions, and nothing else can make room for them.
        reason = (
            f"the system prompt and tool schemas alone ({fixed} tokens) leave no room under "
            f"the target ({limits.target} tokens); they are never cut"
        )
        return await off_loop(run.result, Outcome.NOOP, run.start, [reason])

    # The standing state is put back after whichever stage commits: the stages aim under the
    # target by what it takes (strategies/standing_state.py).
    draft = without_state(run.start)
    whole = ctx
    if run.standing is not None and run.standing.reserve:
        ctx = replace(ctx, limits=replace(limits, target=max(0, limits.target - run.standing.reserve)))
        run.ctx = ctx
    for stage in build_stages(ctx.settings):
        if stage.kind is StageKind.LAST_RESORT and reaches_target(draft, ctx):
            # The last resort drops turns to reach the target: a history under it already (a
            # forced run whose summary had nothing worth writing) keeps them (invariants 10, 11).
            break
        with tracing.span(f"{tracing.STAGE_SPAN}.{stage.name}", {"compaction.stage": stage.name}) as span:
            out = await stage(draft, ctx)
            if out.short_of_room and ctx is not whole:
                # The state's reservation left the summary no room: its items give way before the
                # target does (invariant 5); what the stage leaves, the state takes back at the commit.
                out, ctx = await _state_gives_way(stage, draft, out, run, whole)
            if out.short_of_room:
                # What must stay leaves the summary no room under the target: a summary under a
                # ceiling (invariant 5) keeps more than the last resort would under the target.
                out = await _aim_higher(stage, draft, out, run)
            if out.report is None and stage.kind is StageKind.LAST_RESORT and ctx is not whole:
                # The state's reservation must not make the target unreachable (invariant 5): the
                # last resort aims at the target itself, and the state takes what it leaves.
                out = await stage(draft, whole)
            span.set_attribute("compaction.stage.applied", out.report is not None)
        run.record(out)
        if out.report is None:
            continue
        draft = out.draft
        if stage.kind is not StageKind.EDIT or (reaches_target(draft, ctx) and not limits.force):
            return await off_loop(run.commit, draft)
    if run.applied and reaches_target(draft, run.ctx):
        # A manual compaction whose editing stages did all there was to do; what the summary
        # stage could not do is no error then.
        return await off_loop(run.commit, draft, ())
    if reaches_target(draft, ctx):
        return await off_loop(run.result, Outcome.NOOP, run.start, [*run.errors, UNDER_THE_TARGET])
    return await off_loop(run.result, Outcome.NOOP, run.start, [*run.errors, NO_STAGE_REACHES])


async def _state_gives_way(
    stage: Stage, draft: Draft, out: StageOutcome, run: _Run, whole: StageContext
) -> tuple[StageOutcome, StageContext]:
    """``stage`` again with half the state's reservation, then none, until it has room; the outcome and
    the context the run goes on with (``out`` and the run's own when it never has)."""
    reserve, spent = whole.limits.target - run.ctx.limits.target, out.usage
    for left in (reserve // 2, 0):
        aim = replace(whole, limits=replace(whole.limits, target=whole.limits.target - left))
        retry = await stage(draft, aim)
        spent = add_usage(spent, retry.usage)
        if not retry.short_of_room:
            run.ctx = aim
            return replace(retry, usage=spent), aim
    return replace(out, usage=spent), run.ctx


async def _aim_higher(stage: Stage, draft: Draft, out: StageOutcome, run: _Run) -> StageOutcome:
    """``stage`` again at each ceiling above the target, until one leaves it room; ``out`` if none does.

    Once it succeeds the run works to that ceiling (the standing state is restored under it) and
    its note says why."""
    limits, reserve = run.ctx.limits, run.target - run.ctx.limits.target
    for ceiling in limits.ceilings:
        if ceiling <= run.target:
            continue
        higher = tuple(c for c in limits.ceilings if c > ceiling)
        aim = replace(run.ctx, limits=replace(limits, target=ceiling - reserve, ceilings=higher))
        retry = await stage(draft, aim)
        if retry.report is not None and reaches_target(retry.draft, aim):
            note = (
                f"what must stay leaves a summary no room under the target ({run.target} tokens): "
                f"summarized under {ceiling} tokens instead"
            )
            run.ctx, run.target = aim, ceiling
            return replace(retry, usage=add_usage(out.usage, retry.usage), notes=(*retry.notes, note))
        out = replace(out, usage=add_usage(out.usage, retry.usage))
        if not retry.short_of_room:
            break
    return out


def accounted(draft: Draft) -> set[int]:
    """The transcript ordinals a draft accounts for: its entries, and what its chunks cover."""
    seen = {e.n for e in draft.entries if not e.synthetic}
    for chunk in draft.chunks:
        seen.update(n for n in range(chunk.first_n, chunk.last_n + 1) if chunk.covers(n))
    return seen


def instruction_tokens(history: EffectiveHistory, limits: Limits) -> int:
    """What no stage may compact: the system prompt, system messages and tool schemas."""
    return limits.fixed_tokens + sum(e.tokens for e in history.entries if e.role == "system")


def edited_ordinals(history: EffectiveHistory) -> list[int]:
    """Ordinals of transcript messages the history holds only in edited form: fetch their originals."""
    return [e.n for e in history.entries if e.edit is not None and not e.synthetic]


@dataclass(slots=True)
class _Run:
    """One pipeline run's bookkeeping: the stages applied, what every stage spent and met."""

    history: EffectiveHistory
    ctx: StageContext
    start: Draft = field(init=False)
    tokens_before: int = field(init=False)
    messages_before: int = field(init=False)
    applied: list[StageOutcome] = field(default_factory=list)
    usage: LlmUsage = field(default_factory=LlmUsage)
    errors: list[str] = field(default_factory=list)
    tried: int = 0
    failures: int = 0
    standing: Standing | None = field(init=False)
    target: int = field(init=False)
    """The run's own target (``ctx`` may aim under it by the standing state's reservation)."""

    def __post_init__(self) -> None:
        self.target = self.ctx.limits.target
        self.start = Draft(self.history.chunks, self.history.entries)
        settings, entries = self.ctx.settings, self.history.entries
        items = read_items(entries, self.ctx) if settings.standing_state_max_tokens else ()
        if settings.artifact_budget_tokens:
            # What the identifiers ask for, less what the state's sentences name (one budget, no repeats).
            originals = self.ctx.originals
            messages = [originals.get(e.n, e.message) for e in entries if not e.synthetic and not e.pinned]
            said = "\n".join(i.text for i in items if i.current)
            need = ledger_need(messages, self.history.chunks, self.ctx.count, carried=said)
            self.ctx = replace(self.ctx, ledger_need=need)
        self.tokens_before = self.ctx.tokens(self.start)
        self.standing = read_state(entries, self.ctx, items) if settings.standing_state_max_tokens else None
        if self.standing is not None:
            self.ctx = replace(self.ctx, carried="\n".join(i.text for i in self.standing.held))
        self.messages_before = len(render(self.history, self.ctx.settings.summary_placement))

    def record(self, out: StageOutcome) -> None:
        """Count what a stage spent and met; keep its outcome if it changed the draft."""
        self.usage = add_usage(self.usage, out.usage)
        self.errors.extend(out.errors)
        self.tried += out.tried
        self.failures += out.failures
        if out.report is not None:
            self.applied.append(out)
            if out.items and self.standing is not None:
                # What the summarizer quoted from the user (checked against the messages) joins the state.
                merged = tuple(merge(self.standing.items, out.items))
                self.standing = replace(self.standing, items=merged)

    def commit(self, draft: Draft, errors: Sequence[str] | None = None) -> CompactionResult:
        """The compacted result: ``draft`` repaired (repair runs last on every committed draft).

        A draft with a new summary first gets the working state its span held back
        (:mod:`compaction_worker.strategies.working_state`), within what the target leaves.
        """
        if self.ctx.settings.working_state_max_tokens and (draft.chunks != self.start.chunks or stale(draft)):
            restored = restore_working_state(self.start.entries, draft, self.ctx)
            self.record(restored)
            draft = restored.draft
        repaired = repair(draft, self.ctx)
        if repaired.report is not None:
            self.applied.append(repaired)
        final = repaired.draft
        if self.standing is not None:
            # After repair: the state renders inside the summary turn, outside role order. Within its
            # budget, less than the stages saved (an earlier state's tokens among it: a compaction
            # shrinks the history), and under the run's own target (the stages aimed its reservation
            # under it; what they left beyond serves the items a summarizer quoted).
            final = unsay_changed(self.standing, final, self.ctx)
            after = self.ctx.tokens(final)
            most = min(self.standing.cap, max(0, self.tokens_before - after - 1), max(0, self.target - after))
            # A summary this run wrote gives way to the state's items (not the sliding window's marker,
            # which carries the earlier summaries).
            before = {c.id for c in self.start.chunks}
            written = {c.id for c in final.chunks if c.id not in before and "summarize" in c.stages}
            final = restore_state(self.standing, final, self.ctx, most, narrative=written)
        lost = sorted(accounted(self.start) - accounted(final))
        if lost:
            raise LostMessageError(
                f"{self.ctx.conversation_id or 'the conversation'}: the compaction would leave messages "
                f"{lost[:10]} neither kept nor summarized; nothing is committed"
            )
        return self.result(Outcome.COMPACTED, final, self.errors if errors is None else errors)

    def result(self, outcome: Outcome, draft: Draft, errors: Sequence[str]) -> CompactionResult:
        applied = self.applied if outcome is Outcome.COMPACTED else []
        after = self.history.with_parts(draft.chunks, draft.entries)
        return CompactionResult(
            outcome=outcome,
            draft=draft,
            tokens_before=self.tokens_before,
            tokens_after=self.ctx.tokens(draft),
            messages_before=self.messages_before,
            messages_after=len(render(after, self.ctx.settings.summary_placement)),
            stages=tuple(name for out in applied for name in out.names),
            reports=tuple(out.report for out in applied if out.report is not None),
            summary_tokens=sum(out.summary_tokens for out in applied),
            summarizer=next((out.summarizer for out in reversed(applied) if out.summarizer), None),
            usage=self.usage,
            error="; ".join(errors) or None,
            summarizers_tried=self.tried,
            summarizer_failures=self.failures,
            notes=tuple(note for out in applied for note in out.notes),
            standing=report(self.standing, draft) if self.standing and outcome is Outcome.COMPACTED else None,
            items_refused=sum(out.items_refused for out in applied),
            items_let_go=sum(out.items_let_go for out in applied),
        )
