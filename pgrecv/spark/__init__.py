"""`pgrecv spark-apply`: replay JSONL change files into Delta and Parquet tables (docs/spark-apply.md).

Nothing here imports pyspark at import time: the command (:mod:`pgrecv.cli.spark_apply`) loads it
only when it runs.
"""
