"""The Spark replay's driver side: it lists, plans and commits; Spark tasks read, replay and write.

* :mod:`.run` — one run: read the input, then each wanted table's batch, side by side;
* :mod:`.facts` — per table, what the batch holds (counts, position, TRUNCATEs, TOAST columns);
* :mod:`.batch` — a table's batch as DataFrames (latest and history mode, one pass or step by step);
* :mod:`.values` — values the target type cannot hold (``--bad-values``), changes without identity;
* :mod:`.carry` — prepared transactions whose outcome is not in the input, kept for the next run;
* :mod:`.tuning` — the session's settings sized for this run's input.
"""
