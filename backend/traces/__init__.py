"""Mooncake-format JSONL traces: streaming loader, statistics, cache simulation, token ids."""

from pathlib import Path

SHIPPED_TRACE = Path(__file__).parent / "data" / "conversation_trace.jsonl"
