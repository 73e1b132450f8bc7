"""What a turn decides, computed from the meta the handler knows and the event: pure, no I/O.

:func:`decide` is the one decision about a turn, for a lone turn, each turn of a run
(runtime/runs.py) and each turn of a replay (replay/simulate.py) alike: its messages counted, its
fingerprint, every meta field its append changes (the pins it asks for among them), whether it
records a compaction job, which, and whether its index entry is due, and the write the per-turn
script is sent. The job is decided against the one pending, which the meta holds (meta.py:
``recorded``). The script stores the write only if the meta's revision is still the one it was
decided on (apply.py), so the plan is exact or it is not used.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry.trace import Span

from compaction_worker.budget.overflow import detect_overflow
from compaction_worker.budget.threshold import threshold_trigger
from compaction_worker.budget.tokens import TokenCounter, budget_for, calibrate, counter_for
from compaction_worker.contracts.events import CompactionMode, Trigger, TurnEvent
from compaction_worker.conversation.apply import UNKNOWN_REV, NewMessage, TurnWrite, first_fields
from compaction_worker.conversation.meta import JobRequest, Meta, recorded, stored_text
from compaction_worker.observability import tracing
from compaction_worker.settings import BudgetSettings, Settings
from compaction_worker.state.gaps import held_value

_EVERY_APPEND = frozenset({"last_seq", "updated_at"})


@dataclass(slots=True)
class AppendPlan:
    """The meta fields an append writes (as stored text), the meta after it, and its job, if any."""

    fields: dict[str, str]
    after: Meta
    """The meta once the append is stored (its revision included)."""
    job: JobRequest | None
    """The request the turn makes: the one it carries, else a threshold's (recorded unless a job
    of equal or higher priority is pending)."""
    due: bool = False
    """Whether the job is to be indexed now: the request is the job now, or it was asked for (a
    manual or reactive request) and a stronger job is pending: someone asked, so it is due at once."""
    notes: tuple[str, ...] = ()
    """Warnings for the log, once the append is stored."""
    first: bool = False
    """Whether it is the conversation's first append (its keys are created with it)."""


@dataclass(slots=True)
class Planned:
    """A turn decided (:func:`decide`): the event, its append's plan and the write the script is sent."""

    event: TurnEvent
    plan: AppendPlan
    write: TurnWrite
    span: Span | None = None
    """A run's turn: its own consume span (current while its append is acted on); None: the current one."""
    held_ms: int | None = None
    """When the write carries the turn's held form: the time (ms) it is held from."""


Counted = tuple[TokenCounter, list[NewMessage]]
"""A turn's counter and its messages as stored, counted (:func:`counted`)."""


def decide(
    known: Meta | None,
    event: TurnEvent,
    settings: Settings,
    *,
    hold: tuple[bytes, int] | None = None,
    counts: dict[str, Counted] | None = None,
    now: float | None = None,
) -> Planned:
    """The turn's append onto the meta the handler knows (None: it knows none), under the settings
    profile the turn chooses, else the one the conversation has.

    ``hold``: the event's bytes and the time (ms) it is held from, sent when the handler expects
    a gap before it. Without a known meta the write's revision is unknown, so the script answers
    with the stored meta (a first turn is taken for a new conversation's: revision 0). The jobs it
    records continue the current span's trace. ``counts`` keeps the turn's counts by profile
    across its tries (a stale meta is planned on again): its messages are counted once. ``now``:
    the time of the append (replay's own clock), else the clock's.
    """
    meta = known or Meta()
    profile = event.profile if event.profile is not None else meta.profile
    budget = settings.budgets.get(profile, settings.budget) if profile else settings.budget
    counts = {} if counts is None else counts
    if profile not in counts:
        counts[profile] = counted(event, budget)
    counter, new = counts[profile]
    plan = plan_append(event, meta, new, request_of(event), counter=counter, settings=budget, now=now)
    fingerprint = event.fingerprint([m.text or "" for m in new])
    write = TurnWrite(
        seq=event.turn_seq,
        messages=new,
        first_n=meta.msg_count + 1,
        fields=plan.fields,
        rev=meta.rev if known is not None or event.turn_seq == 1 else UNKNOWN_REV,
        now=plan.after.updated_at,
        fingerprint=fingerprint,
        held=held_value(hold[0], hold[1], fingerprint) if hold is not None else None,
        first=plan.first,
        due=plan.due,
    )
    return Planned(event, plan, write, held_ms=hold[1] if hold is not None else None)


def counted(event: TurnEvent, settings: BudgetSettings) -> Counted:
    """The counter for the event's model, and its messages as stored, each with its token count
    and its JSON text (encoded once: the stores and the fingerprint take it)."""
    counter = counter_for(event.model, settings)
    new = []
    for message in event.messages:
        data = message.to_dict()
        new.append(NewMessage(data, counter.message(data), message.to_json()))
    return counter, new


def request_of(event: TurnEvent) -> JobRequest | None:
    """The compaction request the event carries (manual or reactive), if any."""
    if event.compaction is None:
        return None
    trigger = Trigger.MANUAL if event.compaction.mode is CompactionMode.FORCE else Trigger.REACTIVE
    return JobRequest(trigger, event.compaction.error)


