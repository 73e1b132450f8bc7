"""The CLI as the docs see it: every command and option, read from the click app, for the generated
reference (docs/reference.md) and for checking each ``compaction-worker ...`` line the docs quote.

The ``quality`` suites parse their own options with argparse (``bench/<suite>.py``), so their
parsers are read too: each suite's ``main`` builds its parser and calls ``parse_args`` first, and
that call is intercepted before anything runs (the suites keep their parsers inside ``main``).
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import click

from compaction_worker.cli.common import PROGRAM

QUALITY_VARIANTS = {("standing", "--short"): "short_standing"}
"""``quality SUITE FLAG`` that runs another module of bench/ (``tools.quality`` dispatches so)."""


@dataclass(frozen=True, slots=True)
class Option:
    """One option of one command: its spellings, how many values follow it, what it says."""

    names: tuple[str, ...]
    values: int | str  # 0 (a flag), a count, or argparse's "+", "*", "?"
    metavar: str = ""
    help: str = ""
    default: str = ""
    choices: tuple[str, ...] = ()


@dataclass(slots=True)
class Command:
    """One command (``compaction-worker quality standing`` included) with its options and subcommands."""

    path: str
    usage: str
    help: str
    options: list[Option] = field(default_factory=list)
    subcommands: dict[str, Command] = field(default_factory=dict)
    variants: dict[str, Command] = field(default_factory=dict)  # a flag that runs another parser
    aliases: dict[str, Command] = field(default_factory=dict)
    """Hidden subcommands: they work, so the docs may quote them, but the reference lists them not."""

    def option(self, name: str) -> Option | None:
        return next((o for o in self.options if name in o.names), None)

    def walk(self) -> Iterator[Command]:
        yield self
        for sub in [*self.subcommands.values(), *self.variants.values()]:
            yield from sub.walk()


# --- reading the app -------------------------------------------------------------------------


REPOSITORY = Path(__file__).resolve().parent.parent.parent


def _shown(default: object) -> str:
    """A default as the reference shows it: a path inside the repository relative to it, as on any clone."""
    if default is None or default is False or default == argparse.SUPPRESS:
        return ""
    if isinstance(default, list | tuple):
        return " ".join(map(_shown, default))
    if isinstance(default, Path) and default.is_absolute():
        return str(default.relative_to(REPOSITORY)) if default.is_relative_to(REPOSITORY) else default.name
    return str(default)


def _click_option(param: click.Option) -> Option:
    values = 0 if param.is_flag or param.count else param.nargs
    choices = tuple(str(c) for c in param.type.choices) if isinstance(param.type, click.Choice) else ()
    default = _shown(param.default) if param.show_default and not param.is_flag else ""
    metavar = "" if values == 0 else (param.metavar or param.type.name.upper())
    return Option(
        tuple(param.opts) + tuple(param.secondary_opts), values, metavar, param.help or "", default, choices
    )


def _from_click(command: click.Command, path: str, parent: click.Context | None) -> Command:
    ctx = click.Context(command, info_name=path.rsplit(" ", 1)[-1], parent=parent)
    usage = f"{path} {' '.join(command.collect_usage_pieces(ctx))}".strip()
    spec = Command(path, usage, (command.help or "").strip())
    for param in command.get_params(ctx):
        if isinstance(param, click.Option):
            spec.options.append(_click_option(param))
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is not None:
                listed = spec.aliases if sub.hidden else spec.subcommands
                listed[name] = _from_click(sub, f"{path} {name}", ctx)
    return spec


class _Parsed(Exception):  # a control-flow signal (its parser), not an error
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


@contextmanager
def _intercepted() -> Iterator[None]:
    """``ArgumentParser.parse_args`` raises its parser instead of parsing (so ``main`` stops there)."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> NoReturn:
        raise _Parsed(self)

    argparse.ArgumentParser.parse_args = parse_args  # type: ignore[method-assign]  # restored below
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]  # restoring


