"""The verbatim artifact ledger: exact paths, commands, errors, URLs, ids, names and facts of a span.

Extracted deterministically and stored next to a summary, because summaries paraphrase;
linear in the input whatever the input is.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, Final

from compaction_worker.contracts.history import text_of
from compaction_worker.summaries import carry, mentions

KINDS: Final = ("error", "cmd", "path", "url", "id", "host", "name", "fact", "term")
"""Item kinds, in the order they are listed and kept when the budget is tight.

``host`` is a host:port, ``name`` a kebab- or snake-case name (bucket, cluster, flag),
``fact`` a number with its unit, a date or a version stated by the user. ``term`` is any
other distinctive term of what the user or the assistant wrote, found by its shape rather
than by a pattern per kind (:func:`..carry.line_terms`), as ``"<term> — <its context>"``."""

TERM_CONTEXT: Final = " \u2014 "
"""Between a term item's term (its core) and the words around it."""

MAX_LINE_CHARS: Final = 2_000
"""Only the first this-many characters of a line are looked at."""

MAX_ITEM_CHARS: Final = 300
"""Longer items are cut with an ellipsis: the ledger is a reference list, not a log."""

_SHELL_FENCES: Final = frozenset({"bash", "sh", "shell", "zsh", "console", "shell-session"})
_COMMAND_KEYS: Final = ("command", "cmd")

# --- errors -----------------------------------------------------------------------------

_ERROR_LINES: Final[tuple[re.Pattern[str], ...]] = tuple(
    re.compile(p)
    for p in (
        # Python and most JVM/JS exceptions: "KeyError: 'x'", "requests.exceptions.HTTPError: 404".
        r"^(?:[A-Za-z_][\w]*\.){0,6}[A-Z]\w*(?:Error|Exception|Exit|Interrupt|Failure)\b(?::|$)",
        # Exceptions named otherwise, from an errors module: "psycopg.errors.UndefinedColumn: ...",
        # "django.core.exceptions.ImproperlyConfigured: ...", "sqlalchemy.exc.NoResultFound: ...".
        r"^(?:[a-z_][a-z0-9_]*\.){0,5}(?:errors?|exceptions?|exc)\.[A-Z][A-Za-z0-9]+: \S",
        # Compilers, git, CLIs: "error: ...", "fatal: ...", "error[E0382]: ...", "ERROR: ...".
        r"^(?i:error|fatal)(?:\[[\w-]{1,20}\])?:\s",
        r"^(?:FAILED|FAIL|ERROR)\b",
        r"^npm ERR!",
        r"^panic: ",
        r"^Segmentation fault",
        r": (?:command not found|No such file or directory|Permission denied)\b",
        # Non-zero exit codes in the usual wordings.
        r"(?i:exit(?:ed)?(?: with)? (?:code|status)|exit code:?|returned non-zero exit status)"
        r" ?[1-9]\d*\b",
    )
)
# One pass over a line instead of one per pattern: most lines are no error at all.
_ERROR_LINE: Final = re.compile("|".join(f"(?:{p.pattern})" for p in _ERROR_LINES))
_TRACEBACK: Final = "Traceback (most recent call last)"
# pytest prints the exception of a failed test behind "E" and spaces: "E       KeyError: 'id'".
_PYTEST_ERROR: Final = re.compile(r"^E\s+(?=\S)")

# --- words: paths, ids ------------------------------------------------------------------

