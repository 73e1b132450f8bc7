"""``compaction-worker replay``: read, replay, print the figures, write the plot and the histories."""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from compaction_worker.contracts import cli_output
from compaction_worker.contracts.events import Outcome
from compaction_worker.contracts.history import render
from compaction_worker.errors import CompactionWorkerError
from compaction_worker.replay.cache import CacheFigures
from compaction_worker.replay.plot import plot
from compaction_worker.replay.reader import Format, ReplayInputError, read_paths
from compaction_worker.replay.simulate import ConversationReport, Replay, Tally
from compaction_worker.settings import BudgetSettings, Settings
from compaction_worker.summaries.factory import configured_summarizers


@dataclass(frozen=True, slots=True)
class Options:
    """What the command was asked for, besides the settings."""

    paths: Sequence[Path]
    fmt: Format = "auto"
    model: str | None = None
    context_window: int | None = None
    plot: Path | None = None
    output: Path | None = None
    as_json: bool = False


def with_thresholds(settings: Settings, trigger: float | None, target: float | None) -> Settings:
    """``settings`` with ``--trigger`` and ``--target`` (fractions of the available window) applied."""
    if trigger is None and target is None:
        return settings
    fields = settings.budget.model_dump()
    if trigger is not None:
        fields["trigger_fraction"] = trigger
    if target is not None:
        fields["target_fraction"] = target
    try:
        budget = BudgetSettings.model_validate(fields)
    except ValidationError as e:
        reasons = "; ".join(str(error["msg"]) for error in e.errors())
        raise ReplayInputError(f"invalid thresholds: {reasons}") from e
    return settings.model_copy(update={"budget": budget})


def replay_command(
    settings: Settings,
    paths: Sequence[Path],
    *,
    trigger: float | None,
    target: float | None,
    **options: Any,
) -> int:
    """The CLI's ``replay``: its options applied, its errors as the CLI reports them; the exit status."""
    try:
        chosen = {k: v for k, v in options.items() if v is not None}
        return run_replay(with_thresholds(settings, trigger, target), Options(paths, **chosen))
    except CompactionWorkerError as e:
        raise click.ClickException(str(e)) from e


def run_replay(settings: Settings, options: Options) -> int:
    """Replay, print and write what was asked; the exit status: 0 when something was replayed, whatever
    was skipped beside it (named on stderr), else a ReplayInputError."""
    read = read_paths(options.paths, options.fmt)
    errors: list[str] = [str(e) for e in read.errors]
    replays: list[Replay] = []
    summarizers = configured_summarizers(settings)
    for conversation in read.conversations:
        try:
            replays.append(
                Replay(
                    conversation,
                    settings,
                    summarizers,
                    model=options.model,
                    context_window=options.context_window,
                )
            )
        except ReplayInputError as e:
            errors.append(f"{conversation.source}: {e}")
    if read.unrecognised:
        click.echo(unrecognised_line(read.unrecognised), err=True)
    for error in errors:
        click.echo(f"skipped: {error}", err=True)
    if not replays:
        raise ReplayInputError("no conversation to replay")
    reports = asyncio.run(_replay_all(replays))
    try:
        if options.plot is not None:
            plot(reports, options.plot)
        if options.output is not None:
            options.output.write_text(
                "".join(_history(r, settings).model_dump_json() + "\n" for r in reports), encoding="utf-8"
            )
    except OSError as e:
        raise ReplayInputError(f"cannot write {e.filename}: {e.strerror}") from e
    result = summary(reports, errors, options, skipped_files=[str(p) for p in read.unrecognised])
    if options.as_json:
        click.echo(result.model_dump_json(indent=2))
    else:
        for line in table(result):
            click.echo(line)
    return 0


NAMED_FILES = 10
"""The unrecognised files the text names before it counts the rest (``--json`` lists them all)."""


def unrecognised_line(files: Sequence[Path]) -> str:
    """The files not recognised as conversations, on one line: named under the folder they share."""
    common = Path(os.path.commonpath([f.parent for f in files]))
    names = [str(f.relative_to(common)) for f in files[:NAMED_FILES]]
    more = f", and {len(files) - NAMED_FILES} more" if len(files) > NAMED_FILES else ""
    where = f" (in {common})" if str(common) not in ("", ".") else ""
    what = (
        "file not recognised as a conversation"
        if len(files) == 1
        else "files not recognised as conversations"
    )
    return f"skipped {len(files)} {what}{where}: {', '.join(names)}{more}"


async def _replay_all(replays: Sequence[Replay]) -> list[ConversationReport]:
    turns = sum(len(r.events) for r in replays)
    with click.progressbar(length=turns, label="replaying", file=sys.stderr, show_pos=True) as bar:
        return [await r.run(lambda: bar.update(1)) for r in replays]


def _history(report: ConversationReport, settings: Settings) -> cli_output.History:
    """The final effective history as ``history --json`` prints it."""
    return cli_output.History(
        conversation_id=report.name,
        version=report.meta.version,
        context_status=report.meta.context_status,
        tokens=report.meta.total_tokens,
        chunks=[cli_output.Chunk.of(c) for c in report.history.chunks],
        messages=render(report.history, settings.pipeline.summary_placement),
    )


def conversation_output(report: ConversationReport) -> cli_output.ReplayConversation:
    """One conversation's figures in the ``--json`` model."""
    usage = report.usage
    return cli_output.ReplayConversation.of(
        report,
        window=report.budget.window,
        threshold=report.budget.threshold,
        target=report.budget.target,
        turns=len(report.points),
        compactions=report.by_trigger(),
        llm_input_tokens=usage.prompt_tokens,
        llm_output_tokens=usage.completion_tokens,
        peak_tokens=report.peak,
        final_tokens=report.points[-1].after if report.points else 0,
        context_per_turn=[p.tokens for p in report.points],
        runs=[
            cli_output.ReplayRun.of(
                c, llm_input_tokens=c.usage.prompt_tokens, llm_output_tokens=c.usage.completion_tokens
            )
            for c in report.runs
        ],
        cache=[cache_output(f) for f in report.cache],
        per_100_turns=rates(report.tally()),
    )


