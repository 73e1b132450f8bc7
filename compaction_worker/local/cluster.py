"""An embedded Redis Cluster: three valkey-server primaries (no replicas) as child processes.

For the tests and local runs against a cluster. Each primary keeps an append-only file
and its ``nodes.conf`` in its own directory, so :meth:`EmbeddedRedisCluster.restart`
brings a primary back with its node id, its slots and its data.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Self

from compaction_worker.local.embedded import (
    EmbeddedRedis,
    EmbeddedStartError,
    PortInUseError,
    free_port,
    port_is_free,
)

__all__ = ["EmbeddedRedisCluster"]

_NODE_TIMEOUT_MS = 2000
_POLL_SECONDS = 0.05
_PORT_TRIES = 5


class EmbeddedRedisCluster:
    """Three (``size``) cluster-enabled valkey-server primaries joined with ``valkey-cli --cluster create``."""

    def __init__(self, size: int = 3, *, startup_timeout: float = 30.0) -> None:
        if size < 3:
            raise ValueError("valkey-cli --cluster create needs at least three primaries")
        self.startup_timeout = startup_timeout
        # Cluster nodes also listen on port + 10000 (the bus): pick ports where both are free.
        self.nodes = [self._node() for _ in range(size)]

    @staticmethod
    def _node() -> EmbeddedRedis:
        port = free_port()
        while port + 10000 > 65535 or not port_is_free(port + 10000):
            port = free_port()
        server = EmbeddedRedis(port, extra_args=())
        server.extra_args = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(server.data_dir / "nodes.conf"),
            "--cluster-node-timeout", str(_NODE_TIMEOUT_MS),
            # Survives a restart (clean shutdown writes it out); no fsync per write: tests are fast.
            "--appendonly", "yes",
            "--appendfsync", "no",
        )  # fmt: skip
        return server

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:PORT`` of the first node (the client discovers the others)."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> None:
        """Start the primaries, assign the slots, and return once every node reports the cluster ok."""
        for i in range(len(self.nodes)):
            self._start_node(i)
        if not self._state_ok(self.nodes[0].port):
            self._cli("--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                      "--cluster-replicas", "0", "--cluster-yes")  # fmt: skip
        self._wait_ok(self.ports)

    def _start_node(self, index: int) -> None:
        """Start node ``index``; on new ports when another process took its port or its bus port first
        (parallel test processes each start a cluster)."""
        for attempt in range(_PORT_TRIES):
            try:
                self.nodes[index].start()
                return
            except (PortInUseError, EmbeddedStartError):
                if attempt == _PORT_TRIES - 1:
                    raise
                self.nodes[index].close()
                self.nodes[index] = self._node()

    def restart(self, index: int, down_seconds: float = 0.0) -> None:
        """Stop one primary (cleanly: its data is written out), wait, start it again on its port."""
        self.stop_primary(index)
        time.sleep(down_seconds)
        self.start_primary(index)

    def stop_primary(self, index: int) -> None:
        """Stop one primary, cleanly (its data is written out): its slots are unreachable."""
        self.nodes[index].stop()

    def start_primary(self, index: int) -> None:
        """Start a stopped primary again on its port; return once the cluster reports it ok."""
        node = self.nodes[index]
        node.start()
        self._wait_ok([node.port])

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def close(self) -> None:
        """Stop every primary and delete their directories."""
        for node in self.nodes:
            node.close()

    def _cli(self, *args: str) -> str:
        binary = os.path.join(os.path.dirname(self.nodes[0].binary_path()), "valkey-cli")
        done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise EmbeddedStartError(f"valkey-cli {' '.join(args[:2])} failed: {done.stdout}{done.stderr}")
        return done.stdout

    def _state_ok(self, port: int) -> bool:
        try:
            return "cluster_state:ok" in self._cli("-p", str(port), "cluster", "info")
        except (EmbeddedStartError, subprocess.TimeoutExpired):
            return False

    def _wait_ok(self, ports: list[int]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        for port in ports:
            while not self._state_ok(port):
                if time.monotonic() > deadline:
                    raise EmbeddedStartError(
                        f"embedded cluster node {port} not ok within {self.startup_timeout:.0f}s"
                    )
                time.sleep(_POLL_SECONDS)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<EmbeddedRedisCluster ports={self.ports}>"
