"""pgrecv: consume PostgreSQL logical replication as typed events."""

__version__ = "0.1.0"