def plan_append(
    event: TurnEvent,
    meta: Meta,
    new: Sequence[NewMessage],
    request: JobRequest | None,
    *,
    counter: TokenCounter,
    settings: BudgetSettings,
    now: float | None = None,
) -> AppendPlan:
    """The append of ``event`` (its messages counted as ``new``) onto a conversation whose meta is ``meta``."""
    now = time.time() if now is None else now
    cid = event.conversation_id
    reactive = request is not None and request.trigger is Trigger.REACTIVE
    overflow = detect_overflow(request.error) if request is not None and reactive and request.error else None
    # A maximum the provider stated caps the window from now on, not only for this compaction.
    stated = [w for w in (meta.observed_window, overflow.max_tokens if overflow else None) if w]
    info, budget = budget_for(
        event.model,
        settings,
        event.context_window or meta.context_window,
        event.max_output_tokens or meta.max_output_tokens,
        min(stated, default=None),
    )
    changes: dict[str, Any] = {
        "model": event.model,
        "window": budget.window,
        "threshold": budget.threshold,
        "overhead_tokens": settings.conversation_overhead_tokens,
    }
    notes = []
    if info.source == "fallback" and event.model != meta.model:
        # Once per conversation (its first turn, then each change of model): per turn would
        # flood the log, per process would name the model only in the first of its conversations.
        notes.append(
            f"{cid}: model {event.model!r} has no known context window; assuming {info.window} tokens "
            "(set the turn's context_window or budget.window_overrides)"
        )
    if info.source == "provider" and info.window != meta.observed_window:
        changes["observed_window"] = info.window
        notes.append(f"{cid}: the provider's maximum, {info.window} tokens, is now its window")
    if event.system_prompt is not None and event.system_prompt != meta.system_prompt:
        changes["system_prompt"] = event.system_prompt
        changes["system_tokens"] = counter.text(event.system_prompt) + settings.message_overhead_tokens
    if event.tools is not None:
        tools = tuple(event.tools)
        if tools != meta.tools:  # runtimes send their tools every turn: counted when they change
            changes["tools"] = tools
            changes["tools_tokens"] = counter.tools(event.tools)
    if event.context_window is not None:
        changes["context_window"] = event.context_window
    if event.max_output_tokens is not None:
        changes["max_output_tokens"] = event.max_output_tokens
    changes |= _standing(event, meta)
    # Our estimate of the prompt of the call this turn reports on (its usage or its error); a turn
    # with neither, the common one, needs none.
    estimate = meta.total_tokens + _input_part(new, event) if event.usage is not None or reactive else 0
    calibration = meta.calibration
    if event.usage is not None:
        calibration = calibrate(calibration, estimate, event.usage.prompt_tokens)
    if request is not None and reactive:
        # The provider's count of the rejected prompt is a usage report too; the job keeps
        # the estimate it is paired with, for the compaction to use (limits.reactive_target).
        request = replace(request, estimate=estimate)
        if overflow is not None and overflow.actual_tokens:
            calibration = calibrate(calibration, estimate, overflow.actual_tokens)
    changes |= {
        "calibration": calibration,
        "last_seq": event.turn_seq,
        "msg_count": meta.msg_count + len(new),
        "history_tokens": meta.history_tokens + sum(m.tokens for m in new),
        "updated_at": now,
    }
    changes = {k: v for k, v in changes.items() if k in _EVERY_APPEND or getattr(meta, k) != v}
    after = meta.changed(changes, rev=meta.rev + 1)  # the revision the append gives it
    fields = {k: stored_text(v) for k, v in changes.items()}
    if meta.last_seq == 0:
        fields |= first_fields(now)
    threshold = threshold_trigger(after, settings, now, budget=budget) if request is None else None
    request = _with_instructions(request, event)
    job = request if request is not None else (JobRequest(threshold) if threshold is not None else None)
    job, written, after, due = _job(job, meta, after, now)
    fields |= written
    return AppendPlan(fields, after, job, due, tuple(notes), first=meta.last_seq == 0)


def _job(
    job: JobRequest | None, meta: Meta, after: Meta, now: float
) -> tuple[JobRequest | None, dict[str, str], Meta, bool]:
    """The turn's request with its trace context (its compaction continues this turn's trace), the
    job fields its append writes onto the job pending in ``meta``, the meta ``after`` the append
    with them, and whether the job is due now."""
    if job is None:
        return None, {}, after, False
    job = replace(job, traceparent=tracing.current_traceparent())
    written, new = recorded(job, meta, now)
    return job, written, after.with_job(written), new or job.asked


def asked_pins(pending: str, event: TurnEvent) -> str:
    """The pins waiting to be applied (runtime/pins.py) with the turn's: ``[turn_seq, index, pin, asking
    turn]`` each (the asking turn hears of one not applied). Stored with the turn's append, in the meta;
    the next holder of the lock applies them."""
    asked = json.loads(pending) if pending else []
    asked += [[ref.turn_seq, ref.index, True, event.turn_seq] for ref in event.pin or ()]
    asked += [[ref.turn_seq, ref.index, False, event.turn_seq] for ref in event.unpin or ()]
    return json.dumps(asked, separators=(",", ":"))


def _standing(event: TurnEvent, meta: Meta) -> dict[str, Any]:
    """The meta fields a turn sets until a later one changes them: its standing compaction
    instructions ("" clears them), its settings profile ("": the deployment's), the pins it asks
    for; absent, none."""
    fields: dict[str, Any] = {}
    if event.compaction_instructions is not None:
        fields["instructions"] = event.compaction_instructions.strip()
    if event.profile is not None:
        fields["profile"] = event.profile
    if event.pin or event.unpin:
        fields["pins"] = asked_pins(meta.pins, event)
    return fields


def _with_instructions(request: JobRequest | None, event: TurnEvent) -> JobRequest | None:
    """The turn's request with the instructions it carries (the job keeps them)."""
    asked = event.compaction.instructions if event.compaction is not None else None
    if request is None or not asked or not asked.strip():
        return request
    return replace(request, instructions=asked.strip())


def _input_part(new: Sequence[NewMessage], event: TurnEvent) -> int:
    """Tokens of this turn's messages that were input to the call its usage reports."""
    messages = event.messages
    end = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), len(new))
    return sum(m.tokens for m in new[:end])
