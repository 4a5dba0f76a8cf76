"""Encoders and sinks: events to JSONL, Debezium or tables, and the files they land in."""
