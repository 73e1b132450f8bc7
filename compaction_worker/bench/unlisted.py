"""Kinds no list names, through the broker and Redis: what a worker keeps of them, and what it says it lost.

Run: compaction-worker quality unlisted [--seed 11] [--held-out-seed 2718] [--turns 120] [--json]
     compaction-worker quality unlisted --source ../other-checkout   (that checkout's worker, the same input)

A generated conversation reaches a worker as a runtime sends it: one turn at a time, each waited
for (and the compaction it sets off) before the next, as an agent waits for its model. User turns
are prose; assistant turns call a tool as ``call_0`` (every turn reuses the id), read its result
and answer in prose; the tool's call names a file and its result may name a path, an id, a host, a
ticket or a URL (kinds the extractors list, competing for the ledger as in real work). The model is
``openrouter/openai/gpt-4``: an 8K window from the registry, behind a routing prefix. Every other
turn states one item of 24 kinds in a sentence of its own, by the user or the assistant: shapes
people write (an e-mail address, ``NAME=VALUE``, an image reference, a Kubernetes ``kind/name``, an
amount in EUR, a person's name, ...) and shapes generated from the seed
(:class:`~compaction_worker.bench.fidelity.UnlistedKinds`'s), none of them a kind the extractors
list. The summarizer is a fake OpenAI-compatible server (LiteLLM's real path) whose summary keeps
nothing. A second conversation states 30 held-out kinds (other shapes, other generated ones) once
each on a seed of its own.

After the run, ``Client.messages`` is searched for every planted item verbatim. Each compaction
is the turn after which the history changed version; what it lost is what the history held
verbatim before it (with the turn's own messages) and not after; its ``compaction.completed``
says ``artifacts_dropped``. Both are summed over the run and set side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compaction_worker.bench.fidelity import _PROSE_WORDS, Planted, UnlistedKinds
from compaction_worker.bench.traffic import Conversation, Messages, Sent, drive, drive_in_child, settings_data
from compaction_worker.local.embedded import EmbeddedKafka, EmbeddedRedis
from compaction_worker.summaries.prompts import SECTIONS
from compaction_worker.testing import FakeLLMServer

MODEL = "openrouter/openai/gpt-4"
"""A popular model behind a routing prefix: its 8K window comes from the registry."""
TURNS = 120
SEED = 11
HELD_OUT_SEED = 2718
"""A seed no other measurement of this project uses."""
KINDS = 24
HELD_OUT_KINDS = 30
TARGET = 0.95
PROSE_WORDS = (140, 200)
"""A message's prose, in words (about 1.3 tokens each): 120 turns set off more than ten compactions at 8K."""
SENTENCE_WORDS = (8, 20)
RESULT_WORDS = (40, 80)
"""A tool result's filler, in words."""
NOISE_LINES = (0, 1)
"""Lines naming identifiers of listed kinds in a tool result (besides the file its call names)."""

Kind = tuple[str, Callable[[], str], Callable[[str], str]]
"""A kind: its name, a maker of one item, and the sentence that states an item."""

_FIRST = ("ana", "tomas", "lea", "omar", "ingrid", "ravi", "mei", "jonas", "sofia", "kemal")
_LAST = ("kovacs", "lindqvist", "okafor", "moreau", "tanaka", "silva", "novak", "haddad", "berg", "ferreira")
_TEAMS = ("payments", "ledger", "search", "identity", "billing", "catalog", "risk", "growth")
_APPS = ("api", "worker", "gateway", "scheduler", "exporter", "console")
_K8S = ("deployment", "statefulset", "configmap", "cronjob", "daemonset", "service", "secret", "ingress")
_VARIABLES = ("MAX_POOL_SIZE", "RETRY_BUDGET", "CACHE_TTL_SECONDS", "WORKER_CONCURRENCY", "FEATURE_LEVEL")
_COMPANIES = ("ledgerly", "acmecorp", "northwind", "brightpay", "orbitly", "quantia")
_REGIONS = ("eu-central-1", "us-east-2", "ap-southeast-1", "eu-west-3", "sa-east-1")
_ZONES = ("Europe/Tallinn", "America/Bogota", "Asia/Kolkata", "Africa/Lagos", "Australia/Perth")


