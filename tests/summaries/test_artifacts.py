"""The verbatim artifact ledger: each kind, de-duplication, ordering and the token budget."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compaction_worker.summaries import artifacts, mentions
from compaction_worker.summaries.artifacts import (
    KINDS,
    MAX_ITEM_CHARS,
    extract_artifacts,
    item_core,
    item_kind,
    scan_items,
)

_PIECES = re.compile(r"\w+|[^\w\s]")
HANG_SECONDS = 120
"""A hang guard, not a timing (none is asserted): catastrophic backtracking would not end."""


def count(text: str) -> int:
    """A simple tokenizer: words and punctuation marks, one token each, plus newlines."""
    return len(_PIECES.findall(text)) + text.count("\n")


_CHILD = f"""
import json, re, sys
from compaction_worker.summaries.artifacts import extract_artifacts
pieces = re.compile({_PIECES.pattern!r})
items = extract_artifacts(json.load(sys.stdin), 500, lambda t: len(pieces.findall(t)) + t.count("\\n"))
json.dump(items, sys.stdout)
"""


def ledger_in_a_child(messages: list[dict[str, Any]]) -> list[str]:
    """The ledger of ``messages`` within 500 tokens (``count``), computed in a child process that is
    killed after HANG_SECONDS: a regex that backtracks holds the GIL, so no in-process guard fires."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=json.dumps(messages),
        capture_output=True,
        text=True,
        timeout=HANG_SECONDS,
        check=True,
    )
    items: list[str] = json.loads(done.stdout)
    return items


def count_costly_newlines(text: str) -> int:
    """A tokenizer under which joining items costs more than their sum (newlines cost 4)."""
    return len(_PIECES.findall(text)) + 4 * text.count("\n")


def ledger(*texts: str, budget: int = 10_000) -> list[str]:
    """The ledger of one user message per text."""
    return extract_artifacts([{"role": "user", "content": t} for t in texts], budget, count)


def patterned(items: list[str]) -> list[str]:
    """The items of the pattern kinds: all but the distinctive terms found by their shape."""
    return [item for item in items if item_kind(item) != "term"]


