"""Operator commands over Redis: a conversation's history, status and artifacts; compact; rewind."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import click

from compaction_worker.cli.common import json_output, run_async, settings_of

if TYPE_CHECKING:
    from compaction_worker.client.client import Client
    from compaction_worker.conversation.meta import Meta
    from compaction_worker.runtime.preview import Preview
    from compaction_worker.settings import SummarizerSettings
    from compaction_worker.state.breaker import BreakerState

# Each command imports the client, Redis and the models it needs when it runs: `--help` and the
# other commands start without them (docs/performance.md: start-up).


@click.command()
@click.argument("conversation_id")
@click.option("--full", is_flag=True, help="The whole transcript instead of the effective history.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--width", default=160, show_default=True, help="Characters of each message to show.")
@click.pass_context
def history(ctx: click.Context, conversation_id: str, full: bool, as_json: bool, width: int) -> None:
    """Print a conversation's effective history (or with --full, its transcript) from Redis."""
    settings = settings_of(ctx)

    async def go() -> None:
        from compaction_worker.client.client import Client
        from compaction_worker.contracts import cli_output
        from compaction_worker.contracts.history import render

        async with Client.connect(settings, kafka=False) as client:
            meta = await _stored_meta(client, conversation_id)
            if full:
                stored = await client.transcript(conversation_id)
                records = [cli_output.TranscriptRecord.from_stored(r) for r in stored]
                if as_json:
                    click.echo(json_output(cli_output.Transcript(records)))
                    return
                click.echo(
                    f"{conversation_id}: transcript, {len(records)} messages over {meta.last_seq} turns"
                )
                for r in records:
                    click.echo(f"  #{r.ordinal:<4} turn {r.turn_seq:<4} {_line(r.message, width)}")
                return
            snapshot = await client.snapshot(conversation_id)
            # Rendered from the same snapshot as the chunks, the way Client.messages renders.
            placement = settings.for_profile(snapshot.meta.profile).pipeline.summary_placement
            messages = render(snapshot.history, placement)
            if as_json:
                output = cli_output.History(
                    conversation_id=conversation_id,
                    version=meta.version,
                    context_status=meta.context_status,
                    tokens=meta.total_tokens,
                    chunks=[cli_output.Chunk.of(c) for c in snapshot.history.chunks],
                    messages=messages,
                )
                click.echo(json_output(output))
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

    run_async(go())


@click.command()
@click.argument("conversation_id")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def status(ctx: click.Context, conversation_id: str, as_json: bool) -> None:
    """Show a conversation's budget, token totals, version, profile, pending compaction and waiting proposal."""
    settings = settings_of(ctx)

    async def go() -> None:
        from compaction_worker.client.client import Client, context_stats
        from compaction_worker.contracts import cli_output

        async with Client.connect(settings, kafka=False) as client:
            found = await client.status(conversation_id, proposal=True)
            if not found.stored:
                _missing(client, conversation_id)
            meta, job, waiting = found.meta, found.job, found.proposal
            stats = context_stats(conversation_id, meta, settings)
            health = await _breaker(client, settings.for_profile(meta.profile).summarizer, meta.model)
            now = time.time()
            output = cli_output.Status.of(
                stats,
                last_seq=meta.last_seq,
                messages=meta.msg_count,
                tokens_by_part=stats.breakdown,
                calibration=meta.calibration,
                failures=meta.failures,
                llm_failures=health.failures,
                circuit_open=health.open,
                pending_compaction=job.trigger if job else None,
                profile=meta.profile or None,
                pending_job=(
                    cli_output.JobStatus.of(job, backing_off_until=job.backing_off_until(now))
                    if job
                    else None
                ),
                proposal=cli_output.ProposalStatus.of(waiting) if waiting else None,
            )
            if as_json:
                click.echo(json_output(output))
            else:
                for k, v in output.model_dump(mode="json").items():
                    click.echo(f"{k:>20}: {_flat(v) if k in ('pending_job', 'proposal') else v}")

    run_async(go())


