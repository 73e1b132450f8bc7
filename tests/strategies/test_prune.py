"""Tool-output pruning (strategies/prune.py), and the pipeline stopping after it."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_worker.contracts.events import Outcome
from compaction_worker.contracts.history import EffectiveHistory, render
from compaction_worker.strategies import StageKind, provider_problems
from compaction_worker.strategies.pipeline import build_stages, compact
from compaction_worker.strategies.prune import prune_tool_outputs
from compaction_worker.summaries.contract import SummaryRequest, SummaryResult
from compaction_worker.testing import Chat

from .helpers import COUNTER, IMAGE, by_n, chunk, context, words

# Four 300-word reads (304 tokens each) at n=3, 5, 7, 9, then a user message at n=10.
READS = (3, 5, 7, 9)
SAVED_PER_READ = 304 - 19  # the placeholder message is 15 words plus 4 overhead


def four_reads(*, last_user: bool = True) -> Chat:
    chat = Chat().user("read the files")
    for k in range(4):
        chat.tool(f"c{k}", "read_file", {"path": f"f{k}.py"}, words(300, f"f{k}w"))
    return chat.user("thanks") if last_user else chat


def settings(**kw: Any) -> dict[str, Any]:
    """Budget 700 tokens (two reads), no minimum saving, unless overridden."""
    return {"prune_protect_tokens": 700, "prune_minimum_savings_tokens": 0, **kw}


def pruned(out_entries: Any) -> list[int]:
    return [e.n for e in out_entries if e.edit == "pruned"]


class TestRecency:
    def test_recent_outputs_protected_up_to_the_budget(self) -> None:
        """Reference 004 (stage 1): walking newest first, outputs within the budget stay, older ones are cleared."""
        out = prune_tool_outputs(four_reads().draft(), context(**settings()))
        assert pruned(out.draft.entries) == [3, 5]
        assert by_n(out.draft)[7].message == four_reads().entries[6].message

    def test_the_output_that_crosses_the_budget_is_cleared_and_so_is_everything_older(self) -> None:
        """Recency decides: once an output does not fit, no older output is protected, however small."""
        chat = Chat().user().tool("s", "read_file", {"path": "s.py"}, words(100, "s"))
        for k in range(3):
            chat.tool(f"c{k}", "read_file", {"path": f"f{k}.py"}, words(300, f"f{k}w"))
        chat.user()
        # Budget 700: the two newest (608) fit, the 304-token one would not, the 104-token one would.
        out = prune_tool_outputs(chat.draft(), context(**settings()))
        assert pruned(out.draft.entries) == [3, 5]

    def test_budget_is_the_smaller_of_tokens_and_window_fraction(self) -> None:
        """A 0.0035 share of a 100k window (350 tokens) protects only the newest read, though 40k tokens would protect all."""
        ctx = context(**settings(prune_protect_tokens=40_000, prune_protect_fraction=0.0035))
        out = prune_tool_outputs(four_reads().draft(), ctx)
        assert pruned(out.draft.entries) == [3, 5, 7]

    def test_current_step_results_are_kept_even_over_the_budget(self) -> None:
        """Reference 002 (keep recent): the parallel results the agent is acting on stay; older ones go."""
        chat = four_reads(last_user=False)
        chat.calls(("p1", "read_file", {"path": "a.py"}), ("p2", "run_command", {"command": "make"}))
        chat.result("p1", words(300, "a")).result("p2", words(300, "m"))
        out = prune_tool_outputs(chat.draft(), context(**settings(prune_protect_tokens=100)))
        assert pruned(out.draft.entries) == [3, 5, 7, 9]
        assert [e.edit for e in out.draft.entries[-2:]] == [None, None]

    def test_a_user_message_ends_the_current_step(self) -> None:
        """Once the user has spoken again, the latest results are ordinary old outputs under the budget."""
        out = prune_tool_outputs(four_reads().draft(), context(**settings(prune_protect_tokens=100)))
        assert pruned(out.draft.entries) == [3, 5, 7, 9]


class TestWhatIsKept:
    def test_protected_tools_are_never_pruned_and_use_no_budget(self) -> None:
        """Reference 004: outputs of protected tools ("skill") stay, looked up by their call's tool name."""
        chat = Chat().user()
        for k in range(2):
            chat.tool(f"c{k}", "read_file", {"path": f"f{k}.py"}, words(300, f"f{k}w"))
        chat.tool("k", "skill", {"name": "deploy"}, words(300, "k")).tool("k2", "skill", {}, words(300, "j"))
        chat.user()
        # Budget 700: had the two newest (skill) outputs counted, both reads would be cleared.
        out = prune_tool_outputs(chat.draft(), context(**settings()))
        assert pruned(out.draft.entries) == []
        assert out.report is None
        assert prune_tool_outputs(chat.draft(), context(**settings(protected_tools=[]))).report is not None

    def test_protected_tool_names_come_from_settings(self) -> None:
        """A deployment's own protected tools are honoured, and "skill" is no longer special."""
        chat = Chat().user().tool("k", "skill", {}, words(300, "k")).tool("m", "memory", {}, words(300, "m"))
        chat.tool("r", "read_file", {"path": "r.py"}, words(300, "r")).user()
        out = prune_tool_outputs(
            chat.draft(), context(**settings(protected_tools=["memory"], prune_protect_tokens=0))
        )
        assert pruned(out.draft.entries) == [3, 7]

    def test_pinned_outputs_are_untouched(self) -> None:
        """A pinned tool result keeps its content and gets no edit."""
        chat = (
            Chat().user().calls(("c0", "read_file", {"path": "a.py"})).result("c0", words(300), pinned=True)
        )
        chat.tool("c1", "read_file", {"path": "b.py"}, words(300, "b")).user()
        out = prune_tool_outputs(chat.draft(), context(**settings(prune_protect_tokens=0)))
        assert pruned(out.draft.entries) == [5]
        assert by_n(out.draft)[3] == chat.entries[2]

    def test_short_outputs_are_kept(self) -> None:
        """An output the placeholder would barely shrink (less than 30%) stays."""
        chat = Chat().user().tool("c0", "read_file", {"path": "a.py"}, words(20)).user()
        out = prune_tool_outputs(chat.draft(), context(**settings(prune_protect_tokens=0)))
        assert out.report is None

    def test_placeholders_from_deduplication_are_not_pruned_again(self) -> None:
        """An output already replaced by a placeholder is skipped."""
        chat = Chat().user().calls(("c0", "read_file", {"path": "a.py"}))
        chat.result("c0", "[File a.py - refer to the latest read below]", edit="deduplicated").user()
        out = prune_tool_outputs(chat.draft(), context(**settings(prune_protect_tokens=0)))
        assert out.report is None


