"""The conversation commands that read: history, status, artifacts, versions and the waiting proposal."""

from __future__ import annotations

import shlex
import time
from typing import TYPE_CHECKING

import click

from compaction_worker.cli.common import PROGRAM, json_output, missing, run_async, settings_of, stored_meta
from compaction_worker.cli.render import flat, message_line, preview_lines, version_line

if TYPE_CHECKING:
    from compaction_worker.client.client import Client
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
            meta = await stored_meta(client, conversation_id)
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
                    click.echo(f"  #{r.ordinal:<4} turn {r.turn_seq:<4} {message_line(r.message, width)}")
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
                click.echo(f"  {message_line(m, width)}")

    run_async(go())


@click.command()
@click.argument("conversation_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
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
                missing(client, conversation_id)
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
                    click.echo(f"{k:>20}: {flat(v) if k in ('pending_job', 'proposal') else v}")

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
            await stored_meta(client, conversation_id)
            found = await client.artifacts(conversation_id)
        if as_json:
            output = cli_output.Artifacts(
                [cli_output.ArchivedArtifact.of(a, turn_seq=a.seq, ordinal=a.n) for a in found]
            )
            click.echo(json_output(output))
            return
        lost = sum(not a.in_history for a in found)
        click.echo(
            f"{conversation_id}: {len(found)} artifacts archived, "
            f"{lost} no longer in the effective history (marked *)"
        )
        for a in found:
            click.echo(f"{'*' if not a.in_history else ' '} turn {a.seq:<5} {a.kind:<5} {a.text}")

    run_async(go())


@click.command()
@click.argument("conversation_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def versions(ctx: click.Context, conversation_id: str, as_json: bool) -> None:
    """List every committed version of a conversation's history: each compaction and rewind, and
    which compactions the history still holds (what rewind can undo)."""
    settings = settings_of(ctx)

    async def go() -> None:
        from compaction_worker.client.client import Client
        from compaction_worker.contracts import cli_output

        async with Client.connect(settings, kafka=False) as client:
            meta = await stored_meta(client, conversation_id)
            found = await client.versions(conversation_id)
        output = cli_output.Versions(
            [cli_output.Version.of(v, replaced_through=v.replaced_through_n) for v in found]
        )
        if as_json:
            click.echo(json_output(output))
            return
        in_effect = sum(v.in_effect for v in output.root)
        click.echo(
            f"{conversation_id}: version {meta.version}, {len(output.root)} committed, "
            f"{in_effect} compactions in effect (marked *)"
        )
        for version in output.root:
            click.echo(version_line(version))

    run_async(go())


@click.command()
@click.argument("conversation_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (null when none waits).")
@click.pass_context
def proposal(ctx: click.Context, conversation_id: str, as_json: bool) -> None:
    """Show the compaction waiting for approval (pipeline.approval: manual): the history applying it
    commits, its summary, the tokens before and after, and whether turns have moved past it."""
    settings = settings_of(ctx)

    async def go() -> None:
        from compaction_worker.client.client import Client
        from compaction_worker.contracts import cli_output

        async with Client.connect(settings, kafka=False) as client:
            await stored_meta(client, conversation_id)
            found = await client.proposal(conversation_id)
        if as_json:
            shown = (
                None
                if found is None
                else cli_output.CompactionPreview.of(found, standing_state=found.standing)
            )
            click.echo(json_output(cli_output.WaitingProposal(shown)))
            return
        if found is None:
            click.echo(f"{conversation_id}: no proposal waits for approval")
            return
        for line in preview_lines(found):
            click.echo(line)
        words = f"{shlex.quote(conversation_id)} {found.compaction_id}"
        click.echo(f"apply it:   {PROGRAM} conversation apply {words}")
        click.echo(f"discard it: {PROGRAM} conversation discard {words}")

    run_async(go())


async def _breaker(client: Client, settings: SummarizerSettings, conversation_model: str) -> BreakerState:
    """The breaker of the model that summarizes this conversation (shared with every conversation on it)."""
    from compaction_worker.state.breaker import BreakerState, breaker_model

    if not settings.model:
        return BreakerState()  # the extractive summary only: nothing to break
    return await client.parts.breaker.peek(breaker_model(settings.model, conversation_model))
