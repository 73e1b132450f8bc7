"""The ``compaction-worker`` command group: run the worker and the demo; the other commands join it."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

import click

from compaction_worker.cli import conversation, tools
from compaction_worker.cli.common import embedded_infra, run_async, settings_of
from compaction_worker.observability.logs import configure_logging

if TYPE_CHECKING:
    from compaction_worker.settings import Settings


@click.group()
@click.option(
    "--config",
    type=click.Path(path_type=Path, dir_okay=False),
    envvar="COMPACTION_CONFIG_FILE",
    help="YAML settings file (environment variables take precedence).",
)
@click.version_option(package_name="compaction-worker")
@click.pass_context
def main(ctx: click.Context, config: Path | None) -> None:
    """Keeps LLM conversations inside their models' context windows."""
    ctx.obj = config


@main.command()
@click.pass_context
def run(ctx: click.Context) -> None:
    """Run the worker (with no Kafka/Redis configured, starts embedded ones and says where)."""
    settings = settings_of(ctx)
    configure_logging(settings.log_level, settings.log_json)
    with embedded_infra(settings) as settings:
        asyncio.run(_run(settings))


async def _run(settings: Settings) -> None:
    from compaction_worker.observability.setup import configure
    from compaction_worker.runtime.topics import ensure_topics
    from compaction_worker.runtime.worker import build_worker

    if settings.topics.create:
        created = await ensure_topics(settings)
        if created:
            click.echo(f"created topics: {', '.join(created)} ({settings.topics.partitions} partitions)")
    worker = build_worker(settings)

    def consuming() -> None:
        click.echo(
            f"worker consuming {settings.topics.turns} as group {settings.kafka.group_id}; summarizer: "
            f"{settings.summarizer.model or 'extractive (no LLM configured)'}"
        )

    if settings.health.enabled:
        health = settings.health
        click.echo(f"health endpoints on http://{health.host}:{health.port} (/livez /readyz /metrics)")
    telemetry = configure(settings)  # from the OTEL_* variables; nothing when none is set
    try:
        await worker.serve(consuming)
    finally:
        telemetry.shutdown()


@main.command()
@click.option("--turns", default=60, show_default=True, help="Turns per conversation.")
@click.option("--conversations", default=2, show_default=True)
@click.option(
    "--window", "context_window", default=6000, show_default=True, help="Context window set on the events."
)
@click.option("--json", "as_json", is_flag=True, help="Print the compaction events as JSON lines.")
@click.option(
    "--inspect",
    "inspect_after",
    is_flag=True,
    help="Then serve the read-only inspector over the demo's Redis until Ctrl-C.",
)
@click.pass_context
def demo(
    ctx: click.Context,
    *,
    turns: int,
    conversations: int,
    context_window: int,
    as_json: bool,
    inspect_after: bool,
) -> None:
    """Run the whole loop locally: broker, Redis, worker and a synthetic agent; show compactions."""
    from compaction_worker.local.demo import run_demo

    settings = settings_of(ctx)
    configure_logging("WARNING", settings.log_json)
    say = (lambda _line: None) if as_json else click.echo
    with embedded_infra(settings, say) as settings:
        from compaction_worker.runtime.topics import ensure_topics

        async def go() -> None:
            if settings.topics.create:
                await ensure_topics(settings)
            report = await run_demo(settings, turns, conversations, context_window, say=say)
            if as_json:
                for event in report.compactions:
                    click.echo(event.model_dump_json())

        asyncio.run(go())
        if inspect_after:
            serve_inspector(settings)


@main.command()
@click.option("--host", default=None, help="Address to listen on (default: inspector.host, 127.0.0.1).")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="Port (default: inspector.port).")
@click.pass_context
def inspect(ctx: click.Context, host: str | None, port: int | None) -> None:
    """Serve a read-only web view of the conversations in Redis (budget, sawtooth, history, chunks)."""
    settings = settings_of(ctx)
    update = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    serve_inspector(settings.model_copy(update={"inspector": settings.inspector.model_copy(update=update)}))


def serve_inspector(settings: Settings) -> None:
    """Serve until Ctrl-C (the settings already name a Redis)."""
    from compaction_worker.inspector.app import serve

    with contextlib.suppress(KeyboardInterrupt):
        run_async(serve(settings, click.echo))


for command in (
    conversation.conversation,
    *conversation.aliases(),
    tools.schemas,
    tools.docs,
    tools.bench,
    tools.quality,
    tools.replay,
):
    main.add_command(command)