_URL: Final = re.compile(r"\b[a-z][a-z0-9+.-]{1,15}://[^\s<>\"'`)\]}]+", re.IGNORECASE)
_WORD_EDGES: Final = "\"'`()[]{}<>,;!?*"
_LINE_SUFFIX: Final = re.compile(r"(?::\d+){1,2}$")  # "src/app.py:12:5" -> "src/app.py"
_UNIX_PATH: Final = re.compile(r"(?:~|\.{1,2})?/?[\w.@+-]+(?:/[\w.@+-]+)*/?")
_WINDOWS_PATH: Final = re.compile(r"(?:[A-Za-z]:|\\\\[\w.-]+)\\[^\s\\/:*?\"<>|]+(?:\\[^\s\\/:*?\"<>|]+)*\\?")
_EXTENSION: Final = re.compile(r"\.[A-Za-z][A-Za-z0-9]{0,9}$")
# Word lists, kept as text because a hundred quoted items would hide what they are.
_EXTENSION_WORDS: Final = """
    py pyi ipynb js mjs cjs jsx ts tsx json jsonl yaml yml toml ini cfg conf env md rst txt csv tsv
    log sh bash zsh ps1 bat go rs java kt kts scala rb php c h cc cpp hpp cs swift m sql html htm
    css scss vue svelte xml proto lock gradle tf hcl dockerfile mk cmake r jl lua pl ex exs erl
    dart zig nim pem crt key pub db sqlite parquet zip tar gz tgz whl pdf png jpg jpeg gif svg
    wasm so dll exe bin patch diff
"""
_FILE_EXTENSIONS: Final = frozenset(_EXTENSION_WORDS.split())
# Extensions that are also common attribute names, and the object names that precede them
# in code ("self.lock", "np.log"): a bare "<object>.<attribute>" is not taken for a file.
_ATTRIBUTE_SUFFIXES: Final = frozenset(
    {"log", "lock", "key", "db", "bin", "env", "pub", "so", "r", "m", "c", "h"}
)
_OBJECT_WORDS: Final = """
    self this cls obj os np sys math logging logger log torch pd df re json app ctx client
    config conn db cursor request response s x r m e a b c
"""
_OBJECT_NAMES: Final = frozenset(_OBJECT_WORDS.split())
_BARE_FILENAMES: Final = frozenset({"Dockerfile", "Makefile", "Procfile", "Gemfile", "Jenkinsfile"})
# Every id has a digit; every path a slash, a backslash, a drive colon or a dot inside a
# word (an extension), unless it is a bare file name. A line with none of them (most
# prose) holds no path or id, and its words need not be looked at one by one.
_MAY_HOLD_WORDS: Final = re.compile(r"[\d/\\:]|[.\-_]\w|" + "|".join(sorted(_BARE_FILENAMES)))
_UUID: Final = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_SHA: Final = re.compile(r"[0-9a-f]{7,40}")
_TICKET: Final = re.compile(r"[A-Z][A-Z0-9]{1,9}-\d{1,6}")
_CVE: Final = re.compile(r"CVE-\d{4}-\d{4,7}")
_SEMVER: Final = re.compile(r"v?\d{1,6}\.\d{1,6}\.\d{1,6}(?:-[0-9A-Za-z.-]{1,40})?(?:\+[0-9A-Za-z.-]{1,40})?")
# Prefixes that look like ticket keys but name standards and encodings ("UTF-8", "SHA-256").
_NOT_TICKETS: Final = frozenset(
    {"UTF", "SHA", "ISO", "GPT", "HTTP", "TLS", "SSL", "AES", "RSA", "MD", "PEP", "RFC"}
)

Found = tuple[str, str]  # (kind, text)


def extract_artifacts(
    messages: Sequence[Mapping[str, Any]],
    max_tokens: int,
    count_tokens: Callable[[str], int],
    *,
    exclude: Collection[str] = (),
) -> list[str]:
    """The ledger of ``messages``: ``"<kind>: <text>"`` items within ``max_tokens``.

    Items are de-duplicated, each keeping the position of its most recent occurrence,
    and listed by kind (``KINDS``), then by that position. When they do not all fit, the
    items kept are chosen by kind priority (``KINDS`` order) and, within a kind, most
    recent first (see :func:`select_items`). The budget holds for the items joined by
    newlines. Items in ``exclude`` (a ledger kept elsewhere) are left out before choosing,
    so the budget goes to others.
    """
    if max_tokens <= 0:
        return []
    skip = frozenset(exclude)
    last_seen: dict[str, int] = {}
    for position, (_, item) in enumerate(scan_items(messages)):
        if item not in skip:
            last_seen.pop(item, None)  # re-inserted: the dict stays in order of last sight
            last_seen[item] = position
    rank = {kind: i for i, kind in enumerate(KINDS)}
    by_priority = sorted(last_seen, key=lambda it: (rank[item_kind(it)], -last_seen[it]))
    return select_items(
        by_priority,
        max_tokens,
        count_tokens,
        listed=lambda items: sorted(items, key=lambda it: (rank[item_kind(it)], last_seen[it])),
    )


