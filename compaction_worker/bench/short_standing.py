"""Typed canaries in short sessions at absolute budgets, the product beside what a user could pick.

Run: compaction-worker quality standing --short [--seeds 7 8 9 10 11] [--budgets 0.1 0.2 0.3] [--json]
     compaction-worker quality standing --short --show 7 0.3   (also print one product output)

A short session (``bench/short_sessions.py``: ~2,200 tokens, 20 items the user set among remarks and
acknowledgments, some changed later) is compacted five times: after the session, after three more
turns (one of them a change), then three times with no new turn (forced, for the product). The
output is held to 10%, 20% and 30% of the session's tokens (every message, ``counter.message``) on
a 128K window, so the budget decides, not the window. The methods, on the same sessions, budget and
counter: the product through ``strategies.compact`` (limits as the worker derives them for the
window, the budget as the target, no ceilings) with the extractive summarizer (the outage fallback)
and with a lossy stand-in for a weak model; and the carriers of ``bench/carriers.py``, each carrying
its own output forward as a user would. After every round the output is scored: an item is kept when
one sentence holds its current value and its key words; a changed item is resolved when its new value
is kept and its old value is gone or only on a line marked as no longer current.

Methods are ranked per budget by the items kept in their worst round, ties by output size; a method
whose output exceeded the budget in any round is "over" and ranked after all that fit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter as Tally
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from compaction_worker import strategies
from compaction_worker.bench.canaries import KINDS
from compaction_worker.bench.carriers import Carrier, Checklist, Message, SlidingWindow, SummaryTail
from compaction_worker.bench.short_sessions import (
    PER_KIND,
    Item,
    ShortSession,
    found,
    marked_only,
    says,
    session,
)
from compaction_worker.bench.standing import Lossy
from compaction_worker.budget.tokens import TokenCounter, compute_budget, counter_for
from compaction_worker.budget.windows import resolve_window
from compaction_worker.contracts.history import EffectiveHistory, Entry, render, text_of
from compaction_worker.conversation.meta import Meta
from compaction_worker.runtime.limits import limits_for
from compaction_worker.settings import Settings
from compaction_worker.summaries.contract import Summarizer
from compaction_worker.summaries.extractive import ExtractiveSummarizer

MODEL = "gpt-4o-mini"
WINDOW = 128_000
BUDGETS = (0.10, 0.20, 0.30)
SEEDS = (7, 8, 9, 10, 11)
ROUNDS = 5
PRODUCT = "compaction-worker"
PRODUCT_LOSSY = "compaction-worker (lossy)"
METHODS = (PRODUCT, PRODUCT_LOSSY, "checklist", "checklist+updates", "summary+tail", "sliding window")


@dataclass
class Scored:
    """One round of one method on one session."""

    kept: dict[str, int] = field(default_factory=dict)
    lost: list[tuple[str, str, str]] = field(default_factory=list)
    """(kind, the current sentence, what the output says instead) of each item not kept."""
    task: bool = False
    changed: int = 0
    resolved: int = 0
    tokens: int = 0
    budget: int = 0

    @property
    def items(self) -> int:
        return sum(self.kept.values())


def score(s: ShortSession, round_index: int, output: Sequence[Message], budget: int, counter: Any) -> Scored:
    # A blank line between messages: a heading's section never runs into the next message.
    text = "\n\n".join(text_of(m) for m in output)
    out = Scored(task=found(s.task, text), tokens=counter.messages(output), budget=budget)
    for item in s.items:
        current = item.current(round_index)
        kept = found(current, text)
        if kept:
            out.kept[item.kind] = out.kept.get(item.kind, 0) + 1
        else:
            out.lost.append((item.kind, current.text, _why(item, round_index, text)))
        if item.superseded(round_index):
            out.changed += 1
            out.resolved += kept and marked_only(item.said.canary, text)
    return out


def _why(item: Item, round_index: int, text: str) -> str:
    """What the output says instead of a lost item: its old value, its value without its words, or nothing."""
    current = item.current(round_index)
    if item.superseded(round_index) and found(item.said, text):
        return "only the old value"
    if says(current.canary, text):
        return "value without its words"
    return "absent"


class Product:
    """The product as the worker runs it: one ``strategies.compact`` per round, committed when it shrinks."""

    def __init__(self, counter: TokenCounter, settings: Settings, *, lossy: bool = False) -> None:
        self.name = PRODUCT_LOSSY if lossy else PRODUCT
        self.counter, self.settings = counter, settings
        fallback = ExtractiveSummarizer(counter.text)
        self.summarizers: list[Summarizer] = [Lossy(counter.text), fallback] if lossy else [fallback]
        self.history = EffectiveHistory((), ())
        self.transcript: dict[int, Message] = {}

    async def carry(self, added: Sequence[Entry], budget: int, *, force: bool) -> list[Message]:
        self.transcript.update((e.n, e.message) for e in added)
        history = self.history.with_parts(self.history.chunks, (*self.history.entries, *added))
        window = compute_budget(resolve_window(MODEL, self.settings.budget, WINDOW), self.settings.budget)
        # An absolute budget: the target is the budget and nothing past it is a fallback aim.
        limits = replace(limits_for(self.settings, Meta(), window, budget, 1.0, force=force), ceilings=())
        originals = {n: self.transcript[n] for n in strategies.edited_ordinals(history)}
        result = await strategies.compact(
            history,
            limits,
            self.summarizers,
            self.counter,
            settings=self.settings.pipeline,
            originals=originals,
        )
        if result.shrinks:
            history = history.with_parts(result.draft.chunks, result.draft.entries)
        self.history = history
        rendered: list[Message] = list(render(history, self.settings.pipeline.summary_placement))
        return rendered


async def rounds_of(
    name: str, s: ShortSession, budget: int, counter: TokenCounter, settings: Settings
) -> tuple[list[Scored], list[list[Message]]]:
    """Five rounds of one method on one session: each round's score and output."""
    product = Product(counter, settings, lossy=name == PRODUCT_LOSSY) if name.startswith(PRODUCT) else None
    carrier = None if product else carrier_named(name, counter)
    carried: list[Message] = []
    scores: list[Scored] = []
    outputs: list[list[Message]] = []
    for index in range(ROUNDS):
        added = s.entries if index == 0 else s.more if index == 1 else []
        if product is not None:
            carried = await product.carry(added, budget, force=index >= 2)
        else:
            assert carrier is not None
            carried = carrier.carry(carried, [e.message for e in added], budget)
        scores.append(score(s, index, carried, budget, counter))
        outputs.append(carried)
    return scores, outputs