class TestMinimumSaving:
    def test_no_change_below_the_minimum(self) -> None:
        """Reference 004: when the saving is under the minimum, the draft is returned unchanged, without a report."""
        draft = four_reads().draft()
        out = prune_tool_outputs(
            draft, context(**settings(prune_minimum_savings_tokens=2 * SAVED_PER_READ + 1))
        )
        assert out.report is None
        assert out.draft is draft

    def test_applies_at_exactly_the_minimum(self) -> None:
        """A saving equal to the minimum is enough."""
        out = prune_tool_outputs(
            four_reads().draft(), context(**settings(prune_minimum_savings_tokens=2 * SAVED_PER_READ))
        )
        assert out.report is not None

    def test_minimum_is_the_smaller_of_tokens_and_window_fraction(self) -> None:
        """With 20,000 tokens required but 0.5% of a 100k window (500) as the fraction, 570 saved is enough."""
        ctx = context(**settings(prune_minimum_savings_tokens=20_000, prune_minimum_savings_fraction=0.005))
        assert prune_tool_outputs(four_reads().draft(), ctx).report is not None

    def test_defaults_protect_40000_tokens_and_need_20000_saved(self) -> None:
        """Reference 004 (pruneProtectTokens 40,000, pruneMinimumSavings 20,000): the defaults, in a window large enough for both."""

        def reads(count: int) -> Chat:
            chat = Chat().user("read the files")
            for k in range(count):
                chat.tool(f"c{k}", "read_file", {"path": f"f{k}.py"}, words(5_000, f"f{k}w"))
            return chat.user("thanks")

        # 5,004 tokens a read: the newest seven (35,028) are protected, the eighth would pass 40,000.
        two_old = prune_tool_outputs(reads(9).draft(), context(1_000_000))
        assert two_old.report is None  # about 10,000 tokens saved: under the minimum
        five_old = prune_tool_outputs(reads(12).draft(), context(1_000_000))
        assert pruned(five_old.draft.entries) == [3, 5, 7, 9, 11]