def suite_parser(module: str) -> argparse.ArgumentParser:
    """The argparse parser ``compaction_worker.bench.<module>.main`` builds, without running it."""
    main = importlib.import_module(f"compaction_worker.bench.{module}").main
    with _intercepted():
        try:
            main([])
        except _Parsed as parsed:
            return parsed.parser
    raise RuntimeError(f"bench/{module}.py: main() did not parse its arguments")


def _from_argparse(parser: argparse.ArgumentParser, path: str) -> Command:
    spec = Command(path, f"{path} [OPTIONS]", (parser.description or "").strip().split("\n\n")[0])
    for action in parser._actions:  # argparse has no public list of its actions
        if not action.option_strings:
            continue
        nargs = action.nargs
        values: int | str = 0 if nargs == 0 else 1 if nargs is None else nargs
        metavar = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar or ())
        metavar = "" if values == 0 else metavar or action.dest.upper()
        default = "" if values == 0 else _shown(action.default)
        choices = tuple(str(c) for c in action.choices or ())
        spec.options.append(
            Option(tuple(action.option_strings), values, metavar, action.help or "", default, choices)
        )
    return spec


def commands(root: click.Group) -> Command:
    """The whole CLI from its root command, with the ``quality`` suites' own options."""
    spec = _from_click(root, PROGRAM, None)
    quality = root.commands.get("quality")
    suite = next((p for p in quality.params if p.name == "suite"), None) if quality else None
    if suite is not None and isinstance(suite.type, click.Choice):
        parent = spec.subcommands["quality"]
        for name in map(str, suite.type.choices):
            sub = _from_argparse(suite_parser(name.replace("-", "_")), f"{parent.path} {name}")
            for (variant_suite, flag), variant in QUALITY_VARIANTS.items():
                if variant_suite == name:
                    sub.variants[flag] = _from_argparse(suite_parser(variant), f"{sub.path} {flag}")
            parent.subcommands[name] = sub
    return spec


# --- the reference -----------------------------------------------------------------------------


HELP = {"--help", "-h"}
"""Every command takes it; the tables leave it out."""


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def markdown(root: Command) -> str:
    """The CLI reference: a section per command, its usage, what it does and a table of its options."""
    lines: list[str] = []
    for command in root.walk():
        lines += ["", f"### `{command.path}`", "", "```", command.usage, "```", ""]
        if command.help:
            lines += [" ".join(command.help.split("\n\n")[0].split()), ""]
        if command.subcommands:
            lines.append("Commands: " + ", ".join(f"`{name}`" for name in command.subcommands) + ".")
            lines.append("")
        options = [o for o in command.options if not set(o.names) & HELP]
        if options:
            lines += ["| option | value | default | meaning |", "|---|---|---|---|"]
            for option in options:
                names = ", ".join(f"`{n}`" for n in option.names)
                value = " | ".join(option.choices) if option.choices else option.metavar
                lines.append(f"| {names} | {_cell(value)} | {_cell(option.default)} | {_cell(option.help)} |")
            lines.append("")
    return "\n".join(lines).strip()


# --- the commands the docs quote ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Quoted:
    """A ``compaction-worker ...`` command as a document quotes it: where, and its words after the program."""

    path: Path
    line: int
    text: str
    words: tuple[str, ...]