def rates(tally: Tally) -> cli_output.ReplayRates:
    """A tally per 100 turns, in the ``--json`` model (rounded as printed, a little finer)."""
    return cli_output.ReplayRates.model_validate(
        {
            k: None if v is None else round(v, 6 if k == "dollars" else 2)
            for k, v in tally.per_100_turns().items()
        }
    )


def cache_output(figures: CacheFigures) -> cli_output.ReplayCache:
    """One strategy's cache figures in the ``--json`` model."""
    dollars = figures.dollars
    return cli_output.ReplayCache.of(
        figures,
        cached_share=round(figures.cached_share, 4),
        breaks_per_100_turns=round(figures.breaks_per_100_turns, 2),
        dollars=None if dollars is None else cli_output.ReplayDollars.of(dollars),
    )


def summary(
    reports: Sequence[ConversationReport],
    errors: Sequence[str],
    options: Options,
    *,
    skipped_files: Sequence[str] = (),
) -> cli_output.Replay:
    """The whole replay in the ``--json`` model: per conversation, then the totals."""
    conversations = [conversation_output(r) for r in reports]
    by_trigger = sum((Counter(c.compactions) for c in conversations), Counter[str]())
    total = cli_output.ReplayFigures(
        turns=sum(c.turns for c in conversations),
        compactions=dict(by_trigger),
        tokens_saved=sum(c.tokens_saved for c in conversations),
        llm_input_tokens=sum(c.llm_input_tokens for c in conversations),
        llm_output_tokens=sum(c.llm_output_tokens for c in conversations),
        peak_tokens=max((c.peak_tokens for c in conversations), default=0),
        per_100_turns=rates(sum((r.tally() for r in reports), Tally())),
    )
    return cli_output.Replay(
        conversations=conversations,
        total=total,
        errors=list(errors),
        skipped_files=list(skipped_files),
        plot=str(options.plot) if options.plot else None,
        output=str(options.output) if options.output else None,
    )


def table(result: cli_output.Replay) -> list[str]:
    """The human-readable figures: one row per conversation, then the total, then what the peak is."""
    header = f"{'conversation':<28} {'turns':>6} {'compactions':<24} {'saved':>9} {'LLM in/out':>15} {'peak prompt':>11}"
    rows = [header]
    for c in result.conversations:
        rows.append(_row(c.name[:28], c))
        rows.append(
            f"  {c.model}: window {c.window} ({c.window_source}), threshold {c.threshold}, target {c.target}; "
            f"final {c.final_tokens}" + _unproductive(c.runs)
        )
        rows.append(f"    {_rates(c.per_100_turns)}")
        rows.extend(_cache_rows(c.cache))
    if len(result.conversations) > 1:
        rows.append(_row("total", result.total))
        rows.append(f"  {_rates(result.total.per_100_turns)}")
    rows.append(f"peak prompt: {cli_output.PEAK_PROMPT}")
    if result.plot:
        rows.append(f"plot: {result.plot}")
    if result.output:
        rows.append(f"final histories: {result.output}")
    return rows


def _cache_rows(cache: Sequence[cli_output.ReplayCache]) -> list[str]:
    """The calls a runtime would make with this history and with the peers': prompt tokens, the
    share a prompt cache served, cache breaks per 100 turns, and dollars at the model's prices."""
    rows = [
        f"    {'calls with':<22} {'prompt':>10} {'cached':>7} {'breaks/100':>10} {'peak prompt':>11} {'dollars':>9}"
    ]
    for f in cache:
        dollars = f"{f.dollars.total:.4f}" if f.dollars is not None else "unpriced"
        rows.append(
            f"    {f.strategy:<22} {f.prompt_tokens:>10} {f.cached_share:>7.0%} {f.breaks_per_100_turns:>10.1f} "
            f"{f.peak_tokens:>11} {dollars:>9}"
        )
    return rows


def _rates(rates: cli_output.ReplayRates) -> str:
    """What compactions cost per 100 turns, in one line."""
    dollars = f"${rates.dollars:.4f}" if rates.dollars is not None else "unpriced"
    return (
        f"per 100 turns: {rates.compactions:.1f} compactions ({rates.small_compactions:.1f} saving under 10% "
        f"of a history within its window), {rates.multi_run_turns:.1f} turns with several runs, "
        f"{rates.summary_calls:.1f} summary calls, {rates.cache_breaks:.1f} cache breaks, {dollars}"
    )


def _unproductive(runs: Sequence[cli_output.ReplayRun]) -> str:
    """Runs that committed nothing, counted, with the first one's reason."""
    idle = [r for r in runs if r.outcome is not Outcome.COMPACTED]
    if not idle:
        return ""
    return f"; {len(idle)} run(s) committed nothing (first, turn {idle[0].turn}: {idle[0].error})"


def _row(name: str, figures: cli_output.ReplayFigures) -> str:
    count = sum(figures.compactions.values())
    detail = ", ".join(f"{k} {v}" for k, v in sorted(figures.compactions.items()))
    compactions = f"{count} ({detail})" if count else "0"
    llm = f"{figures.llm_input_tokens}/{figures.llm_output_tokens}"
    return (
        f"{name:<28} {figures.turns:>6} {compactions:<24} {figures.tokens_saved:>9} {llm:>15} "
        f"{figures.peak_tokens:>11}"
    )
