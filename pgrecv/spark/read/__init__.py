"""The input as Spark DataFrames of records, read by Spark tasks (never row by row in the driver).

Three reads, the first that applies wins (:func:`pgrecv.spark.engine.run.run_frames` chooses):

* :mod:`.lean` ``read_lean`` — a large input of one table: a structural pass over the lines
  that are not row changes, and the main job reads, checks and counts the changes itself;
* :mod:`.direct` ``read_plain`` — plain transactions (pgoutput's row changes and TRUNCATEs with
  their LSNs): one narrow first pass checks every line and counts, the replay reads the JSON;
* :mod:`.staged` — everything else (snapshots, streamed and two-phase transactions,
  test_decoding's lines without LSNs): the records parsed once into a staged Parquet copy, with
  each line's place in the input for the positional rules.

Each gives the replay (:func:`pgrecv.spark.replay.committed.committed`) the same columns: the
envelope fields of :mod:`.envelope`, the row images as their exact JSON text, LSNs as 64-bit
integers and the line's place.
"""