def tool_call(name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    """An assistant message with one tool call."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": name, "arguments": raw}}],
    }


class TestPaths:
    """File paths: unix, windows, relative with a directory or an extension."""

    def test_unix_absolute_and_relative_paths(self) -> None:
        """Absolute, ./, ../, ~/ and nested relative paths are kept verbatim."""
        items = ledger("edit /etc/hosts, ./run.sh, ../lib/util.c, ~/.bashrc and src/app/main.py now")
        assert items == [
            "path: /etc/hosts",
            "path: ./run.sh",
            "path: ../lib/util.c",
            "path: ~/.bashrc",
            "path: src/app/main.py",
        ]

    def test_windows_path(self) -> None:
        """A drive-letter path keeps its backslashes."""
        assert ledger(r"Saved to C:\Users\dev\report.txt.") == [r"path: C:\Users\dev\report.txt"]

    def test_bare_file_names_need_a_known_extension(self) -> None:
        """README.md and poetry.lock are files; e.g., and/or, TCP/IP and self.lock are not."""
        items = ledger("See README.md and poetry.lock, e.g. and/or TCP/IP, self.lock np.log example.com")
        assert patterned(items) == ["path: README.md", "path: poetry.lock"]

    def test_line_numbers_and_test_ids_are_stripped(self) -> None:
        """ "src/app.py:12:5" and "tests/test_x.py::test_y" are recorded as their file."""
        assert patterned(ledger("at src/app.py:12:5 in tests/test_x.py::test_y")) == [
            "path: src/app.py",
            "path: tests/test_x.py",
        ]

    def test_paths_in_urls_are_not_paths(self) -> None:
        """The path part of a URL is not also recorded as a file path."""
        assert ledger("docs at https://example.com/docs/setup.md") == [
            "url: https://example.com/docs/setup.md"
        ]


class TestCommands:
    """Shell commands: "$ " lines, shell code blocks, command arguments of tool calls."""

    def test_dollar_prompt_lines(self) -> None:
        """A line starting with "$ " is a command, without the prompt."""
        assert "cmd: pytest -q tests/" in ledger("Run it:\n$ pytest -q tests/\nthen report.")

    def test_bash_block_lines_but_not_comments_or_other_languages(self) -> None:
        """Lines of a ```bash block are commands; comments and ```python lines are not."""
        text = "```bash\n# set up\npip install -e .\nmake test\n```\n```python\nprint('hi')\n```"
        items = ledger(text)
        assert [i for i in items if i.startswith("cmd:")] == ["cmd: pip install -e .", "cmd: make test"]

    def test_console_block_takes_only_prompted_lines(self) -> None:
        """In a ```console block the "$ " lines are commands and the output is not."""
        items = ledger("```console\n$ ls -la\ntotal 0\n```")
        assert [i for i in items if i.startswith("cmd:")] == ["cmd: ls -la"]

    def test_tool_call_command_argument(self) -> None:
        """The command/cmd argument of a tool call is a command; its other strings are scanned."""
        messages = [tool_call("bash", {"command": "git status --short", "cwd": "services/api/"})]
        assert extract_artifacts(messages, 1000, count) == ["cmd: git status --short", "path: services/api/"]

    def test_tool_call_command_as_argv_list(self) -> None:
        """A command given as an argv list is joined with spaces."""
        messages = [tool_call("exec", {"cmd": ["docker", "compose", "up", "-d"]})]
        assert extract_artifacts(messages, 1000, count) == ["cmd: docker compose up -d"]

    def test_tool_call_with_invalid_json_arguments_is_scanned_as_text(self) -> None:
        """Arguments that are not JSON are still scanned for artifacts."""
        messages = [tool_call("read", "{path: src/main.rs")]
        assert extract_artifacts(messages, 1000, count) == ["path: src/main.rs"]


class TestErrors:
    """Error lines: exceptions, CLI errors, failed tests, traceback ends, exit codes."""

    def test_error_kinds(self) -> None:
        """Each common error shape is recorded as its whole line."""
        text = "\n".join(
            [
                "KeyError: 'user_id'",
                "error: could not compile `app` due to 2 previous errors",
                "fatal: not a git repository (or any of the parent directories): .git",
                "FAILED tests/test_api.py::test_login - AssertionError: 401 != 200",
                "npm ERR! code ERESOLVE",
                "bash: jq: command not found",
                "Process exited with code 137",
            ]
        )
        errors = [i for i in ledger(text) if i.startswith("error:")]
        assert errors == [f"error: {line}" for line in text.splitlines()]

    def test_traceback_last_line(self) -> None:
        """The line ending a traceback is the error, even when it has no Error suffix."""
        text = (
            "Traceback (most recent call last):\n"
            '  File "/srv/app/main.py", line 3, in <module>\n'
            "    run()\n"
            "SystemExit: 2\n"
        )
        items = ledger(text)
        assert "error: SystemExit: 2" in items
        assert "path: /srv/app/main.py" in items

    def test_success_exit_code_and_prose_are_not_errors(self) -> None:
        """Exit code 0 and a sentence that mentions an error type are not error lines."""
        items = ledger("Process finished with exit code 0\nA KeyError is raised when a key is missing.")
        assert not [i for i in items if i.startswith("error:")]

    def test_pytest_failure_lines_keep_the_exception_without_the_prefix(self) -> None:
        """pytest's "E   <exception>" lines give the exception verbatim; its other E lines do not."""
        output = "E       KeyError: 'order_id'\nE        +  where 1 = total()\nE       assert 1 == 2"
        assert ledger(output) == ["error: KeyError: 'order_id'"]

    def test_exceptions_from_an_errors_module(self) -> None:
        """Exception classes not named *Error count when an errors module qualifies them."""
        items = ledger(
            "psycopg.errors.UndefinedColumn: column orders.customer_id does not exist\n"
            "sqlalchemy.exc.NoResultFound: No row was found when one was required\n"
            "app.config.Settings: loaded from the environment"
        )
        assert patterned(items) == [
            "error: psycopg.errors.UndefinedColumn: column orders.customer_id does not exist",
            "error: sqlalchemy.exc.NoResultFound: No row was found when one was required",
        ]


class TestUrlsAndIds:
    """URLs and identifiers."""

    def test_url_without_trailing_punctuation(self) -> None:
        """A URL at the end of a sentence loses the full stop, keeps its query."""
        assert ledger("Docs: https://docs.example.com/a/b?x=1&y=2.") == [
            "url: https://docs.example.com/a/b?x=1&y=2"
        ]

    def test_identifier_kinds(self) -> None:
        """UUIDs, git SHAs, ticket keys, CVEs and semantic versions are ids."""
        items = ledger(
            "uuid 123e4567-e89b-12d3-a456-426614174000 sha 3f2a9c1 ticket PAY-4821 CVE-2024-3094 v2.14.0"
        )
        assert items == [
            "id: 123e4567-e89b-12d3-a456-426614174000",
            "id: 3f2a9c1",
            "id: PAY-4821",
            "id: CVE-2024-3094",
            "id: v2.14.0",
        ]

    def test_identifier_look_alikes(self) -> None:
        """UTF-8, SHA-256, a hex word without digits, a number and an IP address are not ids."""
        assert patterned(ledger("UTF-8 SHA-256 deadbeef 12345678 127.0.0.1")) == []


def said(text: str, role: str = "assistant") -> list[str]:
    """The ledger of one message."""
    return extract_artifacts([{"role": role, "content": text}], 10_000, count)


class TestProse:
    """Issue 9: artifacts written in sentences, as assistants and users mention them."""

    def test_inline_code_that_looks_like_a_command(self) -> None:
        """A known program, a script by path, or any program with flags; not an identifier or a phrase."""
        items = said(
            "I ran `kubectl rollout restart deployment/svc-12 -n prod`, then `./scripts/seed.sh staging`, "
            "`sudo systemctl restart nginx` and `frobnicate --all`; `user_id`, `foo bar` and `x = 5` are code."
        )
        assert [i for i in items if i.startswith("cmd:")] == [
            "cmd: kubectl rollout restart deployment/svc-12 -n prod",
            "cmd: ./scripts/seed.sh staging",
            "cmd: sudo systemctl restart nginx",
            "cmd: frobnicate --all",
        ]

    def test_errors_in_the_middle_of_a_line(self) -> None:
        """Exceptions with their message, error:/failed: clauses and errno names with their address."""
        items = said(
            "The client then saw error: ECONNREFUSED 10.0.3.7:5012 twice. The worker crashed with "
            "ValueError: shard 7 has no leader, then recovered. The migration failed: lock timeout on "
            "table orders. Node said connect ECONNRESET 10.0.0.9:443 again."
        )
        assert [i for i in items if i.startswith("error:")] == [
            "error: error: ECONNREFUSED 10.0.3.7:5012 twice",
            "error: ValueError: shard 7 has no leader",
            "error: failed: lock timeout on table orders",
            "error: ECONNRESET 10.0.0.9:443",
        ]

    def test_ids_inside_punctuation(self) -> None:
        """Ticket keys in brackets or with a possessive, commit SHAs and UUIDs in sentences."""
        items = said(
            "Opened (INC-40003); INC-40004's fix is in commit 3f9a2c1d7e4b, see [PAY-12]: "
            "request 123e4567-e89b-12d3-a456-426614174000 failed."
        )
        assert [i for i in items if i.startswith("id:")] == [
            "id: INC-40003",
            "id: INC-40004",
            "id: 3f9a2c1d7e4b",
            "id: PAY-12",
            "id: 123e4567-e89b-12d3-a456-426614174000",
        ]

    def test_hosts_with_ports(self) -> None:
        """An IP, a host name or localhost with a port; not a time of day or a ratio."""
        items = patterned(said("Use 10.0.3.7:5012, db-1.internal:5432 or localhost:8080 at 12:30, not 3:1."))
        assert items == ["host: 10.0.3.7:5012", "host: db-1.internal:5432", "host: localhost:8080"]

    def test_kebab_and_snake_case_names(self) -> None:
        """snake_case always; kebab-case with a digit, three parts, in code, or next to a resource noun."""
        items = said(
            "The feature flag enable_fast_checkout is on, the cluster payments-east and the "
            "acme-logs-archive bucket are new, svc-12 restarted, `orders-api` too, DATABASE_URL is set."
        )
        assert [i for i in items if i.startswith("name:")] == [
            "name: enable_fast_checkout",
            "name: payments-east",
            "name: acme-logs-archive",
            "name: svc-12",
            "name: orders-api",
            "name: DATABASE_URL",
        ]

    def test_facts_stated_by_the_user(self) -> None:
        """Numbers with units, dates and versions the user states, with the words that say what they are."""
        text = (
            "Set the memory limit to 512 MiB before 2025-03-14; we run Postgres 15.4 and v2.3 of the "
            "client, the budget is $1,200 and uptime 99.9% by March 5, 2025."
        )
        assert [i for i in said(text, "user") if i.startswith("fact:")] == [
            "fact: memory limit to 512 MiB",
            "fact: before 2025-03-14",
            "fact: we run Postgres 15.4",
            "fact: and v2.3",
            "fact: the budget is $1,200",
            "fact: and uptime 99.9%",
            "fact: by March 5, 2025",
        ]
        assert not [i for i in said(text, "assistant") if i.startswith("fact:")]

    def test_ordinary_prose_holds_no_artifact(self) -> None:
        """Hyphenated English, times, ratios, plain numbers and capitalised words before numbers are prose."""
        text = (
            "Our up-to-date, well-known and end-to-end tests are state-of-the-art; a read-only, long-term, "
            "real-time plan. At 10:30 we met 3 people, e.g. Anna; it was 3.5 times faster, a 3:1 ratio. "
            "Chapter 3 says the error rate fell. A KeyError is raised when a key is missing. We had "
            "`the usual` talk about failure modes and a follow-up on the x-ray."
        )
        assert patterned(said(text, "user")) == []
        assert patterned(said(text, "assistant")) == []
        # Its distinctive terms are those of any shape (a time, a ratio, a name, a class), not
        # the compounds of ordinary words.
        terms = {item_core(i) for i in said(text)}
        assert terms == {"10:30", "3.5 times", "3:1", "KeyError"}

    def test_cores(self) -> None:
        """The core: the errno and its address, the exception and its message, the stated value."""
        assert item_core("error: error: ECONNREFUSED 10.0.3.7:5012 twice") == "ECONNREFUSED 10.0.3.7:5012"
        assert item_core("error: It crashed with KeyError: 'id', then restarted") == "KeyError: 'id'"
        assert item_core("fact: the memory limit to 512 MiB") == "512 MiB"
        assert item_core("cmd: make test") == "make test"
        long = "error: " + "word " * 60
        assert len(item_core(long)) <= 120

    def test_scan_items_gives_the_message_of_each_item(self) -> None:
        """Positions let the archive say where an artifact was first seen."""
        messages = [
            {"role": "user", "content": "see src/a.py"},
            {"role": "assistant", "content": "INC-1 src/a.py"},
        ]
        assert list(scan_items(messages)) == [(0, "path: src/a.py"), (1, "id: INC-1"), (1, "path: src/a.py")]

    def test_pathological_prose_is_linear(self) -> None:
        """Backticks, endless clauses, hyphens, digits and errno names do not make the scan backtrack."""
        nasty = "\n".join(
            [
                "`" * 50_000,
                "error: " + "a" * 50_000,
                "a-" * 50_000,
                "1" * 50_000 + " MiB",
                "ECONNREFUSED " * 10_000,
                "ValueError: " * 10_000,
                "x " * 50_000,
            ]
        )
        items = ledger_in_a_child([{"role": "user", "content": nasty}])
        assert all(len(item) <= MAX_ITEM_CHARS + 20 for item in items)
        assert count("\n".join(items)) <= 500


