"""Ledger items (``"<kind>: <text>"``) and what a ledger keeps of them within a token budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compaction_worker.summaries import mentions

__all__ = ["item_core", "item_kind", "select_items"]


def select_items(
    ranked: Sequence[str],
    budget: int,
    count: Callable[[str], int],
    *,
    listed: Callable[[list[str]], list[str]] = list,
    carried: str = "",
) -> list[str]:
    """What is kept of ``ranked`` (best first) within ``budget`` tokens, joined by newlines.

    An item whose core ``carried`` (a summary) or an item kept before it already holds
    verbatim takes no room. When not all fit whole, coverage comes first: every item is
    tried as its core (``item_core``), best first, and those kept get their whole text
    back, best first, while room is left. ``listed`` orders the kept items (given as
    they are in ``ranked``); the result is what is stored, in that order.
    """
    if budget <= 0:
        return []
    candidates = (
        [it for it in ranked if not mentions.holds(carried, item_core(it))] if carried else list(ranked)
    )
    chosen, used, short = _greedy(candidates, budget, count, shrink=False)
    if short:
        chosen, used, _ = _greedy(candidates, budget, count, shrink=True)
        for item, text in chosen.items():
            extra = count(item) - count(text)
            if text != item and used + extra <= budget + 1:
                chosen[item] = item
                used += extra
    kept = list(chosen)
    # Token counts are not exactly additive; the joined text is what must fit.
    while kept and count("\n".join(chosen[it] for it in listed(kept))) > budget:
        kept.pop()
    return [chosen[it] for it in listed(kept)]


def _greedy(
    items: Sequence[str], budget: int, count: Callable[[str], int], *, shrink: bool
) -> tuple[dict[str, str], int, bool]:
    """Items (as their cores if ``shrink``) in order while they fit; the room used; whether any did not."""
    chosen: dict[str, str] = {}
    held = ""  # the texts kept so far: an item whose core they hold is carried already
    used = 0
    short = False
    for item in items:
        kind, _, text = item.partition(": ")
        core = mentions.core(kind, text)
        if core in held and mentions.holds(held, core):
            continue
        stored = f"{kind}: {core}" if shrink else item
        cost = count(stored) + 1  # +1 for the newline joining it to the next
        if used + cost <= budget + 1:
            chosen[item] = stored
            used += cost
            held += "\n" + (core if shrink else text)
        else:
            short = True
    return chosen, used, short


def item_kind(item: str) -> str:
    """The kind of a ledger item (``"path: a.py"`` -> ``"path"``)."""
    return item.split(": ", 1)[0]


def item_core(item: str) -> str:
    """The verbatim part of a ledger item that must survive (see :func:`mentions.core`)."""
    kind, _, text = item.partition(": ")
    return mentions.core(kind, text) if text else item
