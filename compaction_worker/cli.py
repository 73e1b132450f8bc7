"""The ``compaction-worker`` command: run the worker, the demo, and operator commands."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import click
from pydantic import BaseModel

from compaction_worker.client.client import Client, context_stats
from compaction_worker.contracts import cli_output, specification
from compaction_worker.contracts.events import Trigger
from compaction_worker.contracts.history import render, text_of
from compaction_worker.errors import CompactionWorkerError
from compaction_worker.local.embedded import EmbeddedKafka, EmbeddedRedis
from compaction_worker.runtime.telemetry import configure_logging
from compaction_worker.settings import Settings, load_settings
from compaction_worker.state.meta import Meta

SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "schemas"

LIBRDKAFKA_NOTE = (
    "aiokafka and kafka-python clients work with it; librdkafka ones (kcat, confluent-kafka) do not "
    "(malformed ApiVersions reply): use the docker-compose Kafka for those"
)
"""Said where ``run`` and ``demo`` say where the embedded broker listens."""


def _settings(ctx: click.Context) -> Settings:
    try:
        return load_settings(ctx.obj)
    except (CompactionWorkerError, ValueError) as e:
        raise click.ClickException(f"invalid settings: {e}") from e


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


@contextlib.contextmanager
def embedded_infra(settings: Settings, say: Any = click.echo) -> Iterator[Settings]:
    """Start an embedded broker and Redis for whatever the settings leave unconfigured."""
    with contextlib.ExitStack() as stack:
        kafka = settings.kafka
        redis = settings.redis
        if not kafka.bootstrap_servers:
            broker = stack.enter_context(EmbeddedKafka())
            # The embedded broker has no idempotent producer (no InitProducerId).
            kafka = kafka.model_copy(
                update={"bootstrap_servers": broker.bootstrap_servers, "enable_idempotence": False}
            )
            say(f"embedded Kafka-protocol broker listening on {broker.bootstrap_servers}")
            say(f"  {LIBRDKAFKA_NOTE}")
            say(f"  export COMPACTION_KAFKA__BOOTSTRAP_SERVERS={broker.bootstrap_servers}")
            say("  export COMPACTION_KAFKA__ENABLE_IDEMPOTENCE=false")
        if not redis.url:
            server = stack.enter_context(EmbeddedRedis())
            redis = redis.model_copy(update={"url": server.url})
            say(f"embedded Redis-protocol server listening on {server.url}")
            say(f"  export COMPACTION_REDIS__URL={server.url}")
        embedded = kafka is not settings.kafka
        topics = settings.topics.model_copy(update={"create": settings.topics.create or embedded})
        yield settings.model_copy(update={"kafka": kafka, "redis": redis, "topics": topics})


@main.command()
@click.pass_context
def run(ctx: click.Context) -> None:
    """Run the worker (with no Kafka/Redis configured, starts embedded ones and says where)."""
    settings = _settings(ctx)
    configure_logging(settings.log_level, settings.log_json)
    with embedded_infra(settings) as settings:
        asyncio.run(_run(settings))


async def _run(settings: Settings) -> None:
    from compaction_worker.runtime.topics import ensure_topics
    from compaction_worker.runtime.worker import build_worker

    if settings.topics.create:
        created = await ensure_topics(settings)
        if created:
            click.echo(f"created topics: {', '.join(created)} ({settings.topics.partitions} partitions)")
    worker = build_worker(settings)
    click.echo(
        f"worker consuming {settings.topics.turns} as group {settings.kafka.group_id}; summarizer: "
        f"{settings.summarizer.model or 'extractive (no LLM configured)'}"
    )
    await worker.serve()


@main.command()
@click.option("--turns", default=60, show_default=True, help="Turns per conversation.")
@click.option("--conversations", default=2, show_default=True)
@click.option(
    "--window", "context_window", default=6000, show_default=True, help="Context window set on the events."
)
@click.option("--json", "as_json", is_flag=True, help="Print the compaction events as JSON lines.")
@click.pass_context
def demo(ctx: click.Context, turns: int, conversations: int, context_window: int, as_json: bool) -> None:
    """Run the whole loop locally: broker, Redis, worker and a synthetic agent; show compactions."""
    from compaction_worker.local.demo import run_demo

    settings = _settings(ctx)
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


@main.command()
@click.argument("conversation_id")
@click.option("--full", is_flag=True, help="The whole transcript instead of the effective history.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--width", default=160, show_default=True, help="Characters of each message to show.")
@click.pass_context
def history(ctx: click.Context, conversation_id: str, full: bool, as_json: bool, width: int) -> None:
    """Print a conversation's effective history (or with --full, its transcript) from Redis."""
    settings = _settings(ctx)

    async def go() -> None:
        async with Client.connect(settings, kafka=False) as client:
            meta = await _stored_meta(client, conversation_id)
            if full:
                stored = await client.transcript(conversation_id)
                records = [cli_output.TranscriptRecord.from_stored(r) for r in stored]
                if as_json:
                    click.echo(_json(cli_output.Transcript(records)))
                    return
                click.echo(
                    f"{conversation_id}: transcript, {len(records)} messages over {meta.last_seq} turns"
                )
                for r in records:
                    click.echo(f"  #{r.ordinal:<4} turn {r.turn_seq:<4} {_line(r.message, width)}")
                return
            snapshot = await client.snapshot(conversation_id)
            # Rendered from the same snapshot as the chunks, the way Client.messages renders.
            messages = render(snapshot.history, settings.pipeline.summary_placement)
            if as_json:
                output = cli_output.History(
                    conversation_id=conversation_id,
                    version=meta.version,
                    context_status=meta.context_status,
                    tokens=meta.total_tokens,
                    chunks=[cli_output.Chunk.from_chunk(c) for c in snapshot.history.chunks],
                    messages=messages,
                )
                click.echo(_json(output))
                return
            click.echo(
                f"{conversation_id}: version {meta.version}, {meta.context_status.value}, {len(messages)} messages, "
                f"~{meta.total_tokens} tokens (window {meta.window}, threshold {meta.threshold})"
            )
            for chunk in snapshot.history.chunks:
                click.echo(
                    f"  summary of turns {chunk.first_seq}-{chunk.last_seq} ({chunk.tokens} tokens, {chunk.model})"
                )
            for m in messages:
                click.echo(f"  {_line(m, width)}")

    _run_async(go())


