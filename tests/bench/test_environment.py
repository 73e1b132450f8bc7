"""Worker processes of another checkout (``--baseline-source``): its code, this environment's packages."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any, cast

import pytest

from compaction_worker.bench.environment import BenchEnv, BenchError, WorkerProcess, WorkerSource
from compaction_worker.settings import Settings


def _checkout(root: Path) -> Path:
    package = root / "compaction_worker"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""another checkout"""\n')
    return root


def _env(workdir: Path) -> BenchEnv:
    settings = Settings(kafka={"bootstrap_servers": "localhost:9"}, redis={"url": "redis://localhost:9"})
    return BenchEnv(settings, cast(Any, None), cast(Any, None), workdir=workdir)


def test_a_directory_without_the_package_is_no_checkout(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="not a checkout of compaction-worker"):
        WorkerSource.of(tmp_path)


def test_a_checkout_is_named_by_its_commit_and_says_when_its_tree_differs(tmp_path: Path) -> None:
    root = _checkout(tmp_path / "repo")
    assert WorkerSource.of(root).label == "worker at repo"  # no git: its directory's name

    def git(*args: str) -> str:
        command = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "one")
    commit = git("rev-parse", "--short", "HEAD")
    assert WorkerSource.of(root).label == f"worker at {commit}"
    (root / "compaction_worker" / "__init__.py").write_text('"""changed"""\n')
    assert WorkerSource.of(root).label == f"worker at {commit}+changes"


def test_a_worker_process_of_a_source_imports_that_checkouts_package(tmp_path: Path) -> None:
    """Its directory comes first on the path, whatever the directory the bench runs in."""
    source = WorkerSource.of(_checkout(tmp_path / "other"))
    workdir = tmp_path / "work"
    workdir.mkdir()
    show = ("-c", "import compaction_worker; print('package at', compaction_worker.__file__)")
    for name, chosen in (("other", source), ("this", None)):
        process = WorkerProcess(_env(workdir), name, {}, show, source=chosen)
        process.start()
        assert process.process is not None
        assert process.process.wait(timeout=60) == 0, process.log()
    assert (
        f"package at {source.path / 'compaction_worker' / '__init__.py'}"
        in (workdir / "other.log").read_text()
    )
    this = (workdir / "this.log").read_text()
    assert "package at" in this
    assert str(source.path) not in this
