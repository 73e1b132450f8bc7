"""Redis on a core of its own, for a phase: the bench's other processes moved off it.

In production a Redis shard has a core to itself. On the bench's machine it shares the cores
with the workers, the broker and the bench, and the CPU it spends on a turn grows with the
sharing (preempted mid-request, its caches taken). :func:`own_core` gives the Redis process
the last core this process may use and moves this process and its children (workers, an
embedded broker) to the others while the block runs, then puts every thread back. Other
processes on the machine are left alone: they are the machine's noise.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

PROC = Path("/proc")


def local_pid(info: Mapping[str, Any]) -> int | None:
    """The Redis process's pid, from its ``INFO server``, if it runs on this machine: the
    executable at that pid is the one it names (a remote Redis's pid is some other process)."""
    pid, executable = info.get("process_id"), info.get("executable")
    if not isinstance(pid, int) or not executable:
        return None
    try:
        if os.path.realpath(PROC / str(pid) / "exe") == os.path.realpath(str(executable)):
            return pid
    except OSError:
        pass
    return None


@contextlib.contextmanager
def own_core(redis_pid: int | None) -> Iterator[bool]:
    """While the block runs, Redis alone on the last core and this process's tree on the others.

    Yields whether it could: not on a single core, nor for a Redis not on this machine
    (``redis_pid`` None) or one this process may not move.
    """
    cores = os.sched_getaffinity(0)
    if redis_pid is None or len(cores) < 2:
        yield False
        return
    alone, rest = {max(cores)}, cores - {max(cores)}
    saved: dict[int, set[int]] = {}
    try:
        _move(_threads(redis_pid), alone, saved)
    except OSError:
        _restore(saved, cores)
        yield False
        return
    tree = [pid for pid in _tree(os.getpid()) if pid != redis_pid]
    with contextlib.suppress(OSError):  # a child that exits meanwhile
        _move([tid for pid in tree for tid in _threads(pid)], rest, saved)
    try:
        yield True
    finally:
        # Threads started meanwhile took the moved affinity: they get this process's back.
        _restore(saved, cores, [tid for pid in [*tree, redis_pid] for tid in _threads(pid)])


def _move(threads: list[int], cores: set[int], saved: dict[int, set[int]]) -> None:
    for tid in threads:
        saved.setdefault(tid, os.sched_getaffinity(tid))
        os.sched_setaffinity(tid, cores)


def _restore(saved: dict[int, set[int]], cores: set[int], threads: list[int] | None = None) -> None:
    for tid in dict.fromkeys([*saved, *(threads or [])]):
        with contextlib.suppress(OSError):  # a thread gone meanwhile
            os.sched_setaffinity(tid, saved.get(tid, cores))


def _threads(pid: int) -> list[int]:
    """A process's threads (Linux: each is scheduled, and pinned, on its own)."""
    try:
        return [int(task.name) for task in (PROC / str(pid) / "task").iterdir()]
    except OSError:
        return []


def _tree(root: int) -> list[int]:
    """``root`` and its descendants, from ``/proc/<pid>/stat``."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found
