"""Artifacts written in prose: inline commands, errors mid-line, host:port, names, stated facts.

:mod:`compaction_worker.summaries.artifacts` applies these bounded, line-at-a-time patterns
next to its log-shaped ones; each item also has a *core* a short ledger keeps.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Final

MAX_CLAUSE_CHARS: Final = 160
"""An error phrase found mid-line runs to its clause's end, at most this far."""

# A clause ends at a sentence end, a semicolon, a dash between spaces, or a comma that
# starts another clause. Lazy and bounded: at most MAX_CLAUSE_CHARS steps per match.
_CLAUSE: Final = (
    rf"[^\n]{{1,{MAX_CLAUSE_CHARS}}}?"
    r"(?=[.;!?](?:\s|$)|,\s+(?:and|but|so|then|which|while|because|after|before|when)\b|\s[\u2014\u2013-]\s|$)"
)

# --- commands in inline code ---------------------------------------------------------

_CODE_SPAN: Final = re.compile(r"`([^`\n]{2,300})`")
_PROGRAM_WORDS: Final = """
    kubectl helm docker podman git gh make cmake npm npx pnpm yarn pip pip3 pipx uv poetry python
    python3 pytest tox nox ruff mypy black node deno bun cargo rustc go java mvn gradle dotnet
    terraform tofu ansible ansible-playbook aws gcloud az gsutil eksctl kind minikube k9s
    systemctl journalctl service sudo ssh scp rsync curl wget psql mysql redis-cli mongosh
    sqlite3 ls cat grep rg sed awk find chmod chown rm mv cp mkdir tar unzip kill pkill ps top
    df du tail head less env export source bash sh zsh nc dig nslookup ping openssl vault
    consul nomad jq yq bazel brew apt apt-get yum dnf apk flyctl heroku vercel supabase
"""
_PROGRAMS: Final = frozenset(_PROGRAM_WORDS.split())
_PROGRAM: Final = re.compile(r"(?:\./|/|~/)?[a-z][a-z0-9._/-]{0,60}")


def inline_commands(line: str) -> Iterator[str]:
    """The inline code spans of ``line`` that look like shell commands, verbatim."""
    if "`" not in line:  # most lines have no code span
        return
    for span in code_spans(line):
        words = span.split()
        if len(words) < 2:
            continue
        program = words[1] if words[0] == "sudo" and len(words) > 2 else words[0]
        if not _PROGRAM.fullmatch(program):
            continue
        # A known program, or a script run by path, or any program given flags.
        flagged = any(w.startswith("-") and len(w) > 1 for w in words[1:])
        if program in _PROGRAMS or program.startswith(("./", "/", "~/")) or flagged:
            yield span


def code_spans(line: str) -> Iterator[str]:
    """The inline code spans of ``line``, without backticks."""
    for match in _CODE_SPAN.finditer(line):
        yield match.group(1).strip()


# --- errors anywhere in a line -----------------------------------------------------------

_ERRNO_WORDS: Final = """
    ECONNREFUSED ECONNRESET ECONNABORTED ETIMEDOUT ENOENT EACCES EPERM EADDRINUSE EADDRNOTAVAIL
    EHOSTUNREACH EHOSTDOWN ENETUNREACH ENETDOWN EPIPE ENOSPC EEXIST ENOTDIR EISDIR EMFILE ENFILE
    ENOMEM EAI_AGAIN ENOTFOUND EINVAL EBUSY EAGAIN ENOTEMPTY EROFS EDQUOT ENOTCONN EPROTO ESRCH
    EBADF EFAULT ENOEXEC EOVERFLOW ECANCELED ERANGE EDEADLK ELOOP ENAMETOOLONG
"""
_ERRNO: Final = re.compile(r"\b(?:" + "|".join(sorted(_ERRNO_WORDS.split(), key=len, reverse=True)) + r")\b")
# What follows an errno name when it is its address: an IP, host or path, maybe a port.
_ADDRESS: Final = re.compile(
    r"[:\s]\s?(\[?[0-9A-Fa-f:.]{3,45}\]?(?::\d{1,5})?|[A-Za-z0-9][\w.-]{0,100}:\d{1,5}|/[\w./-]{1,200}"
    r"|\d{1,3}(?:\.\d{1,3}){3})(?=[\s,;)'\"]|[.!?](?:\s|$)|$)"
)
_EXCEPTION_NAME: Final = r"(?:[A-Za-z_][\w]{0,60}\.){0,6}[A-Z]\w{0,60}?(?:Error|Exception|Failure|Fault)"
_INLINE_ERRORS: Final = re.compile(
    # "crashed with ValueError: shard 7 has no leader", "raised KeyError('id')"
    rf"(?<![\w.])(?:{_EXCEPTION_NAME}(?::\s|\()|\b(?:{_ERRNO.pattern}):\s|"
    # "saw error: ...", "the deploy failed: ...", "fatal: ..."
    r"\b(?i:error|errors|failed|failure|fatal)(?:\[[\w-]{1,20}\])?:\s)" + _CLAUSE
)