class TestLedger:
    """De-duplication, ordering and the budget."""

    def test_duplicates_keep_their_most_recent_position(self) -> None:
        """An item seen again later moves after items first seen in between."""
        assert ledger("a/b/first.py", "a/b/second.py", "a/b/first.py again") == [
            "path: a/b/second.py",
            "path: a/b/first.py",
        ]

    def test_ordered_by_kind_then_position(self) -> None:
        """Kinds are listed in KINDS order whatever order they appeared in."""
        items = ledger(
            "the limit 512 MiB, the cluster orders-east, db.internal:5432, id ABC-1 at https://x.io "
            "then src/a.py for Alice Chen\n$ make\nerror: boom"
        )
        assert [i.split(":", 1)[0] for i in items] == list(KINDS)

    def test_tight_budget_keeps_errors_before_paths_and_recent_before_old(self) -> None:
        """With room for two items, the error and the newest command stay."""
        texts = ["old/dir/one.py", "$ make old", "error: it broke", "$ make new", "https://x.io/y"]
        full = ledger(*texts)
        budget = count("error: error: it broke\ncmd: make new")
        assert len(full) == 5
        assert ledger(*texts, budget=budget) == ["error: error: it broke", "cmd: make new"]

    def test_excluded_items_are_skipped_before_the_budget(self) -> None:
        """Items kept elsewhere are left out and leave their room to others."""
        messages = [{"role": "user", "content": "see src/a.py, src/b.py and src/c.py"}]
        per_item = count("path: src/a.py") + 1
        assert extract_artifacts(messages, 2 * per_item, count) == ["path: src/b.py", "path: src/c.py"]
        assert extract_artifacts(messages, 2 * per_item, count, exclude={"path: src/c.py"}) == [
            "path: src/a.py",
            "path: src/b.py",
        ]

    def test_zero_budget_and_no_messages(self) -> None:
        """No budget or no messages give an empty ledger."""
        assert ledger("src/app.py", budget=0) == []
        assert extract_artifacts([], 100, count) == []

    def test_content_parts_and_missing_content(self) -> None:
        """Text parts of a content list are scanned; images and None content are skipped."""
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": [{"type": "text", "text": "see lib/x.go"}, {"type": "image_url"}]},
            {"role": "assistant", "content": None},
        ]
        assert extract_artifacts(messages, 100, count) == ["path: lib/x.go"]

    def test_long_items_are_capped(self) -> None:
        """An item longer than MAX_ITEM_CHARS is cut with an ellipsis."""
        items = ledger("error: " + "x" * 1000)
        assert len(items) == 1
        assert len(items[0]) == len("error: ") + MAX_ITEM_CHARS
        assert items[0].endswith("…")

    def test_pathological_input_is_linear(self) -> None:
        """Inputs built to make regexes backtrack finish, with bounded items."""
        nasty = (
            ("a." * 50_000) + "\n" + ("/a" * 50_000) + "\n" + ("A" * 100_000) + "\n" + ("$ " + "x" * 100_000)
        )
        items = ledger_in_a_child([{"role": "tool", "content": nasty}])
        assert all(len(item) <= MAX_ITEM_CHARS + 20 for item in items)
        assert count("\n".join(items)) <= 500