def scan_items(messages: Sequence[Mapping[str, Any]]) -> Iterator[tuple[int, str]]:
    """Every item of ``messages`` as ``(message index, "<kind>: <text>")``, in order, repeats included."""
    for index, message in enumerate(messages):
        for kind, text in _scan_message(message):
            yield index, f"{kind}: {text}"


# --- scanning ---------------------------------------------------------------------------


def _scan_message(message: Mapping[str, Any]) -> tuple[Found, ...]:
    text = text_of(message)
    role = str(message.get("role"))
    calls = tuple(_arguments(call) for call in message.get("tool_calls") or () if isinstance(call, Mapping))
    found = _SCANS.get((text, role, calls))
    if found is None:
        found = (
            *_scan_text(text, user=role == "user", prose=role in ("user", "assistant")),
            *(f for raw in calls for f in _scan_arguments(raw)),
        )
        _SCANS.put((text, role, calls), len(text) + sum(map(len, calls)), found)
    return found


_ScanKey = tuple[str, str, tuple[str, ...]]
"""A message as far as its scan goes: its text, who wrote it, its calls' arguments."""


class _ScanMemo:
    """Recently scanned messages' items (``max_chars`` of text): a run reads its span 3-4 times, scans it once."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._items: OrderedDict[_ScanKey, tuple[int, tuple[Found, ...]]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()  # compactions scan in worker threads (off the event loop)

    def get(self, key: _ScanKey) -> tuple[Found, ...] | None:
        with self._lock:
            if (held := self._items.get(key)) is not None:
                self._items.move_to_end(key)
        return None if held is None else held[1]

    def put(self, key: _ScanKey, size: int, found: tuple[Found, ...]) -> None:
        with self._lock:  # another thread may have scanned it meanwhile: count it once
            if size <= self.max_chars // 16 and key not in self._items:  # one huge text pushes out all else
                self._items[key] = (size, found)
                self._chars += size
            while self._chars > self.max_chars:
                self._chars -= self._items.popitem(last=False)[1][0]


_SCANS: Final = _ScanMemo(max_chars=8_000_000)


def _arguments(call: Mapping[str, Any]) -> str:
    function = call.get("function")
    raw = function.get("arguments") if isinstance(function, Mapping) else None
    return raw if isinstance(raw, str) else ""


def _scan_arguments(raw: str) -> Iterator[Found]:
    try:
        arguments = json.loads(raw)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        yield from _scan_text(raw)
        return
    for key, value in arguments.items():
        if key in _COMMAND_KEYS and isinstance(value, str):
            yield from _commands(value.splitlines())
            yield from _scan_words(value[:MAX_LINE_CHARS])
        elif key in _COMMAND_KEYS and isinstance(value, list) and all(isinstance(v, str) for v in value):
            yield from _commands([" ".join(value)])
        elif isinstance(value, str):
            yield from _scan_text(value)


def _commands(lines: Sequence[str]) -> Iterator[Found]:
    for line in lines:
        command = line[:MAX_LINE_CHARS].strip()
        if command and not command.startswith("#"):
            yield "cmd", _cap(command)


def _terms(line: str, found: Sequence[Found]) -> Iterator[Found]:
    """The line's distinctive terms that none of its other items holds, with their context."""
    held = " ".join(text for _, text in found)
    for term, phrase in carry.line_terms(line):
        if term in held or len(term) > MAX_ITEM_CHARS:
            continue
        held += " " + term
        yield "term", _cap(term if phrase == term else f"{term}{TERM_CONTEXT}{phrase}")


