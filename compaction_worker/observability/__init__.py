"""Observability: logs, traces, metrics and the health port."""
