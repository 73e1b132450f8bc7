"""Tool commands: the schemas, the operations page, the benchmarks, and replaying recorded conversations offline."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import click

from compaction_worker.bench.options import bench_options
from compaction_worker.cli.common import FILE, SCHEMAS_DIR, settings_of


@click.command()
@click.option("--check", is_flag=True, help="Fail if the committed files differ from the models.")
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path, file_okay=False),
    default=SCHEMAS_DIR,
    show_default=True,
)
def schemas(check: bool, directory: Path) -> None:
    """Write the JSON Schemas of the event and CLI output models, and the AsyncAPI document FastStream generates."""
    from compaction_worker.contracts import specification
    from compaction_worker.runtime.channels import committed_document

    expected = specification.render_all(committed_document())
    if check:
        drift = specification.check(directory, expected)
        for line in drift:
            click.echo(line, err=True)
        if drift:
            raise click.ClickException("schemas are out of date: run `compaction-worker schemas`")
        click.echo("schemas are up to date")
        return
    for path in specification.write(directory, expected):
        click.echo(f"wrote {path}")


@click.command()
@click.option(
    "--check",
    is_flag=True,
    help="Fail if a page differs from the code, or a command the docs quote does not exist.",
)
@click.option(
    "--path",
    type=FILE,
    default=None,
    help="Only this page's settings, metrics and spans (default: docs/operations.md and docs/reference.md, "
    "and every command quoted in README.md and docs/).",
)
@click.pass_context
def docs(ctx: click.Context, check: bool, path: Path | None) -> None:
    """Write the docs' generated tables (every setting, metric, span and command) and check every
    `compaction-worker ...` line quoted in README.md and docs/*.md against the commands and options."""
    from compaction_worker.cli import reference
    from compaction_worker.observability import operations

    pages = {path or operations.OPERATIONS_PAGE: operations.default_regions()}
    quoted: list[str] = []
    root = ctx.find_root().command
    if path is None and isinstance(root, click.Group):
        cli = reference.commands(root)
        pages[operations.REFERENCE_PAGE] = {"cli": reference.markdown(cli)}
        quoted = reference.check(cli, reference.documents(operations.REPOSITORY))
    if check:
        drift = [line for page, regions in pages.items() for line in operations.check(page, regions)]
        for line in drift + quoted:
            click.echo(line, err=True)
        if drift:
            raise click.ClickException("the docs are out of date: run `compaction-worker docs`")
        if quoted:
            raise click.ClickException("the docs quote commands the CLI does not have")
        click.echo(f"{', '.join(map(str, pages))} up to date; every quoted command exists")
        return
    for page, regions in pages.items():
        operations.write(page, regions)
        click.echo(f"wrote {page}")
    for line in quoted:
        click.echo(line, err=True)
    if quoted:
        raise click.ClickException("the docs quote commands the CLI does not have")


@click.command()
@bench_options
@click.pass_context
def bench(ctx: click.Context, /, **options: Any) -> None:
    """Measure the worker beside the broker's and Redis's bare speed, and its costs; print one table."""
    from compaction_worker.bench.command import bench_command

    ctx.exit(bench_command(settings_of(ctx), ctx.obj, **options))


QUALITY_SUITES = ("fidelity", "standing", "small-windows", "unlisted")
"""``compaction-worker quality``'s suites: the modules of bench/ that measure what compactions keep."""


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("suite", type=click.Choice(QUALITY_SUITES))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def quality(suite: str, args: tuple[str, ...]) -> None:
    """Measure what compactions keep: SUITE is fidelity (artifacts across cycles), standing (what the
    user set, by kind, at tight budgets), small-windows (published agent runs on 4K-8K windows), all
    offline (no broker, no Redis; no LLM unless --model), or unlisted (kinds no list names, sent a turn
    at a time through an embedded broker and Redis to a worker whose fake LLM keeps nothing; --source
    runs another checkout's worker). Each runs on the default settings (not --config's), varied as it
    says (standing --short: short sessions at absolute budgets, beside the simple methods a user could
    pick). `compaction-worker quality SUITE --help` lists a suite's options."""
    name, rest = suite.replace("-", "_"), list(args)
    if name == "standing" and "--short" in rest:
        name = "short_standing"
        rest.remove("--short")
    importlib.import_module(f"compaction_worker.bench.{name}").main(rest)


@click.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--format", "fmt", type=click.Choice(["auto", "openai", "responses", "anthropic", "gemini", "langchain"])
)
@click.option("--model", help="The conversations' model (default: each record's 'model', else gpt-4o-mini).")
@click.option("--context-window", type=int, help="Window in tokens, instead of the model's.")
@click.option("--trigger", type=float, help="Compact at this fraction of the available window.")
@click.option("--target", type=float, help="Compact down to this fraction of the available window.")
@click.option("--plot", type=FILE, help="Write the PNG of context tokens per turn here.")
@click.option("--output", type=FILE, help="Write the final histories here (`history --json`, one per line).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def replay(ctx: click.Context, /, paths: tuple[Path, ...], **options: Any) -> None:
    """Replay recorded conversations offline through the budget and the pipeline, to tune thresholds.

    PATH: a JSONL file (a directory: every file under it, subfolders too) with one message per line,
    the file being one conversation (OpenAI chat; or Responses items, Anthropic or LangChain messages),
    or one conversation per line: {"messages": [...], "model": ..., "tools": [...]} ({"input": [...]}
    for Responses); or an agent's trajectory (SWE-agent's .traj, mini-swe-agent's .traj.json). A user
    message starts a turn. Settings (thresholds, pipeline, summarizer): `compaction-worker --config
    FILE replay ...`. Files that are no conversation (a README, a LICENSE) are named on one line, bad
    lines with file and line; the rest run. The exit status is 1 only when nothing could be replayed.
    """
    from compaction_worker.replay.command import replay_command

    ctx.exit(replay_command(settings_of(ctx), paths, **options))
