"""The docs' references to tests are real: every test docs/reference-coverage.md cites exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COVERAGE = ROOT / "docs" / "reference-coverage.md"


def _defined(path: Path) -> set[str]:
    """``Class::test`` and ``test`` for every test function of a module, as pytest names them."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return names


def test_every_cited_test_exists() -> None:
    """A renamed or moved test leaves no dangling id on the coverage page."""
    cited = set(re.findall(r"`(tests/[^`:]+\.py)::([^`\[]+)", COVERAGE.read_text()))
    assert len(cited) > 100, "the page's ids were not found: has its format changed?"
    missing = sorted(
        f"{module}::{name}"
        for module, name in cited
        if not (ROOT / module).is_file() or name not in _defined(ROOT / module)
    )
    assert missing == []
