"""What the bench runs on: the broker and Redis (embedded, or given), a fake LLM, and worker processes.

Worker processes run this checkout's worker, or another checkout's (``--baseline-source``): its
directory first on ``PYTHONPATH``, with this environment's packages.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from compaction_worker.errors import CompactionWorkerError
from compaction_worker.local.embedded import EmbeddedKafka, EmbeddedRedis
from compaction_worker.runtime.connections import connect_redis
from compaction_worker.settings import Settings
from compaction_worker.state.connection import RedisClient
from compaction_worker.testing import FakeLLMServer


class BenchError(CompactionWorkerError):
    """A bench scenario could not run (a worker exited, input was not stored in time)."""


@dataclass(frozen=True, slots=True)
class WorkerSource:
    """Another checkout of the project whose worker runs beside this one's: the same rows, side by side."""

    path: Path
    label: str
    """How the table names its figures: ``worker at bed3025`` (``+changes`` if its tree is not clean)."""

    @classmethod
    def of(cls, path: Path) -> WorkerSource:
        """The checkout at ``path``; BenchError if it holds no ``compaction_worker`` package."""
        path = path.resolve()
        if not (path / "compaction_worker" / "__init__.py").is_file():
            raise BenchError(
                f"{path} is not a checkout of compaction-worker (no compaction_worker/__init__.py)"
            )
        return cls(path, f"worker at {_revision(path)}")

    def environment(self, child: dict[str, str]) -> dict[str, str]:
        """``child`` with the checkout first on ``PYTHONPATH``, so that its package shadows this one."""
        paths = [str(self.path), *filter(None, child.get("PYTHONPATH", "").split(os.pathsep))]
        return {**child, "PYTHONPATH": os.pathsep.join(paths)}


def _revision(path: Path) -> str:
    """The checkout's short commit, ``+changes`` if tracked files differ from it; its name without git."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(path), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        changes = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return path.name
    return f"{commit}+changes" if changes else commit


@dataclass(slots=True)
class BenchEnv:
    """The broker, Redis and fake LLM every scenario shares, and how hard to run."""

    settings: Settings
    """Where the broker and Redis are (bootstrap servers and URL always set), and their security."""
    redis: RedisClient
    llm: FakeLLMServer
    repeat: int = 3
    """Each figure is the median of this many runs."""
    scale: float = 1.0
    """Input sizes times this (``--quick``: small, for a first look and the tests)."""
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="cw-bench-")))
    config_file: Path | None = None
    """The ``--config`` file, passed on to worker processes (environment variables override it)."""
    baseline: WorkerSource | None = None
    """``--baseline-source``: the throughput and Redis rows run its worker too, and the replay rows its
    replay, beside this one's."""
    tune_gc: bool = True
    """Tune garbage collection before timing compactions, as a worker does when it starts
    (``runtime.worker.tune_gc``); off in tests, which must not change the test process's."""

    def size(self, full: int, least: int = 1) -> int:
        """``full`` times the scale, at least ``least``."""
        return max(least, round(full * self.scale))

    def unique(self, what: str) -> str:
        """A fresh name (topic, group, key prefix): runs never share state."""
        return f"bench-{what}-{uuid.uuid4().hex[:8]}"


@contextlib.asynccontextmanager
async def bench_env(
    settings: Settings,
    *,
    repeat: int,
    scale: float,
    config_file: Path | None = None,
    baseline: WorkerSource | None = None,
) -> AsyncIterator[BenchEnv]:
    """Start an embedded broker and Redis for what ``settings`` leave unconfigured, and a fake LLM."""
    with contextlib.ExitStack() as stack:
        kafka, redis_settings = settings.kafka, settings.redis
        if not kafka.bootstrap_servers:
            broker = stack.enter_context(EmbeddedKafka())
            # The embedded broker has no idempotent producer (no InitProducerId).
            kafka = kafka.model_copy(
                update={"bootstrap_servers": broker.bootstrap_servers, "enable_idempotence": False}
            )
        if not redis_settings.url:
            server = stack.enter_context(EmbeddedRedis())
            redis_settings = redis_settings.model_copy(update={"url": server.url})
        llm = stack.enter_context(FakeLLMServer())
        settings = settings.model_copy(update={"kafka": kafka, "redis": redis_settings})
        redis = connect_redis(redis_settings)
        try:
            yield BenchEnv(
                settings, redis, llm, repeat=repeat, scale=scale, config_file=config_file, baseline=baseline
            )
        finally:
            await redis.aclose()


