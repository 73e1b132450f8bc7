"""What a short session says: the items a user sets (several templates per kind, each with a canary
value) and the remarks, questions and replies around them (``bench/short_sessions.py`` puts them
together).

Items are phrased as various people would: labelled ("Hard constraint: ...", "Safety rule: ..."),
imperative ("Never force-push to release/24.3."), declarative ("Customer data stays in eu-west-1."),
in passing ("For the record, OPS-4471 is the ticket for the cutover."). The vocabulary is the
benchmark's own, not the product's extractor's (``summaries/standing.py``). Each canary is a value
that nothing else in the session says: a region, a host, a number with its unit, a name, a path.
Remarks state nothing the work needs; a few carry a number or "always", "must", "only", as people
write them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

KINDS = ("rule", "constraint", "fact", "goal", "preference")


@dataclass(frozen=True, slots=True)
class Said:
    """One sentence the user wrote, the value that identifies it, and the words that place it."""

    text: str
    canary: str
    keys: tuple[str, ...]


# --- values: each distinct within a session -------------------------------------------------------

_REGIONS = [
    "eu-west-1", "eu-west-3", "eu-central-1", "eu-north-1", "us-east-2", "us-west-2",
    "ca-central-1", "ap-southeast-2", "ap-northeast-1", "sa-east-1", "af-south-1", "me-south-1",
]  # fmt: skip
_FIRST = ["Priya", "Tomasz", "Ines", "Kenji", "Siobhan", "Rami", "Agnieszka", "Joost", "Lakshmi", "Thabo"]
_LAST = [
    "Okonkwo", "Lindqvist", "Ferreira", "Nakamura", "Brennan", "Haddad", "Kowalczyk", "Achterberg",
    "Ramaswamy", "Delacroix", "Ivanova", "Sandoval",
]  # fmt: skip
_CODENAMES = [
    "bluefin",
    "kestrel",
    "marlin",
    "osprey",
    "gannet",
    "heron",
    "puffin",
    "skua",
    "plover",
    "shrike",
]
_ZONES = [
    "Europe/Lisbon", "Asia/Singapore", "America/Denver", "Australia/Perth", "Europe/Warsaw",
    "America/Sao_Paulo", "Asia/Kolkata", "Pacific/Auckland",
]  # fmt: skip
_VENDORS = ["Stripe", "Adyen", "Zuora", "Chargebee", "Recurly", "Paddle"]
_MONTHS = ["January", "February", "March", "April", "June", "July", "September", "October", "November"]
_WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
_TOPICS = ["ledger", "payouts", "cutover", "exports", "invoicing", "dunning"]


class Values:
    """Draws values no other item of the session uses (numbers included, so that no canary is part of another)."""

    def __init__(self, r: random.Random) -> None:
        self.r = r
        self.used: set[str] = set()

    def fresh(self, make: Callable[[], str]) -> str:
        for _ in range(200):
            value = make()
            if value not in self.used:
                self.used.add(value)
                return value
        raise RuntimeError("ran out of distinct values")  # pragma: no cover - pools are far larger

    def number(self, low: int, high: int, step: int = 1) -> int:
        return int(self.fresh(lambda: str(self.r.randrange(low, high, step))))

    def pick(self, pool: Sequence[str]) -> str:
        return self.fresh(lambda: self.r.choice(pool))

    def host(self) -> str:
        prefix = ["db", "pg", "cache", "batch", "ingest", "bastion", "vault", "etl", "search"]
        domain = ["internal", "corp.lan", "ops.example.net", "prod.local"]
        return self.fresh(lambda: f"{self.r.choice(prefix)}-{self.r.randint(10, 99)}.{self.r.choice(domain)}")

    def person(self) -> tuple[str, str]:
        """A full name and its surname (the canary)."""
        last = self.pick(_LAST)
        return f"{self.r.choice(_FIRST)} {last}", last

    def channel(self) -> str:
        return self.fresh(
            lambda: f"#{self.r.choice(['inc', 'team', 'proj', 'ops'])}-{self.r.choice(_TOPICS)}"
        )

    def clock(self) -> str:
        return self.fresh(
            lambda: f"{self.r.randint(5, 22):02d}:{self.r.choice(['00', '15', '30', '45'])} UTC"
        )

    def version(self) -> str:
        return self.fresh(lambda: f"v{self.r.randint(2, 9)}.{self.r.randint(10, 40)}.{self.r.randint(1, 9)}")


# --- the items: several templates per kind, each (first sentence, a later change or None) ---------

Made = tuple[Said, Said | None]
Template = Callable[[Values], Made]


def said(text: str, canary: str, *keys: str) -> Said:
    assert canary in text, text
    assert all(k.lower() in text.lower() for k in keys), text
    return Said(text, canary, keys)


def _rules() -> list[Template]:
    def migrations(v: Values) -> Made:
        host = v.host()
        return said(
            f"Safety rule: never run schema migrations against {host} during business hours.",
            host,
            "migrations",
        ), None

    def restarts(v: Values) -> Made:
        region = v.pick(_REGIONS)
        return said(f"Do not restart more than one pod at a time in {region}.", region, "restart"), None

    def deletes(v: Values) -> Made:
        bucket = v.fresh(lambda: f"s3://acme-{v.r.choice(_TOPICS)}-{v.r.randint(10, 99)}")
        return said(
            f"Anything that deletes objects in {bucket} needs a second pair of eyes first.", bucket, "deletes"
        ), None

    def sign_off(v: Values) -> Made:
        name, last = v.person()
        return said(f"Get {name}'s sign-off before any change to the ledger schema.", last, "sign-off"), None

    def force_push(v: Values) -> Made:
        branch = v.fresh(lambda: f"release/{v.r.randint(23, 26)}.{v.r.randint(1, 12)}")
        return said(f"Never force-push to {branch}, whatever the reason.", branch, "force-push"), None

    def kill_switch(v: Values) -> Made:
        flag = v.fresh(
            lambda: (
                f"{v.r.choice(['EXPORTS', 'QUEUE', 'LEDGER'])}_{v.r.choice(['PAUSE', 'HALT', 'FREEZE'])}_{v.r.randint(2, 9)}"
            )
        )
        return said(f"If the error rate spikes, flip {flag} and stop everything.", flag, "error rate"), None

    def credentials(v: Values) -> Made:
        path = v.fresh(lambda: f"/srv/{v.r.choice(_TOPICS)}/{v.r.choice(['app', 'worker', 'cron'])}.env")
        return said(
            f"Production credentials stay out of the chat and out of {path}.", path, "credentials"
        ), None

    def writes(v: Values) -> Made:
        host = v.host()
        return said(f"Rule: no writes to {host} from a laptop, only from the bastion.", host, "writes"), None

    return [migrations, restarts, deletes, sign_off, force_push, kill_switch, credentials, writes]


def _constraints() -> list[Template]:
    def window(v: Values) -> Made:
        n, m = v.number(20, 55, 5), v.number(60, 120, 5)
        return (
            said(f"Hard constraint: the maintenance window is {n} minutes.", f"{n} minutes", "window"),
            said(f"Actually, make the window {m} minutes.", f"{m} minutes", "window"),
        )

    def residency(v: Values) -> Made:
        old, new = v.pick(_REGIONS), v.pick(_REGIONS)
        return (
            said(f"Customer data stays in {old}.", old, "customer data"),
            said(
                f"Legal came back: customer data has to live in {new} now, not the old region.",
                new,
                "customer data",
            ),
        )

    def memory(v: Values) -> Made:
        n, m = v.number(128, 512, 32), v.number(640, 2048, 64)
        return (
            said(f"Each worker gets at most {n} MB of memory.", f"{n} MB", "memory"),
            said(f"We can afford {m} MB of memory per worker after all.", f"{m} MB", "memory"),
        )

    def rate(v: Values) -> Made:
        vendor, n, m = v.pick(_VENDORS), v.number(20, 90, 5), v.number(100, 400, 10)
        return (
            said(
                f"We can't go over {n} requests per second against the {vendor} API.",
                f"{n} requests per second",
                vendor,
            ),
            said(
                f"{vendor} raised our quota, so {m} requests per second is the new ceiling.",
                f"{m} requests per second",
                vendor,
            ),
        )

    def batch(v: Values) -> Made:
        n, m = v.number(500, 5000, 250), v.number(6000, 20000, 500)
        return (
            said(f"Batch size is capped at {n} rows.", f"{n} rows", "batch"),
            said(f"Bump the batch size to {m} rows.", f"{m} rows", "batch"),
        )

    def budget(v: Values) -> Made:
        n, m = v.number(2000, 9000, 100), v.number(10000, 30000, 500)
        return (
            said(f"The migration budget is ${n:,} and that's a hard ceiling.", f"${n:,}", "budget"),
            said(f"Finance approved more, the migration budget is ${m:,} now.", f"${m:,}", "budget"),
        )

    def downtime(v: Values) -> Made:
        n, m = v.number(5, 30), v.number(31, 90)
        return (
            said(f"Keep the cutover under {n} seconds of downtime.", f"{n} seconds", "downtime"),
            said(f"Change of plan: {m} seconds of downtime is acceptable.", f"{m} seconds", "downtime"),
        )

    def retention(v: Values) -> Made:
        n, m = v.number(30, 90), v.number(180, 400)
        return (
            said(f"Exports have to be retained for {n} days.", f"{n} days", "retained"),
            said(f"Retention for exports goes up to {m} days.", f"{m} days", "retention"),
        )

    return [window, residency, memory, rate, batch, budget, downtime, retention]


def _facts() -> list[Template]:
    def staging(v: Values) -> Made:
        old, new = v.host(), v.host()
        return (
            said(f"The staging database lives on {old}.", old, "staging"),
            said(f"Staging moved to {new} over the weekend.", new, "staging"),
        )

    def owner(v: Values) -> Made:
        name, last = v.person()
        return said(f"{name} owns the exporter code.", last, "owns"), None

    def account(v: Values) -> Made:
        acct = v.fresh(lambda: f"acct_{v.r.getrandbits(32):08x}")
        return said(f"Our merchant account id is {acct}.", acct, "merchant"), None

    def handover(v: Values) -> Made:
        old, new = v.clock(), v.clock()
        return (
            said(f"On-call hands over at {old}.", old, "on-call"),
            said(f"From this week the on-call handover is at {new}.", new, "on-call"),
        )

    def legacy(v: Values) -> Made:
        name = v.pick(_CODENAMES)
        return said(f"The legacy queue is named {name}.", name, "legacy"), None

    def incidents(v: Values) -> Made:
        channel = v.channel()
        return said(f"Incidents for this go to {channel}.", channel, "incidents"), None

    def ticket(v: Values) -> Made:
        ticket = v.fresh(lambda: f"{v.r.choice(['OPS', 'BILL', 'DATA', 'PLAT'])}-{v.r.randint(1000, 9999)}")
        return said(f"For the record, {ticket} is the ticket for the cutover.", ticket, "ticket"), None

    def version(v: Values) -> Made:
        old, new = v.version(), v.version()
        return (
            said(f"The exporter runs {old} in production.", old, "exporter"),
            said(f"Correction: the exporter is on {new} in production already.", new, "exporter"),
        )

    return [staging, owner, account, handover, legacy, incidents, ticket, version]


def _goals() -> list[Template]:
    def first(v: Values) -> Made:
        name = v.pick(_CODENAMES)
        return said(f"Current goal: cut over the {name} consumer first.", name, "consumer"), None

    def tenants(v: Values) -> Made:
        total = v.number(40, 90)
        n, m = v.number(3, 15), v.number(16, 39)
        return (
            said(f"Status: {n} of {total} tenants are migrated.", f"{n} of {total}", "tenants"),
            said(f"Update: {m} of {total} tenants are migrated now.", f"{m} of {total}", "tenants"),
        )

    def shadow(v: Values) -> Made:
        n, m, day = v.number(5, 25), v.number(30, 75), v.r.choice(_WEEKDAYS)
        return (
            said(f"Next milestone is shadow traffic at {n}% by {day}.", f"{n}%", "shadow"),
            said(f"Let's ramp shadow traffic to {m}% instead.", f"{m}%", "shadow"),
        )

    def backfill(v: Values) -> Made:
        name = v.pick(_CODENAMES)
        return said(f"The {name} backfill is done, so that part is finished.", name, "backfill"), None

    def cron(v: Values) -> Made:
        name = v.pick(_CODENAMES)
        return said(f"What's left after that is retiring the {name} cron job.", name, "cron"), None

    def reconcile(v: Values) -> Made:
        month = v.pick(_MONTHS)
        return said(f"We're done when the {month} invoices reconcile to the cent.", month, "invoices"), None

    def schema(v: Values) -> Made:
        version = v.version()
        return said(f"Schema {version} is deployed; the consumers are next.", version, "schema"), None

    return [first, tenants, shadow, backfill, cron, reconcile, schema]


def _preferences() -> list[Template]:
    def zone(v: Values) -> Made:
        old, new = v.pick(_ZONES), v.pick(_ZONES)
        return (
            said(f"Please write timestamps in {old}.", old, "timestamps"),
            said(f"Switch timestamps to {new}, please.", new, "timestamps"),
        )

    def bullets(v: Values) -> Made:
        n, m = v.number(3, 6), v.number(7, 12)
        return (
            said(f"I like status updates as bullet lists, {n} bullets max.", f"{n} bullets", "status"),
            said(f"Make that {m} bullets max for the status updates.", f"{m} bullets", "status"),
        )

    def naming(v: Values) -> Made:
        name = v.pick(_CODENAMES)
        return said(f"In anything you write for me, call the new queue {name}.", name, "queue"), None

    def reviewer(v: Values) -> Made:
        name, last = v.person()
        return said(f"Put {name} down as reviewer on the pull requests.", last, "reviewer"), None

    def summaries(v: Values) -> Made:
        channel = v.channel()
        return said(f"Summaries go in {channel}, not in DMs.", channel, "summaries"), None

    def commits(v: Values) -> Made:
        n, m = v.number(50, 72), v.number(80, 120)
        return (
            said(f"Keep commit subjects under {n} characters.", f"{n} characters", "commit"),
            said(f"Let's allow {m} characters for commit subjects.", f"{m} characters", "commit"),
        )

    def dates(v: Values) -> Made:
        example = v.fresh(lambda: f"{v.r.randint(10, 28)}.{v.r.randint(1, 12):02d}.{v.r.randint(2024, 2027)}")
        return said(f"Write dates the way we do here, like {example}.", example, "dates"), None

    return [zone, bullets, naming, reviewer, summaries, commits, dates]


TEMPLATES: dict[str, Callable[[], list[Template]]] = {
    "rule": _rules,
    "constraint": _constraints,
    "fact": _facts,
    "goal": _goals,
    "preference": _preferences,
}

# --- what surrounds them ----------------------------------------------------------------------------

FILLER = [
    "The webhook retries three times before dead-lettering.",
    "Cache invalidation is event-driven; the TTL is only a backstop.",
    "The dashboard refreshes every few minutes, so expect some lag.",
    "Most of the consumers are idle at night anyway.",
    "The old exporter was written before we had structured logging.",
    "Serialization is plain JSON, nothing fancy.",
    "The scheduler always runs jobs in submission order.",
    "Backpressure kicks in when the queue gets deep.",
    "Half of the alerts on that board are noise.",
    "The CSV writer streams rows rather than buffering the whole file.",
    "Retries use exponential backoff with jitter.",
    "The reconciliation report is generated from the same tables.",
    "Nobody has touched the exporter's config in a long time.",
    "The queue client reconnects on its own after a broker restart.",
    "Idempotency keys are derived from the invoice id.",
    "Most tenants are small; a handful dominate the volume.",
    "The integration tests spin up a throwaway broker.",
    "Log lines from the exporter are fairly verbose.",
    "The exporter must have been copied from the reporting service at some point.",
    "Timeouts there are mostly slow DNS, not the database.",
    "The old queue only supports at-least-once delivery.",
    "Dead letters are reviewed by hand once a week.",
    "Schema changes are backward compatible by convention.",
    "The metrics pipeline samples traces, so gaps are normal.",
    "The exporter and the importer share a connection pool.",
    "Feature flags are evaluated per request.",
    "The partition key is the tenant id.",
    "Compression is on for the larger payloads.",
    "The build takes a while because of the protobuf step.",
    "The staging environment is rebuilt from scratch every night.",
    "Consumers commit offsets after processing, not before.",
    "The monitoring agent ships logs in batches.",
    "That service was split out of the monolith a couple of years ago.",
    "Error budgets are tracked per quarter.",
    "The new queue keeps messages in order per key.",
    "Alert thresholds were tuned for the old traffic pattern.",
    "The README for the exporter is out of date.",
    "The job runner keeps its state in a small table.",
    "Version 2 of the client library fixed the reconnect bug.",
    "The old broker cluster has 3 nodes and nobody loves it.",
    "Our finance team closes the books on the 5th business day.",
    "The exporter never had proper load tests.",
    "Payload sizes vary a lot between tenants.",
    "Health checks hit a lightweight endpoint, not the database.",
    "The old consumers poll; the new ones get pushed messages.",
    "The exporter's unit tests mock the queue entirely.",
    "Most failures we see are transient network blips.",
    "The admin UI reads from a replica, so it can lag a little.",
    "The old queue's client library is no longer maintained.",
    "Message headers carry the trace context.",
    "The nightly exports are the biggest by far.",
    "Rate limiting happens at the gateway, not in the service.",
    "The invoice renderer is a separate service with its own queue.",
    "Config is loaded once at startup.",
    "Deploys go out through the usual pipeline.",
    "The exporters were written by three different teams.",
    "Some tenants still send XML, which gets converted upstream.",
    "The queue dashboard groups consumers by service.",
    "Dashboards for the new queue are still being built.",
    "Memory use of the exporter is dominated by the CSV buffers.",
    "The feature flag service caches values for a short while.",
    "Our staging data is a scrubbed copy of production.",
    "The runbook for the old queue is mostly accurate.",
    "The connection pool is shared across all exporters.",
    "Duplicates are rare but do happen after a rebalance.",
]
"""Remarks that state nothing the work needs (a few with a number, a few with "always", "must",
"only" or "never" in them, as people write)."""

ASKS = [
    "Can you check the consumer lag?",
    "Any errors in the last run?",
    "How far along is the dry run?",
    "Let me know when the first export lands.",
    "What does the retry path look like now?",
    "Go on with the next step.",
    "Is the new queue's dead-letter topic set up?",
    "Did the smoke test pass?",
]
TASKS = [
    "Please migrate the {s} exports to the new queue and keep me posted.",
    "I need you to move the {s} exports off the old queue onto the new one.",
    "Today's job: port the {s} exports to the new queue, one exporter at a time.",
    "Can you take the migration of the {s} exports to the new queue from here?",
]
TASK_SUBJECTS = ["billing", "invoice", "usage", "refund", "payout"]
ACKS = [
    "Acknowledged. Continuing with the plan.",
    "Noted.",
    "Got it.",
    "Understood, proceeding.",
    "Okay, noted. Moving on.",
    "Thanks, that's clear.",
    "Will do.",
    "Noted, I'll keep that in mind.",
]
NOTES = [
    "Checked the consumer config; nothing unusual there.",
    "Dry run finished without errors.",
    "Updated the exporter's queue settings on my branch.",
    "Ran the unit tests; all green.",
    "Looked at the retry path; it matches what you described.",
    "Drafted the cutover checklist; I'll share it when it's firmer.",
    "The first exporter is wired to the new queue in a branch.",
    "No errors in the last run.",
    "Compared the old and new consumer configs; only the prefetch differs.",
    "The exporter's integration test passes against the new queue locally.",
    "Read through the dead-letter handling; it carries over unchanged.",
    "Staged the config change; nothing is deployed yet.",
]
TOOLS = [
    ("run_command", {"cmd": "queue-stats --queue exports"}, "depth: 0\nconsumers: 4\nlag_seconds: 0"),
    ("read_file", {"path": "exporter/settings.toml"}, '[queue]\nbackend = "new"\nprefetch = 16\n'),
    ("run_command", {"cmd": "pytest tests/exporter -q"}, "18 passed in 2.41s"),
]
