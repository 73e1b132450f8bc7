"""Worker processes for tests that kill, restart and race real workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from compaction_worker.bench.environment import START_CEILING
from compaction_worker.settings import Settings


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that reproduces ``settings`` in a child process (COMPACTION_* variables)."""
    env: dict[str, str] = {}

    def walk(prefix: str, data: Mapping[str, Any]) -> None:
        for key, value in data.items():
            name = f"{prefix}__{key.upper()}" if prefix else f"COMPACTION_{key.upper()}"
            if isinstance(value, Mapping):
                walk(name, value)
            elif value is None:
                continue
            elif isinstance(value, bool):
                env[name] = "true" if value else "false"
            elif isinstance(value, list):
                env[name] = json.dumps(value)
            else:
                env[name] = str(value)

    data = settings.model_dump(
        mode="json",
        exclude={
            "kafka_bootstrap_servers",
            "redis_url",
            "summarizer_model",
            "summarizer_api_base",
            "summarizer_api_key",
            "trigger_fraction",
        },
    )
    walk("", data)
    if settings.summarizer.api_key is not None:
        env["COMPACTION_SUMMARIZER__API_KEY"] = settings.summarizer.api_key.get_secret_value()
    return env


class WorkerProcess:
    """``compaction-worker run`` in a child process, with its output in a log file."""

    def __init__(self, settings: Settings, log_dir: Path, name: str) -> None:
        self.settings = settings
        self.log_path = log_dir / f"{name}.log"
        self.name = name
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_")}
        env.update(settings_env(self.settings))
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "compaction_worker.cli", "run"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        log.close()

    def wait_consuming(self, within: float = START_CEILING) -> None:
        """Wait until the worker says it consumes (its consumers hold their partitions)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if "worker consuming" in self.log():
                return
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.log()[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(
            f"{self.name} did not say it consumes within {within:.0f} s: {self.log()[-3000:]}"
        )

    def kill(self) -> None:
        """SIGKILL: no shutdown hook runs, locks and leases are left to expire."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, within: float = 30) -> int | None:
        """SIGTERM and wait: the graceful path."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=within)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
