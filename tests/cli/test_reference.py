"""cli/reference.py: the CLI as the docs see it, the generated reference and the check of quoted commands."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from compaction_worker.cli import main, reference
from compaction_worker.cli.reference import Command, check, commands, markdown, quoted


@pytest.fixture(scope="module")
def cli() -> Command:
    return commands(main)


def page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text)
    return path


class TestTheApp:
    def test_every_click_command_is_read(self, cli: Command) -> None:
        """Each command of the group is in the spec, with every option click accepts for it; a hidden
        one (an alias) as an alias, which the reference does not list."""
        listed = {name for name, command in main.commands.items() if not command.hidden}
        assert set(cli.subcommands) == listed
        assert set(cli.aliases) == {"history", "status", "artifacts", "compact", "rewind"}
        assert set(cli.aliases) <= set(cli.subcommands["conversation"].subcommands)
        assert "### `compaction-worker status`" not in markdown(cli)
        assert "### `compaction-worker conversation status`" in markdown(cli)
        bench = cli.subcommands["bench"]
        assert bench.option("--baseline-source") is not None
        quick = bench.option("--quick")
        assert quick is not None
        assert quick.values == 0
        assert cli.option("--config") is not None

    def test_quality_suites_bring_their_argparse_options(self, cli: Command) -> None:
        """`quality SUITE` options are the suite's parser's, `standing --short` its own parser's."""
        quality = cli.subcommands["quality"]
        assert set(quality.subcommands) == {"fidelity", "standing", "small-windows", "unlisted"}
        standing = quality.subcommands["standing"]
        assert standing.option("--budgets") is not None
        assert standing.option("--show") is None
        assert standing.variants["--short"].option("--show") is not None

    def test_reading_a_suite_runs_nothing(self) -> None:
        """The suite's parser comes back before main() does any work, and argparse is left as it was."""
        parser = reference.suite_parser("small_windows")
        assert "--windows" in parser.format_usage()
        assert parser.parse_args(["--windows", "4096"]).windows == [4096]


class TestTheReference:
    def test_lists_every_command_and_option(self, cli: Command) -> None:
        text = markdown(cli)
        for command in cli.walk():
            assert f"### `{command.path}`" in text
            for option in command.options:
                if not set(option.names) & reference.HELP:
                    assert f"`{option.names[0]}`" in text, (command.path, option.names)

    def test_defaults_do_not_depend_on_the_checkout(self, cli: Command) -> None:
        """A path default inside the repository is shown relative to it: the page is the same on any clone."""
        assert str(reference.REPOSITORY) not in markdown(cli)


class TestQuotedCommands:
    def test_code_blocks_and_inline_code_are_read(self, tmp_path: Path) -> None:
        path = page(
            tmp_path,
            "Run `compaction-worker demo --inspect` or `uv run compaction-worker run`.\n"
            "Not `compaction-worker:host:pid` nor `docker build -t compaction-worker .`.\n"
            "```bash\n"
            "# a comment: compaction-worker nothing\n"
            "pip install uv==0.13.9 && uv run --locked --all-extras compaction-worker run   # the worker\n"
            "LITELLM_LOCAL_MODEL_COST_MAP=True compaction-worker replay a.jsonl \\\n"
            "    --context-window 8192 --json | jq .\n"
            "```\n",
        )
        found = [(q.line, q.words) for q in quoted(path)]
        assert found == [
            (1, ("demo", "--inspect")),
            (1, ("run",)),
            (5, ("run",)),
            (6, ("replay", "a.jsonl", "--context-window", "8192", "--json")),
        ]

    def test_good_commands_pass(self, tmp_path: Path, cli: Command) -> None:
        path = page(
            tmp_path,
            "```bash\n"
            "compaction-worker --config worker.yaml replay logs/ --plot saw.png --trigger 0.7\n"
            "compaction-worker bench --only throughput --repeat 3 --markdown\n"
            "compaction-worker quality standing --short --seeds 7 8 9 --show 7 0.3\n"
            "compaction-worker quality unlisted --noise -1 -1 --json\n"
            "compaction-worker replay $(find /tmp/runs -name '*.traj') --context-window 4096\n"
            "```\n"
            "`compaction-worker compact CONVERSATION [--dry-run [--instructions TEXT] [--json]]`,\n"
            "`compaction-worker quality {fidelity,standing,small-windows,unlisted} [SUITE OPTIONS]`,\n"
            "`compaction-worker quality SUITE --help`, `compaction-worker docs --check`,\n"
            "`compaction-worker conversation pin c-1 3 --index 0 --json`,\n"
            "`compaction-worker conversation {apply,discard} CID PROPOSAL_ID`, `compaction-worker status c-1`.\n",
        )
        assert check(cli, [path]) == []

    @pytest.mark.parametrize(
        ("command", "wrong"),
        [
            ("compaction-worker rewnid c-1", "`compaction-worker` has no command 'rewnid'"),
            (
                "compaction-worker rewind c-1 --verison 3",
                "`compaction-worker rewind` has no option --verison",
            ),
            (
                "compaction-worker --config w.yaml bench --fast",
                "`compaction-worker bench` has no option --fast",
            ),
            (
                "compaction-worker quality standing --show 7 0.3",
                "`compaction-worker quality standing` has no option --show",
            ),
            ("compaction-worker quality recall", "`compaction-worker quality` has no command 'recall'"),
            (
                "compaction-worker quality {fidelity,recall}",
                "`compaction-worker quality` has no command recall",
            ),
            ("compaction-worker replay x.jsonl --format claude", "--format takes one of auto, openai"),
            (
                "compaction-worker conversation pni c-1 3",
                "`compaction-worker conversation` has no command 'pni'",
            ),
            (
                "compaction-worker conversation unpin c-1 3 --all",
                "`compaction-worker conversation unpin` has no option --all",
            ),
        ],
    )
    def test_a_wrong_command_fails_naming_file_line_and_what(
        self, tmp_path: Path, cli: Command, command: str, wrong: str
    ) -> None:
        path = page(tmp_path, f"Intro.\n\n```bash\n{command}   # see below\n```\n")
        [problem] = check(cli, [path])
        assert problem.startswith(f"{path}:4: `{command}`")
        assert wrong in problem

    def test_docs_check_fails_on_a_quoted_command_that_does_not_exist(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`compaction-worker docs --check` reports the file and line, and exits 1."""
        path = page(tmp_path, "`compaction-worker status c-1 --verbose`\n")
        monkeypatch.setattr(reference, "documents", lambda _repository: [path])
        result = CliRunner().invoke(main, ["docs", "--check"])
        assert result.exit_code == 1
        assert f"{path}:1: `compaction-worker status c-1 --verbose`" in result.output
        assert "has no option --verbose" in result.output


def test_the_repositorys_docs_quote_only_real_commands() -> None:
    """README.md and docs/*.md: every `compaction-worker ...` line names a command and options that exist."""
    assert check(commands(main), reference.documents(reference.REPOSITORY)) == []
    assert sum(1 for path in reference.documents(reference.REPOSITORY) for _ in quoted(path)) > 20


def test_the_help_flag_is_every_commands(cli: Command) -> None:
    assert all(any(set(o.names) & reference.HELP for o in c.options) for c in cli.walk()), (
        "a command without --help"
    )
    assert isinstance(main, click.Group)
