"""One conversation: its keys, meta, the turn's decision, its status."""