class TestEdits:
    def test_placeholder_and_exact_saving(self) -> None:
        """References 002 and 004: the content becomes a placeholder naming the tool and tokens; the report's saving is exact."""
        draft = four_reads().draft()
        ctx = context(**settings())
        out = prune_tool_outputs(draft, ctx)
        entry = by_n(out.draft)[3]
        assert entry.message["content"] == (
            "[Old tool result cleared: read_file, 304 tokens; the full output is preserved in the transcript]"
        )
        assert entry.tokens == COUNTER.message(entry.message) == 19
        assert out.report is not None
        assert out.report.stage == "prune"
        assert out.report.tokens_saved == 2 * SAVED_PER_READ == ctx.tokens(draft) - ctx.tokens(out.draft)
        assert out.report.detail == "2 tool outputs"

    def test_a_cleared_output_keeps_its_errors_and_commands_verbatim(self) -> None:
        """The placeholder lists the output's artifact ledger, errors first, within prune_keep_artifact_tokens."""
        log = "\n".join(
            [
                "$ pytest tests/test_orders.py -k total -x",
                words(300, "log"),
                "E       ValueError: order 4412 total is negative",
                "see src/orders/total.py",
            ]
        )
        chat = Chat().user().tool("r", "run_command", {"command": "pytest"}, log).user()
        out = prune_tool_outputs(chat.draft(), context(**settings(prune_protect_tokens=0)))
        content = str(by_n(out.draft)[3].message["content"])
        assert content.startswith("[Old tool result cleared: run_command,")
        kept = content.split("Kept verbatim from it:\n", 1)[1].splitlines()
        assert kept[0] == "- error: ValueError: order 4412 total is negative"
        assert "- cmd: pytest tests/test_orders.py -k total -x" in kept
        assert "- path: src/orders/total.py" in kept
        none = prune_tool_outputs(
            chat.draft(), context(**settings(prune_protect_tokens=0, prune_keep_artifact_tokens=0))
        )
        assert "Kept verbatim" not in str(by_n(none.draft)[3].message["content"])

    def test_parallel_results_are_named_by_their_own_calls(self) -> None:
        """Two results of one assistant message each name the tool of the call with their id."""
        chat = (
            Chat().user().calls(("a", "read_file", {"path": "x.py"}), ("b", "run_command", {"command": "ls"}))
        )
        chat.result("a", words(300, "x")).result("b", words(300, "y")).user()
        out = prune_tool_outputs(chat.draft(), context(**settings(prune_protect_tokens=0)))
        contents = [str(e.message["content"]) for e in out.draft.entries if e.role == "tool"]
        assert contents[0].startswith("[Old tool result cleared: read_file,")
        assert contents[1].startswith("[Old tool result cleared: run_command,")

    def test_list_content_with_an_image_is_cleared_whole(self) -> None:
        """A text-and-image output becomes one placeholder string that counts the image; tokens are re-counted."""
        chat = Chat().user().tool("s", "screenshot", {}, [{"type": "text", "text": words(50)}, IMAGE]).user()
        out = prune_tool_outputs(chat.draft(), context(**settings(prune_protect_tokens=0)))
        entry = by_n(out.draft)[3]
        assert entry.message["content"] == (
            "[Old tool result cleared: screenshot, 154 tokens and 1 image; "
            "the full output is preserved in the transcript]"
        )
        assert entry.tokens == COUNTER.message(entry.message)

    def test_ordinals_pairing_and_other_fields_are_intact(self) -> None:
        """Reference 002 (pairing stays intact): only content changes: ordinals, roles, tool_call_ids stay, and the history renders valid for providers."""
        draft = four_reads().draft()
        out = prune_tool_outputs(draft, context(**settings(prune_protect_tokens=0)))
        assert [(e.n, e.seq, e.role, e.message.get("tool_call_id")) for e in out.draft.entries] == [
            (e.n, e.seq, e.role, e.message.get("tool_call_id")) for e in draft.entries
        ]
        assert provider_problems(render(EffectiveHistory((), out.draft.entries))) == []

    def test_summary_chunks_pass_through(self) -> None:
        """The draft's summary chunks are kept as they are."""
        chat = Chat(start=2).user().tool("c0", "read_file", {"path": "a.py"}, words(300)).user()
        draft = chat.draft((chunk(),))
        out = prune_tool_outputs(draft, context(**settings(prune_protect_tokens=0)))
        assert out.report is not None
        assert out.draft.chunks == draft.chunks

    def test_idempotent(self) -> None:
        """Pruning a pruned draft changes nothing and reports nothing."""
        ctx = context(**settings())
        once = prune_tool_outputs(four_reads().draft(), ctx)
        twice = prune_tool_outputs(once.draft, ctx)
        assert twice.report is None
        assert twice.draft == once.draft