def inline_errors(line: str) -> Iterator[str]:
    """Error phrases anywhere in ``line``: exceptions with their message, ``error:``/``failed:``
    clauses, errno names with their address; each to its clause's end, verbatim."""
    taken: list[tuple[int, int]] = []
    # Every phrase needs a colon or a parenthesis after its name, every errno an "E":
    # most lines have neither and need no regex at all.
    clauses = _INLINE_ERRORS.finditer(line) if ": " in line or "(" in line else ()
    for match in clauses:
        text = match.group().rstrip(" ,")
        if len(text.split(":", 1)[-1].strip()) >= 2:
            taken.append((match.start(), match.end()))
            yield text
    for match in _ERRNO.finditer(line) if "E" in line else ():
        if any(start <= match.start() < end for start, end in taken):
            continue  # already inside a clause found above
        address = _ADDRESS.match(line, match.end())
        end = address.end() if address else match.end()
        yield line[match.start() : end]


# --- hosts and names ---------------------------------------------------------------------

_HOST_PORT: Final = re.compile(
    r"(?:\d{1,3}(?:\.\d{1,3}){3}|\[[0-9A-Fa-f:]{2,45}\]|localhost"
    r"|[A-Za-z0-9][A-Za-z0-9-]{0,62}(?:\.[A-Za-z0-9-]{1,63}){0,8}):(\d{2,5})"
)


def is_host_port(word: str) -> bool:
    """``10.0.3.7:5012``, ``db-1.internal:5432``, ``localhost:8080``; not ``12:30`` or ``1:2``."""
    match = _HOST_PORT.fullmatch(word)
    if match is None or int(match.group(1)) > 65535:
        return False
    host = word[: match.start(1) - 1]
    return not host.isdigit()


_SNAKE: Final = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+|[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
_KEBAB: Final = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)+")
# Parts that make a hyphenated word an English compound ("up-to-date", "end-to-end").
_COMPOUND_WORDS: Final = """
    a an the to of in on at by for and or with from up out off over per as via non self well so
    all one two day end state face mind law time way like ever never re pre co only based free
    safe wide level side term aware friendly specific ready related driven
"""
_COMPOUND_PARTS: Final = frozenset(_COMPOUND_WORDS.split())
# Nouns that announce a name: "the bucket acme-logs", "the acme-logs bucket".
_RESOURCE_WORDS: Final = """
    bucket buckets cluster clusters flag flags namespace deployment service services branch topic
    queue table database db repo repository project pipeline job workflow env environment host
    node pod secret index schema stack region image container volume workspace channel tenant
    account role policy module package crate library app function lambda instance vpc subnet zone
    tag label release profile group
"""
_RESOURCES: Final = frozenset(_RESOURCE_WORDS.split())


def is_name(word: str, before: str = "", after: str = "", *, code: bool = False) -> bool:
    """Whether ``word`` is a kebab- or snake-case name (a bucket, cluster, flag, variable).

    snake_case is never English; a hyphenated word is a name when it has a digit, three
    parts none of which is a compound's function word, is in inline code, or stands next
    to a resource noun (``before``/``after``, lower case).
    """
    shape = name_shape(word)
    return shape if shape is not None else (code or before in _RESOURCES or after in _RESOURCES)


# Words recur (every log line names the same hosts and workers): each shape is worked out once.
@functools.lru_cache(maxsize=1 << 15)
def name_shape(word: str) -> bool | None:
    """What :func:`is_name` says of ``word`` whatever stands around it; None: a name only in
    inline code or next to a resource noun (a hyphenated word that is no name on its own)."""
    if len(word) < 4 or len(word) > 100:
        return False
    if _SNAKE.fullmatch(word):
        return any(c.isalpha() for c in word)
    if not _KEBAB.fullmatch(word):
        return False
    parts = word.split("-")
    if any(c.isdigit() for c in word):
        named = any(c.isalpha() for c in word) and len(max(parts, key=len)) > 1
    else:
        named = len(parts) >= 3 and not _COMPOUND_PARTS.intersection(parts)
    return True if named else None


# --- facts: numbers with units, dates, versions ------------------------------------------

