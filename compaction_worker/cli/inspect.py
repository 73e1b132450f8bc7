"""``compaction-worker inspect``: serve the read-only inspector over the configured Redis."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import click

from compaction_worker.cli.common import run_async, settings_of

if TYPE_CHECKING:
    from compaction_worker.settings import Settings


@click.command()
@click.option("--host", default=None, help="Address to listen on (default: inspector.host, 127.0.0.1).")
@click.option("--port", type=click.IntRange(0, 65535), default=None, help="Port (default: inspector.port).")
@click.pass_context
def inspect(ctx: click.Context, host: str | None, port: int | None) -> None:
    """Serve a read-only web view of the conversations in Redis (budget, sawtooth, history, chunks)."""
    serve_inspector(with_address(settings_of(ctx), host, port))


def with_address(settings: Settings, host: str | None, port: int | None) -> Settings:
    """The settings with the inspector's address overridden by the command line."""
    update = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    return settings.model_copy(update={"inspector": settings.inspector.model_copy(update=update)})


def serve_inspector(settings: Settings) -> None:
    """Serve until Ctrl-C (the settings already name a Redis)."""
    from compaction_worker.inspector.app import serve

    with contextlib.suppress(KeyboardInterrupt):
        run_async(serve(settings, click.echo))
