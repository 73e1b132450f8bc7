"""File attachments fitted to a budget: the budget formula, previews, the fast path, cuts and drops."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_worker.budget.attachments import (
    FILE_FAST_PATH_SIZE,
    FILE_PREVIEW_CHARS,
    FILE_PREVIEW_MODE_SIZE,
    MIN_FILE_TOKENS,
    FittedFile,
    file_budget,
    fit_files,
    notices_cost,
)
from compaction_worker.budget.tokens import TokenCounter, counter_for
from compaction_worker.settings import BudgetSettings

_PIECES = re.compile(r"\w+|[^\w\s]")
GPT4O = counter_for("gpt-4o", BudgetSettings())
CLAUDE = counter_for("claude-sonnet-4-20250514", BudgetSettings())
TRUNCATED = re.compile(r"\[\.\.\. truncated: kept ([\d,]+) of ([\d,]+) tokens of (.+) \.\.\.\]")


def words(text: str) -> int:
    """A simple tokenizer: words and punctuation marks, one token each, plus newlines."""
    return len(_PIECES.findall(text)) + text.count("\n")


class Recording:
    """A counter that remembers the length of every text it counted."""

    def __init__(self, count: Callable[[str], int] = words) -> None:
        self.count = count
        self.lengths: list[int] = []

    def __call__(self, text: str) -> int:
        self.lengths.append(len(text))
        return self.count(text)


def prose(tokens: int, word: str = "word") -> str:
    """``tokens`` tokens under :func:`words`: lines of nine words and a newline."""
    line = " ".join([word] * 9) + "\n"
    return (line * (tokens // 10 + 1))[: len(line) * (tokens // 10)] + " ".join([word] * (tokens % 10))


def head_and_notice(fitted: FittedFile) -> tuple[str, str]:
    head, _, notice = fitted.text.rpartition("\n")
    return head, notice


def kept_tokens(fitted: FittedFile) -> int:
    """The kept tokens a truncated file's notice states."""
    match = TRUNCATED.fullmatch(head_and_notice(fitted)[1])
    assert match is not None
    return int(match.group(1).replace(",", ""))


def total(result: list[FittedFile], count: Callable[[str], int] = words) -> int:
    return sum(count(f.text) for f in result)


class TestFileBudget:
    """Reference 004 (file token budget): ``floor((window - current - max_output) * 0.6)``."""

    @pytest.mark.parametrize(
        ("window", "current", "max_output", "expected"),
        [
            (200_000, 50_000, 8_192, math.floor((200_000 - 50_000 - 8_192) * 0.6)),
            (128_000, 0, 4_096, 74_342),
            (10, 0, 0, 6),
            (1_001, 0, 1_000, 0),  # floor(0.6) of the one token left
        ],
    )
    def test_reference_formula(self, window: int, current: int, max_output: int, expected: int) -> None:
        """Reference 004 (file token budget): 60% of the window less the context and the output, floored."""
        assert expected == file_budget(window, current, max_output)

    @pytest.mark.parametrize(("current", "max_output"), [(900, 100), (2_000, 100), (0, 5_000)])
    def test_zero_when_nothing_remains(self, current: int, max_output: int) -> None:
        """Reference 004 (file token budget): 0 when the remaining tokens are zero or negative."""
        assert file_budget(1_000, current, max_output) == 0

    def test_fraction(self) -> None:
        """Reference 004 (file token budget): the fraction is FILE_READ_BUDGET_PERCENT, 0.6 unless given."""
        expected = (500, 1_000)

        assert expected == (file_budget(1_000, 0, 0, 0.5), file_budget(1_000, 0, 0, 1.0))

    def test_fraction_is_validated(self) -> None:
        """A fraction outside [0, 1] is a mistake, not a budget."""
        with pytest.raises(ValueError, match="fraction"):
            file_budget(1_000, 0, 0, 1.5)


class TestFits:
    def test_files_that_fit_are_unchanged(self) -> None:
        """Reference 004 (file token budget): within the budget every file is attached whole, in order."""
        files = {"b.txt": prose(300), "a.txt": prose(200), "c.txt": ""}

        result = fit_files(files, 500, words)

        assert [(f.name, f.text, f.action) for f in result] == [(n, t, "kept") for n, t in files.items()]
        assert [(f.original_tokens, f.tokens) for f in result] == [(300, 300), (200, 200), (0, 0)]

    def test_no_files(self) -> None:
        """Nothing to fit, nothing returned."""
        assert fit_files({}, 0, words) == []


