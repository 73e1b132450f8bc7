"""The ``bench`` command's options, kept apart so that the CLI declares them without loading the bench."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

SCENARIO_NAMES = (
    "startup",
    "cold_backlog",
    "throughput",
    "head_of_line",
    "per_turn",
    "compaction",
    "long_conversation",
    "telemetry",
    "recall",
    "cache",
    "replays",
)
"""For ``--help`` only; the runner's SCENARIOS is the list (a test keeps the two equal)."""


def bench_options(command: F) -> F:
    """Add the bench's options to a click command."""
    options = [
        click.option(
            "--only",
            multiple=True,
            help=f"Run only these scenarios (repeatable; a part of a name will do): {', '.join(SCENARIO_NAMES)}.",
        ),
        click.option(
            "--repeat",
            type=click.IntRange(1),
            default=3,
            show_default=True,
            help="Runs per figure (the median is shown).",
        ),
        click.option(
            "--quick", is_flag=True, help="Small inputs and one run: a first look (and what the tests run)."
        ),
        click.option(
            "--bootstrap", help="Kafka bootstrap servers to use (default: settings, else an embedded broker)."
        ),
        click.option("--redis-url", help="Redis URL to use (default: settings, else an embedded Redis)."),
        click.option(
            "--baseline-source",
            type=click.Path(exists=True, file_okay=False, path_type=Path),
            help="Another checkout (e.g. a git worktree of an older commit) whose worker runs the throughput "
            "and Redis rows too, and whose replay the replay rows, beside this one's, with this environment's packages.",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON instead of the table."),
        click.option("--markdown", is_flag=True, help="Print the table as Markdown (docs/performance.md)."),
        click.option("--no-progress", is_flag=True, help="No progress line on stderr."),
    ]
    for option in reversed(options):
        command = option(command)
    return command
