"""The client for agent runtimes: publish turns, read the effective history back."""

from compaction_worker.client.client import Artifact, Client, ContextStats
from compaction_worker.client.llm import complete
from compaction_worker.client.receipts import Receipt, TurnResult
from compaction_worker.client.sync import SyncClient

__all__ = ["Artifact", "Client", "ContextStats", "Receipt", "SyncClient", "TurnResult", "complete"]
