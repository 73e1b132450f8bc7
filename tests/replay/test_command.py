"""``compaction-worker replay`` end to end through click: figures, --json, the PNG, --output, bad lines."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from compaction_worker import strategies
from compaction_worker.cli import SCHEMAS_DIR, main
from compaction_worker.contracts import cli_output
from compaction_worker.contracts.events import ChatMessage
from compaction_worker.contracts.history import is_summary_text
from compaction_worker.replay.command import with_thresholds
from compaction_worker.replay.reader import ReplayInputError
from compaction_worker.settings import Settings
from tests.replay.test_plot import png_size
from tests.trajectories import DATA as TRAJECTORIES
from tests.trajectories import load_trajectories

FIXTURE = Path(__file__).parent / "fixtures" / "agent_session.jsonl"


def test_replay_prints_the_figures_writes_the_png_and_the_final_history(tmp_path: Path) -> None:
    png, out = tmp_path / "sawtooth.png", tmp_path / "history.jsonl"
    args = ["replay", str(FIXTURE), "--context-window", "4000", "--plot", str(png), "--output", str(out)]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output + result.stderr
    data = json.loads(result.stdout)
    jsonschema.Draft202012Validator(json.loads((SCHEMAS_DIR / "cli" / "replay.json").read_text())).validate(
        data
    )
    report = cli_output.Replay.model_validate(data)
    (conversation,) = report.conversations
    assert (conversation.name, conversation.turns, conversation.window) == ("agent_session", 48, 4000)
    compactions = conversation.compactions["threshold"]
    assert compactions >= 2
    assert report.total.compactions == {"threshold": compactions}
    assert report.total.tokens_saved == conversation.tokens_saved > 0
    assert (report.total.llm_input_tokens, report.total.llm_output_tokens) == (0, 0)
    assert report.errors == []
    assert "replaying" in result.stderr  # the progress bar's label, on stderr

    assert png_size(png) == (1200, 600)
    (line,) = out.read_text().splitlines()
    history = cli_output.History.model_validate_json(line)
    assert history.conversation_id == "agent_session"
    assert history.version == compactions
    assert history.tokens == conversation.final_tokens
    assert history.chunks
    for message in history.messages:
        ChatMessage.model_validate(message)
    assert history.messages[1]["content"].startswith("Step 1:")  # the task, where it was said
    assert is_summary_text(history.messages[2]["content"])
    assert strategies.provider_problems(history.messages) == []

    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0
    assert f"{compactions} (threshold {compactions})" in text.stdout
    assert "window 4000 (event), threshold 2400, target 1500" in text.stdout


def test_replay_says_what_compactions_cost_per_100_turns() -> None:
    """Compactions, small ones, turns of several runs, summary calls, cache breaks and dollars, per
    100 turns, for each conversation and in total, in --json and in the text."""
    args = ["replay", str(FIXTURE), "--context-window", "4000"]
    data = cli_output.Replay.model_validate_json(CliRunner().invoke(main, [*args, "--json"]).stdout)
    (conversation,) = data.conversations
    rates, ours = conversation.per_100_turns, conversation.cache[0]
    assert rates.compactions == round(sum(conversation.compactions.values()) * 100 / 48, 2) > 0
    assert rates.cache_breaks == round(ours.breaks * 100 / 48, 2) > 0
    assert rates.summary_calls == round(sum(r.summary_calls for r in conversation.runs) * 100 / 48, 2) > 0
    assert ours.dollars is not None
    assert rates.dollars == pytest.approx(ours.dollars.total * 100 / 48, abs=1e-6)
    assert data.total.per_100_turns == rates  # one conversation: its figures are the total's
    text = CliRunner().invoke(main, args).stdout
    assert f"per 100 turns: {rates.compactions:.1f} compactions ({rates.small_compactions:.1f} saving" in text


def test_thresholds_come_from_the_options_or_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "worker.yaml"
    config.write_text("budget:\n  trigger_fraction: 0.6\n  target_fraction: 0.4\n")
    args = ["replay", str(FIXTURE), "--context-window", "4000", "--json"]
    from_file = CliRunner().invoke(main, ["--config", str(config), *args])
    assert from_file.exit_code == 0, from_file.output
    (conversation,) = json.loads(from_file.stdout)["conversations"]
    assert (conversation["threshold"], conversation["target"]) == (1800, 1200)
    from_options = CliRunner().invoke(main, [*args, "--trigger", "0.7", "--target", "0.3"])
    (conversation,) = json.loads(from_options.stdout)["conversations"]
    assert (conversation["threshold"], conversation["target"]) == (2100, 900)


def test_a_target_over_the_trigger_is_refused() -> None:
    with pytest.raises(ReplayInputError, match="invalid thresholds"):
        with_thresholds(Settings(), 0.5, 0.6)
    result = CliRunner().invoke(main, ["replay", str(FIXTURE), "--trigger", "0.5", "--target", "0.6"])
    assert result.exit_code == 1
    assert "Error: invalid thresholds: Value error, target_fraction must be below" in result.stderr


def test_an_unwritable_plot_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    png = tmp_path / "missing" / "plot.png"
    result = CliRunner().invoke(main, ["replay", str(FIXTURE), "--plot", str(png)])
    assert result.exit_code == 1
    assert f"Error: cannot write {png}" in result.stderr


def test_bad_lines_are_named_and_the_rest_is_replayed(tmp_path: Path) -> None:
    """Issue 56: something replayed is a success (exit 0), with each bad line named on stderr."""
    shutil.copy(FIXTURE, tmp_path / "good.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"role": "user", "content": "hi"}\n{"role": "user", "content": \n')
    result = CliRunner().invoke(main, ["replay", str(tmp_path), "--context-window", "4000", "--json"])
    assert result.exit_code == 0, result.stderr
    assert f"skipped: {tmp_path / 'bad.jsonl'}:2: not JSON" in result.stderr
    data = json.loads(result.stdout)
    assert [c["name"] for c in data["conversations"]] == ["bad", "good"]
    assert [c["turns"] for c in data["conversations"]] == [1, 48]
    assert data["errors"] == [
        f"{tmp_path / 'bad.jsonl'}:2: not JSON: Expecting value: line 1 column 29 (char 28)"
    ]
    assert data["skipped_files"] == []


def test_the_project_s_data_folder_replays_with_one_line_for_what_is_no_conversation() -> None:
    """Issue 56: `replay tests/data/trajectories/` reads the runs in its subfolders, names the README
    and the licences on one line, and exits 0."""
    result = CliRunner().invoke(main, ["replay", str(TRAJECTORIES), "--json"])
    assert result.exit_code == 0, result.stderr
    skipped = [line for line in result.stderr.splitlines() if line.startswith("skipped")]
    assert skipped == [
        f"skipped 3 files not recognised as conversations (in {TRAJECTORIES}): "
        "README.md, mini-swe-agent/LICENSE.md, swe-agent/LICENSE"
    ]
    data = cli_output.Replay.model_validate_json(result.stdout)
    assert sorted(Path(c.source) for c in data.conversations) == [t.path for t in load_trajectories()]
    assert data.errors == []
    assert data.skipped_files == [
        str(TRAJECTORIES / p) for p in ("README.md", "mini-swe-agent/LICENSE.md", "swe-agent/LICENSE")
    ]


def test_many_unrecognised_files_are_named_ten_then_counted(tmp_path: Path) -> None:
    shutil.copy(FIXTURE, tmp_path / "session.jsonl")
    for i in range(12):
        (tmp_path / f"notes-{i:02}.txt").write_text("not a conversation\n")
    result = CliRunner().invoke(main, ["replay", str(tmp_path), "--context-window", "4000"])
    assert result.exit_code == 0, result.stderr
    names = ", ".join(f"notes-{i:02}.txt" for i in range(10))
    assert f"skipped 12 files not recognised as conversations (in {tmp_path}): {names}, and 2 more\n" in (
        result.stderr
    )


def test_nothing_to_replay_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "LICENSE").write_text("MIT License\n")
    result = CliRunner().invoke(main, ["replay", str(tmp_path / "empty.jsonl")])
    assert result.exit_code == 1
    assert f"skipped 1 file not recognised as a conversation (in {tmp_path}): empty.jsonl" in result.stderr
    assert "no conversation to replay" in result.stderr
    folder = CliRunner().invoke(main, ["replay", str(tmp_path)])
    assert folder.exit_code == 1
    assert "skipped 2 files not recognised as conversations" in folder.stderr


def test_the_summary_and_the_calls_table_give_one_peak(tmp_path: Path) -> None:
    """Issue 56: the row's peak is the product's peak prompt in the calls table, named the same in
    both, and defined once below them; the final context is never above it."""
    args = ["replay", str(FIXTURE), "--context-window", "4000"]
    data = cli_output.Replay.model_validate_json(CliRunner().invoke(main, [*args, "--json"]).stdout)
    (conversation,) = data.conversations
    ours = conversation.cache[0]
    assert ours.strategy == "compaction-worker"
    assert conversation.peak_tokens == ours.peak_tokens == data.total.peak_tokens
    assert conversation.final_tokens <= conversation.peak_tokens < conversation.threshold
    assert max(conversation.context_per_turn) > conversation.threshold  # what no call sent
    lines = CliRunner().invoke(main, args).stdout.splitlines()
    assert lines[0].endswith("peak prompt")
    assert lines[1].endswith(f" {conversation.peak_tokens}")
    (ours_row,) = [line for line in lines if line.strip().startswith("compaction-worker")]
    assert "peak prompt" in lines[lines.index(ours_row) - 1]
    assert f" {ours.peak_tokens} " in ours_row
    assert lines[-1] == f"peak prompt: {cli_output.PEAK_PROMPT}"