def _shapes(rng: random.Random) -> dict[str, tuple[Callable[[], str], Callable[[str], str]]]:
    """Shapes people write, each with a sentence that states one; every call of a maker draws a new item."""

    def person() -> tuple[str, str]:
        return rng.choice(_FIRST), rng.choice(_LAST)

    def pick(*choices: str) -> str:
        return rng.choice(choices)

    def mail() -> str:
        first, last = person()
        return f"{first}.{last}@{rng.choice(_COMPANIES)}.example"

    return {
        "e-mail address": (mail, lambda x: f"The contact for this one is {x} from now."),
        "NAME=VALUE": (
            lambda: f"{rng.choice(_VARIABLES)}_{rng.randint(2, 40)}={rng.choice((8, 16, 32, 64, 128, 256))}",
            lambda x: f"We set {x} in the environment.",
        ),
        "image reference": (
            lambda: (
                f"registry.{rng.choice(_COMPANIES)}.io/{rng.choice(_TEAMS)}/{rng.choice(_APPS)}:"
                f"{rng.randint(1, 4)}.{rng.randint(0, 12)}.{rng.randint(0, 9)}"
            ),
            lambda x: f"The image running there is {x} today.",
        ),
        "Kubernetes resource": (
            lambda: f"{rng.choice(_K8S)}/{rng.choice(_TEAMS)}-{rng.choice(_APPS)}",
            lambda x: f"The change touched {x} only.",
        ),
        "amount in EUR": (
            lambda: f"{rng.randint(1, 99)},{rng.randint(0, 999):03d}.{rng.randint(0, 99):02d} EUR",
            lambda x: f"The invoice came to {x} in total.",
        ),
        "person's name": (
            lambda: " ".join(w.capitalize() for w in person()),
            lambda x: f"{x} owns that part now.",
        ),
        "chat channel": (
            lambda: f"#{rng.choice(_TEAMS)}-{pick('alerts', 'oncall', 'releases', 'incidents')}",
            lambda x: f"The updates go to {x} as usual.",
        ),
        "git branch": (
            lambda: (
                f"{pick('feature', 'fix', 'release')}/{rng.choice(_TEAMS)}-{pick('retry', 'split', 'cutover')}"
            ),
            lambda x: f"The work sits on {x} until review.",
        ),
        "HTTP header": (
            lambda: f"X-{rng.choice(_TEAMS).capitalize()}-{pick('Trace', 'Tenant', 'Budget', 'Origin')}",
            lambda x: f"The proxy now forwards {x} upstream.",
        ),
        "share": (
            lambda: f"{rng.randint(90, 99)}.{rng.randint(1, 99):02d}%",
            lambda x: f"Availability held at {x} over the month.",
        ),
        "cloud resource name": (
            lambda: (
                f"arn:aws:sqs:{rng.choice(_REGIONS)}:{rng.randint(10**11, 10**12 - 1)}:{rng.choice(_TEAMS)}-dlq"
            ),
            lambda x: f"The dead letters land in {x} for now.",
        ),
        "phone number": (
            lambda: f"+{rng.randint(30, 49)}-{rng.randint(100, 999)}-{rng.randint(1000000, 9999999)}",
            lambda x: f"The escalation line is {x} at night.",
        ),
        # The held-out conversation's own shapes: the main one never states these.
        "MAC address": (
            lambda: ":".join(f"{rng.getrandbits(8):02x}" for _ in range(6)),
            lambda x: f"The card in that box reports {x} again.",
        ),
        "IPv6 address": (
            lambda: f"fd{rng.getrandbits(8):02x}:{rng.getrandbits(16):x}::{rng.getrandbits(12):x}",
            lambda x: f"The sidecar listens on {x} inside.",
        ),
        "timestamp": (
            lambda: (
                f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:"
                f"{rng.randint(0, 59):02d}:00Z"
            ),
            lambda x: f"The cutover happened at {x} exactly.",
        ),
        "image digest": (
            lambda: f"sha256:{rng.getrandbits(64):016x}",
            lambda x: f"We pinned {x} for the rollback.",
        ),
        "cloud region": (lambda: rng.choice(_REGIONS), lambda x: f"The replica lives in {x} since then."),
        "time zone": (lambda: rng.choice(_ZONES), lambda x: f"The reports follow {x} hours."),
        "scoped package": (
            lambda: (
                f"@{rng.choice(_COMPANIES)}/{rng.choice(_TEAMS)}-ui@{rng.randint(1, 9)}.{rng.randint(0, 20)}.0"
            ),
            lambda x: f"The front end pulls {x} at build.",
        ),
        "repository issue": (
            lambda: (
                f"{rng.choice(_COMPANIES)}/{rng.choice(_TEAMS)}-{rng.choice(_APPS)}#{rng.randint(10, 9999)}"
            ),
            lambda x: f"The discussion is in {x} upstream.",
        ),
        "Maven coordinate": (
            lambda: (
                f"com.{rng.choice(_COMPANIES)}:{rng.choice(_TEAMS)}-core:{rng.randint(1, 9)}.{rng.randint(0, 30)}"
            ),
            lambda x: f"The service depends on {x} still.",
        ),
        "amount in USD": (
            lambda: f"${rng.randint(1, 99)},{rng.randint(0, 999):03d}.{rng.randint(0, 99):02d}",
            lambda x: f"The quote was {x} per year.",
        ),
        "handle": (
            lambda: f"@{rng.choice(_FIRST)}_{rng.choice(_TEAMS)}",
            lambda x: f"You can ping {x} about it.",
        ),
        "hostname": (
            lambda: (
                f"{rng.choice(_TEAMS)}-{rng.randint(1, 40)}.{rng.choice(_REGIONS)}.{rng.choice(_COMPANIES)}.net"
            ),
            lambda x: f"The job runs on {x} nightly.",
        ),
        "temperature": (
            lambda: f"{rng.randint(18, 95)}.{rng.randint(0, 9)}\u00b0C",
            lambda x: f"The rack peaked at {x} that day.",
        ),
        "SQL column": (
            lambda: (
                f"{rng.choice(_TEAMS)}_events.{pick('amount', 'created', 'settled', 'tenant')}_{pick('cents', 'at', 'id')}"
            ),
            lambda x: f"The report reads {x} directly.",
        ),
        "version range": (
            lambda: f">={rng.randint(1, 5)}.{rng.randint(0, 9)},<{rng.randint(6, 9)}.0",
            lambda x: f"The lock file allows {x} for it.",
        ),
    }


