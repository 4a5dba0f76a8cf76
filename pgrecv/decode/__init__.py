"""Decoders: output plugin bytes or lines in, :mod:`pgrecv.events` out (pure, no I/O)."""