@click.command()
@click.argument("conversation_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def artifacts(ctx: click.Context, conversation_id: str, as_json: bool) -> None:
    """List every artifact extracted from a conversation's compacted turns, and which the history lost."""
    settings = settings_of(ctx)

    async def go() -> None:
        from compaction_worker.client.client import Client
        from compaction_worker.contracts import cli_output

        async with Client.connect(settings, kafka=False) as client:
            await _stored_meta(client, conversation_id)
            found = await client.artifacts(conversation_id)
        if as_json:
            output = cli_output.Artifacts(
                [cli_output.ArchivedArtifact.of(a, turn_seq=a.seq, ordinal=a.n) for a in found]
            )
            click.echo(json_output(output))
            return
        missing = sum(not a.in_history for a in found)
        click.echo(
            f"{conversation_id}: {len(found)} artifacts archived, "
            f"{missing} no longer in the effective history (marked *)"
        )
        for a in found:
            click.echo(f"{'*' if not a.in_history else ' '} turn {a.seq:<5} {a.kind:<5} {a.text}")

    run_async(go())


@click.command()
@click.argument("conversation_id")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Compute the compaction here and print what it would change; write nothing.",
)
@click.option("--instructions", default=None, help="With --dry-run: what the summary should keep first.")
@click.option("--json", "as_json", is_flag=True, help="With --dry-run: machine-readable output.")
@click.pass_context
def compact(
    ctx: click.Context, conversation_id: str, dry_run: bool, instructions: str | None, as_json: bool
) -> None:
    """Ask the workers to compact a conversation now (a manual compaction), or preview it."""
    settings = settings_of(ctx)

    async def go() -> None:
        from compaction_worker.client.client import Client
        from compaction_worker.contracts.events import Trigger

        async with Client.connect(settings, kafka=False) as client:
            await _stored_meta(client, conversation_id)
            if dry_run:
                _print_preview(await client.preview_compaction(conversation_id, instructions), as_json)
                return
            await client.parts.jobs.schedule(conversation_id, Trigger.MANUAL)
            click.echo(f"manual compaction of {conversation_id} scheduled")

    run_async(go())


def _print_preview(found: Preview, as_json: bool) -> None:
    from compaction_worker.contracts import cli_output

    if as_json:
        click.echo(json_output(cli_output.CompactionPreview.of(found, standing_state=found.standing)))
        return
    click.echo(
        f"{found.conversation_id} (version {found.version}): a manual compaction would be "
        f"{found.outcome.value}, ~{found.tokens_before} -> ~{found.tokens_after} tokens, "
        f"{found.replaced} messages replaced, stages: {', '.join(found.stages) or '-'} (nothing written)"
    )
    if found.error:
        click.echo(f"note: {found.error}")
    if found.summary:
        click.echo("summary it would write:")
        click.echo(found.summary)


@click.command()
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
    settings = settings_of(ctx)

    async def go() -> None:
        from compaction_worker.client.client import Client
        from compaction_worker.contracts import cli_output

        # Kafka too: consumers learn of the new version from compaction.completed.
        async with Client.connect(settings) as client:
            await _stored_meta(client, conversation_id)
            rewound = await client.rewind(conversation_id, version)
        done = rewound.completed
        if as_json:
            output = cli_output.Rewind.of(
                done,
                rewound_version=rewound.rewound_version,
                chunks=rewound.chunks,
                restored_messages=rewound.restored_messages,
                over_threshold=rewound.over_threshold,
                compaction_id=str(done.compaction_id),
            )
            click.echo(json_output(output))
            return
        click.echo(
            f"rewound compaction {rewound.rewound_version} of {conversation_id}: now version {done.version}, "
            f"{done.context_status.value}, {rewound.chunks} summary chunks, "
            f"{rewound.restored_messages} messages verbatim, ~{done.tokens_before} -> ~{done.tokens_after} tokens"
        )
        if rewound.over_threshold:
            click.echo("the restored history is over the threshold: the next turn schedules a compaction")

    run_async(go())


async def _stored_meta(client: Client, conversation_id: str) -> Meta:
    """The conversation's metadata; a clear error when Redis holds no such conversation."""
    meta = await client.meta(conversation_id)
    if meta.last_seq == 0:
        _missing(client, conversation_id)
    return meta


def _flat(value: Mapping[str, Any] | None) -> str | None:
    """A nested part of the output on one line: ``name value, ...`` (nulls left out)."""
    if value is None:
        return None
    return ", ".join(f"{name} {v}" for name, v in value.items() if v is not None)


def _missing(client: Client, conversation_id: str) -> NoReturn:
    raise click.ClickException(f"no conversation {conversation_id!r} in {client.settings.redis.url}")


async def _breaker(client: Client, settings: SummarizerSettings, conversation_model: str) -> BreakerState:
    """The breaker of the model that summarizes this conversation (shared with every conversation on it)."""
    from compaction_worker.state.breaker import BreakerState, breaker_model

    if not settings.model:
        return BreakerState()  # the extractive summary only: nothing to break
    return await client.parts.breaker.peek(breaker_model(settings.model, conversation_model))


def _line(message: Mapping[str, Any], width: int) -> str:
    from compaction_worker.contracts.history import text_of

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
