"""The committed contract files: exactly what the models (and FastStream, for AsyncAPI) generate; write() and check()."""

from __future__ import annotations

import json
from pathlib import Path

from compaction_worker.contracts import specification
from compaction_worker.contracts.cli_output import CLI_GENERATED_NOTE, CLI_MODELS, cli_schema_file
from compaction_worker.contracts.events import COMPLETED_TOPIC, TURNS_TOPIC
from compaction_worker.contracts.json_schemas import GENERATED_NOTE, schema_file
from compaction_worker.contracts.specification import ASYNCAPI_FILE
from compaction_worker.runtime.channels import committed_document
from tests.contracts.helpers import SCHEMA_FILES, SCHEMAS_DIR, TOPICS


def render_all() -> dict[str, str]:
    """Every contract file as the ``schemas`` command renders it."""
    return specification.render_all(committed_document())


def write(directory: Path) -> list[Path]:
    return specification.write(directory, render_all())


def check(directory: Path) -> list[str]:
    return specification.check(directory, render_all())


class TestDrift:
    """The committed files in schemas/ are exactly what the models generate."""

    def test_committed_files_match_the_models(self) -> None:
        """CI fails when a model changed and the contracts were not regenerated."""
        problems = check(SCHEMAS_DIR)
        assert problems == [], (
            "schemas/ is out of date with the models or the worker's channels; run "
            "`compaction-worker schemas` and commit the result:\n  " + "\n  ".join(problems)
        )

    def test_one_file_per_event_plus_asyncapi_and_cli(self) -> None:
        """Every topic of EVENT_MODELS has its schema file, named after the topic; every CLI --json one in cli/."""
        assert set(render_all()) == (
            {f"{topic}.json" for topic in TOPICS}
            | {ASYNCAPI_FILE}
            | {
                f"cli/{name}.json"
                for name in ("history", "history-full", "status", "artifacts", "rewind", "compact-dry-run")
            }
            | {f"cli/{name}.json" for name in ("versions", "proposal", "pin", "unpin", "apply", "discard")}
            | {f"cli/{name}.json" for name in ("demo", "replay", "bench")}
        )

    def test_rendering_is_deterministic(self) -> None:
        """Two renderings are byte-identical, so a diff only ever shows a model change."""
        assert render_all() == render_all()

    def test_json_files_are_sorted_indented_and_end_with_a_newline(self) -> None:
        """The JSON files are in their canonical form (sorted keys, 2-space indent, LF)."""
        for name in SCHEMA_FILES:
            text = render_all()[name]
            assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            assert "\r" not in text


class TestWriteAndCheck:
    """write() brings a directory up to date; check() says how it differs."""

    def test_fresh_directory_is_written_and_then_clean(self, tmp_path: Path) -> None:
        """A new directory gets every file, byte for byte, and check() then finds nothing."""
        written = write(tmp_path / "schemas")
        assert sorted(path.relative_to(tmp_path / "schemas").as_posix() for path in written) == sorted(
            render_all()
        )
        assert check(tmp_path / "schemas") == []
        for name, text in render_all().items():
            assert (tmp_path / "schemas" / name).read_bytes() == text.encode()

    def test_up_to_date_files_are_not_rewritten(self, tmp_path: Path) -> None:
        """A second write() changes nothing and returns nothing."""
        write(tmp_path)
        assert write(tmp_path) == []

    def test_changed_file_is_reported(self, tmp_path: Path) -> None:
        """An edited schema is reported by name and line, and write() repairs it."""
        write(tmp_path)
        path = tmp_path / schema_file(COMPLETED_TOPIC)
        path.write_text(path.read_text().replace('"minimum": 0', '"minimum": 1', 1))
        (problem,) = check(tmp_path)
        assert str(path) in problem
        assert "differs" in problem
        assert "line " in problem
        assert write(tmp_path) == [path]
        assert check(tmp_path) == []

    def test_missing_file_is_reported(self, tmp_path: Path) -> None:
        """A deleted file is reported as missing."""
        write(tmp_path)
        (tmp_path / ASYNCAPI_FILE).unlink()
        assert check(tmp_path) == [f"{tmp_path / ASYNCAPI_FILE}: missing"]

    def test_missing_directory_reports_every_file(self, tmp_path: Path) -> None:
        """A directory that does not exist is every file missing."""
        problems = check(tmp_path / "nowhere")
        assert len(problems) == len(render_all())
        assert all(problem.endswith(": missing") for problem in problems)

    def test_stale_generated_file_is_extra_and_removed(self, tmp_path: Path) -> None:
        """A generated file no model produces any more is reported, then removed by write()."""
        write(tmp_path)
        stale = tmp_path / "conversation.renamed.json"
        stale.write_text(json.dumps({"$comment": GENERATED_NOTE}))
        assert check(tmp_path) == [f"{stale}: extra, no model produces it"]
        write(tmp_path)
        assert not stale.exists()
        assert check(tmp_path) == []

    def test_stale_cli_schema_is_extra_and_removed(self, tmp_path: Path) -> None:
        """A generated CLI schema of a command that no longer has one is reported, then removed."""
        write(tmp_path)
        stale = tmp_path / "cli" / "gone.json"
        stale.write_text(json.dumps({"$comment": CLI_GENERATED_NOTE}))
        assert check(tmp_path) == [f"{stale}: extra, no model produces it"]
        write(tmp_path)
        assert not stale.exists()
        assert (tmp_path / cli_schema_file(next(iter(CLI_MODELS)))).is_file()

    def test_files_we_did_not_generate_are_left_alone(self, tmp_path: Path) -> None:
        """A hand-written file in the directory is neither reported nor removed."""
        write(tmp_path)
        mine = tmp_path / "extra-notes.json"
        mine.write_text("{}")
        assert check(tmp_path) == []
        write(tmp_path)
        assert mine.exists()

    def test_crlf_checkout_is_reported(self, tmp_path: Path) -> None:
        """Line-ending changes count as drift, so the committed bytes stay canonical."""
        write(tmp_path)
        path = tmp_path / schema_file(TURNS_TOPIC)
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
        (problem,) = check(tmp_path)
        assert str(path) in problem
