"""Connections from settings: Kafka security for FastStream and aiokafka, and Redis."""

from __future__ import annotations

import ssl
from typing import Any

from faststream.kafka.security import parse_security
from faststream.security import BaseSecurity, SASLPlaintext, SASLScram256, SASLScram512
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

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


def connect_redis(settings: RedisSettings) -> RedisClient:
    """A Redis client from settings: URL, password, TLS; retries on connection errors.

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
    if settings.password is not None:
        kwargs["password"] = settings.password.get_secret_value()
    if settings.ssl and not url.startswith("rediss://"):
        kwargs["ssl"] = True
    if settings.ssl_ca_certs:
        kwargs["ssl_ca_certs"] = str(settings.ssl_ca_certs)
    if settings.uses_cluster:
        return RedisCluster.from_url(url, **kwargs)
    return Redis.from_url(url, retry_on_timeout=True, **kwargs)