MAIN_SHAPES = 12
"""The first this-many shapes are the main conversation's, the rest the held-out one's."""


def kinds_of(seed: int, count: int, *, held_out: bool = False) -> list[Kind]:
    """``count`` kinds from ``seed``: the shapes (the main ones, or with ``held_out`` the others), then
    kinds generated as :class:`UnlistedKinds` generates them (random shapes, names, numbers with units)."""
    rng = random.Random(seed)
    shapes = list(_shapes(rng).items())
    chosen = shapes[MAIN_SHAPES:] if held_out else shapes[:MAIN_SHAPES]
    chosen = chosen[: count // 2]
    generated = UnlistedKinds(rng.randrange(1 << 30), kinds=count - len(chosen))
    generic = (
        "It is {} for this one.",
        "Note {} for later.",
        "The value we settled on is {} here.",
    )
    kinds: list[Kind] = [(name, make, say) for name, (make, say) in chosen]
    for i, make in enumerate(generated.kinds):
        template = generic[i % len(generic)]
        kinds.append((f"generated {i}", make, template.format))
    return kinds


@dataclass(frozen=True, slots=True)
class Session:
    """One generated conversation: its turns and the items they plant (kind, text, turn that states it)."""

    turns: tuple[tuple[int, Messages], ...]
    planted: tuple[Planted, ...]
    stated_at: tuple[int, ...]
    """The turn that states each planted item (same order)."""
    noise: tuple[str, ...] = ()
    """The identifiers of listed kinds the tool calls and results name (paths, ids, hosts, tickets,
    URLs): not measured for fidelity, but they compete for the ledger and are lost and counted too."""


_TOOLS = ("read_file", "search_code", "run_query", "fetch_logs")
_VERBS = ("GET", "POST", "PUT", "DELETE")


class _Noise:
    """What an agent's tools name: files, request ids, hosts, tickets, build links (kinds the extractors list).

    A third of the time one named before (agents re-read the same files and hosts).
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.named: list[str] = []
        self.lines: dict[str, str] = {}

    def _new(self) -> tuple[str, str]:
        rng = self.rng
        team, shape = rng.choice(_TEAMS), rng.randrange(5)
        if shape == 0:
            item = f"/v{rng.randint(1, 3)}/{team}/{rng.choice(('orders', 'accounts', 'events'))}/{rng.randint(100, 99999)}"
            return item, f"{rng.choice(_VERBS)} {item} 200 {rng.randint(3, 900)}ms"
        if shape == 1:
            item = f"{rng.getrandbits(40):010x}"
            return item, f"request {item} was retried"
        if shape == 2:
            item = f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}:{rng.randint(1024, 65000)}"
            return item, f"connected to {item} after a retry"
        if shape == 3:
            item = f"OPS-{rng.randint(100, 99999)}"
            return item, f"see {item} for the history"
        item = f"https://ci.internal.example/{team}/builds/{rng.randint(100, 99999)}"
        return item, f"build log at {item}"

    def line(self) -> str:
        if self.named and self.rng.random() < 1 / 3:
            return self.lines[self.rng.choice(self.named)]
        item, line = self._new()
        if item not in self.lines:
            self.named.append(item)
            self.lines[item] = line
        return line

    def path(self) -> str:
        rng = self.rng
        if self.named and rng.random() < 1 / 3:
            paths = [n for n in self.named if n.startswith("services/")]
            if paths:
                return rng.choice(paths)
        item = f"services/{rng.choice(_TEAMS)}/{rng.choice(('handlers', 'models', 'jobs'))}/module_{rng.randint(1, 999)}.py"
        if item not in self.lines:
            self.named.append(item)
            self.lines[item] = item
        return item


def session(
    seed: int,
    kinds: Sequence[Kind],
    turns: int = TURNS,
    *,
    every: int = 2,
    noise: tuple[int, int] | None = NOISE_LINES,
) -> Session:
    """``turns`` turns as a runtime sends them, one item stated every ``every`` turns (alternately by the
    user and the assistant), the kinds in a seeded order that repeats (each stated as often as another).

    A user turn is prose (:data:`PROSE_WORDS`); an assistant turn calls a tool as ``call_0`` on a file,
    reads its result and answers in prose. The prose is lowercase filler but for the planted items;
    unless ``noise`` is None the tool's argument names a file and its result that many lines naming
    identifiers of listed kinds (:class:`_Noise`), as real tools do; else they are filler too.
    """
    rng = random.Random(seed)
    tools = _Noise(random.Random(rng.randrange(1 << 30)))
    order: list[int] = []
    out: list[tuple[int, Messages]] = []
    planted: list[Planted] = []
    stated: list[int] = []

    def prose(words: int) -> list[str]:
        sentences: list[str] = []
        while words > 0:
            length = min(words, rng.randint(*SENTENCE_WORDS))
            sentences.append(" ".join(rng.choices(_PROSE_WORDS, k=length)).capitalize() + ".")
            words -= length
        return sentences

    def stating(seq: int) -> bool:
        # Turns 1, every+2, 2*every+1, ...: as often on user turns (odd) as on assistant turns (even).
        return seq % (2 * every) in (1, (every + 2) % (2 * every))

    for seq in range(1, turns + 1):
        sentences = prose(rng.randint(*PROSE_WORDS))
        if stating(seq):
            if not order:
                order = rng.sample(range(len(kinds)), len(kinds))
            name, make, say = kinds[order.pop()]
            item = make()
            planted.append(Planted(name, item))
            stated.append(seq)
            sentences.insert(rng.randint(1, len(sentences) - 1), say(item))
        text = " ".join(sentences)
        if seq % 2:
            out.append((seq, [{"role": "user", "content": text}]))
            continue
        filler = " ".join(rng.choices(_PROSE_WORDS, k=rng.randint(*RESULT_WORDS)))
        if noise is not None:
            arguments = {"path": tools.path()}
            result = "\n".join([filler, *(tools.line() for _ in range(rng.randint(*noise)))])
        else:
            arguments = {"query": " ".join(rng.choices(_PROSE_WORDS, k=4))}
            result = filler
        call = {
            "id": "call_0",
            "type": "function",
            "function": {"name": rng.choice(_TOOLS), "arguments": json.dumps(arguments)},
        }
        out.append(
            (
                seq,
                [
                    {"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_0", "content": result},
                    {"role": "assistant", "content": text},
                ],
            )
        )
    return Session(tuple(out), tuple(planted), tuple(stated), tuple(tools.named))


def paraphrase_summary() -> str:
    """The fake LLM's every summary: the sections, and nothing of what they summarized."""
    return "\n".join(f"## {s}\n- (paraphrased)" for s in SECTIONS)


def shown_text(messages: Messages) -> str:
    """What a model reads of rendered messages: their text and their tool calls' arguments (decoded)."""
    texts: list[str] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(str(p.get("text") or "") for p in content if isinstance(p, dict))
        for call in message.get("tool_calls") or ():
            raw = call.get("function", {}).get("arguments")
            if isinstance(raw, str):
                texts.append(raw)
                with contextlib.suppress(ValueError):
                    arguments = json.loads(raw)
                    if isinstance(arguments, dict):
                        texts.extend(v for v in arguments.values() if isinstance(v, str))
    return "\n".join(texts)


@dataclass(frozen=True, slots=True)
class Compaction:
    """One compaction of the run: its turn, the planted items it lost (by this harness's check) and what its event said."""

    turn: int
    lost: tuple[str, ...]
    """Planted items the history held verbatim before it (with its turn's messages) and not after."""
    lost_noise: tuple[str, ...]
    """The same of the identifiers the tools named (:attr:`Session.noise`)."""
    reported: int
    stages: tuple[str, ...]

    @property
    def identifiers_lost(self) -> int:
        return len(self.lost) + len(self.lost_noise)


@dataclass(frozen=True, slots=True)
class Measured:
    """What a run kept of the planted items, and what its events said it dropped."""

    label: str
    planted: int
    kept: int
    lost: tuple[tuple[str, str], ...]
    """(kind, item) of each planted item not in the final history verbatim."""
    compactions: tuple[Compaction, ...]
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        return self.kept / self.planted if self.planted else 1.0

    @property
    def reported(self) -> int:
        """``artifacts_dropped`` summed over the run's events."""
        return sum(c.reported for c in self.compactions)

    @property
    def lost_by_compactions(self) -> int:
        """Planted items the compactions lost, each time one did (an item lost, restored and lost again counts twice)."""
        return sum(len(c.lost) for c in self.compactions)

    @property
    def identifiers_lost(self) -> int:
        """Every identifier (planted, or named by a tool) the compactions lost: what ``artifacts_dropped`` counts."""
        return sum(c.identifiers_lost for c in self.compactions)


def measure(label: str, conversation: Session, sent: Sent) -> Measured:
    """Score one conversation: which planted items the final history holds verbatim, and per compaction
    what it lost (held before it, with its turn's messages, and not after) beside what its event reported."""
    final = shown_text(sent.messages)
    lost = tuple((p.kind, p.text) for p in conversation.planted if p.text not in final)
    events = {e.get("version"): e for e in sent.completed if e.get("outcome") == "compacted"}
    compactions: list[Compaction] = []
    before, version = "", 0
    steps = zip(conversation.turns, sent.after_turn, sent.versions, strict=True)
    for (seq, messages), after, now in steps:
        if now > version:  # one compaction or more committed during this turn
            held = before + "\n" + shown_text(messages)
            text = shown_text(after)
            stated = [
                p.text
                for p, at in zip(conversation.planted, conversation.stated_at, strict=True)
                if at <= seq
            ]
            ran = [events.get(v, {}) for v in range(version + 1, now + 1)]
            compactions.append(
                Compaction(
                    seq,
                    tuple(item for item in stated if item in held and item not in text),
                    tuple(item for item in conversation.noise if item in held and item not in text),
                    sum(int(e.get("artifacts_dropped") or 0) for e in ran),
                    tuple(s for e in ran for s in e.get("stages") or ()),
                )
            )
            version = now
        before = shown_text(after)
    outcomes = Counter(str(e.get("outcome")) for e in sent.completed)
    return Measured(
        label,
        planted=len(conversation.planted),
        kept=len(conversation.planted) - len(lost),
        lost=lost,
        compactions=tuple(compactions),
        outcomes=dict(outcomes),
    )


def conversations(
    seed: int, held_out_seed: int, turns: int, noise: tuple[int, int] | None = NOISE_LINES
) -> list[tuple[str, Session]]:
    """The run's two conversations: 24 kinds every other turn on ``seed``, 30 held-out kinds once each on ``held_out_seed``."""
    main = session(seed, kinds_of(seed, KINDS), turns, noise=noise)
    held_kinds = kinds_of(held_out_seed, HELD_OUT_KINDS, held_out=True)
    held = session(held_out_seed, held_kinds, turns, every=turns // HELD_OUT_KINDS, noise=noise)
    return [(f"24 kinds (seed {seed})", main), (f"30 held-out kinds (seed {held_out_seed})", held)]


async def send(
    data: Mapping[str, Any], cases: Sequence[tuple[str, Session]], source: Path | None = None
) -> list[Measured]:
    """``cases`` through a worker on the settings ``data`` (this package's worker, or ``source``'s in a
    child process), one turn at a time; scored."""
    sends = [
        Conversation(f"unlisted-{i}-{uuid.uuid4().hex[:6]}", MODEL, case.turns)
        for i, (_, case) in enumerate(cases)
    ]
    if source is None:
        sent = await drive(data, sends)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="cw-unlisted-"))
        try:
            sent = await asyncio.to_thread(drive_in_child, source, data, sends, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return [measure(label, case, s) for (label, case), s in zip(cases, sent, strict=True)]


async def run(
    seed: int = SEED,
    held_out_seed: int = HELD_OUT_SEED,
    turns: int = TURNS,
    source: Path | None = None,
    noise: tuple[int, int] | None = NOISE_LINES,
) -> list[Measured]:
    """Both conversations (:func:`conversations`) on an embedded broker and Redis, with a fake LLM that keeps
    nothing (:func:`send`)."""
    with EmbeddedKafka() as kafka, EmbeddedRedis() as redis, FakeLLMServer() as llm:
        llm.set_reply(paraphrase_summary())
        data = settings_data(kafka.bootstrap_servers, redis.url, llm.url, label="unlisted")
        return await send(data, conversations(seed, held_out_seed, turns, noise), source)


def format_measured(runs: Sequence[Measured], title: str = "") -> str:
    """One block per conversation: kept, compactions, reported beside lost, and what was lost."""
    lines = [title] if title else []
    for m in runs:
        lines.append(
            f"{m.label}: kept {m.kept} of {m.planted} ({m.fraction:.0%}) after {len(m.compactions)} compactions "
            f"(outcomes {dict(sorted(m.outcomes.items()))})"
        )
        lines.append(
            f"  artifacts_dropped summed {m.reported}; identifiers the compactions lost {m.identifiers_lost} "
            f"({m.lost_by_compactions} planted, {m.identifiers_lost - m.lost_by_compactions} named by tools)"
        )
        for c in m.compactions:
            lines.append(
                f"    turn {c.turn:>3}: reported {c.reported:>3}, lost {c.identifiers_lost:>3} "
                f"({len(c.lost)} planted: {', '.join(c.lost) or '-'})"
            )
        for kind, item in m.lost:
            lines.append(f"  lost: {item}  ({kind})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="compaction-worker quality unlisted",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--held-out-seed", type=int, default=HELD_OUT_SEED)
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--source", type=Path, help="another checkout: run its worker on the same input")
    parser.add_argument(
        "--noise",
        type=int,
        nargs=2,
        default=list(NOISE_LINES),
        metavar=("LOW", "HIGH"),
        help="lines naming identifiers of listed kinds per tool result (-1 -1: no identifier in any tool call)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    noise = None if args.noise[0] < 0 else (args.noise[0], args.noise[1])
    runs = asyncio.run(run(args.seed, args.held_out_seed, args.turns, args.source, noise))
    if args.json:
        print(
            json.dumps(
                [{**asdict(m), "fraction": m.fraction, "reported": m.reported} for m in runs], indent=2
            )
        )
    else:
        print(
            format_measured(
                runs, f"Kinds no list names, through the broker ({MODEL}), a summarizer that keeps nothing"
            )
        )
