"""Streaming: the replication connection, the pipeline stage, and the loop that runs them."""
