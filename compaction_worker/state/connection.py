"""The Redis client type the state modules take: one server or a Redis Cluster."""

from __future__ import annotations

from typing import TypeAlias

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

RedisClient: TypeAlias = Redis | RedisCluster
"""A client of a single Redis server or of a cluster; every script keeps to one hash slot."""


def is_cluster(redis: RedisClient) -> bool:
    """Whether the client talks to a Redis Cluster."""
    return isinstance(redis, RedisCluster)