_UNITS: Final = (
    r"ms|µs|us|ns|s|secs?|seconds?|mins?|minutes?|h|hrs?|hours?|days?|weeks?|months?|years?"
    r"|[KMGTP]i?B|[kKMGT]b(?:ps)?|bytes?|%|x|rps|qps|rpm|req/s|ops/s|vCPUs?|cores?|CPUs?|GPUs?"
    r"|[GMk]Hz|USD|EUR|GBP|dollars?|euros?|users?|nodes?|replicas?|pods?|shards?|workers?|threads?"
    r"|connections?|requests?|tokens?|lines?|rows?|items?|files?|retries|attempts?"
)
_MONTHS: Final = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_FACT_VALUE: Final = (
    rf"(?<![\w.$])\$?\d{{1,3}}(?:,\d{{3}}){{1,4}}(?:\.\d{{1,6}})?\s?(?:{_UNITS})(?![\w%/])"  # 1,200 rows
    rf"|(?<![\w.$,])\$?\d{{1,9}}(?:\.\d{{1,6}})?\s?(?:{_UNITS})(?![\w%/])"  # 512 MiB, 30s, 99.9%
    r"|(?<![\w.])\$\d{1,3}(?:,\d{3}){0,4}(?:\.\d{1,2})?(?![\w.])"  # $40, $1,200
    r"|(?<![\w-])\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?(?:Z|[+-]\d{2}:?\d{2})?)?(?![\w-])"
    rf"|\b{_MONTHS}\.? \d{{1,2}}(?:st|nd|rd|th)?(?:,? \d{{4}})?\b"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)? {_MONTHS}(?: \d{{4}})?\b"
    r"|(?<![\w.])v\d{1,4}(?:\.\d{1,6}){1,3}(?![\w.])"  # v2.3
    r"|\b(?:[A-Z][a-z][A-Za-z+#]{0,19}|version|release) \d{1,4}(?:\.\d{1,6}){1,2}(?![\w.:])"  # Postgres 15.4
)
_VALUE: Final = re.compile(_FACT_VALUE)
_CONTEXT_WORDS: Final = 3
_MAX_CONTEXT_WORD: Final = 40
_CLAUSE_MARKS: Final = frozenset(',;:.()[]!?"')


def facts(line: str) -> Iterator[str]:
    """Numbers with units, dates and versions in ``line``, each with a few words of context.

    The context is up to three words before the value, within its clause: "memory limit
    to 512 MiB" says what the number is about; the value alone is the item's core.
    """
    floor = 0  # context never reaches back into the value before
    for match in _VALUE.finditer(line):
        start = match.start()
        for _ in range(_CONTEXT_WORDS):
            if start - 1 <= floor or line[start - 1] != " ":
                break
            space = line.rfind(" ", floor, start - 1)
            word_start = space + 1 if space >= 0 else floor
            word = line[word_start : start - 1]
            if not word or len(word) > _MAX_CONTEXT_WORD or _CLAUSE_MARKS.intersection(word):
                break
            start = word_start
        floor = match.end()
        yield line[start : match.end()].strip()


# --- cores -------------------------------------------------------------------------------

_CORE_ERROR: Final = re.compile(
    rf"(?:{_ERRNO.pattern})(?:{_ADDRESS.pattern})?|{_EXCEPTION_NAME}:\s" + _CLAUSE
)
MAX_CORE_CHARS: Final = 120


def core(kind: str, text: str) -> str:
    """The shortest verbatim part of an item that still says what it is (see the module doc)."""
    if kind == "fact":  # the last value stated
        values = _VALUE.findall(text)
        return values[-1].strip() if values else text
    if kind == "term":  # "<term> — <its context>": the term is what must survive
        return text.split(" \u2014 ", 1)[0]
    if kind == "error":
        match = _CORE_ERROR.search(text[:2000])
        if match is not None:
            text = match.group().rstrip(" ,")
        if len(text) > MAX_CORE_CHARS:
            cut = text[:MAX_CORE_CHARS]
            text = cut[: cut.rfind(" ")] if " " in cut[20:] else cut
    return text


_JOINERS: Final = frozenset("-./")


def holds(text: str, core: str) -> bool:
    """Whether ``text`` holds ``core`` verbatim as a whole: not ``INC-4000`` inside ``INC-40003``,
    ``svc-1`` inside ``svc-12`` or ``10.0.3.2`` inside ``10.0.3.23``."""
    if not core:
        return True
    start = text.find(core)
    while start >= 0:
        end = start + len(core)
        before = text[start - 1] if start else " "
        after = text[end] if end < len(text) else " "
        next_ = text[end + 1] if end + 1 < len(text) else " "
        glued_before = (before.isalnum() or before == "_" or before in _JOINERS) and core[0].isalnum()
        glued_after = (after.isalnum() or after == "_" or (after in _JOINERS and next_.isalnum())) and (
            core[-1].isalnum()
        )
        if not glued_before and not glued_after:
            return True
        start = text.find(core, start + 1)
    return False
