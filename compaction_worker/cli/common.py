"""What the commands share: settings from the context, the embedded servers, JSON output, errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from compaction_worker.errors import CompactionWorkerError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from compaction_worker.client.client import Client
    from compaction_worker.conversation.meta import Meta
    from compaction_worker.settings import Settings

PROGRAM = "compaction-worker"
"""The command's name, as the help, the reference and the commands' hints spell it."""

SCHEMAS_DIR = Path(__file__).resolve().parent.parent.parent / "schemas"

LIBRDKAFKA_NOTE = (
    "aiokafka and kafka-python clients work with it; librdkafka ones (kcat, confluent-kafka) do not "
    "(malformed ApiVersions reply): use the docker-compose Kafka for those"
)
"""Said where ``run`` and ``demo`` say where the embedded broker listens."""

FILE = click.Path(path_type=Path, dir_okay=False)


def settings_of(ctx: click.Context) -> Settings:
    """The settings, read once from the group's ``--config`` and the environment."""
    from compaction_worker.settings import load_settings

    try:
        return load_settings(ctx.obj)
    except (CompactionWorkerError, ValueError) as e:
        raise click.ClickException(f"invalid settings: {e}") from e


@contextlib.contextmanager
def embedded_infra(settings: Settings, say: Any = click.echo) -> Iterator[Settings]:
    """Start an embedded broker and Redis for whatever the settings leave unconfigured."""
    from compaction_worker.local.embedded import EmbeddedKafka, EmbeddedRedis

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


def json_output(output: BaseModel) -> str:
    """A command's ``--json`` output: its model (schema in ``schemas/cli/``), indented."""
    # ensure_ascii=False as before: messages in any language stay readable.
    return json.dumps(output.model_dump(mode="json"), indent=2, ensure_ascii=False)


def run_async(coro: Any) -> None:
    """Run a command's coroutine; any of the package's errors ends it with one line on stderr, exit 1."""
    from aiokafka.errors import KafkaError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    try:
        asyncio.run(coro)
    except CompactionWorkerError as e:
        raise click.ClickException(one_line(e)) from e
    except (RedisConnectionError, RedisTimeoutError, KafkaError, OSError) as e:
        # Unreachable infrastructure is the operator's to fix: say what, not where in the code.
        what = (
            "Kafka"
            if isinstance(e, KafkaError)
            else "Redis"
            if "redis" in type(e).__module__
            else "the network"
        )
        raise click.ClickException(
            f"cannot reach {what}: {one_line(e)} (check --config, COMPACTION_KAFKA__BOOTSTRAP_SERVERS and COMPACTION_REDIS__URL)"
        ) from e


def one_line(error: BaseException) -> str:
    """An error's message on one line (its type's name when it has none): what the CLI prints for it."""
    return " ".join(str(error).split()) or type(error).__name__


async def stored_meta(client: Client, conversation_id: str) -> Meta:
    """The conversation's metadata; a clear error when Redis holds no such conversation."""
    meta = await client.meta(conversation_id)
    if meta.last_seq == 0:
        missing(client, conversation_id)
    return meta


def missing(client: Client, conversation_id: str) -> NoReturn:
    raise click.ClickException(f"no conversation {conversation_id!r} in {client.settings.redis.url}")
