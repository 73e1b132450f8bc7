"""The standing state in the effective history: reserved before the stages run, restored after any of them.

What the user set (:mod:`compaction_worker.summaries.standing`) is read from the history a
run starts from (the user's messages as the transcript has them, and the state an earlier
compaction carried), its size reserved under the target before any stage runs, and put back,
verbatim, in every draft a run commits with summary chunks (an LLM summary, the extractive
fallback, the sliding window's marker, a fold): whichever stage made room, it made room for
this too. So a second compaction, with or without new turns, holds everything the first held.

The state is one entry (``edit="standing"``, ordinal 0) rendered inside the summary turn, before
the restored working state; its private ``standing_state`` field keeps the items as data.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from compaction_worker.contracts.events import StandingStateReport
from compaction_worker.contracts.history import STANDING, Entry, text_of
from compaction_worker.strategies.draft import Draft, StageContext
from compaction_worker.strategies.tail import observations, task_index
from compaction_worker.summaries.standing import KINDS, Item, accepted, extract, is_prose, merge, render

FIELD = "standing_state"
CARRY_MAX = 500
"""Items a state carries as data at most (a conversation's whole life of user sentences would grow without end)."""
FACT_SOURCE_MAX_CHARS = 3_000
"""A longer user message is pasted material (a log, a document, a command's output): its rules written
in prose count, its other sentences and its facts do not."""


@dataclass(frozen=True, slots=True)
class Standing:
    """A run's standing state: its items, and what the stages must leave for it."""

    items: tuple[Item, ...]
    reserve: int
    """What the state takes within the budget: the stages aim this much under the target."""
    cap: int = 0
    """The most it may take (its settings' budget): the state put back after the stages keeps to it,
    and to what they left under the target."""


def read_state(entries: Sequence[Entry], ctx: StageContext) -> Standing:
    """The state of a history: what earlier compactions carried, what its user messages state, and the
    decisions an assistant proposed that the user's next message accepted."""
    carried: list[Item] = []
    found: list[Item] = []
    observed = observations(entries)
    for index, entry in enumerate(entries):
        if index in observed:
            continue  # an agent's observation sent as a user message: output, not the user speaking
        if entry.edit == STANDING:
            carried += [Item.from_data(r) for r in entry.message[FIELD]["items"]]
        elif not entry.synthetic and entry.role == "user":
            text = text_of(ctx.originals.get(entry.n, entry.message))
            items = extract(text, entry.seq, entry.n)
            if len(text) > FACT_SOURCE_MAX_CHARS:
                items = [i for i in items if i.kind != "fact" and is_prose(i.text)]
            if index and (before := entries[index - 1]).role == "assistant" and not before.synthetic:
                # A decision the assistant proposed and this reply accepted ("I'll use X." "ok").
                proposal = text_of(ctx.originals.get(before.n, before.message))
                items = [*accepted(proposal, text, before.seq, before.n), *items]
            found += items
    merged = tuple(merge(carried, found))
    settings, limits = ctx.settings, ctx.limits
    # The most it may take: ``standing_state_max_tokens`` or its share of the room the system prompt,
    # the tools and the system messages leave, the smaller.
    instructions = limits.fixed_tokens + sum(e.tokens for e in entries if e.role == "system")
    budget = min(
        settings.standing_state_max_tokens,
        int(settings.standing_state_max_fraction * max(0, limits.target - instructions)),
    )
    # What the state may show after any stage: all of it when it fits; else the current items first,
    # and a changed one whose message may stay verbatim ranks with them (its mark beside the old words).
    # Not the items of messages kept whole whatever the stages do (the task within its budget, pinned
    # messages): those messages say them already.
    verbatim = {e.n for e in entries if e.edit is None and not e.synthetic and e.role == "user"}
    whole = _kept_whole(entries, ctx)
    widest = (merged, [i for i in merged if i.current or i.n in verbatim])
    reserve = max(
        (
            e.tokens
            for items in widest
            if (e := _entry(items, budget, 0, ctx, {i for i in items if i.n in whole})) is not None
        ),
        default=0,
    )
    return Standing(merged, reserve, budget)


def _kept_whole(entries: Sequence[Entry], ctx: StageContext) -> set[int]:
    """Ordinals of messages every stage keeps verbatim: pinned ones, and the task within its budget."""
    kept = {e.n for e in entries if e.pinned and not e.synthetic}
    task = task_index(entries) if ctx.limits.task_max_tokens > 0 else None
    if task is not None and entries[task].edit is None and entries[task].tokens <= ctx.limits.task_max_tokens:
        kept.add(entries[task].n)
    return kept


def without_state(draft: Draft) -> Draft:
    """``draft`` without an earlier compaction's state entry (a run puts the state back at its end)."""
    return Draft(draft.chunks, tuple(e for e in draft.entries if e.edit != STANDING))


def restore_state(standing: Standing, draft: Draft, ctx: StageContext, most: int) -> Draft:
    """``draft`` with the state first among its entries, within ``most`` tokens (only a draft with summary
    chunks: the state renders inside the summary turn; without them every user message is still there).

    Items of messages still verbatim in ``draft`` are not repeated (a changed one keeps its mark)."""
    draft = without_state(draft)
    if not draft.chunks:
        return draft
    seq = draft.chunks[-1].last_seq
    entry = _entry(standing.items, most, seq, ctx, said(standing.items, draft.entries))
    return draft if entry is None else Draft(draft.chunks, (entry, *draft.entries))


CHANGED = "(changed later)"
"""What a summary says in place of a sentence the user later changed (the state shows both)."""


def unsay_changed(standing: Standing, draft: Draft, ctx: StageContext) -> Draft:
    """``draft`` with every sentence the user later changed taken out of its summary chunks (their
    text and ledger), so that no summary states an old value as current: the state lists it, marked
    no longer current, beside the value that holds (docs/design.md, "The standing state")."""
    # Longest first (one sentence may hold another); none shorter than the mark (it must save room).
    old = sorted({i.text for i in standing.items if not i.current and len(i.text) > len(CHANGED)}, key=len)[
        ::-1
    ]
    if not old:
        return draft

    def clean(text: str) -> str:
        for sentence in old:
            text = text.replace(sentence, CHANGED)
        return text

    chunks = []
    for chunk in draft.chunks:
        text, artifacts = clean(chunk.text), tuple(clean(a) for a in chunk.artifacts)
        cleaned = replace(chunk, text=text, artifacts=artifacts)
        changed = text != chunk.text or artifacts != chunk.artifacts
        chunks.append(replace(cleaned, tokens=ctx.count(cleaned.render_text())) if changed else chunk)
    return Draft(tuple(chunks), draft.entries)


def said(items: Sequence[Item], entries: Sequence[Entry]) -> set[Item]:
    """The items ``entries`` still say: their message is there verbatim, or what was kept of it when
    it was cut (the task's head and tail) holds the sentence word for word."""
    verbatim = {e.n for e in entries if e.edit is None and not e.synthetic}
    cut = {e.n: text_of(e.message) for e in entries if e.edit is not None and not e.synthetic and e.n}
    return {i for i in items if i.n in verbatim or (i.n in cut and i.text in cut[i.n])}


def report(standing: Standing, draft: Draft) -> StandingStateReport | None:
    """What of the state the draft still says, by kind: kept means its sentence is there, word for word."""
    current = [i for i in standing.items if i.current]
    if not current:
        return None
    shown = "\n".join([c.text for c in draft.chunks] + [text_of(e.message) for e in draft.entries])
    kept = dict.fromkeys(KINDS, 0)
    let_go = dict.fromkeys(KINDS, 0)
    for item in current:
        (kept if item.text in shown else let_go)[item.kind] += 1
    return StandingStateReport(
        kept={k: v for k, v in kept.items() if v},
        let_go={k: v for k, v in let_go.items() if v},
        superseded=sum(not i.current for i in standing.items),
    )


def _carry(items: Sequence[Item]) -> list[Item]:
    """What the state carries as data: at most ``CARRY_MAX`` items, superseded ones the first to go."""
    if len(items) <= CARRY_MAX:
        return list(items)
    current = [i for i in items if i.current][-CARRY_MAX:]
    old = (
        [i for i in items if not i.current][-(CARRY_MAX - len(current)) :] if len(current) < CARRY_MAX else []
    )
    return sorted([*old, *current], key=lambda i: (i.seq, i.n))


def _entry(
    items: Sequence[Item], budget: int, seq: int, ctx: StageContext, shown: Collection[Item] = ()
) -> Entry | None:
    """The state's entry within ``budget`` tokens (what does not fit left out, in ``render``'s order)."""
    if not items or budget <= 0:
        return None
    frame = ctx.count_message({"role": "user", "content": ""})
    rendered = render(items, budget - frame, ctx.count, shown)
    if not rendered.text:
        return None
    # Every item travels as data (private: never rendered or counted), the ones left out too: the
    # next compaction, with more room, shows them again.
    data: dict[str, Any] = {"items": [i.to_data() for i in _carry(items)]}
    message = {"role": "user", "content": rendered.text, FIELD: data}
    return Entry(n=0, seq=seq, message=message, tokens=ctx.count_message(message), edit=STANDING)