_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=400) | st.sampled_from(
    [
        "$ make",
        "error: x",
        "src/a/b.py",
        "https://a.io/x",
        "```bash\nls\n```",
        "Traceback (most recent call last)",
    ]
)
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system"]), "content": _TEXT | st.none()}
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(_MESSAGE, max_size=6),
    budget=st.integers(min_value=-5, max_value=60),
    counter=st.sampled_from([count, count_costly_newlines]),
)
def test_never_raises_and_respects_the_budget(
    messages: list[dict[str, Any]], budget: int, counter: Callable[[str], int]
) -> None:
    """On arbitrary text the ledger never raises and its joined items fit the budget."""
    items = extract_artifacts(messages, budget, counter)
    assert len(items) == len(set(items))
    assert all(i.split(":", 1)[0] in KINDS for i in items)
    if items:
        assert counter("\n".join(items)) <= budget
    # Kept whole or as its core: either way verbatim, an item of the messages.
    every = {item for _, item in scan_items(messages)}
    forms = set(every) | {f"{item.split(': ', 1)[0]}: {item_core(item)}" for item in every}
    assert set(items) <= forms


class TestScanMemo:
    """A run reads the same messages several times; each is scanned once, within a bound on memory."""

    def test_a_message_read_again_gives_the_same_items_without_a_second_scan(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        memo = artifacts._ScanMemo(max_chars=10_000)
        monkeypatch.setattr(artifacts, "_SCANS", memo)
        message = {
            "role": "user",
            "content": "run `make test` in src/app/main.py, saw ECONNREFUSED 10.0.0.1:80",
        }
        first = list(scan_items([message]))
        scans: list[str] = []

        def scan_text(text: str, *, user: bool = False, prose: bool = False) -> Iterator[tuple[str, str]]:
            scans.append(text)
            return iter(())

        monkeypatch.setattr(artifacts, "_scan_text", scan_text)
        assert list(scan_items([dict(message)])) == first  # an equal message, not the same object
        assert scans == []
        assert list(scan_items([{"role": "assistant", "content": message["content"]}])) == []
        assert len(scans) == 1  # who wrote it is part of what was scanned

    def test_the_oldest_scans_go_when_the_text_held_passes_the_bound(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        memo = artifacts._ScanMemo(max_chars=3_200)
        monkeypatch.setattr(artifacts, "_SCANS", memo)
        texts = [f"{i:02d} " + "x" * 97 for i in range(40)]  # 100 characters each
        for text in texts:
            list(scan_items([{"role": "tool", "content": text}]))
        assert memo.get((texts[0], "tool", ())) is None
        assert memo.get((texts[-1], "tool", ())) is not None
        assert sum(size for size, _ in memo._items.values()) <= 3_200
        list(scan_items([{"role": "tool", "content": "y" * 201}]))  # over a sixteenth of the bound: not kept
        assert memo.get(("y" * 201, "tool", ())) is None


@pytest.mark.parametrize(
    ("word", "shape", "beside_a_resource"),
    [
        ("orders_api", True, True),  # snake_case is never English
        ("svc-12", True, True),  # a digit makes a hyphenated word a name
        ("acme-logs-archive", True, True),  # three parts, no compound's function word
        ("acme-logs", None, True),  # a name only next to "bucket" (or in code)
        ("up-to-date", None, True),
        ("Title-Case", False, False),  # no kebab- or snake-case at all
        ("a-b", False, False),  # too short
    ],
)
def test_a_names_shape_says_what_its_neighbours_cannot_change(
    word: str, shape: bool | None, beside_a_resource: bool
) -> None:
    assert mentions.name_shape(word) is shape
    assert mentions.is_name(word, "bucket") is beside_a_resource
    assert mentions.is_name(word, code=True) is beside_a_resource
    assert mentions.is_name(word) is bool(shape)
