"""An agent loop on compaction-worker: it never trims its own context; a provider's overflow heals itself."""

import asyncio
import os
import sys
from typing import Any

from compaction_worker.client import Client, complete
from compaction_worker.settings import load_settings

MODEL, API_BASE = os.environ.get("AGENT_MODEL", "openai/gpt-4o-mini"), os.environ.get("AGENT_API_BASE")


async def agent(cid: str, task: str, steps: int = 10) -> None:
    async with Client.connect(load_settings()) as client:
        await client.set_instructions(cid, "Keep the task, each file changed and each failing test's name.")
        new: list[dict[str, Any]] = [{"role": "user", "content": task}]
        for step in range(1, steps + 1):
            # Compacted history + `new`; "too long": compact, retry; recall=True answers the recall tool.
            reply = await complete(client, cid, model=MODEL, messages=new, api_base=API_BASE, recall=True)
            calls = [c for c in reply.choices[0].message.tool_calls or [] if c.function.name != "recall"]
            new = [{"role": "tool", "tool_call_id": c.id, "content": f"ran {c.function.name}"} for c in calls]
            new = new or [{"role": "user", "content": f"step {step} done; go on"}]
            await client.wait_for(cid)  # the turn stored, any compaction it set off landed
            stats = await client.context_stats(cid)
            print(f"step {step}: {stats.tokens} tokens in context, history version {stats.version}")


if __name__ == "__main__":
    asyncio.run(agent(sys.argv[1], " ".join(sys.argv[2:]) or "refactor the parser"))