def _scan_text(text: str, *, user: bool = False, prose: bool = False) -> Iterator[Found]:
    """Items of a text, line by line; ``user``: the user wrote it, so the numbers it states are facts;
    ``prose``: the user or the assistant wrote it, so the other distinctive terms of its lines of
    prose (not code, a command or a log line) count too."""
    fence: str | None = None  # the language of the ``` block we are in, "" for a plain one
    traceback = False
    for raw in text.splitlines():
        line = raw[:MAX_LINE_CHARS]
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip().lower()
            continue
        if stripped.startswith(_TRACEBACK):
            traceback = True
            continue
        # A traceback ends at its first unindented line: the exception and its message.
        ends_traceback = traceback and bool(stripped) and not line[0].isspace()
        traceback = traceback and not ends_traceback
        found: list[Found] = []
        terms = False
        if stripped.startswith("$ ") or (fence in _SHELL_FENCES and fence != "console" and stripped):
            found += _commands([stripped[2:] if stripped.startswith("$ ") else stripped])
        elif ends_traceback or _ERROR_LINE.search(stripped):
            found.append(("error", _cap(stripped)))
        elif (pytest := _PYTEST_ERROR.match(stripped)) and _is_exception(message := stripped[pytest.end() :]):
            found.append(("error", _cap(message)))  # the exception verbatim, without pytest's prefix
        elif fence is None:  # prose: errors and commands inside sentences
            terms = prose and not traceback
            found += (("error", _cap(e)) for e in mentions.inline_errors(stripped))
            found += (("cmd", _cap(c)) for c in mentions.inline_commands(stripped))
        found += _scan_words(line)
        if user and fence is None:
            found += (("fact", _cap(f)) for f in mentions.facts(stripped))
        yield from found
        if terms:
            yield from _terms(line, found)


def _is_exception(text: str) -> bool:
    return any(p.search(text) for p in _ERROR_LINES[:2])


def _scan_words(line: str) -> Iterator[Found]:
    urls = "://" in line  # every URL has one: most lines need neither URL pass
    for url in _URL.finditer(line) if urls else ():
        yield "url", _cap(url.group().rstrip(".,:;!?"))
    if not _MAY_HOLD_WORDS.search(line):
        return
    # `orders-api`: in code, a name whatever its shape.
    code = {span for span in mentions.code_spans(line) if " " not in span} if "`" in line else set()
    words = (_URL.sub(" ", line) if urls else line).split()
    for i, raw in enumerate(words):
        if raw.isalpha():  # most words: prose, no item unless a bare file name
            if raw in _BARE_FILENAMES:
                yield "path", raw
            continue
        if raw.isdecimal():  # counts and numbers in logs: no id (no letter), path or host:port
            continue
        word = _bare(raw)
        found = _classify(word)
        if found is None and ("-" in word or "_" in word):
            named = mentions.name_shape(word)
            if named is None:  # the words around it decide
                before = _bare(words[i - 1]).lower() if i else ""
                after = _bare(words[i + 1]).lower() if i + 1 < len(words) else ""
                named = mentions.is_name(word, before, after, code=word in code)
            if named:
                found = "name", word
        if found is not None:
            yield found


def _bare(word: str) -> str:
    word = word.strip(_WORD_EDGES).rstrip(".:").rstrip(_WORD_EDGES)  # "[PAY-12]:" -> "PAY-12"
    return word[:-2] if word.endswith(("'s", "\u2019s")) else word  # "INC-4000's" -> "INC-4000"


# Words recur (hosts, names, paths in every log line): classifying each once is enough.
@functools.lru_cache(maxsize=1 << 15)
def _classify(word: str) -> Found | None:
    if len(word) < 3 or len(word) > MAX_ITEM_CHARS:
        return None
    # Most words are prose: letters only. Such a word is no id (they all have a digit or a
    # separator) and a path only as a bare file name; skipping the patterns for them makes
    # extraction several times faster on long spans.
    if word.isalpha():
        return ("path", word) if word in _BARE_FILENAMES else None
    if _is_id(word):
        return "id", word
    windows = bool(_WINDOWS_PATH.fullmatch(word))
    path = word if windows else _LINE_SUFFIX.sub("", word.split("::", 1)[0])
    if windows or (_UNIX_PATH.fullmatch(path) and _looks_like_path(path)):
        return "path", path  # "tests/x.py::test_y" and "src/x.py:12" -> their file
    if mentions.is_host_port(word):
        return "host", word
    return None


