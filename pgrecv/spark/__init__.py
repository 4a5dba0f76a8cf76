"""`pgrecv spark-apply`: replay JSONL change files into Delta and Parquet tables (docs/spark-apply.md).

Nothing here imports pyspark at import time: the command module loads it only when it runs.
"""
