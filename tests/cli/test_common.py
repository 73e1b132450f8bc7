"""cli/common.py: what every command shares, here how the package's errors reach the person at the shell."""

from __future__ import annotations

import click
from aiokafka.errors import KafkaConnectionError
from click.testing import CliRunner
from redis.exceptions import ConnectionError as RedisConnectionError

from compaction_worker.cli.common import one_line, run_async
from compaction_worker.errors import CompactionWorkerError, PinError


class NewKindError(CompactionWorkerError):
    """An error type the CLI has never heard of: it is reported like every other."""


def _command(error: Exception) -> click.Command:
    @click.command()
    def fails() -> None:
        async def go() -> None:
            raise error

        run_async(go())

    return fails


def test_any_package_error_is_one_line_on_stderr_and_exit_1() -> None:
    """Issue 56: whatever its type, a CompactionWorkerError ends the command with its message on
    one line of stderr, status 1, nothing on stdout; no traceback."""
    for error in (
        PinError("c-1 has no turn 99"),
        NewKindError("c-1: the turn was rejected\n  reason: conflicting_duplicate\n  detail: seq 3"),
    ):
        result = CliRunner().invoke(_command(error), [])
        assert result.exit_code == 1
        assert result.stdout == ""
        assert result.stderr.splitlines() == [f"Error: {one_line(error)}"]
        assert "Traceback" not in result.output
    assert one_line(NewKindError("a\n  b\tc ")) == "a b c"
    assert one_line(NewKindError()) == "NewKindError"


def test_another_error_is_not_hidden() -> None:
    """A bug is not dressed as a message: it propagates (the traceback says where)."""
    result = CliRunner().invoke(_command(KeyError("x")), [])
    assert result.exit_code == 1
    assert isinstance(result.exception, KeyError)


def test_unreachable_redis_or_kafka_is_one_line_naming_it() -> None:
    """An outage at the shell is the operator's to fix: one line naming what cannot be reached and the
    settings that say where, status 1, no traceback."""
    for error, what in (
        (RedisConnectionError("Error 111 connecting to 127.0.0.1:1."), "Redis"),
        (KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]"), "Kafka"),
    ):
        result = CliRunner().invoke(_command(error), [])
        assert result.exit_code == 1
        (line,) = result.stderr.splitlines()
        assert line.startswith(f"Error: cannot reach {what}: ")
        assert "COMPACTION_REDIS__URL" in line
        assert "Traceback" not in result.output