def _is_id(word: str) -> bool:
    if _UUID.fullmatch(word) or _CVE.fullmatch(word) or _SEMVER.fullmatch(word):
        return True
    if _SHA.fullmatch(word):
        return not word.isdigit() and not word.isalpha()  # a SHA has letters and digits
    return bool(_TICKET.fullmatch(word)) and word.split("-", 1)[0] not in _NOT_TICKETS


def _looks_like_path(word: str) -> bool:
    """Absolute or explicitly relative, or a relative path with a directory and a file name.

    "and/or", "TCP/IP" and "1/2" have a slash too; a relative path needs a known extension,
    a trailing slash or at least two separators before it counts.
    """
    if word.startswith(("/", "~/", "./", "../")):
        return len(word) > 1 and any(c.isalpha() for c in word)
    extension = _EXTENSION.search(word)
    suffix = extension.group()[1:].lower() if extension else ""
    known = suffix in _FILE_EXTENSIONS
    if "/" not in word:
        stem = word[: -len(suffix) - 1] if suffix else word
        if suffix in _ATTRIBUTE_SUFFIXES and stem.lower() in _OBJECT_NAMES:
            return False  # "self.lock", "np.log": attribute access, not a file
        return known or word in _BARE_FILENAMES
    return known or word.endswith("/") or word.count("/") >= 2


def _cap(text: str) -> str:
    return text if len(text) <= MAX_ITEM_CHARS else text[: MAX_ITEM_CHARS - 1] + "…"


# --- choosing within a budget -------------------------------------------------------------


def select_items(
    ranked: Sequence[str],
    budget: int,
    count: Callable[[str], int],
    *,
    listed: Callable[[list[str]], list[str]] = list,
    carried: str = "",
) -> list[str]:
    """What is kept of ``ranked`` (best first) within ``budget`` tokens, joined by newlines.

    An item whose core ``carried`` (a summary) or an item kept before it already holds
    verbatim takes no room. When not all fit whole, coverage comes first: every item is
    tried as its core (``item_core``), best first, and those kept get their whole text
    back, best first, while room is left. ``listed`` orders the kept items (given as
    they are in ``ranked``); the result is what is stored, in that order.
    """
    if budget <= 0:
        return []
    candidates = (
        [it for it in ranked if not mentions.holds(carried, item_core(it))] if carried else list(ranked)
    )
    chosen, used, short = _greedy(candidates, budget, count, shrink=False)
    if short:
        chosen, used, _ = _greedy(candidates, budget, count, shrink=True)
        for item, text in chosen.items():
            extra = count(item) - count(text)
            if text != item and used + extra <= budget + 1:
                chosen[item] = item
                used += extra
    kept = list(chosen)
    # Token counts are not exactly additive; the joined text is what must fit.
    while kept and count("\n".join(chosen[it] for it in listed(kept))) > budget:
        kept.pop()
    return [chosen[it] for it in listed(kept)]


def _greedy(
    items: Sequence[str], budget: int, count: Callable[[str], int], *, shrink: bool
) -> tuple[dict[str, str], int, bool]:
    """Items (as their cores if ``shrink``) in order while they fit; the room used; whether any did not."""
    chosen: dict[str, str] = {}
    held = ""  # the texts kept so far: an item whose core they hold is carried already
    used = 0
    short = False
    for item in items:
        kind, _, text = item.partition(": ")
        core = mentions.core(kind, text)
        if core in held and mentions.holds(held, core):
            continue
        stored = f"{kind}: {core}" if shrink else item
        cost = count(stored) + 1  # +1 for the newline joining it to the next
        if used + cost <= budget + 1:
            chosen[item] = stored
            used += cost
            held += "\n" + (core if shrink else text)
        else:
            short = True
    return chosen, used, short


def item_kind(item: str) -> str:
    """The kind of a ledger item (``"path: a.py"`` -> ``"path"``)."""
    return item.split(": ", 1)[0]


def item_core(item: str) -> str:
    """The verbatim part of a ledger item that must survive (see :func:`mentions.core`)."""
    kind, _, text = item.partition(": ")
    return mentions.core(kind, text) if text else item
