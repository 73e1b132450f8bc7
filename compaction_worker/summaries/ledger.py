"""A chunk's verbatim ledger: what it keeps exactly of the span and chunks it replaces.

Planned before the summary, completed after it with what the summary text lost. Its items
come from :mod:`artifacts` (extracted from the messages; :mod:`mentions` for those written in
prose), which also chooses them within a budget (``select_items``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from compaction_worker.contracts.history import SummaryChunk
from compaction_worker.summaries.artifacts import (
    KINDS,
    extract_artifacts,
    item_core,
    item_kind,
    scan_items,
    select_items,
)
from compaction_worker.summaries.contract import CountTokens
from compaction_worker.summaries.instructions import Terms, matches
from compaction_worker.summaries.mentions import holds


def merge_ledgers(
    ledgers: Sequence[Sequence[str]],
    budget: int,
    count: CountTokens,
    *,
    carried: str = "",
    terms: Terms = frozenset(),
) -> tuple[str, ...]:
    """One ledger from several, given newest first, within ``budget`` tokens (items joined by newlines).

    Items are de-duplicated (the newest copy counts). When they do not all fit, an item's
    rank is its kind's place in ``KINDS`` plus its age (0 for the newest ledger): one step
    older weighs as much as one step down in kind, so a recent command outranks an old
    error but not a recent one, and old items give way gradually as folds repeat. Within
    one ledger, later items of a kind are the more recent (see ``extract_artifacts``).
    Short of room, items keep their cores (see ``select_items``). The result is listed
    like a fresh ledger: by kind, oldest first. Items sharing the most of ``terms`` (the
    compaction instructions', ``summaries.instructions``) are kept first; items whose core
    ``carried`` (a summary) holds verbatim take no room.
    """
    if budget <= 0:
        return ()
    kind_rank = {kind: i for i, kind in enumerate(KINDS)}
    found: dict[str, tuple[int, int, int]] = {}  # item -> (kind rank, age, position)
    for age, ledger in enumerate(ledgers):
        for position, item in enumerate(ledger):
            if item not in found:
                found[item] = (kind_rank.get(item_kind(item), len(KINDS)), age, position)
    asked = {it: matches(it, terms) for it in found} if terms else {}
    ranked = sorted(
        found,
        key=lambda it: (-asked.get(it, 0), found[it][0] + found[it][1], found[it][1], -found[it][2]),
    )
    kept = select_items(
        ranked,
        budget,
        count,
        carried=carried,
        listed=lambda items: sorted(items, key=lambda it: (found[it][0], -found[it][1], found[it][2])),
    )
    return tuple(kept)


def ledger_need(
    messages: Sequence[Mapping[str, Any]],
    folded: Sequence[SummaryChunk],
    count: CountTokens,
    *,
    carried: str = "",
) -> int:
    """Tokens of a ledger that would hold every item of ``messages`` and of the chunks' ledgers that
    ``carried`` (what the history shows anyway) does not: what the identifiers ask for, before any budget."""
    items = dict.fromkeys(
        [*extract_artifacts(messages, sys.maxsize, count), *(a for c in folded for a in c.artifacts)]
    )
    kept = [item for item in items if not (carried and holds(carried, item_core(item)))]
    # Item by item, as a ledger lists them: a joined count can be less than what choosing them costs.
    return sum(count(f"- {item}") for item in kept)


def plan_ledger(
    messages: Sequence[Mapping[str, Any]],
    folded: Sequence[SummaryChunk],
    *,
    allowance: int,
    cap: int,
    count: CountTokens,
    terms: Terms = frozenset(),
) -> tuple[int, tuple[str, ...]]:
    """A new chunk's ledger budget, and its ledger of the span and the chunks it folds, before the summary.

    The budget is ``allowance``; a fold's grows, up to ``cap``, to hold what the chunks it
    folds carried (their ledgers and what their summaries stated) with the span's items:
    a re-summary must not lose them, and ledger items outrank summary prose (the summary
    gets what the ledger leaves). An additive chunk's ledger grows only after its summary,
    into what the summary left unused (``finalize_ledger``). Items sharing ``terms`` come first.
    """
    budget = min(allowance, cap)
    if budget <= 0:
        return 0, ()
    if not folded and not terms:
        return budget, tuple(extract_artifacts(messages, budget, count))
    cached = functools.cache(count)
    # All of the span's items compete with the folded ones, not a pre-trimmed few.
    sources = _sources((), messages, folded)
    if not folded:
        return budget, merge_ledgers(sources, budget, cached, terms=terms)
    everything = merge_ledgers(sources, sys.maxsize, cached, terms=terms)
    need = cached("\n".join(everything))
    if need <= budget:
        return budget, everything
    budget = min(cap, need)
    return budget, everything if need <= budget else merge_ledgers(sources, budget, cached, terms=terms)


def finalize_ledger(
    summary: str,
    ledger: Sequence[str],
    messages: Sequence[Mapping[str, Any]],
    folded: Sequence[SummaryChunk],
    *,
    budget: int,
    count: CountTokens,
    fits: Callable[[tuple[str, ...]], bool] | None = None,
    terms: Terms = frozenset(),
) -> tuple[str, ...]:
    """The chunk's final ledger: what ``summary`` lost of the span's and the folded chunks' items.

    The candidates are ``ledger`` (chosen before the summary), every item of ``messages``,
    and of each folded chunk its ledger and the items its summary stated (a fold must not
    lose the facts an earlier summary carried). Items whose core the summary holds
    verbatim take no room; the rest are kept as ``merge_ledgers`` keeps them, within
    ``budget`` tokens joined by newlines and, if given, while ``fits`` accepts the ledger
    (the exact check of the chunk it makes). Items sharing ``terms`` come first.
    """
    if budget <= 0:
        return ()
    cached = functools.cache(count)  # choosing a ledger counts the same items repeatedly
    sources = _sources(ledger, messages, folded)

    def choose(room: int) -> tuple[str, ...]:
        return merge_ledgers(sources, room, cached, carried=summary, terms=terms)

    kept = choose(budget)
    if fits is None or fits(kept):
        return kept
    # Rendering adds bullets and a heading: find the largest room whose ledger fits.
    low, high = 0, budget
    while low < high:
        middle = (low + high + 1) // 2
        if fits(choose(middle)):
            low = middle
        else:
            high = middle - 1
    return choose(low)


def _sources(
    ledger: Sequence[str], messages: Sequence[Mapping[str, Any]], folded: Sequence[SummaryChunk]
) -> list[list[str]]:
    """A new chunk's candidate items, newest source first (``ledger``, if any, leads).

    The span's items, then each folded chunk's ledger with the items its summary stated:
    a fold must not lose what an earlier summary carried in its prose. Within a source
    items are listed oldest first, each once, as ``extract_artifacts`` lists them.
    """
    fresh = [item for _, item in scan_items(messages)]
    older = [
        [*chunk.artifacts, *(item for _, item in scan_items([{"role": "user", "content": chunk.text}]))]
        for chunk in reversed(folded)
    ]
    return [list(ledger), list(reversed(dict.fromkeys(reversed(fresh)))), *older]
