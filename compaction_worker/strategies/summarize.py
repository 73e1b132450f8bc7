"""The summary stage: older turns become additive chunks; chunks fold when over their budget.

A span too large for the summarizer's input is split into pieces, each its own chunk;
when a summarizer fails, the next one takes what is left.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from compaction_worker.contracts.events import LlmUsage
from compaction_worker.contracts.history import Entry, SummaryChunk, public_message, text_of
from compaction_worker.offload import off_loop
from compaction_worker.strategies.allocation import MIN_SUMMARY_TOKENS, Keeps, Wants, allocate
from compaction_worker.strategies.draft import (
    Draft,
    StageContext,
    StageKind,
    StageOutcome,
    StageReport,
    add_usage,
    chunk_frame,
    make_chunk,
    plural,
)
from compaction_worker.strategies.oversized import cut_kept, cut_to, statement
from compaction_worker.strategies.repair import reaches_target
from compaction_worker.strategies.tail import (
    Partition,
    is_filler_message,
    newest_step,
    partition,
    split_points,
    task_index,
)
from compaction_worker.summaries import schema
from compaction_worker.summaries.contract import (
    InputTooLargeError,
    Summarizer,
    SummarizerError,
    SummaryRequest,
    SummaryResult,
    transcript_limit,
)
from compaction_worker.summaries.ledger import finalize_ledger, ledger_need, plan_ledger
from compaction_worker.summaries.prompts import piece_boundaries, piece_end, transcript_costs
from compaction_worker.summaries.sentences import classify
from compaction_worker.summaries.standing import Item, quoted

log = logging.getLogger(__name__)

STAGE = "summarize"
PIECE_SUMMARY_TOKENS = 256
"""The least room a piece's own chunk is given when a span is read in pieces; below it (its share
of the room), the pieces are chained instead: each request carries the summary so far, and writes the
one chunk anew with the whole room (a share of 63 tokens for 6K read says nothing)."""
ALLOCATION_TRIES = 3
"""Allocations the stage tries when the cuts overshoot their shares (strategies/allocation.py)."""


@dataclass(frozen=True, slots=True)
class _Piece:
    """One request's worth of the span, with the budget its chunk must keep to."""

    start: int
    stop: int
    folded: tuple[SummaryChunk, ...]
    request: SummaryRequest
    ledger_budget: int
    frame: int
    """Tokens of the chunk around its summary: heading and ledger."""
    replaced: int
    carried: int
    """Tokens of this span's chunk so far that the piece carries and rewrites (chained pieces)."""


