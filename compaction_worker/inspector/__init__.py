"""``compaction-worker inspect``: a read-only web view of one conversation's memory, over Redis.

``views`` reads what a page shows, ``sawtooth`` draws the context tokens per turn with a
marker per compaction, ``app`` serves the pages (docs/design.md, "The inspector").
"""