def carrier_named(name: str, counter: TokenCounter) -> Carrier:
    carriers: list[Carrier] = [
        Checklist(counter),
        Checklist(counter, updates=True),
        SummaryTail(counter),
        SlidingWindow(counter),
    ]
    return next(c for c in carriers if c.name == name)


# --- the report -------------------------------------------------------------------------------------


@dataclass
class Row:
    method: str
    share: float
    budget: float
    """The mean budget in tokens over the seeds."""
    worst_round: int
    """The round (1-5) in which the fewest items were kept, over all seeds."""
    items: float
    """Share of the planted items kept in the worst round (all seeds)."""
    by_kind: dict[str, float]
    """In the worst round."""
    task: float
    resolved: float
    """Changed items resolved, in the round where the fewest were."""
    rounds: list[dict[str, Any]]
    """Per round: items, each kind, task, resolved, the largest output / budget."""
    used: float
    """The largest output / budget of any round and seed."""
    tokens: float
    """Mean output tokens in the worst round."""
    over: bool
    rank: int = 0
    lost: dict[int, tuple[int, list[tuple[str, str, str]]]] = field(default_factory=dict)
    """By seed: the seed's worst round (0-based) and the items lost in it."""


def summarize(name: str, share: float, runs: dict[int, list[Scored]]) -> Row:
    seeds = len(runs)
    rounds = [_round([r[i] for r in runs.values()]) for i in range(ROUNDS)]
    worst = min(range(ROUNDS), key=lambda i: rounds[i]["items"])
    lost = {}
    for seed, r in runs.items():
        at = min(range(ROUNDS), key=lambda i: r[i].items)
        lost[seed] = (at, r[at].lost)
    return Row(
        method=name,
        share=share,
        budget=sum(r[0].budget for r in runs.values()) / seeds,
        worst_round=worst + 1,
        items=rounds[worst]["items"],
        by_kind={k: rounds[worst][k] for k in KINDS},
        task=rounds[worst]["task"],
        resolved=min(x["resolved"] for x in rounds),
        rounds=rounds,
        used=max(x["used"] for x in rounds),
        tokens=sum(r[worst].tokens for r in runs.values()) / seeds,
        over=any(x.tokens > x.budget for r in runs.values() for x in r),
        lost=lost,
    )


def _round(scores: Sequence[Scored]) -> dict[str, Any]:
    """One round over the seeds, as shares."""
    n = len(scores)
    kinds: Tally[str] = Tally()
    for x in scores:
        kinds.update(x.kept)
    return {
        "items": sum(x.items for x in scores) / (len(KINDS) * PER_KIND * n),
        **{k: kinds[k] / (PER_KIND * n) for k in KINDS},
        "task": sum(x.task for x in scores) / n,
        "resolved": sum(x.resolved for x in scores) / max(1, sum(x.changed for x in scores)),
        "used": max(x.tokens / x.budget for x in scores),
    }


def ranked(rows: Sequence[Row]) -> list[Row]:
    """Those that fit first, by items kept in the worst round, then by output size."""
    order = sorted(rows, key=lambda r: (r.over, -round(r.items, 6), r.tokens))
    return [replace(r, rank=i) for i, r in enumerate(order, 1)]


