"""Runs: consecutive turns of one conversation from one fetched batch, appended by one script call.

A partition's batch often holds several turns of a conversation in a row (a backlog, a fast
agent loop). The per-turn path (turns.py) costs each a script call and a round trip. A run
decides each turn on the meta the turn before it leaves (conversation/decide.py, no I/O), and the
per-turn script (conversation/apply.py; a single turn is a run of one) stores them in order, each
on the meta the one before it leaves, and stops after the first it does not append, writing
nothing for it. Whatever a run did not append goes through the per-turn path, which acts on
everything else (duplicates, gaps, conflicts, a meta changed by another writer, failures and
the DLQ). So a run changes what turns cost, never what is stored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from opentelemetry import trace
from opentelemetry.trace import Span

from compaction_worker.contracts.events import BadEventError, TurnEvent
from compaction_worker.conversation.apply import AppendStatus
from compaction_worker.conversation.decide import Planned, decide
from compaction_worker.conversation.meta import Meta
from compaction_worker.observability import metrics, tracing
from compaction_worker.observability.logs import bound
from compaction_worker.runtime.turns import TurnHandler, TurnOutcome, is_outage

log = logging.getLogger(__name__)

RUN_MAX = 32
"""The most turns one run script call appends (a bound on how long it holds Redis)."""
RUN_MAX_BYTES = 1 << 20
"""The most event bytes one run takes (a turn over it alone goes the per-turn way): a bound on a
call's size, whatever ``kafka.max_event_bytes`` allows one turn."""


def _no_span(_index: int) -> Span:
    return trace.INVALID_SPAN


async def append_run(
    handler: TurnHandler,
    records: Sequence[tuple[bytes, bytes | None]],
    span_of: Callable[[int], Span] = _no_span,
) -> list[TurnOutcome]:
    """Append the leading records (one conversation's ``(value, key)``, in offset order) as a run.

    Returns the outcomes of the turns appended, in order: the caller handles the next record
    on its own. None are appended (an empty list) when fewer than two lead the records as a
    run, or when the first turn is not a plain append of the meta the handler knows. A turn
    whose planning fails ends the run before it, as its first try. An outage propagates; any
    other failure is logged and an empty list returned, so that the per-turn path, with its
    bounded tries and its DLQ, handles the turns (those the run stored are then duplicates).

    Traced, each turn keeps its own span (``span_of``: record ``i``'s, started, not current):
    it is current while the turn is planned (a job it records continues its trace) and while its
    append is acted on, and ends with the run; telemetry does not change how Redis is written.
    """
    if len(records) < 2:
        return []
    spans: list[Span] = []
    try:
        events = _leading_run(handler, records)
        if len(events) < 2:
            return []
        cid = events[0][0].conversation_id
        with bound(conversation_id=cid):
            planned = _planned(handler, events, handler.known(cid) or Meta(), span_of, spans)
            return await _append(handler, cid, planned) if planned else []
    except Exception as error:
        if is_outage(error):
            raise
        log.warning(
            "a run of %d turns failed (%s: %s); its turns go one by one",
            len(records),
            type(error).__name__,
            error,
            exc_info=error,
        )
        return []
    finally:
        for span in spans:
            span.end()


def _leading_run(
    handler: TurnHandler, records: Sequence[tuple[bytes, bytes | None]]
) -> list[tuple[TurnEvent, bytes]]:
    """The valid events leading ``records`` whose seqs follow the known meta's and each other
    (at most RUN_MAX of them, RUN_MAX_BYTES in all)."""
    events: list[tuple[TurnEvent, bytes]] = []
    size = 0
    for raw, key in records[:RUN_MAX]:
        size += len(raw)
        if size > RUN_MAX_BYTES:
            break
        try:
            event = handler.parse(raw, key)
        except BadEventError:
            break
        if not events:
            # The next turn of the meta it knows (none: a new conversation's first), or no run.
            meta = handler.known(event.conversation_id)
            if event.turn_seq != (meta.last_seq if meta is not None else 0) + 1:
                break
        elif (
            event.conversation_id != events[0][0].conversation_id
            or event.turn_seq != events[-1][0].turn_seq + 1
        ):
            break
        events.append((event, raw))
    return events


def _planned(
    handler: TurnHandler,
    events: Sequence[tuple[TurnEvent, bytes]],
    meta: Meta,
    span_of: Callable[[int], Span],
    spans: list[Span],
) -> list[Planned]:
    """Each turn's write, computed from the meta the turn before it leaves once appended, with its
    span current (added to ``spans``, for the caller to end).

    A turn whose counting or planning fails ends the run before it: that was its first try,
    and the per-turn path makes the others (``TurnHandler.failed_in_run``).
    """
    planned = []
    for index, (event, raw) in enumerate(events):
        span = span_of(index)
        spans.append(span)
        try:
            with tracing.current(span):
                turn = decide(meta, event, handler.settings)
        except Exception as error:
            log.warning("turn %s failed in a run (%s: %s)", event.turn_seq, type(error).__name__, error)
            if len(handler.failed_in_run) >= RUN_MAX * 64:  # a bound: records never handled again
                handler.failed_in_run.clear()
            handler.failed_in_run[raw] = 1
            break
        turn.span = span
        planned.append(turn)
        meta = turn.plan.after
    return planned


async def _append(handler: TurnHandler, cid: str, planned: Sequence[Planned]) -> list[TurnOutcome]:
    # The script's verdict on the turn it stopped at (a duplicate, a gap, a stale meta) is the
    # per-turn path's to act on: nothing was written for it, and that path sends it again.
    replies = await handler.appends.apply(cid, [p.write for p in planned])
    outcomes = []
    for done, reply in zip(planned, replies, strict=False):
        if reply.status is not AppendStatus.APPENDED:
            break
        with bound(turn_seq=done.event.turn_seq), tracing.current(done.span or trace.INVALID_SPAN):
            outcomes.append(handler.appended(done, reply))
    for i, done in enumerate(planned):
        if done.span is None:
            continue
        if i < len(outcomes):
            done.span.set_attribute("compaction.append.status", AppendStatus.APPENDED.value)
            done.span.set_attribute("compaction.append.run", len(outcomes))
        else:  # left to the per-turn path, which traces it again
            done.span.set_attribute("compaction.append.status", "left to the per-turn path")
    metrics.record_turn("appended", count=len(outcomes))
    if outcomes and outcomes[-1].next_held:  # the run stopped after it: the held turn applies now
        await handler.drain_pending(cid, outcomes[-1].last_seq)
    return outcomes
