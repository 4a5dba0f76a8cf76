"""docs/spark-apply.md's replay rules as DataFrame operations (they run in Spark tasks).

* :mod:`.committed` — the rows of committed transactions, each with its commit LSN, and the
  structure the driver learns from the few structural records;
* :mod:`.events` — one table's changes as key/value events, and the last event per key;
* :mod:`.convert` — a value's JSON text as the column's Spark type, exactly.
"""
