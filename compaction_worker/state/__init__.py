"""The Redis state: each stored structure with its keys, codec and scripts."""
