"""The conversation commands' text form: what a person reads where a script reads ``--json``."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compaction_worker.contracts import cli_output
    from compaction_worker.runtime.preview import Preview


def message_line(message: Mapping[str, Any], width: int) -> str:
    """One message on one line: its role (and tool call id), then its text or its calls, cut at ``width``."""
    from compaction_worker.contracts.history import text_of

    role = message.get("role", "?")
    calls = message.get("tool_calls") or []
    if calls:
        call_text = ", ".join(f"{c['function']['name']}({c['function'].get('arguments', '')})" for c in calls)
        text = f"→ {call_text}"
    else:
        text = text_of(message)
        if isinstance(message.get("content"), list) and any(
            p.get("type") != "text" for p in message["content"]
        ):
            text += " [+non-text parts]"
    label = f"[{role}{' ' + str(message['tool_call_id']) if role == 'tool' else ''}]"
    flat = " ".join(text.split())
    return f"{label} {flat[:width]}{'…' if len(flat) > width else ''}"


def flat(value: Mapping[str, Any] | None) -> str | None:
    """A nested part of an output on one line: ``name value, ...`` (nulls left out)."""
    if value is None:
        return None
    return ", ".join(f"{name} {v}" for name, v in value.items() if v is not None)


def preview_lines(found: Preview) -> list[str]:
    """A dry run or a waiting proposal: what committing it would change, then its summary."""
    change = (
        f"~{found.tokens_before} -> ~{found.tokens_after} tokens, {found.replaced} messages replaced, "
        f"stages: {', '.join(found.stages) or '-'}"
    )
    if found.compaction_id is None:
        lines = [
            f"{found.conversation_id} (version {found.version}): a manual compaction would be "
            f"{found.outcome.value}, {change} (nothing written)"
        ]
    else:
        lines = [
            f"{found.conversation_id}: proposal {found.compaction_id} (computed on version {found.version}) "
            f"would be {found.outcome.value}, {change}"
        ]
        if found.stale:
            lines.append(
                f"stale: {found.turns_since} turns arrived since; applying it computes it again on the "
                "history as it is now"
            )
    if found.error:
        lines.append(f"note: {found.error}")
    if found.summary:
        lines += ["summary it would write:", found.summary]
    return lines


def version_line(version: cli_output.Version) -> str:
    """One committed version: ``*`` when the history holds it, when, why, the tokens, what it covers."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(version.at))
    why = version.trigger.value
    if version.rewound_version is not None:
        why += f" of version {version.rewound_version}"
    covers = f", summaries up to message {version.replaced_through}" if version.replaced_through else ""
    stages = f", stages: {', '.join(version.stages)}" if version.stages else ""
    return (
        f"{'*' if version.in_effect else ' '} version {version.version:<4} {when} UTC  {why}: "
        f"~{version.tokens_before} -> ~{version.tokens_after} tokens{covers}{stages}"
    )