async def run(seeds: Sequence[int], shares: Sequence[float]) -> list[Row]:
    """Every method on every seed's session at every budget: one row per budget and method, ranked."""
    settings = Settings()
    counter = counter_for(MODEL, settings.budget)
    sessions = [session(seed, counter) for seed in seeds]
    rows: list[Row] = []
    for share in shares:
        found_rows = []
        for name in METHODS:
            runs = {}
            for s in sessions:
                runs[s.seed], _ = await rounds_of(name, s, int(share * s.tokens), counter, settings)
            found_rows.append(summarize(name, share, runs))
        rows += ranked(found_rows)
    return rows


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def print_table(rows: Sequence[Row], seeds: Sequence[int]) -> None:
    print(
        f"Short sessions, seeds {', '.join(map(str, seeds))} (20 items each), {ROUNDS} rounds, window {WINDOW:,}; "
        "each cell sums the seeds, in each method's worst round (the round that kept the fewest items)"
    )
    print(
        "| budget | rank | method | items kept | " + " | ".join(KINDS) + " | task | superseded resolved "
        "| output / budget (max) | output tokens |"
    )
    print("|--:|--:|---|--:|" + "--:|" * len(KINDS) + "--:|--:|--:|--:|")
    for r in rows:
        kinds = " | ".join(_pct(r.by_kind[k]) for k in KINDS)
        flag = " **over**" if r.over else ""
        print(
            f"| {_pct(r.share)} ({r.budget:.0f}) | {r.rank} | {r.method}{flag} | {_pct(r.items)} (round {r.worst_round}) "
            f"| {kinds} | {_pct(r.task)} | {_pct(r.resolved)} | {r.used:.2f} | {r.tokens:.0f} |"
        )
    print()
    print("By round (rounds 1-5): items kept, each kind, superseded resolved")
    print("| budget | method | items | " + " | ".join(KINDS) + " | superseded resolved |")
    print("|--:|---|---|" + "---|" * len(KINDS) + "---|")
    for r in rows:
        cells = [" ".join(_pct(x[key]) for x in r.rounds) for key in ("items", *KINDS, "resolved")]
        print(f"| {_pct(r.share)} | {r.method} | " + " | ".join(cells) + " |")
    for r in rows:
        if r.method != PRODUCT:
            continue
        print()
        print(f"{r.method} at {_pct(r.share)}: what each seed's worst round lost")
        for seed, (at, lost) in r.lost.items():
            print(f"  seed {seed}, round {at + 1}: {len(lost)} of 20 lost")
            for kind, text, why in lost:
                print(f"    [{kind}] {text}  ({why})")


async def show(seed: int, share: float) -> None:
    """The product's output for one seed and budget in each round, message by message, with tokens."""
    settings = Settings()
    counter = counter_for(MODEL, settings.budget)
    s = session(seed, counter)
    budget = int(share * s.tokens)
    scores, outputs = await rounds_of(PRODUCT, s, budget, counter, settings)
    for index, (scored, output) in enumerate(zip(scores, outputs, strict=True)):
        print(
            f"--- {PRODUCT}, seed {seed}, budget {_pct(share)} = {budget} tokens, round {index + 1}: "
            f"{scored.tokens} tokens, {scored.items}/20 items kept"
        )
        if index not in (0, ROUNDS - 1):
            continue
        for message in output:
            print(f"[{message.get('role')}, {counter.message(message)} tokens]")
            for section in _sections(text_of(message)):
                print(f"  ({counter.text(section)} tokens) " + section.replace("\n", "\n  "))


def _sections(text: str) -> list[str]:
    """A message's text cut at its headings (lines starting with "[" or "#"), for a per-part count."""
    parts: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.startswith(("[", "#")) and parts[-1]:
            parts.append([])
        parts[-1].append(line)
    return ["\n".join(p) for p in parts if p]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="compaction-worker quality standing --short",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--budgets", type=float, nargs="+", default=list(BUDGETS))
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--show",
        nargs=2,
        metavar=("SEED", "BUDGET"),
        help="also print the product's output for one seed and budget",
    )
    args = parser.parse_args(argv)
    rows = asyncio.run(run(args.seeds, args.budgets))
    if args.json:
        print(json.dumps([_as_json(r) for r in rows], indent=2))
    else:
        print_table(rows, args.seeds)
    if args.show:
        asyncio.run(show(int(args.show[0]), float(args.show[1])))


def _as_json(row: Row) -> dict[str, Any]:
    out = dict(vars(row))
    out["lost"] = {
        str(seed): {"round": at + 1, "items": [{"kind": k, "text": t, "why": w} for k, t, w in lost]}
        for seed, (at, lost) in row.lost.items()
    }
    return out