@dataclass(slots=True)
class _Span:
    """What the summary stage replaces, and the pieces' chunks as they are written."""

    ctx: StageContext
    head: tuple[Entry, ...]
    messages: list[Mapping[str, Any]]
    pinned: tuple[Entry, ...]
    folded: tuple[SummaryChunk, ...]
    space: int
    """Tokens the new chunks may take together; shrinks as chunks are written."""
    replaced: int
    """Tokens of what is still to be replaced; shrinks likewise."""
    allowance: int
    """What a chunk's ledger may take (``ledger_allowance``); a fold's may take more."""
    fold_allowance: int
    writers: list[str] = field(default_factory=list)
    """Who wrote each piece's summary, in order (a chained chunk has several writers)."""
    chain: bool = False
    """Pieces are chained (:data:`PIECE_SUMMARY_TOKENS`): each rewrites the one chunk with the room."""
    chunks: list[SummaryChunk] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    """The user's sentences the summaries quoted as standing items, each found in a user message."""
    anchor: tuple[SummaryChunk, ...] = ()
    """The chunks that stay (no fold): their items are the memory an additive chunk's changes apply to."""
    refused: int = 0
    """Summary items the check refused (``summaries.schema``)."""
    let_go: int = 0
    """Summary items that did not fit their chunk's budget."""

    def carried(self, start: int) -> tuple[SummaryChunk, ...]:
        """The earlier summaries a piece starting at ``start`` rewrites: the chunks it folds (the first
        piece), or, chained, this span's chunk so far."""
        if start == 0:
            return self.folded
        return tuple(self.chunks) if self.chain else ()

    def share(self, start: int, stop: int) -> int:
        """The room a piece's own summary would have as one of several additive chunks."""
        replaced = sum(e.tokens for e in self.head[start:stop]) + sum(c.tokens for c in self.carried(start))
        return self.space * replaced // max(1, self.replaced)

    def piece(self, start: int, stop: int) -> _Piece | str:
        """The request for ``messages[start:stop]`` (folding, if it is the first); a reason if none fits."""
        ctx, count = self.ctx, self.ctx.count
        folded = self.carried(start)
        carried = sum(c.tokens for c in folded) if start > 0 else 0
        entries, messages = self.head[start:stop], self.messages[start:stop]
        replaced = sum(e.tokens for e in entries) + sum(c.tokens for c in folded)
        # A share of the space by what the piece replaces; what earlier pieces left unused
        # passes on, and the last piece gets all that remains. A chained piece has all of it.
        whole = stop >= len(self.head) or self.chain
        space = self.space + carried if whole else self.share(start, stop)
        # The ledger takes at most half of what is left beyond a minimal summary, both of the room and of
        # what the chunk replaces: a summary asked for in a few dozen tokens is one no model writes (its
        # identifiers ask the allocation for more room instead: strategies/allocation.py).
        allowance = self.fold_allowance if folded and not carried else self.allowance
        cap = max(0, (min(space, replaced) - MIN_SUMMARY_TOKENS) // 2)
        ledger_budget, ledger = plan_ledger(
            messages, folded, allowance=allowance, cap=cap, count=count, terms=ctx.terms
        )
        heading, ledger_tokens = chunk_frame(entries, folded, ledger, count)
        if ledger and min(ctx.limits.max_summary_tokens, space - ledger_tokens) < MIN_SUMMARY_TOKENS:
            # The least summary ranks above the ledger: the ledger takes what the summary leaves
            # (``finalize_ledger``) instead.
            ledger_budget, ledger = 0, ()
            heading, ledger_tokens = chunk_frame(entries, folded, ledger, count)
        if min(ctx.limits.max_summary_tokens, space - ledger_tokens) < MIN_SUMMARY_TOKENS:
            return f"no room for a summary: {space} tokens left under the target"
        # The memory's items: the folded chunks' (their summary rewritten), else those of the chunks that
        # stay (the new chunk holds what changed).
        layers = folded if folded else (*self.anchor, *self.chunks)
        current = schema.merge([[schema.Item.decode(raw) for raw in c.items] for c in layers])
        request = SummaryRequest(
            conversation_id=ctx.conversation_id,
            messages=messages,
            previous_summaries=[c.text for c in folded],
            itemized=[bool(c.items) for c in folded],
            items=[item.encode() for item in current],
            folds=bool(folded),
            seqs=[e.seq for e in entries],
            # The chunk is heading, summary and ledger: the summary gets what the other two leave.
            max_summary_tokens=min(ctx.limits.max_summary_tokens, space - ledger_tokens - heading),
            # The whole chunk must be smaller than what it replaces; 0 would mean "unknown".
            replaced_tokens=max(1, replaced - ledger_tokens - heading),
            conversation_model=ctx.conversation_model,
            ledger=ledger,
            instructions=ctx.instructions,
        )
        return _Piece(start, stop, folded, request, ledger_budget, heading + ledger_tokens, replaced, carried)

    def add(self, piece: _Piece, summary: SummaryResult) -> None:
        """The piece's chunk, its ledger completed with what the summary lost; the user's sentences
        the summary quotes as standing items, checked against the piece's user messages."""
        count, request = self.ctx.count, piece.request
        entries = self.head[piece.start : piece.stop]
        if self.ctx.settings.standing_state_max_tokens:
            # What the user wrote, in this piece or kept beside it (the task): where a quote must be.
            said = [
                (e.seq, e.n, text_of(m))
                for e, m in zip(entries, request.messages, strict=True)
                if e.role == "user"
            ] + [
                (e.seq, e.n, text_of(self.ctx.originals.get(e.n, e.message)))
                for e in self.pinned
                if e.role == "user"
            ]
            items, text = quoted(summary.text, said)
            self.items.extend(items)
            self.items.extend(_stated(summary.items, request, entries))
            if text != summary.text:
                summary = replace(summary, text=text, tokens=count(text))
        # Pinned entries go with the piece before them, as with a single chunk.
        low = self.head[piece.start].n if piece.start > 0 else -1
        high = self.head[piece.stop].n if piece.stop < len(self.head) else math.inf
        kept = [e for e in self.pinned if low <= e.n < high]
        chained = piece.carried > 0
        if chained:
            stages = piece.folded[0].stages  # the chain's first chunk says whether it folded
        else:
            stages = ("summarize", "fold") if piece.folded else ("summarize",)
        # The ledger keeps what the summary lost; it may use what the summary left of its share.
        summary_room = min(request.max_summary_tokens, request.replaced_tokens)
        chunk_cap = piece.frame + summary_room
        unused = max(0, summary_room - count(summary.text)) if self.allowance else 0  # 0: no ledger at all
        # ... but at most half of what the chunk replaces: the chunk must save tokens.
        budget = min(
            piece.ledger_budget + unused, max(piece.ledger_budget, (piece.replaced - MIN_SUMMARY_TOKENS) // 2)
        )
        ledger = finalize_ledger(
            # What the standing state shows needs no ledger line (nor what the summary says).
            f"{summary.text}\n{self.ctx.carried}" if self.ctx.carried else summary.text,
            request.ledger,
            request.messages,
            piece.folded,
            budget=budget,
            count=count,
            terms=self.ctx.terms,
            fits=lambda items: (
                make_chunk(
                    summary.text, entries, piece.folded, model="", stages=(), count=count, artifacts=items
                ).tokens
                <= chunk_cap
            ),
        )
        chunk = make_chunk(
            summary.text,
            entries,
            piece.folded,
            model=summary.model,
            stages=stages,
            count=count,
            artifacts=ledger,
            kept=kept,
            items=summary.items,
        )
        self.refused += summary.refused
        self.let_go += summary.let_go
        if chained:
            # One chunk rewritten, not a fold: its level is the one it carries.
            chunk = replace(chunk, level=max((c.level for c in piece.folded), default=0))
            self.chunks.clear()
        self.chunks.append(chunk)
        self.space += piece.carried - chunk.tokens
        self.replaced -= piece.replaced - piece.carried
        self.writers.append(summary.model)


@dataclass(slots=True)
class _Attempts:
    """The summarizers asked so far: who is on, what failed and why, what it all cost."""

    summarizers: Sequence[Summarizer]
    current: int = 0
    asked: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    usage: LlmUsage = field(default_factory=LlmUsage)

    def spend(self, usage: LlmUsage | None) -> None:
        # Failed calls were paid for too.
        if usage is not None:
            self.usage = add_usage(self.usage, usage)

    def fail(self, reason: str) -> None:
        """The current summarizer gave up; the next one takes over."""
        name = self.summarizers[self.current].name
        self.errors.append(f"{name}: {reason}")
        self.asked.add(self.current)
        self.current += 1
        after = self.summarizers[self.current].name if self.current < len(self.summarizers) else None
        log.warning(
            "summary by %s failed (%s); %s",
            name,
            reason,
            f"falling back to {after}" if after else "no summarizer left",
        )


async def _write_chunks(span: _Span) -> tuple[_Attempts, str | None]:
    """Summarize the span piece by piece; the attempts, and why it stopped short (None: it did not)."""
    summarizers = span.ctx.summarizers
    attempts = _Attempts(summarizers)
    costs: list[int] | None = None  # counted once a limit makes them matter
    # The fold's piece covers every entry inside the folded chunks' spans (ones they kept
    # then and no longer do): the chunks that follow must not overlap the folded one.
    inside = sum(1 for e in span.head if e.n <= max((c.last_n for c in span.folded), default=0))
    cuts = [c for c in await off_loop(piece_boundaries, span.messages) if c == 0 or c >= inside]
    caps: dict[int, int] = {}  # what size rejections taught, per summarizer
    start = 0
    while start < len(span.messages) or not span.chunks:
        if attempts.current >= len(summarizers):
            return attempts, None
        summarizer = summarizers[attempts.current]
        # Counting and building a request is CPU on a large span: in a thread, off the event loop.
        limit = await off_loop(_limit, span, summarizer, start, caps.get(attempts.current))
        if limit is not None and limit <= 0 and start < len(span.messages):
            attempts.fail("its input has no room for a transcript beside the earlier summaries")
            continue
        if limit is not None and costs is None:
            costs = await off_loop(transcript_costs, span.messages, span.ctx.count)
        stop = len(span.messages) if costs is None else piece_end(costs, cuts, start, limit)
        if start == 0 and stop < len(span.messages) and span.share(start, stop) < PIECE_SUMMARY_TOKENS:
            span.chain = True  # the span's share for each piece is too small for a summary
        piece = await off_loop(span.piece, start, stop)
        if isinstance(piece, str):
            return attempts, piece
        attempts.asked.add(attempts.current)
        try:
            summary = await summarizer.summarize(piece.request)
        except InputTooLargeError as e:
            attempts.spend(e.usage)
            if costs is None:
                costs = await off_loop(transcript_costs, span.messages, span.ctx.count)
            size = sum(costs[start:stop])
            if stop - start <= 1:
                attempts.fail(str(e))  # one message: nothing left to split
                continue
            if not any(start < c < stop for c in cuts):
                # One tool call with its results, too large as a whole: they go apart rather
                # than unread.
                cuts = sorted({*cuts, *range(max(start + 1, inside), stop)})
            told = e.transcript_limit if e.transcript_limit is not None else size // 2
            caps[attempts.current] = max(0, min(told, size - 1))
            continue
        except SummarizerError as e:
            attempts.spend(e.usage)
            attempts.fail(str(e))
            continue
        attempts.spend(summary.usage)
        await off_loop(span.add, piece, summary)
        start = stop
    return attempts, None


def _stated(items: Sequence[str], request: SummaryRequest, entries: Sequence[Entry]) -> list[Item]:
    """The goals and constraints a summary's model stated as new items, as standing items in its wording
    (checked against the turns they cite like every item; ``summaries.schema``)."""
    before = set(request.items)
    where = {e.seq: e.n for e in entries}
    out = []
    for raw in items:
        item = schema.Item.decode(raw)
        if raw in before or item.section != "goals" or item.resolved or not item.cites:
            continue
        seq = max(item.cites)
        kind = classify(item.text)
        out.append(
            Item(
                kind if kind in ("rule", "constraint", "goal") else "goal",
                item.text,
                seq,
                where.get(seq, 0),
                model=True,
            )
        )
    return out


def ledger_allowance(ctx: StageContext) -> int:
    """What a chunk's ledger may take before room runs out (see ``summarize`` for the room).

    It scales with the window: a span of a long coding session names hundreds of files,
    commands and errors, and a fixed few hundred tokens would keep a fraction of them,
    while the window has room for all. ``artifact_budget_tokens`` is the floor.
    """
    settings = ctx.settings
    if settings.artifact_budget_tokens == 0:
        return 0
    return max(settings.artifact_budget_tokens, int(settings.artifact_budget_fraction * ctx.limits.window))


def _limit(span: _Span, summarizer: Summarizer, start: int, cap: int | None) -> int | None:
    """The transcript tokens a piece starting at ``start`` may take with ``summarizer``."""
    folded = span.carried(start)
    layers = folded if folded else (*span.anchor, *span.chunks)
    current = schema.merge([[schema.Item.decode(raw) for raw in c.items] for c in layers])
    probe = SummaryRequest(
        conversation_id=span.ctx.conversation_id,
        messages=(),
        previous_summaries=[c.text for c in folded],
        itemized=[bool(c.items) for c in folded],
        items=[item.encode() for item in current],  # listed in the prompt: they take room too
        folds=bool(folded),
        # The largest reply a piece may ask for: the limit found holds for any piece.
        max_summary_tokens=span.ctx.limits.max_summary_tokens,
        conversation_model=span.ctx.conversation_model,
        instructions=span.ctx.instructions,  # they take room in the prompt too
    )
    limit = transcript_limit(summarizer, probe)
    if cap is not None:
        limit = cap if limit is None else min(limit, cap)
    return limit


async def summarize(draft: Draft, ctx: StageContext) -> StageOutcome:
    """Summarize what lies before the verbatim tail, folding earlier chunks if they are too big.

    ``ctx.originals`` are transcript messages by ordinal: the summary and its ledger read an
    entry's original when there is one, not what pruning, de-duplication or truncation
    left of it, because the chunk replaces the messages themselves (the cheap stages'
    edits made them cheaper to keep, not less worth summarizing).
    """
    limits = ctx.limits
    room = limits.target - limits.fixed_tokens
    # What the new summary may cost: capped by settings, and by a share of the room so
    # that a small window still keeps a verbatim tail.
    reserve = min(limits.max_summary_tokens, max(0, int(room * ctx.settings.summary_share)))
    # The new chunk also carries a ledger, at most about as large as its summary (below).
    chunk_reserve = reserve + min(ledger_allowance(ctx), reserve)
    existing = sum(c.tokens for c in draft.chunks)
    fold = bool(draft.chunks) and existing + chunk_reserve > limits.chunk_budget
    forced = False
    while True:
        kept_chunks: tuple[SummaryChunk, ...] = () if fold else draft.chunks
        folded: tuple[SummaryChunk, ...] = draft.chunks if fold else ()
        kept_chunk_tokens = sum(c.tokens for c in kept_chunks)
        tail_budget = min(limits.tail_max_tokens, max(0, room - ctx.overhead - kept_chunk_tokens - reserve))
        head, pinned, tail, notes = _arrange(
            draft,
            ctx,
            tail_budget,
            free=room - ctx.overhead - kept_chunk_tokens,
            reserve=chunk_reserve,
            # The identifiers rank above the user's words and the older tail: what they ask for.
            ledger=max(chunk_reserve - reserve, ctx.ledger_need) if ledger_allowance(ctx) else 0,
        )
        left = room - ctx.overhead - kept_chunk_tokens - sum(e.tokens for e in (*pinned, *tail))
        if fold or not draft.chunks or left >= chunk_reserve // 2:
            break
        # The chunks that would stay leave the new summary less than half its reserve: fold them
        # into it instead, rather than aim over the target (pipeline._aim_higher).
        fold = forced = True
    if forced:
        notes += ("the earlier summaries were folded into this one to make room for it",)
    if kept_chunks and (early := tuple(e for e in head if e.n < kept_chunks[-1].last_n)):
        # Entries kept ahead of the chunks (a task kept when the settings said so) cannot join
        # an added chunk, whose span would then hold an older chunk's too: they stay until a fold.
        head = tuple(e for e in head if e.n >= kept_chunks[-1].last_n)
        order = {e.n: i for i, e in enumerate(draft.entries) if not e.synthetic}
        pinned = tuple(sorted((*pinned, *early), key=lambda e: order.get(e.n, -1)))
    if not head and not fold:
        return StageOutcome(draft, errors=("nothing before the verbatim tail to compact",), notes=notes)

    tail_tokens = sum(e.tokens for e in pinned) + sum(e.tokens for e in tail)
    replaced = sum(e.tokens for e in head) + sum(c.tokens for c in folded)
    # The identifiers of what it replaces may all stay, room permitting (the cap in ``_Span.piece``).
    allowance = ledger_allowance(ctx)
    if allowance:
        messages = [ctx.originals.get(e.n, e.message) for e in head]
        allowance = max(allowance, ledger_need(messages, folded, ctx.count, carried=ctx.carried))
    span = _Span(
        ctx,
        head,
        [public_message(ctx.originals.get(e.n, e.message)) for e in head],
        pinned,
        folded,
        space=room - ctx.overhead - tail_tokens - kept_chunk_tokens,
        replaced=replaced,
        allowance=allowance,
        # A fold merges every chunk's ledger: it may keep up to half the chunk budget, so
        # that the folded chunk still leaves half for the additive chunks to come.
        fold_allowance=max(allowance, limits.chunk_budget // 2 - reserve) if allowance else 0,
        anchor=kept_chunks,
    )
    attempts, stopped = await _write_chunks(span)
    tried, failures = len(attempts.asked), attempts.current
    if stopped is not None or attempts.current >= len(ctx.summarizers):
        errors = (*attempts.errors, stopped) if stopped else tuple(attempts.errors)
        return StageOutcome(
            draft,
            usage=attempts.usage,
            errors=errors,
            tried=tried,
            failures=failures,
            notes=notes,
            short_of_room=stopped is not None and not span.chunks and failures == 0,
        )
    chunks = tuple(span.chunks)
    if len(span.writers) > 1:
        how = "each request carrying the summary so far" if span.chain else "each read whole"
        notes += (
            f"the {plural(len(head), 'message')} summarized did not fit the summarizer's input in one "
            f"request: summarized in {len(span.writers)} pieces, {how}",
        )
    writers = ", ".join(dict.fromkeys(span.writers))
    summary_tokens = sum(c.tokens for c in chunks)
    return StageOutcome(
        Draft((*kept_chunks, *chunks), (*pinned, *tail)),
        StageReport(STAGE, replaced - summary_tokens, writers),
        stages=(STAGE, "fold") if fold else (STAGE,),
        summarizer=writers,
        summary_tokens=summary_tokens,
        items=tuple(span.items),
        items_refused=span.refused,
        items_let_go=span.let_go,
        usage=attempts.usage,
        errors=tuple(attempts.errors),
        tried=tried,
        failures=failures,
        notes=notes,
    )


def _arrange(
    draft: Draft, ctx: StageContext, tail_budget: int, *, free: int, reserve: int, ledger: int
) -> tuple[tuple[Entry, ...], tuple[Entry, ...], tuple[Entry, ...], tuple[str, ...]]:
    """What is summarized, what stays before the tail and the tail, within ``free`` tokens (the room
    less the chunks that stay), and notes on what was cut: the partition, the newest step kept,
    then one allocation by value (strategies/allocation.py) beside the summary (``reserve`` at most,
    ``ledger`` of it its identifiers)."""
    limits = ctx.limits
    parts = partition(
        draft.entries,
        limits.tail_max_messages,
        tail_budget,
        task=limits.task_max_tokens > 0,
        user_words=limits.user_words_max_tokens,
        carried=ctx.settings.standing_state_max_tokens > 0,
    )
    notes: tuple[str, ...] = (parts.note,) if parts.note else ()
    start = newest_step(draft.entries)
    if start is not None and all(is_filler_message(e) for e in draft.entries[start:]):
        start = None  # an acknowledgment says nothing the next call continues from: no step to keep
    if start is not None and len(draft.entries) - len(parts.tail) > start:
        # The tail holds less than the newest step (it alone exceeds the tail's bound, or the tail
        # starts at the observation after it): the step stays whole (the agent's last action and its
        # result are what the next call continues from), cut to fit below if it must be.
        step = draft.entries[start:]
        ids = {id(e) for e in step}
        parts = Partition(
            tuple(e for e in parts.head if id(e) not in ids),
            tuple(e for e in parts.pinned if id(e) not in ids),
            step,
        )
        notes = (
            f"the newest step ({plural(sum(e.tokens for e in step), 'token')}) did not fit the verbatim tail's "
            "bound: it stays, cut to fit if it must be",
        )
    # One allocation (strategies/allocation.py): the summary keeps its floor; the user's words, the
    # tail and, last, the task give way in its order when they leave it less.
    task_at = task_index(draft.entries) if limits.task_max_tokens > 0 else None
    task = draft.entries[task_at] if task_at is not None else None
    task = None if task is not None and task.pinned else task  # pinned by the runtime: never cut
    kept = [e for e in parts.pinned if e is not task]
    never = sum(e.tokens for e in kept if e.pinned or e.role == "system")
    # The task's share is worked out from the task as written, so that one compaction's cut is not
    # the next one's starting point (each would cut it further).
    whole = _as_written(task, ctx) if task is not None and task in parts.pinned else None
    wants = Keeps(
        task=min(limits.task_max_tokens, whole.tokens) if whole is not None else 0,
        user_words=sum(e.tokens for e in kept) - never,
        tail=sum(e.tokens for e in parts.tail),
    )
    free -= never
    step_at = newest_step(parts.tail) or 0
    newest = sum(e.tokens for e in parts.tail[step_at:])
    stated = statement(whole, ctx) if whole is not None else None
    asked = Wants(
        wants,
        step=newest if start is not None else 0,
        summary=max(
            reserve, reserve - min(reserve // 2, ledger) + ledger
        ),  # the narrative's part, and the ledger
        ledger=ledger,
        filler=0 if start is not None else newest,
        statement=stated.tokens if stated is not None else 0,
    )
    keeps, aim = wants, free
    for _ in range(ALLOCATION_TRIES):
        # A cut lands near its share, not on it (a head and a tail, whole lines, a notice): what it
        # overshoots comes off the next try's room.
        keeps = allocate(aim, asked, last_aim=not limits.ceilings)
        head, pinned, tail = _fit(
            parts,
            wants=wants,
            keeps=keeps,
            task=task,
            whole=whole,
            entries=draft.entries,
            ctx=ctx,
        )
        over = sum(e.tokens for e in (*pinned, *tail)) - never - keeps.total
        if keeps == wants or over <= 0:
            break
        aim -= over
    if keeps != wants:
        notes += (
            f"the task, the user's recent words and the verbatim tail ({wants.total} tokens) were cut to "
            f"{sum(e.tokens for e in (*pinned, *tail)) - never} by value, beside the summary",
        )
    return head, pinned, tail, notes


def _as_written(entry: Entry, ctx: StageContext) -> Entry:
    """``entry`` as the transcript has it (an earlier compaction may have cut it)."""
    message = ctx.originals.get(entry.n) if entry.edit is not None else None
    if message is None:
        return entry
    return Entry(n=entry.n, seq=entry.seq, message=message, tokens=ctx.count_message(message))


def _fit(
    parts: Partition,
    *,
    wants: Keeps,
    keeps: Keeps,
    task: Entry | None,
    whole: Entry | None,
    entries: Sequence[Entry],
    ctx: StageContext,
) -> tuple[tuple[Entry, ...], tuple[Entry, ...], tuple[Entry, ...]]:
    """``parts`` as (head, pinned, tail) within ``keeps``: the task (``whole``: as written) whole or cut
    to its share (head and tail, its distinctive terms carried), the oldest of the user's words
    returned to the head, the tail's older steps too, down to the newest step, which is cut to fit
    rather than summarized."""
    head, pinned, tail = list(parts.head), list(parts.pinned), list(parts.tail)
    order = {id(e): i for i, e in enumerate(entries)}
    words = [e for e in pinned if e is not task and not e.pinned and e.role == "user" and not e.synthetic]
    if task is not None and whole is not None and task in pinned:
        if whole.tokens <= keeps.task:
            fitted: Entry | None = whole
        elif (
            whole.tokens <= ctx.limits.task_max_tokens  # over its own budget, its head and tail (cut_kept)
            and (stated := statement(whole, ctx, keeps.task)) is not None
            and stated.tokens <= keeps.task
        ):
            fitted = stated  # its statement: the sentences that ask for work, the rest's terms carried
        else:
            fitted = (cut := cut_kept(whole, keeps.task, ctx)) and cut[0]
        if fitted and fitted.tokens != task.tokens:
            pinned = [fitted if e is task else e for e in pinned]
            order[id(fitted)] = order[id(task)]
    if keeps == wants:
        return tuple(head), tuple(pinned), tuple(tail)
    over = wants.user_words - keeps.user_words
    for entry in words:  # oldest first
        if over <= 0:
            break
        pinned.remove(entry)
        head.append(entry)
        over -= entry.tokens
    newest = newest_step(tail) or 0
    if keeps.tail == 0 and tail and all(is_filler_message(e) for e in tail[newest:]):
        newest = len(tail)  # the newest step says nothing: with no room for the tail, it goes too
    points = [p for p in [*split_points(tail), len(tail)] if 0 < p <= newest]
    suffix = [sum(e.tokens for e in tail[p:]) for p in points]
    start = next(
        (p for p, size in zip(points, suffix, strict=True) if size <= keeps.tail), points[-1] if points else 0
    )
    if sum(e.tokens for e in tail) > keeps.tail and start:
        for entry in tail[:start]:  # the task, when the tail held it, stays as pinned messages do
            (pinned if entry.pinned or entry.role == "system" or entry is task else head).append(entry)
        tail = tail[start:]
    head = sorted((e for e in head if not e.synthetic), key=lambda e: order[id(e)])
    pinned = sorted(pinned, key=lambda e: order[id(e)])
    return tuple(head), tuple(pinned), cut_to(tail, keeps.tail, ctx)


class SummaryStage:
    """:func:`summarize` as a pipeline stage: its summary counts only when it reaches the target."""

    name = STAGE
    kind = StageKind.REPLACE

    async def __call__(self, draft: Draft, ctx: StageContext) -> StageOutcome:
        """The summarized draft, or the input draft with what the attempt cost and why it fell short.

        When keeping the user's recent words verbatim leaves too little to summarize (the
        history would not shrink) or too much to keep (it stays over the target), they are
        summarized with the rest: the summary's own retry, before the last resort.
        """
        out = await summarize(draft, ctx)
        kept_words = ctx.limits.user_words_max_tokens > 0
        if kept_words and not (
            out.report is not None
            and reaches_target(out.draft, ctx)
            and ctx.tokens(out.draft) < ctx.tokens(draft)
        ):
            plain = replace(ctx, limits=replace(ctx.limits, user_words_max_tokens=0))
            again = await summarize(draft, plain)
            out = replace(
                again,
                usage=add_usage(out.usage, again.usage),
                errors=(*out.errors, *again.errors),
                tried=out.tried + again.tried,
                failures=out.failures + again.failures,
            )
        if out.report is None or reaches_target(out.draft, ctx):
            return out
        return StageOutcome(
            draft,
            usage=out.usage,
            errors=(*out.errors, f"summary by {out.summarizer} left the history over the target"),
            tried=out.tried,
            failures=out.failures,
        )


SUMMARIZE = SummaryStage()
"""The stage as the pipeline runs it."""