class TestReusedIds:
    """Runtimes that number calls per turn (``call_0`` in every assistant message), issue 9."""

    def test_eight_large_outputs_are_pruned_and_reported(self) -> None:
        """An agent loop reading eight files, each as call_0, 15k tokens each: the current step's
        id protected every result and pruning never fired; now only the step's own result
        and what fits the budget stay, and the report says how much went."""
        chat = Chat().user("read the eight modules")
        for k in range(8):
            chat.tool("call_0", "read_file", {"path": f"/src/m{k}.py"}, words(15_000, f"m{k}w"))
        ctx = context(window=200_000)  # default settings: protect 40,000 tokens, need 20,000 saved
        out = prune_tool_outputs(chat.draft(), ctx)
        assert pruned(out.draft.entries) == [3, 5, 7, 9, 11, 13]
        assert out.report is not None
        assert out.report.detail == "6 tool outputs"
        assert out.report.tokens_saved == ctx.tokens(chat.draft()) - ctx.tokens(out.draft) > 6 * 14_000
        assert [e.edit for e in out.draft.entries[-4:]] == [None, None, None, None]

    def test_a_placeholder_names_its_own_calls_tool(self) -> None:
        """Each cleared result names the tool of its own turn's call_0, not the latest call_0's."""
        chat = Chat().user().tool("call_0", "run_command", {"command": "make"}, words(300, "m"))
        chat.user().tool("call_0", "read_file", {"path": "a.py"}, words(300, "a")).user()
        out = prune_tool_outputs(chat.draft(), context(**settings(prune_protect_tokens=0)))
        contents = [str(e.message["content"]) for e in out.draft.entries if e.role == "tool"]
        assert contents[0].startswith("[Old tool result cleared: run_command,")
        assert contents[1].startswith("[Old tool result cleared: read_file,")

    def test_a_protected_tool_stays_protected_when_its_id_is_reused(self) -> None:
        """A skill output keeps its protection though a later read_file call is also call_0."""
        chat = Chat().user().tool("call_0", "skill", {"name": "deploy"}, words(300, "k"))
        chat.user().tool("call_0", "read_file", {"path": "a.py"}, words(300, "a")).user()
        out = prune_tool_outputs(chat.draft(), context(**settings(prune_protect_tokens=0)))
        assert pruned(out.draft.entries) == [6]
        assert by_n(out.draft)[3] == chat.entries[2]

    def test_duplicate_ids_in_one_step_are_all_the_current_step(self) -> None:
        """Two parallel calls both named call_0 in the current step: both results stay."""
        chat = Chat().user().tool("call_0", "read_file", {"path": "old.py"}, words(300, "o"))
        chat.calls(("call_0", "read_file", {"path": "a.py"}), ("call_0", "read_file", {"path": "b.py"}))
        chat.result("call_0", words(300, "a")).result("call_0", words(300, "b"))
        out = prune_tool_outputs(chat.draft(), context(**settings(prune_protect_tokens=0)))
        assert pruned(out.draft.entries) == [3]


class FailingSummarizer:
    """A summarizer the test must never reach."""

    name = "must-not-be-called"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        pytest.fail("the summarizer was called although pruning reached the target")


class TestPipeline:
    def test_stages_in_cost_order_and_switchable(self) -> None:
        """References 002 and 004 (stages in cost order, each switchable): the enabled no-LLM stages run prune, deduplicate, truncate_oversized, in that order, before the summary and the window."""
        ctx = context()
        assert [s.name for s in build_stages(ctx.settings)] == [
            "prune",
            "deduplicate",
            "truncate_oversized",
            "summarize",
            "truncate",
        ]
        assert [s.kind for s in build_stages(ctx.settings)][:3] == [StageKind.EDIT] * 3
        off = context(prune=False, truncate_oversized=False, summarize=False, sliding_window=False).settings
        assert [s.name for s in build_stages(off)] == ["deduplicate"]

    async def test_stops_after_pruning_when_that_reaches_the_target(self) -> None:
        """Reference 004 and docs/design.md (cheapest first, stop when the target is met): pruning alone suffices, so no LLM call."""
        draft = four_reads().draft()
        before = context().tokens(draft)
        ctx = context(target=before - 2 * SAVED_PER_READ, **settings())
        result = await compact(
            EffectiveHistory((), draft.entries),
            ctx.limits,
            [FailingSummarizer()],
            COUNTER,
            settings=ctx.settings,
        )
        assert result.outcome is Outcome.COMPACTED
        assert result.stages == ("prune",)
        assert result.tokens_after == before - 2 * SAVED_PER_READ
        assert pruned(result.draft.entries) == [3, 5]