_FENCE = re.compile(r"^\s*(```|~~~)")
_INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
_SEPARATORS = {"|", "||", "&&", ";", "&"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def _words(text: str) -> list[str]:
    """The shell words of ``text``; a command substitution ``$(...)`` is one word (a value)."""
    try:
        words = shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote in prose-like notation: words as written
        words = text.split("#", 1)[0].split()
    merged: list[str] = []
    depth = 0
    for word in words:
        if depth:
            merged[-1] += " " + word
        else:
            merged.append(word)
        depth = max(0, depth + word.count("$(") - word.count(")"))
    return merged


def _invocations(text: str) -> Iterator[tuple[str, ...]]:
    """The words after ``compaction-worker`` of each shell command in ``text`` that runs it."""
    segment: list[str] = []
    for word in [*_words(text), ";"]:
        if word not in _SEPARATORS:
            segment.append(word)
            continue
        words, segment = segment, []
        while words and (_ASSIGNMENT.match(words[0]) or words[0] in {"$", "exec", "time", "sudo"}):
            words = words[1:]
        if words[:2] == ["uv", "run"]:
            words = words[2:]
            while words and words[0].startswith("-"):
                words = words[1:]
        if words and words[0] == PROGRAM:
            yield tuple(words[1:])


def quoted(path: Path) -> Iterator[Quoted]:
    """Every command line in a Markdown file's code blocks and inline code that runs ``compaction-worker``."""
    fenced = False
    pending: tuple[int, str] | None = None  # a line continued with a backslash
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if _FENCE.match(line):
            fenced, pending = not fenced, None
            continue
        if fenced:
            start, text = pending if pending else (number, "")
            text += line.rstrip()
            if text.endswith("\\"):
                pending = (start, text[:-1] + " ")
                continue
            pending = None
            spans = [text]
        else:
            start, spans = number, [m.group(1) for m in _INLINE.finditer(line)]
        for span in spans:
            for words in _invocations(span):
                yield Quoted(path, start, " ".join((PROGRAM, *words)), words)


def _placeholder(word: str) -> bool:
    """A word that stands for a value (``N``, ``PATH...``, ``<file>``, ``{a,b}``, ``$(...)``), not a literal one."""
    return word.startswith(("<", "{", "$")) or word == "..." or not any(c.islower() for c in word)


def _value(option: Option, words: Sequence[str], i: int, attached: str) -> tuple[str, int]:
    """The option's (first) value and the index of the word after its values."""
    if option.values == 0 or attached:
        return attached, i
    value = words[i] if i < len(words) else ""
    if isinstance(option.values, int):
        return value, i + option.values
    while i < len(words) and not words[i].startswith("-"):  # argparse's "+", "*", "?"
        i += 1
    return value, i


def _subcommand(command: Command, word: str) -> Command | str | None:
    """The subcommand ``word`` names, what is wrong with it, or None when a placeholder names it."""
    if word.startswith("{"):
        unknown = [w for w in word.strip("{}").split(",") if w not in command.subcommands]
        return f"`{command.path}` has no command {', '.join(unknown)}" if unknown else None
    if _placeholder(word):
        return None
    found = command.subcommands.get(word) or command.aliases.get(word)
    return found or f"`{command.path}` has no command {word!r}"


def _wrong(root: Command, words: Sequence[str]) -> str | None:
    """What is wrong with a command's words: a subcommand, option or choice the CLI does not have."""
    command, positional, i = root, 0, 0
    while i < len(words):
        word, i = words[i], i + 1
        if word.startswith("-") and len(word) > 1 and not word[1:2].isdigit():
            name, _, attached = word.partition("=")
            if name in command.variants:
                command = command.variants[name]
                continue
            option = command.option(name)
            if option is None:
                return f"`{command.path}` has no option {name}"
            if name in HELP:
                return None
            value, i = _value(option, words, i, attached)
            if option.choices and value and not _placeholder(value) and value not in option.choices:
                return f"{name} takes one of {', '.join(option.choices)}, not {value!r}"
        elif command.subcommands and positional == 0:
            found = _subcommand(command, word)
            if not isinstance(found, Command):
                return found
            command = found
        else:
            positional += 1
    return None


def problems(root: Command, quote: Quoted) -> list[str]:
    """What is wrong with one quoted command, by file and line (empty: nothing)."""
    words = [w for w in (w.strip("[]") for w in quote.words) if w and w not in {"...", "|"}]
    wrong = _wrong(root, words)
    if wrong is None:
        return []
    shown = quote.path.relative_to(REPOSITORY) if quote.path.is_relative_to(REPOSITORY) else quote.path
    return [f"{shown}:{quote.line}: `{quote.text}`: {wrong}"]


def check(root: Command, paths: Iterable[Path]) -> list[str]:
    """Every problem of every ``compaction-worker`` command quoted in ``paths``, by file and line."""
    return [problem for path in paths for quote in quoted(path) for problem in problems(root, quote)]


def documents(repository: Path) -> Sequence[Path]:
    """The documents whose commands are checked: the README and every page of docs/."""
    return [repository / "README.md", *sorted((repository / "docs").glob("*.md"))]
