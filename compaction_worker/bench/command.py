"""``compaction-worker bench``: start (or connect to) the broker and Redis, run the scenarios, print one table."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import click

from compaction_worker.bench.environment import BenchEnv, BenchError, WorkerSource, bench_env
from compaction_worker.bench.report import ProgressLine, Row, format_table, markdown_table, rows_json
from compaction_worker.bench.runner import run_scenarios, select
from compaction_worker.contracts import cli_output
from compaction_worker.settings import Settings

QUICK_SCALE = 0.05


def bench_command(
    settings: Settings,
    config_file: Path | None = None,
    *,
    only: Sequence[str] = (),
    repeat: int = 3,
    quick: bool = False,
    bootstrap: str | None = None,
    redis_url: str | None = None,
    baseline_source: Path | None = None,
    as_json: bool = False,
    markdown: bool = False,
    no_progress: bool = False,
) -> int:
    """Run the bench and print its table (or JSON); the exit status: 0, or 1 if a scenario failed."""
    try:
        names = select(only)
        baseline = WorkerSource.of(baseline_source) if baseline_source else None
    except (ValueError, BenchError) as e:
        raise click.UsageError(str(e)) from e
    if bootstrap:
        kafka = settings.kafka.model_copy(update={"bootstrap_servers": bootstrap})
        settings = settings.model_copy(update={"kafka": kafka})
    if redis_url:
        settings = settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": redis_url})})
    progress = ProgressLine(enabled=not no_progress)
    scale, repeat = (QUICK_SCALE, 1) if quick else (1.0, repeat)

    async def go() -> list[Row]:
        async with bench_env(
            settings, repeat=repeat, scale=scale, config_file=config_file, baseline=baseline
        ) as env:
            progress(_where(env))
            return await run_scenarios(env, names, progress)

    try:
        rows = asyncio.run(go())
    finally:
        progress.done()
    if as_json:
        rows_out = [cli_output.BenchRow.model_validate(row) for row in rows_json(rows)]
        click.echo(cli_output.Bench(repeat=repeat, quick=quick, rows=rows_out).model_dump_json(indent=2))
    elif markdown:
        click.echo(markdown_table(rows))
    else:
        click.echo(format_table(rows))
    return 0


def _where(env: BenchEnv) -> str:
    where = f"broker {env.settings.kafka.bootstrap_servers}, Redis {env.settings.redis.url}, workdir {env.workdir}"
    return where + (f", beside the {env.baseline.label} ({env.baseline.path})" if env.baseline else "")
