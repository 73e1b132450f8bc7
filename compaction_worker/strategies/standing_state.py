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

import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from compaction_worker.contracts.events import StandingStateReport
from compaction_worker.contracts.history import STANDING, Entry, SummaryChunk, text_of
from compaction_worker.strategies.allocation import MIN_FLOOR, MIN_SUMMARY_TOKENS, TASK_HEAD_TOKENS, Tier
from compaction_worker.strategies.draft import Draft, StageContext
from compaction_worker.strategies.oversized import statement
from compaction_worker.strategies.tail import is_filler_message, newest_step, observations, task_index
from compaction_worker.summaries import schema
from compaction_worker.summaries.sentences import KINDS, is_prose
from compaction_worker.summaries.standing import TIERS, Item, accepted, extract, merge, render, values

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
    held: tuple[Item, ...] = ()
    """The items its reservation holds: the history shows them whatever the stages do (a summary's ledger
    need not repeat what they name)."""


def read_items(entries: Sequence[Entry], ctx: StageContext) -> tuple[Item, ...]:
    """The items of a history: what earlier compactions carried, what its user messages state, and the
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
    return tuple(merge(carried, found))


def read_state(
    entries: Sequence[Entry], ctx: StageContext, items: tuple[Item, ...] | None = None
) -> Standing:
    """The state of a history (``items``, or :func:`read_items`'s) and what it reserves under the target,
    by value (strategies/allocation.py): the rules, constraints, goals and decisions take what they need;
    the newest step comes next; the preferences and facts share their tier with the summary's ledger
    (``ctx.ledger_need``, what its identifiers ask for)."""
    merged = read_items(entries, ctx) if items is None else items
    settings, limits = ctx.settings, ctx.limits
    # What ranks above the state: the instructions, the runtime's pinned messages, the task's
    # statement, the summary turn and the least summary.
    task = task_index(entries) if limits.task_max_tokens > 0 else None
    required = sum(e.tokens for e in entries if e.pinned) + limits.fixed_tokens + ctx.overhead + MIN_FLOOR
    if task is not None and not entries[task].pinned:
        stated = statement(entries[task], ctx)
        required += min(entries[task].tokens, stated.tokens if stated is not None else TASK_HEAD_TOKENS)
    room = max(0, limits.target - required)
    cap = min(settings.standing_state_max_tokens, room)
    # What the state may show after any stage: the current items, and a changed one whose message may
    # stay verbatim (its mark beside the old words); a changed one whose message is gone is history,
    # shown only in room no stage wanted. Not the items of messages kept whole whatever the stages do
    # (the task within its budget, pinned messages): those say them already.
    verbatim = {e.n for e in entries if e.edit is None and not e.synthetic and e.role == "user"}
    whole = _kept_whole(entries, ctx)
    shows = [i for i in merged if i.current or i.n in verbatim]
    shown = {i for i in shows if i.n in whole}
    first = _entry([i for i in shows if TIERS[i.kind] < Tier.STEP], cap, 0, ctx, shown)
    taken = first.tokens if first is not None else 0
    # The preferences and facts share their tier with the ledger's identifiers: when both do not fit,
    # they share what the newest step leaves in proportion to what each asks (the facts at least
    # their settings' share of the room).
    left = max(0, room - taken - _newest_step_tokens(entries))
    want = _entry(shows, cap, 0, ctx, shown)
    facts = want.tokens - taken if want is not None else 0
    if facts > left and ctx.ledger_need:
        share = left * facts // (facts + ctx.ledger_need)
        left = max(min(left, int(settings.standing_state_max_fraction * room)), share)
    budget = taken + min(max(0, cap - taken), left)
    both = _entry(shows, budget, 0, ctx, shown)
    frame = ctx.count_message({"role": "user", "content": ""})
    held = render(shows, budget - frame, ctx.count, shown).kept if both is not None else ()
    # Put back after the stages, the state takes what they left, within its settings' budget.
    reserve = max(taken, both.tokens if both is not None else 0)
    return Standing(merged, reserve, settings.standing_state_max_tokens, held)


def _newest_step_tokens(entries: Sequence[Entry]) -> int:
    """Tokens of the newest step (``tail.newest_step``), 0 when there is none or it says nothing."""
    start = newest_step(entries)
    if start is None or all(is_filler_message(e) for e in entries[start:]):
        return 0
    return sum(e.tokens for e in entries[start:])


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


def restore_state(
    standing: Standing, draft: Draft, ctx: StageContext, most: int, *, narrative: Collection[str] = ()
) -> Draft:
    """``draft`` with the state first among its entries, within ``most`` tokens (only a draft with summary
    chunks: the state renders inside the summary turn; without them every user message is still there).

    Items of messages still verbatim in ``draft`` are not repeated (a changed one keeps its mark). When
    current items do not fit, the narrative of the chunks named in ``narrative`` (the ones this run
    wrote) gives them room, down to its least: the narrative ranks last (strategies/allocation.py)."""
    draft = without_state(draft)
    if not draft.chunks:
        return draft
    seq = draft.chunks[-1].last_seq
    shown = said(standing.items, draft.entries)
    entry = _entry(standing.items, most, seq, ctx, shown)
    placed = entry.tokens if entry is not None else 0
    wanted = _entry([i for i in standing.items if i.current or i in shown], standing.cap, seq, ctx, shown)
    short = (wanted.tokens if wanted is not None else 0) - placed
    if short > 0 and narrative:
        # The ledger's identifiers rank with the facts: they give way to rules, constraints, goals and
        # decisions left out, never to other facts.
        frame = ctx.count_message({"role": "user", "content": ""})
        missing = render(standing.items, most - frame, ctx.count, shown).dropped
        above = any(i.current and TIERS[i.kind] < Tier.STEP for i in missing)
        chunks, freed = _give_way(draft.chunks, set(narrative), short, ctx, ledger=above)
        if freed > 0:
            draft = Draft(chunks, draft.entries)
            entry = _entry(standing.items, most + freed, seq, ctx, shown)
    return draft if entry is None else Draft(draft.chunks, (entry, *draft.entries))


def _give_way(
    chunks: Sequence[SummaryChunk], ids: set[str], need: int, ctx: StageContext, *, ledger: bool = False
) -> tuple[tuple[SummaryChunk, ...], int]:
    """``chunks`` with the narrative of those in ``ids`` cut by about ``need`` tokens, the longest lines
    first (the least value per token), each keeping its last point (its next steps, the latest request);
    with ``ledger`` (rules, constraints, goals or decisions wait), their ledgers first, the last-ranked
    items first, and the narrative down to that point alone; and the tokens freed."""
    out, freed = list(chunks), 0
    for index in range(len(out) - 1, -1, -1):
        chunk = out[index]
        if chunk.id not in ids or freed >= need:
            continue
        while ledger and chunk.artifacts and freed < need:
            shorter = replace(chunk, artifacts=chunk.artifacts[:-1])
            shorter = replace(shorter, tokens=ctx.count(shorter.render_text()))
            freed += chunk.tokens - shorter.tokens
            out[index] = chunk = shorter
        lines = chunk.text.strip().splitlines()
        room = ctx.count(chunk.text) - (0 if ledger else MIN_SUMMARY_TOKENS)
        points = [i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
        cut: set[int] = set()
        for at in sorted(points[:-1], key=lambda i: -len(lines[i])):  # the last point always stays
            if freed >= need or room <= 0:
                continue
            cost = ctx.count(lines[at]) + 1
            if cost > room:
                continue
            cut.add(at)
            room -= cost
            freed += cost
        if cut:
            kept = [line for at, line in enumerate(lines) if at not in cut]
            # A heading left with nothing under it says nothing.
            kept = [ln for at, ln in enumerate(kept) if not _empty_heading(kept, at)]
            trimmed = replace(chunk, text="\n".join(kept))
            out[index] = replace(trimmed, tokens=ctx.count(trimmed.render_text()))
    return tuple(out), sum(c.tokens for c in chunks) - sum(c.tokens for c in out)


def _empty_heading(lines: Sequence[str], at: int) -> bool:
    if not lines[at].lstrip().startswith("#"):
        return False
    following = lines[at + 1] if at + 1 < len(lines) else "#"
    return following.lstrip().startswith("#")


CHANGED = "(changed later)"
"""What a summary says in place of a sentence the user later changed (the state shows both)."""


def unsay_changed(standing: Standing, draft: Draft, ctx: StageContext) -> Draft:
    """``draft`` with every sentence the user later changed taken out of its summary chunks (their
    text and ledger), so that no summary states an old value as current: the state lists it, marked
    no longer current, beside the value that holds (docs/design.md, "The standing state"). A ledger
    item that is only an old value (an identifier no current item names) goes too, and a summary's
    own words for an old identifier are replaced by the mark, in its text and its items."""
    # Longest first (one sentence may hold another); none shorter than the mark (it must save room).
    old = sorted({i.text for i in standing.items if not i.current and len(i.text) > len(CHANGED)}, key=len)[
        ::-1
    ]
    if not old:
        return draft
    current = {v for i in standing.items if i.current for v in values(i.text)}
    stale = sorted(
        {v for i in standing.items if not i.current for v in values(i.text) if _identifier(v)} - current,
        key=len,
        reverse=True,
    )
    named = (
        re.compile("|".join(rf"(?<![\w-]){re.escape(v)}(?![\w-])" for v in stale), re.IGNORECASE)
        if stale
        else None
    )

    def clean(text: str) -> str:
        for sentence in old:
            text = text.replace(sentence, CHANGED)
        return named.sub(CHANGED, text) if named is not None else text

    chunks = []
    for chunk in draft.chunks:
        text = clean(chunk.text)
        artifacts = tuple(
            a for a in chunk.artifacts if named is None or not named.fullmatch(a.partition(": ")[2])
        )
        artifacts = tuple(clean(a) for a in artifacts)
        items = tuple(_unsaid(raw, clean) for raw in chunk.items)
        cleaned = replace(chunk, text=text, artifacts=artifacts, items=items)
        changed = text != chunk.text or artifacts != chunk.artifacts or items != chunk.items
        chunks.append(replace(cleaned, tokens=ctx.count(cleaned.render_text())) if changed else chunk)
    return Draft(tuple(chunks), draft.entries)


def _unsaid(raw: str, clean: Callable[[str], str]) -> str:
    """A summary item (encoded) without the old values ``clean`` takes out, marked no longer true when it
    said one: the next request lists it so, and the model does not state the old value again. An item
    that said none keeps its bytes."""
    item = schema.Item.decode(raw)
    text = clean(item.text)
    return raw if text == item.text else replace(item, text=text, resolved=True).encode()


def _identifier(value: str) -> bool:
    """Whether a value names something (a region, a host, a ticket) rather than counts: replacing every
    "3" in a summary would say nothing true."""
    return len(value) >= 4 and any(c.isalpha() for c in value) and any(c.isdigit() for c in value)


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
