"""Connections from settings: Kafka security for FastStream and aiokafka, and Redis."""

from __future__ import annotations

import os
import socket
import ssl
from typing import Any

import hiredis
from faststream.kafka.security import parse_security
from faststream.security import BaseSecurity, SASLPlaintext, SASLScram256, SASLScram512
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import DataError

from compaction_worker.errors import ConfigError
from compaction_worker.settings import KafkaSettings, RedisSettings
from compaction_worker.state.connection import RedisClient


def kafka_security(settings: KafkaSettings) -> BaseSecurity | None:
    """FastStream security from settings (SASL/TLS), or None for plaintext."""
    protocol = settings.security_protocol
    context: ssl.SSLContext | None = None
    if protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=str(settings.ssl_cafile) if settings.ssl_cafile else None)
        if settings.ssl_certfile:
            context.load_cert_chain(
                str(settings.ssl_certfile), str(settings.ssl_keyfile) if settings.ssl_keyfile else None
            )
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        user = settings.sasl_username or ""
        password = settings.sasl_password.get_secret_value() if settings.sasl_password else ""
        use_ssl = protocol == "SASL_SSL"
        kinds: dict[str | None, type[SASLPlaintext] | type[SASLScram256] | type[SASLScram512]] = {
            None: SASLPlaintext,
            "PLAIN": SASLPlaintext,
            "SCRAM-SHA-256": SASLScram256,
            "SCRAM-SHA-512": SASLScram512,
        }
        return kinds[settings.sasl_mechanism](
            username=user, password=password, use_ssl=use_ssl, ssl_context=context
        )
    if context is not None:
        return BaseSecurity(ssl_context=context, use_ssl=True)
    return None


def kafka_client_args(settings: KafkaSettings) -> dict[str, Any]:
    """aiokafka keyword arguments for the same security (used by the admin client)."""
    security = kafka_security(settings)
    if security is None:
        return {}
    return dict(parse_security(security))


WORKER_CLIENT_NAME = "compaction-worker"
"""The start of a worker process's Redis connection names (``CLIENT LIST``), then its host and process id."""


def worker_client_name() -> str:
    """This process's Redis connection name: ``compaction-worker:<host>:<pid>`` (no spaces: Redis refuses them)."""
    host = "".join(ch if ch.isalnum() or ch in "-._" else "-" for ch in socket.gethostname())
    return f"{WORKER_CLIENT_NAME}:{host}:{os.getpid()}"


def connect_redis(settings: RedisSettings, name: str | None = None) -> RedisClient:
    """A Redis client from settings: URL, password, TLS; retries on connection errors; each
    connection named ``name`` (``CLIENT LIST`` shows whose it is).

    A Redis Cluster (``redis.cluster`` or a ``redis+cluster://`` URL) gets the cluster
    client, which follows the slot map and its redirections; the URL names any one node.
    """
    if not settings.url:
        raise ConfigError("no Redis URL configured (COMPACTION_REDIS__URL)")
    url = settings.url.replace("+cluster://", "://", 1)
    kwargs: dict[str, Any] = {
        "health_check_interval": 15,
        "socket_connect_timeout": 5,
        "socket_timeout": 30,
    }
    if name is not None:
        kwargs["client_name"] = name
    if settings.password is not None:
        kwargs["password"] = settings.password.get_secret_value()
    if settings.ssl and not url.startswith("rediss://"):
        kwargs["ssl"] = True
    if settings.ssl_ca_certs:
        kwargs["ssl_ca_certs"] = str(settings.ssl_ca_certs)
    if settings.uses_cluster:
        return RedisCluster.from_url(url, **kwargs)
    # A bounded pool that waits for a free connection: without it every conversation in flight
    # (batch_concurrency per consumer) held a connection of its own, hundreds per worker.
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=settings.max_connections,
        timeout=kwargs["socket_timeout"],
        retry_on_timeout=True,
        **kwargs,
    )
    pool.connection_class = hiredis_packing(pool.connection_class)
    return Redis.from_pool(pool)


_PACKING: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def hiredis_packing(kind: type[AbstractConnection]) -> type[AbstractConnection]:
    """``kind`` (TCP, TLS or Unix socket) packing commands with hiredis, in C.

    redis-py's asyncio connections pack each argument in Python, which cost a stored turn
    ~20 us of its ~190 (a run's script call carries ~35 arguments a turn); its sync client
    packs with hiredis, as this does. The bytes are the same (tests/runtime/test_connections.py).
    The cluster client makes its nodes' connections itself, and packs in Python.
    """

    def pack_command(self: AbstractConnection, *args: Any) -> list[bytes]:
        head = args[0]
        if isinstance(head, str):  # "CLIENT SETNAME" is two words for the server
            args = (*head.encode().split(), *args[1:])
        elif b" " in head:
            args = (*head.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]
        except TypeError as error:  # a bool or None: redis-py's own packer refuses them too
            raise DataError(str(error)) from error

    if kind not in _PACKING:
        _PACKING[kind] = type(f"Hiredis{kind.__name__}", (kind,), {"pack_command": pack_command})
    return _PACKING[kind]