class TestPreview:
    def test_file_over_five_megabytes_is_previewed(self) -> None:
        """Reference 004 (file token budget): over FILE_PREVIEW_MODE_SIZE, the first 2,000 characters and a notice."""
        text = "abc def\n" * (FILE_PREVIEW_MODE_SIZE // 8 + 1)
        count = Recording()

        [fitted] = fit_files({"big.log": text}, 10_000, count)
        head, notice = head_and_notice(fitted)

        assert fitted.action == "previewed"
        assert head == text[:FILE_PREVIEW_CHARS]
        assert notice == (
            f"[... preview: the first 2,000 of {len(text):,} characters of big.log, a file over 5 MB ...]"
        )
        assert fitted.original_tokens is None
        assert fitted.tokens == words(fitted.text)
        assert max(count.lengths) < FILE_PREVIEW_MODE_SIZE  # the whole file is never counted

    def test_size_is_utf8_bytes(self) -> None:
        """Reference 004 (file token budget): the 5 MB is of bytes: 2M CJK characters (6 MB) are previewed, 2M 'é' (4 MB) are not."""
        cjk, latin = "漢" * 2_000_000, "é" * 2_000_000

        result = fit_files({"cjk.txt": cjk, "latin.txt": latin}, 10_000_000, words)

        assert [f.action for f in result] == ["previewed", "kept"]

    def test_preview_shrinks_when_the_budget_is_short(self) -> None:
        """A preview over its share of the budget stays a preview, of fewer characters."""
        text = "abc def\n" * (FILE_PREVIEW_MODE_SIZE // 8 + 1)

        [fitted] = fit_files({"big.log": text}, 200, words)
        head, notice = head_and_notice(fitted)

        assert fitted.action == "previewed"
        assert 0 < len(head) < FILE_PREVIEW_CHARS
        assert text.startswith(head)
        assert notice.startswith(f"[... preview: the first {len(head):,} of ")
        assert words(fitted.text) <= 200


class TestFastPath:
    def test_small_files_that_fit_are_not_counted(self) -> None:
        """Reference 004 (file token budget): files under FILE_FAST_PATH_SIZE skip counting when their bound fits."""
        files = {"a.txt": prose(100), "b.txt": prose(50)}
        count = Recording()

        result = fit_files(files, 10_000, count, max_tokens_per_byte=1.0)

        assert count.lengths == []
        assert [(f.text, f.action, f.original_tokens) for f in result] == [
            (files["a.txt"], "kept", None),
            (files["b.txt"], "kept", None),
        ]
        # Not counted, so the tokens are the bound: UTF-8 bytes times tokens per byte.
        assert [f.tokens for f in result] == [len(t.encode()) for t in files.values()]

    def test_small_files_are_counted_when_their_bound_does_not_fit(self) -> None:
        """Reference 004 (file token budget): the fast path never lets the total exceed the budget."""
        files = {"a.txt": prose(100), "b.txt": prose(50)}  # about 5 bytes per token
        count = Recording()

        result = fit_files(files, 200, count, max_tokens_per_byte=1.0)

        assert sorted(count.lengths) == sorted(len(t) for t in files.values())
        assert [(f.action, f.tokens) for f in result] == [("kept", 100), ("kept", 50)]

    def test_without_a_bound_every_file_is_counted(self) -> None:
        """A count function of unknown density has no fast path."""
        count = Recording()

        fit_files({"a.txt": "tiny"}, 10_000, count)

        assert count.lengths == [4]

    def test_large_files_are_always_counted(self) -> None:
        """Reference 004 (file token budget): a file at or over 100 KB gets no fast path."""
        text = "x" * FILE_FAST_PATH_SIZE
        count = Recording()

        [fitted] = fit_files({"a.txt": text}, 10**9, count, max_tokens_per_byte=1.0)

        assert (count.lengths, fitted.tokens) == ([FILE_FAST_PATH_SIZE], 1)


class TestTruncation:
    def test_proportional_cut_within_budget_in_order(self) -> None:
        """Reference 004 (file token budget): over the budget, files are cut in proportion to their size."""
        files = {"small.txt": prose(1_000, "small"), "large.txt": prose(3_000, "large")}

        result = fit_files(files, 1_000, words)

        assert [f.name for f in result] == ["small.txt", "large.txt"]
        assert [f.action for f in result] == ["truncated", "truncated"]
        assert total(result) <= 1_000
        kept = [kept_tokens(f) for f in result]
        assert 2.5 < kept[1] / kept[0] < 3.5  # three times the size, three times the share
        assert sum(kept) > 900  # the notices take the rest, not waste
        for fitted, original in zip(result, files.values(), strict=True):
            assert original.startswith(head_and_notice(fitted)[0])
            assert fitted.tokens == words(fitted.text)

    def test_notice_names_the_file_and_the_counts(self) -> None:
        """Reference 004 (file token budget): the notice says what was kept of which file."""
        [fitted] = fit_files({"report.txt": prose(9_876)}, 1_300, words)
        head, notice = head_and_notice(fitted)

        match = TRUNCATED.fullmatch(notice)
        assert match is not None
        assert (match.group(2), match.group(3)) == ("9,876", "report.txt")
        assert int(match.group(1).replace(",", "")) == words(head)
        assert fitted.original_tokens == 9_876

    def test_head_ends_at_a_line_break_near_the_cut(self) -> None:
        """A head ends at a line break when one is close to the cut, not mid-line."""
        [fitted] = fit_files({"a.txt": prose(5_000)}, 500, words)

        assert head_and_notice(fitted)[0].endswith("word")
        assert fitted.text.count("\n") == head_and_notice(fitted)[0].count("\n") + 1

    def test_tiny_share_is_dropped(self) -> None:
        """Reference 004 (file token budget): a file whose share is too small to be useful is dropped, with a notice."""
        files = {"big.txt": prose(10_000), "small.txt": prose(300)}

        big, small = fit_files(files, 2_000, words)

        # Its proportional share would be about 2,000 * 300 / 10,300 = 58 tokens, under 64.
        assert MIN_FILE_TOKENS > 2_000 * 300 // 10_300
        assert small.action == "dropped"
        assert (
            small.text
            == f"[... dropped: small.txt ({len(files['small.txt']):,} characters) did not fit the file budget ...]"
        )
        assert (small.original_tokens, small.tokens) == (300, words(small.text))
        assert big.action == "truncated"
        assert words(big.text) + words(small.text) <= 2_000

    def test_budget_zero_drops_everything(self) -> None:
        """Reference 004 (file token budget): with no room left, every file is dropped and only its notice stays."""
        files = {"a.txt": prose(500), "b.txt": prose(50)}

        result = fit_files(files, 0, words)

        assert [f.action for f in result] == ["dropped", "dropped"]
        assert all(f.text.startswith(f"[... dropped: {f.name} (") for f in result)

    def test_file_cheaper_than_its_notice_is_kept(self) -> None:
        """A file that costs no more than its dropped notice is kept whole: dropping it would cost more."""
        result = fit_files({"a.txt": prose(500), "flag": "on"}, 0, words)

        assert [f.action for f in result] == ["dropped", "kept"]

    def test_deterministic(self) -> None:
        """The same input gives the same output."""
        files = {f"f{i}.txt": prose(100 * (i + 1)) for i in range(6)}

        assert fit_files(files, 900, words) == fit_files(files, 900, words)


COUNTERS: list[tuple[Callable[[str], int], float]] = [
    (words, 1.0),
    (GPT4O.text, GPT4O.multiplier),
    (CLAUDE.text, CLAUDE.multiplier),
]
NAMES = st.text(alphabet="abcdefghij._-0123456789", min_size=1, max_size=12)
TEXTS = st.one_of(
    st.text(max_size=400),
    st.lists(st.text(max_size=60), max_size=80).map("\n".join),
    st.builds(
        lambda w, n: (w + " ") * n, st.sampled_from(["a", "word", "漢字", "🙂"]), st.integers(0, 2_000)
    ),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    files=st.dictionaries(NAMES, TEXTS, max_size=6),
    budget=st.integers(0, 4_000),
    counter=st.sampled_from(range(len(COUNTERS))),
    fast=st.booleans(),
)
def test_result_fits_and_keeps_prefixes(files: dict[str, str], budget: int, counter: int, fast: bool) -> None:
    """Reference 004 (file token budget): the total never exceeds the budget once the notices fit; kept text is the file's own prefix."""
    count, bound = COUNTERS[counter]

    result = fit_files(files, budget, count, max_tokens_per_byte=bound if fast else None)

    assert [f.name for f in result] == list(files)
    if budget >= notices_cost(files, count):
        assert total(result, count) <= budget
        assert sum(f.tokens for f in result) <= budget
    for fitted, original in zip(result, files.values(), strict=True):
        assert fitted.tokens >= count(fitted.text)  # exact, or the fast path's bound
        if fitted.action == "kept":
            assert fitted.text == original
        elif fitted.action == "truncated":
            head, notice = head_and_notice(fitted)
            assert original.startswith(head)
            assert 0 < len(head) < len(original)
            assert TRUNCATED.fullmatch(notice) is not None
        else:
            assert fitted.action == "dropped"
            assert fitted.text.startswith(f"[... dropped: {fitted.name} (")


def test_counter_bound_holds() -> None:
    """A TokenCounter never counts more than its multiplier per UTF-8 byte: the fast path's premise."""
    texts = ["", "a", "🙂", "漢字" * 50, " " * 1_000, "x\n" * 300, "é" * 77]
    counters: list[TokenCounter] = [GPT4O, CLAUDE]

    for counter in counters:
        for text in texts:
            assert counter.text(text) <= math.ceil(len(text.encode()) * counter.multiplier)
