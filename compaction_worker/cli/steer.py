"""The conversation commands that change it: compact, rewind, pin, unpin, and apply or discard a proposal.

Those that commit a version or end a proposal (rewind, apply, discard) publish its
``compaction.completed``, so they connect to the broker too; the others need Redis only.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import click

from compaction_worker.cli.common import json_output, run_async, settings_of, stored_meta
from compaction_worker.cli.render import preview_lines

if TYPE_CHECKING:
    from compaction_worker.contracts.events import CompactionCompleted
    from compaction_worker.settings import Settings

# As in read.py: each command imports the client and the models when it runs.


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
        from compaction_worker.contracts import cli_output
        from compaction_worker.contracts.events import Trigger

        async with Client.connect(settings, kafka=False) as client:
            meta = await stored_meta(client, conversation_id)
            if dry_run:
                found = await client.preview_compaction(conversation_id, instructions)
                if as_json:
                    click.echo(
                        json_output(cli_output.CompactionPreview.of(found, standing_state=found.standing))
                    )
                    return
                for line in preview_lines(found):
                    click.echo(line)
                return
            await client.parts.jobs.schedule(conversation_id, Trigger.MANUAL)
        approval = settings.for_profile(meta.profile).pipeline.approval
        waits = "; approval is manual: it is proposed, not applied (conversation proposal)"
        click.echo(f"manual compaction of {conversation_id} scheduled{waits if approval == 'manual' else ''}")

    run_async(go())


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
            await stored_meta(client, conversation_id)
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


def _pin_arguments(command: Callable[..., None]) -> Callable[..., None]:
    """What ``pin`` and ``unpin`` take: the conversation, the turn, and optionally one of its messages."""
    for decorate in reversed(
        (
            click.argument("conversation_id"),
            click.argument("turn_seq", type=click.IntRange(min=1)),
            click.option(
                "--index",
                type=click.IntRange(min=0),
                default=None,
                help="Only the turn's message at this position (from 0); default: all of its messages.",
            ),
            click.option("--json", "as_json", is_flag=True, help="Machine-readable output."),
            click.pass_context,
        )
    ):
        command = decorate(command)
    return command


@click.command()
@_pin_arguments
def pin(ctx: click.Context, conversation_id: str, turn_seq: int, index: int | None, as_json: bool) -> None:
    """Pin a turn's messages (or one of them): every later compaction keeps them verbatim."""
    run_async(_set_pinned(settings_of(ctx), conversation_id, turn_seq, index, as_json, pinned=True))


@click.command()
@_pin_arguments
def unpin(ctx: click.Context, conversation_id: str, turn_seq: int, index: int | None, as_json: bool) -> None:
    """Unpin a turn's messages (or one of them): later compactions may summarize them again."""
    run_async(_set_pinned(settings_of(ctx), conversation_id, turn_seq, index, as_json, pinned=False))


async def _set_pinned(
    settings: Settings, conversation_id: str, turn_seq: int, index: int | None, as_json: bool, *, pinned: bool
) -> None:
    from compaction_worker.client.client import Client
    from compaction_worker.contracts import cli_output

    async with Client.connect(settings, kafka=False) as client:
        await stored_meta(client, conversation_id)
        change = client.pin if pinned else client.unpin
        ordinals = await change(conversation_id, turn_seq, index)
    if as_json:
        output = cli_output.Pin(
            conversation_id=conversation_id, turn_seq=turn_seq, index=index, pinned=pinned, ordinals=ordinals
        )
        click.echo(json_output(output))
        return
    which = "" if index is None else f" (its message {index})"
    plural = "s" if len(ordinals) > 1 else ""
    click.echo(
        f"{'pinned' if pinned else 'unpinned'} turn {turn_seq}{which} of {conversation_id}: "
        f"transcript message{plural} {', '.join(map(str, ordinals))}"
    )


@click.command()
@click.argument("conversation_id")
@click.argument("proposal_id", type=click.UUID)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def apply(ctx: click.Context, conversation_id: str, proposal_id: uuid.UUID, as_json: bool) -> None:
    """Apply a compaction waiting for approval: commit it as proposed, or, when turns have moved the
    history past it, have it computed again and proposed anew."""
    settings = settings_of(ctx)

    async def go() -> None:
        from compaction_worker.client.client import Client

        async with Client.connect(settings) as client:
            await stored_meta(client, conversation_id)
            done = await client.apply(conversation_id, proposal_id)
            version = done.version if done else (await client.meta(conversation_id)).version
        _decided(conversation_id, proposal_id, done, version, as_json)

    run_async(go())


@click.command()
@click.argument("conversation_id")
@click.argument("proposal_id", type=click.UUID)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def discard(ctx: click.Context, conversation_id: str, proposal_id: uuid.UUID, as_json: bool) -> None:
    """Discard a compaction waiting for approval; the next threshold crossing proposes again."""
    settings = settings_of(ctx)

    async def go() -> None:
        from compaction_worker.client.client import Client

        async with Client.connect(settings) as client:
            await stored_meta(client, conversation_id)
            await client.discard(conversation_id, proposal_id)
            version = (await client.meta(conversation_id)).version
        _decided(conversation_id, proposal_id, None, version, as_json, discarded=True)

    run_async(go())


def _decided(
    conversation_id: str,
    proposal_id: uuid.UUID,
    done: CompactionCompleted | None,
    version: int,
    as_json: bool,
    *,
    discarded: bool = False,
) -> None:
    """Print what became of a proposal: applied (``done``, its event), recomputed or discarded."""
    from compaction_worker.contracts import cli_output

    decision: Literal["applied", "recomputed", "discarded"] = (
        "discarded" if discarded else "recomputed" if done is None else "applied"
    )
    if as_json:
        output = cli_output.ProposalDecision(
            conversation_id=conversation_id,
            compaction_id=proposal_id,
            decision=decision,
            version=version,
            tokens_before=done.tokens_before if done else None,
            tokens_after=done.tokens_after if done else None,
        )
        click.echo(json_output(output))
        return
    head = f"proposal {proposal_id} of {conversation_id}"
    if done is not None:
        click.echo(
            f"{head} applied: now version {done.version}, {done.context_status.value}, "
            f"~{done.tokens_before} -> ~{done.tokens_after} tokens"
        )
    elif discarded:
        click.echo(f"{head} discarded: the history stays at version {version}")
    else:
        click.echo(
            f"{head} not applied: turns have moved the history past it, so it is being computed again "
            "(a new compaction.proposed replaces it; see conversation proposal)"
        )
