"""Working state restored after a summary: the latest files the agent read or edited, and its plan.

A summary paraphrases; an agent that continues from one would re-read the files it was
working on blindly, and a plan kept in a todo tool's arguments would be prose. So, as
Claude Code does after it compacts, the state those calls left is put back, verbatim:
for each file (the most recent first) its latest content, or a pointer with its path
and size when it is too large or the budget is spent, and the latest plan as a
checklist (shapes: :mod:`compaction_worker.strategies.tool_shapes`).

Only what left with the summarized span comes back: a file whose latest full content is
still verbatim in the history, or a plan whose latest call is, is not repeated. The
state is one entry (``edit="restored"``, ordinal 0) rendered inside the summary turn
under ``RESTORED_HEADER``; its private ``working_state`` field keeps the state as data,
so the next compaction carries forward what its own span does not renew. It costs its
tokens against the target: its budget is ``pipeline.working_state_max_tokens`` or the
room left under the target, the smaller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from compaction_worker.contracts.history import RESTORED, RESTORED_HEADER, Entry, text_of
from compaction_worker.contracts.toolpairs import pair_results
from compaction_worker.strategies.draft import Draft, StageContext, StageOutcome, StageReport, plural
from compaction_worker.strategies.repair import repair
from compaction_worker.strategies.tool_shapes import apply_edits, failed, file_call, plan_call

STAGE = "working_state"
FIELD = "working_state"
INTRO = (
    "The latest state of the files and plan from the summarized turns, as they last stood there. "
    "Messages after this one are newer and take precedence."
)


@dataclass(frozen=True, slots=True)
class FileState:
    """What the conversation last showed of a file."""

    path: str
    seq: int
    """The turn of the latest read, write or edit."""
    base: int
    """The ordinal of the message that showed the content this state builds on (0: an
    earlier compaction's restored state)."""
    how: str
    """``read``, ``written``, ``edited``, or a read's part (``read lines 10-40``)."""
    content: str | None
    """The latest content, or None when unknown (an edit of a file never shown, or one that
    could not be placed) or too large to carry."""
    size: str = ""


@dataclass(frozen=True, slots=True)
class PlanState:
    tool: str
    seq: int
    n: int
    text: str


@dataclass(slots=True)
class _State:
    files: dict[str, FileState]
    plan: PlanState | None = None


def restore_working_state(before: Sequence[Entry], draft: Draft, ctx: StageContext) -> StageOutcome:
    """``draft`` with its working state restored (see the module docstring); ``before`` are
    the entries of the history the run started from."""
    draft = Draft(draft.chunks, tuple(e for e in draft.entries if not _restored(e)))
    if not draft.chunks:  # it renders inside the summary turn
        return StageOutcome(draft)
    state = _carried(before)
    _scan(before, ctx, state)
    shown = {e.n for e in draft.entries if e.edit is None and not e.synthetic}
    files = sorted((f for f in state.files.values() if f.base not in shown), key=lambda f: -f.seq)
    plan = state.plan if state.plan is not None and state.plan.n not in shown else None
    # What repair will add costs tokens too; and a message the oversized stage would cut is
    # too large to restore.
    room = ctx.limits.target - ctx.tokens(repair(draft, ctx).draft)
    huge = int(ctx.settings.oversized_fraction * ctx.limits.window)
    budget = min(ctx.settings.working_state_max_tokens, room, huge)
    entry = _entry(files[: ctx.settings.working_state_max_files], plan, budget, draft, ctx)
    if entry is None:
        return StageOutcome(draft)
    kept = entry.message[FIELD]
    detail = f"{plural(len(kept['files']), 'file')}" + (", the plan" if kept.get("plan") else "")
    out = Draft(draft.chunks, (entry, *draft.entries))
    return StageOutcome(out, StageReport(STAGE, -entry.tokens, detail))


def stale(draft: Draft) -> bool:
    """Whether a stage edited the restored state (cut it to a smaller window): restore it anew."""
    return any(_restored(e) and e.edit != RESTORED for e in draft.entries)


def _restored(entry: Entry) -> bool:
    """Whether ``entry`` is an earlier restored state (a stage may have edited it since)."""
    return entry.edit == RESTORED or (entry.synthetic and FIELD in entry.message)


def _carried(entries: Sequence[Entry]) -> _State:
    """The state an earlier compaction restored (the oldest knowledge, overridden by what follows)."""
    state = _State({})
    for entry in entries:
        data = entry.message.get(FIELD) if _restored(entry) else None
        if not isinstance(data, Mapping):
            continue
        for raw in data.get("files") or ():
            file = FileState(**{**raw, "base": 0})
            state.files[file.path] = file
        if isinstance(plan := data.get("plan"), Mapping):
            state.plan = PlanState(**{**plan, "n": 0})
    return state


def _scan(entries: Sequence[Entry], ctx: StageContext, state: _State) -> None:
    """Update ``state`` with the file and plan calls of ``entries``, read as the transcript has them."""
    real = [e for e in entries if not e.synthetic]
    messages = [ctx.originals.get(e.n, e.message) for e in real]
    extra = ctx.settings.plan_tools
    for index, call in sorted(pair_results(messages).items()):
        result = text_of(messages[index])
        if failed(result):
            continue
        owner = real[call.owner]
        if (plan := plan_call(call.name, call.arguments, extra)) is not None:
            state.plan = PlanState(plan.tool, owner.seq, owner.n, plan.text)
            continue
        op = file_call(call.name, call.arguments)
        if op is None:
            continue
        known = state.files.get(op.path)
        if op.op == "read":
            how = f"read {op.part}" if op.part else "read"
            state.files[op.path] = FileState(op.path, real[index].seq, real[index].n, how, result)
        elif op.op == "write" and op.content is not None:
            state.files[op.path] = FileState(op.path, owner.seq, owner.n, "written", op.content)
        else:
            content = apply_edits(known.content, op.edits) if known and known.content and op.edits else None
            base = known.base if known is not None and content is not None else owner.n
            state.files[op.path] = FileState(op.path, owner.seq, base, "edited", content)


def _entry(
    files: Sequence[FileState], plan: PlanState | None, budget: int, draft: Draft, ctx: StageContext
) -> Entry | None:
    """The restored-state entry within ``budget`` tokens, or None when nothing fits."""
    sections: list[str] = [RESTORED_HEADER, INTRO]
    kept: dict[str, Any] = {"files": []}
    if plan is not None:
        section = f"## Plan ({plan.tool}, turn {plan.seq})\n{plan.text}"
        if _cost([*sections, section], ctx) <= budget:
            sections.append(section)
            kept["plan"] = {"tool": plan.tool, "seq": plan.seq, "text": plan.text}
    cap = ctx.settings.working_state_file_max_tokens
    for file in files:
        heading = f"## File {file.path} ({file.how} at turn {file.seq})"
        full = f"{heading}\n{_fence(file.content)}" if file.content is not None else None
        if full is not None and ctx.count(full) <= cap and _cost([*sections, full], ctx) <= budget:
            sections.append(full)
            kept["files"].append(asdict(file))
            continue
        pointer = _pointer(file, ctx)
        if _cost([*sections, pointer], ctx) > budget:
            break
        sections.append(pointer)
        kept["files"].append(asdict(replace(file, content=None, size=_size(file, ctx))))
    if len(sections) == 2:
        return None
    for file in kept["files"]:
        del file["base"]
    message = {"role": "user", "content": "\n\n".join(sections), FIELD: kept}
    seq = draft.chunks[-1].last_seq if draft.chunks else 0
    return Entry(n=0, seq=seq, message=message, tokens=ctx.count_message(message), edit=RESTORED)


def _cost(sections: Sequence[str], ctx: StageContext) -> int:
    return ctx.count_message({"role": "user", "content": "\n\n".join(sections)})


def _fence(content: str) -> str:
    fence = "```"
    while fence in content:
        fence += "`"
    return f"{fence}\n{content.rstrip()}\n{fence}"


def _size(file: FileState, ctx: StageContext) -> str:
    if file.content is None:
        return file.size
    lines = file.content.count("\n") + (not file.content.endswith("\n"))
    size = len(file.content.encode())
    return (
        f"{plural(lines, 'line')}, {plural(size, 'byte')}, about {plural(ctx.count(file.content), 'token')}"
    )


def _pointer(file: FileState, ctx: StageContext) -> str:
    if file.content is None and not file.size:
        what = "its content is not known here; read it again before relying on it"
    else:
        what = f"{_size(file, ctx)}: too large to restore here; read it again if you need it"
    return f"## File {file.path} ({file.how} at turn {file.seq}): {what}"
