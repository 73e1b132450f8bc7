"""compaction-worker: keeps LLM conversations inside their models' context windows."""

__version__ = "0.1.0"