@main.command()
@click.argument("conversation_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status(ctx: click.Context, conversation_id: str, as_json: bool) -> None:
    """Show a conversation's budget, token totals, version and pending compaction."""
    settings = _settings(ctx)

    async def go() -> None:
        async with Client.connect(settings, kafka=False) as client:
            meta = await _stored_meta(client, conversation_id)
            job = await client.job(conversation_id)
            stats = context_stats(conversation_id, meta, settings)
            output = cli_output.Status(
                conversation_id=conversation_id,
                model=meta.model,
                last_seq=meta.last_seq,
                messages=meta.msg_count,
                tokens=stats.tokens,
                usage_ratio=stats.usage_ratio,
                tokens_by_part=stats.breakdown,
                calibration=meta.calibration,
                window=stats.window,
                available=stats.available,
                threshold=stats.threshold,
                soft_threshold=stats.soft_threshold,
                target=stats.target,
                should_compact=stats.should_compact,
                version=meta.version,
                context_status=meta.context_status,
                failures=meta.failures,
                llm_failures=meta.llm_failures,
                circuit_open=meta.breaker_until > time.time(),
                pending_compaction=job.trigger if job else None,
            )
            if as_json:
                click.echo(_json(output))
            else:
                for k, v in output.model_dump(mode="json").items():
                    click.echo(f"{k:>20}: {v}")

    _run_async(go())


@main.command()
@click.argument("conversation_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def artifacts(ctx: click.Context, conversation_id: str, as_json: bool) -> None:
    """List every artifact extracted from a conversation's compacted turns, and which the history lost."""
    settings = _settings(ctx)

    async def go() -> None:
        async with Client.connect(settings, kafka=False) as client:
            await _stored_meta(client, conversation_id)
            found = await client.artifacts(conversation_id)
        if as_json:
            output = cli_output.Artifacts(
                [
                    cli_output.ArchivedArtifact(
                        kind=a.kind, text=a.text, turn_seq=a.seq, ordinal=a.n, in_history=a.in_history
                    )
                    for a in found
                ]
            )
            click.echo(_json(output))
            return
        missing = sum(not a.in_history for a in found)
        click.echo(
            f"{conversation_id}: {len(found)} artifacts archived, "
            f"{missing} no longer in the effective history (marked *)"
        )
        for a in found:
            click.echo(f"{'*' if not a.in_history else ' '} turn {a.seq:<5} {a.kind:<5} {a.text}")

    _run_async(go())


@main.command()
@click.argument("conversation_id")
@click.pass_context
def compact(ctx: click.Context, conversation_id: str) -> None:
    """Ask the workers to compact a conversation now (a manual compaction)."""
    settings = _settings(ctx)

    async def go() -> None:
        from compaction_worker.runtime.components import build_components

        async with Client.connect(settings, kafka=False) as client:
            await _stored_meta(client, conversation_id)
            parts = build_components(settings, client.store.redis, _no_publisher)
            await parts.jobs.schedule(conversation_id, Trigger.MANUAL)
            click.echo(f"manual compaction of {conversation_id} scheduled")

    _run_async(go())


@main.command()
@click.argument("conversation_id")
@click.option(
    "--version",
    "version",
    type=click.IntRange(min=1),
    default=None,
    help="The compaction to undo (a version from the compaction log); default: the latest in effect.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def rewind(ctx: click.Context, conversation_id: str, version: int | None, as_json: bool) -> None:
    """Undo a compaction: restore the history from before it, from the preserved transcript."""
    settings = _settings(ctx)

    async def go() -> None:
        from compaction_worker.runtime.components import build_components

        # Kafka too: consumers learn of the new version from compaction.completed.
        async with Client.connect(settings) as client:
            await _stored_meta(client, conversation_id)
            producer = client.producer
            assert producer is not None  # connect() opened one

            async def publish(topic: str, payload: bytes, key: bytes | None) -> None:
                await producer.send_and_wait(topic, payload, key=key)

            parts = build_components(settings, client.store.redis, publish)
            rewound = await parts.rewinder.rewind(conversation_id, version)
        done = rewound.completed
        if as_json:
            output = cli_output.Rewind(
                conversation_id=conversation_id,
                rewound_version=rewound.rewound_version,
                version=done.version,
                context_status=done.context_status,
                chunks=rewound.chunks,
                restored_messages=rewound.restored_messages,
                messages_before=done.messages_before,
                messages_after=done.messages_after,
                tokens_before=done.tokens_before,
                tokens_after=done.tokens_after,
                over_threshold=rewound.over_threshold,
                compaction_id=str(done.compaction_id),
            )
            click.echo(_json(output))
            return
        click.echo(
            f"rewound compaction {rewound.rewound_version} of {conversation_id}: now version {done.version}, "
            f"{done.context_status.value}, {rewound.chunks} summary chunks, "
            f"{rewound.restored_messages} messages verbatim, ~{done.tokens_before} -> ~{done.tokens_after} tokens"
        )
        if rewound.over_threshold:
            click.echo("the restored history is over the threshold: the next turn schedules a compaction")

    _run_async(go())


@main.command()
@click.option("--check", is_flag=True, help="Fail if the committed files differ from the models.")
@click.option(
    "--dir",
    "directory",
    type=click.Path(path_type=Path, file_okay=False),
    default=SCHEMAS_DIR,
    show_default=True,
)
def schemas(check: bool, directory: Path) -> None:
    """Write the JSON Schemas and the AsyncAPI document generated from the event and CLI output models."""
    if check:
        drift = specification.check(directory)
        for line in drift:
            click.echo(line, err=True)
        if drift:
            raise click.ClickException("schemas are out of date: run `compaction-worker schemas`")
        click.echo("schemas are up to date")
        return
    for path in specification.write(directory):
        click.echo(f"wrote {path}")


async def _stored_meta(client: Client, conversation_id: str) -> Meta:
    """The conversation's metadata; a clear error when Redis holds no such conversation."""
    meta = await client.meta(conversation_id)
    if meta.last_seq == 0:
        raise click.ClickException(f"no conversation {conversation_id!r} in {client.settings.redis.url}")
    return meta


def _json(output: BaseModel) -> str:
    """A command's ``--json`` output: its model (schema in ``schemas/cli/``), indented."""
    # ensure_ascii=False as before: messages in any language stay readable.
    return json.dumps(output.model_dump(mode="json"), indent=2, ensure_ascii=False)


def _line(message: Mapping[str, Any], width: int) -> str:
    role = message.get("role", "?")
    calls = message.get("tool_calls") or []
    if calls:
        call_text = ", ".join(f"{c['function']['name']}({c['function'].get('arguments', '')})" for c in calls)
        text = f"→ {call_text}"
    else:
        text = text_of(message)
        if isinstance(message.get("content"), list) and any(
            p.get("type") != "text" for p in message["content"]
        ):
            text += " [+non-text parts]"
    label = f"[{role}{' ' + str(message['tool_call_id']) if role == 'tool' else ''}]"
    flat = " ".join(text.split())
    return f"{label} {flat[:width]}{'…' if len(flat) > width else ''}"


async def _no_publisher(topic: str, payload: bytes, key: bytes | None) -> None:
    """The publisher of commands that connect to Redis only: they must not publish."""
    raise RuntimeError(f"this command has no Kafka connection to publish to {topic}")


def _run_async(coro: Any) -> None:
    try:
        asyncio.run(coro)
    except CompactionWorkerError as e:
        raise click.ClickException(str(e)) from e


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