def worker_environment(env: BenchEnv, overrides: Mapping[str, str]) -> dict[str, str]:
    """A worker process's environment: ours, the broker and Redis the bench uses, then ``overrides``.

    ``overrides`` are ``COMPACTION_*`` names without the prefix (``TOPICS__TURNS``).
    """
    kafka = env.settings.kafka
    child = dict(os.environ)
    child.update(
        {
            "COMPACTION_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers or "",
            "COMPACTION_KAFKA__ENABLE_IDEMPOTENCE": "true" if kafka.enable_idempotence else "false",
            "COMPACTION_REDIS__URL": env.settings.redis.url or "",
            "COMPACTION_TOPICS__CREATE": "false",
            "COMPACTION_HEALTH__ENABLED": "false",
        }
    )
    if env.config_file is not None:
        child["COMPACTION_CONFIG_FILE"] = str(env.config_file.resolve())  # the child runs elsewhere
    child.update({f"COMPACTION_{name}": value for name, value in overrides.items()})
    return child


START_CEILING = 180.0
"""Seconds a worker process may take to say it consumes: a ceiling for a loaded machine, not a target
(a cold start takes a few seconds; the startup rows measure it)."""

RUN = ("-m", "compaction_worker.cli", "run")
"""``compaction-worker run``, as the child's arguments to the Python interpreter."""


class WorkerProcess:
    """``compaction-worker run`` in a child process, its output in a log file under the bench's workdir.

    It runs in the workdir, never in a checkout (``python -m`` puts its directory first on
    the path): this checkout's package is the installed one, ``source``'s comes first on
    ``PYTHONPATH``.
    """

    def __init__(
        self,
        env: BenchEnv,
        name: str,
        overrides: Mapping[str, str],
        command: Sequence[str] = RUN,
        *,
        source: WorkerSource | None = None,
    ) -> None:
        self.log_path = env.workdir / f"{name}.log"
        self.name = name
        self.command = [sys.executable, *command]
        self.cwd = env.workdir
        environment = worker_environment(env, overrides)
        self._environment = source.environment(environment) if source else environment
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._environment,
                cwd=self.cwd,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def check_alive(self) -> None:
        """Raise BenchError (with the end of its log) if the process has exited."""
        if self.process is not None and self.process.poll() is not None:
            raise BenchError(f"worker {self.name} exited ({self.process.returncode}):\n{self.log()[-2000:]}")

    def wait_consuming(self, within: float = START_CEILING) -> None:
        """Wait until the worker says it consumes (its consumers hold their partitions)."""
        deadline = time.monotonic() + within
        while "worker consuming" not in self.log():
            self.check_alive()
            if time.monotonic() > deadline:
                raise BenchError(
                    f"worker {self.name} did not say it consumes within {within:.0f} s:\n{self.log()[-2000:]}"
                )
            time.sleep(0.05)

    def stop(self, within: float = 20.0) -> None:
        """SIGTERM, then SIGKILL if it does not exit within ``within`` seconds."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Workers:
    """Several worker processes started together and stopped together (``with``)."""

    def __init__(
        self,
        env: BenchEnv,
        count: int,
        name: str,
        overrides: Mapping[str, str],
        command: Sequence[str] = RUN,
        *,
        source: WorkerSource | None = None,
    ) -> None:
        self.processes = [
            WorkerProcess(env, f"{name}-{i}", overrides, command, source=source) for i in range(count)
        ]

    def __enter__(self) -> Self:
        try:
            for process in self.processes:
                process.start()
            for process in self.processes:
                process.wait_consuming()
        except BaseException:
            self.stop()
            raise
        return self

    def check_alive(self) -> None:
        for process in self.processes:
            process.check_alive()

    def stop(self) -> None:
        for process in self.processes:
            process.stop()

    def __exit__(self, *_: object) -> None:
        self.stop()
