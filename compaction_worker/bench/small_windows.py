"""Published agent trajectories replayed on small windows: every compaction ends under the window.

Run: compaction-worker quality small-windows [--windows 4096 6144 8192] [--trajectories DIR] [--json]

Each run in tests/data/trajectories/ (two agents, both message styles), or under ``--trajectories``,
arrives one step at a time, as its agent produced it, with the default settings on a 4K, 6K or 8K
window. Whenever the history reaches the compaction threshold (the worker's trigger), it is
compacted with the extractive summarizer (every outage's fallback) through ``strategies.compact``,
with the limits the worker derives (``runtime.limits.limits_for``). After each compaction the
suite checks what issue 33 asks of a small window:

- **under the window**: the history fits what the window leaves for input, or the outcome says
  why it cannot (its error names the numbers);
- **the newest step verbatim**: the last step's assistant message is still an entry (cut if it
  must be, never summarized);
- **read whole**: every message the summary replaced reached the summarizer's request;
- **the task kept**: the share of the task's distinctive terms still in the history.

It prints one row per run and window.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compaction_worker import strategies
from compaction_worker.bench.trajectories import Trajectory, load_trajectories
from compaction_worker.budget.tokens import compute_budget, counter_for
from compaction_worker.budget.windows import resolve_window
from compaction_worker.contracts.events import Outcome
from compaction_worker.contracts.history import EffectiveHistory, Entry, render, text_of
from compaction_worker.conversation.meta import Meta
from compaction_worker.runtime.limits import limits_for
from compaction_worker.settings import Settings
from compaction_worker.summaries.carry import distinctive_terms
from compaction_worker.summaries.contract import SummaryRequest, SummaryResult
from compaction_worker.summaries.extractive import ExtractiveSummarizer

MODEL = "gpt-4o-mini"
WINDOWS = (4_096, 6_144, 8_192)
TRAJECTORIES = Path("tests/data/trajectories")
"""The repository's published runs (run from a checkout), unless ``--trajectories`` names others."""


class Reading:
    """The extractive summarizer, counting the transcript messages each request carried."""

    name = "extractive"

    def __init__(self, count: Any) -> None:
        self.inner = ExtractiveSummarizer(count)
        self.read: set[str] = set()

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        self.read.update(json.dumps(m, sort_keys=True) for m in request.messages)
        return await self.inner.summarize(request)


@dataclass
class Row:
    run: str
    window: int
    steps: int
    compactions: int = 0
    noops: int = 0
    over_window: int = 0
    """Compactions that left the history over what the window leaves for input, saying nothing."""
    said_why: int = 0
    """Compactions over the window whose outcome says why (the pinned content alone exceeds it)."""
    newest_summarized: int = 0
    unread: int = 0
    """Messages a summary replaced that no summary request carried."""
    task_terms_kept: float = 1.0
    """The smallest share of the task's distinctive terms in the history after any compaction."""
    errors: list[str] = field(default_factory=list)


def _key(message: Mapping[str, Any]) -> str:
    return json.dumps(message, sort_keys=True)


async def replay(run: Trajectory, window: int) -> Row:
    settings = Settings()
    counter = counter_for(MODEL, settings.budget)
    budget = compute_budget(resolve_window(MODEL, settings.budget, window), settings.budget)
    turns = run.turns()
    system = [m for m in turns[0] if m["role"] == "system"]
    task = next((m for m in turns[0] if m["role"] == "user"), None)
    task_terms = distinctive_terms(text_of(task)) if task else []
    row = Row(run.name, window, len(turns))
    history = EffectiveHistory((), ())
    transcript: dict[int, dict[str, Any]] = {}
    n = 0
    for seq, turn in enumerate(turns, 1):
        added = []
        for message in turn:
            n += 1
            transcript[n] = message
            added.append(Entry(n=n, seq=seq, message=message, tokens=counter.message(message)))
        history = history.with_parts(history.chunks, (*history.entries, *added))
        overhead = strategies.summary_overhead(counter)
        tokens = strategies.draft_tokens(strategies.Draft(history.chunks, history.entries), overhead)
        if tokens < budget.threshold:
            continue
        reading = Reading(counter.text)
        meta = Meta()
        limits = limits_for(settings, meta, budget, budget.target, 1.0, force=False)
        # As the worker does: the transcript's originals of what earlier compactions edited.
        originals = {n: transcript[n] for n in strategies.edited_ordinals(history)}
        result = await strategies.compact(
            history, limits, [reading], counter, settings=settings.pipeline, originals=originals
        )
        if result.outcome is not Outcome.COMPACTED:
            row.noops += 1
            if result.tokens_before > budget.available:
                row.said_why += 1 if result.error else 0
                row.over_window += 0 if result.error else 1
            row.errors.append(f"turn {seq}: {result.outcome.value}: {result.error}")
            continue
        row.compactions += 1
        before = history
        history = history.with_parts(result.draft.chunks, result.draft.entries)
        if result.tokens_after > budget.available:
            row.over_window += 1
        newest = [m for m in turn if m["role"] == "assistant"]
        kept = {_key(e.message) for e in history.entries}
        if any(_key(m) not in kept for m in newest) and not _cut_in_place(history, seq):
            row.newest_summarized += 1
        replaced = {e.n for e in before.entries} - {e.n for e in history.entries}
        replaced_messages = [transcript[e.n] for e in before.entries if e.n in replaced and not e.synthetic]
        if any(c not in before.chunks for c in history.chunks):
            row.unread += sum(1 for m in replaced_messages if _key(m) not in reading.read)
        shown = "\n".join(text_of(m) for m in render(history)) + "".join(text_of(m) for m in system)
        if task_terms:
            share = sum(t in shown for t in task_terms) / len(task_terms)
            row.task_terms_kept = min(row.task_terms_kept, share)
    return row


async def _replay_all(runs: Sequence[Trajectory], windows: Sequence[int]) -> list[Row]:
    return [await replay(run, window) for window in windows for run in runs]


def _cut_in_place(history: EffectiveHistory, seq: int) -> bool:
    """Whether the newest step is still there as an entry, edited (cut to fit) but not summarized."""
    return any(e.seq == seq and e.role == "assistant" for e in history.entries)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="compaction-worker quality small-windows",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--windows", type=int, nargs="+", default=list(WINDOWS))
    parser.add_argument(
        "--trajectories",
        type=Path,
        default=TRAJECTORIES,
        help="a folder of agent runs, <agent>/<run>.traj or .traj.json (default: the repository's)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    runs = load_trajectories(args.trajectories)
    if not runs:
        parser.error(f"no <agent>/<run>.traj or .traj.json under {args.trajectories}")
    rows = asyncio.run(_replay_all(runs, args.windows))
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return
    print(
        "| run | window | steps | compactions | no-ops | over the window, unexplained | over, said why "
        "| newest step summarized | replaced but unread | task terms kept (worst) |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        print(
            f"| {r.run} | {r.window:,} | {r.steps} | {r.compactions} | {r.noops} | {r.over_window} | "
            f"{r.said_why} | {r.newest_summarized} | {r.unread} | {r.task_terms_kept:.0%} |"
        )
    for r in rows:
        for error in dict.fromkeys(r.errors):
            print(f"  {r.run} @ {r.window}: {error}")
