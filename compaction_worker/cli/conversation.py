"""``compaction-worker conversation``: every command on one conversation, in one group.

The five that came first (history, status, artifacts, compact, rewind) still answer at the top
level as well, hidden from the help, so that scripts written for them keep working.
"""

from __future__ import annotations

import copy

import click

from compaction_worker.cli import read, steer

COMMANDS = (
    read.history,
    read.status,
    read.artifacts,
    read.versions,
    read.proposal,
    steer.compact,
    steer.rewind,
    steer.pin,
    steer.unpin,
    steer.apply,
    steer.discard,
)

TOP_LEVEL_ALIASES = ("history", "status", "artifacts", "compact", "rewind")
"""The group's commands that also answer at the top level (``status CID`` as ``conversation status CID``)."""


@click.group()
def conversation() -> None:
    """Read and steer one conversation in Redis: its history, status, artifacts, versions and waiting
    proposal; compact, rewind, pin, unpin, apply or discard. Each has --json. History, status,
    artifacts, compact and rewind also answer at the top level, as before."""


for command in COMMANDS:
    conversation.add_command(command)


def aliases() -> list[click.Command]:
    """The top-level aliases: copies of the group's commands, hidden from the help and the reference."""
    hidden = []
    for name in TOP_LEVEL_ALIASES:
        alias = copy.copy(conversation.commands[name])
        alias.hidden = True
        hidden.append(alias)
    return hidden
