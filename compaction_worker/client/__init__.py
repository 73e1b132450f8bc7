"""The client for agent runtimes: publish turns, read the effective history back."""

from compaction_worker.client.client import Artifact, Client, ContextStats

__all__ = ["Artifact", "Client", "ContextStats"]
