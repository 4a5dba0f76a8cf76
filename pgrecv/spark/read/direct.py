"""The common input read straight from its JSON, without the staged copy.

Most inputs are plain: transactions of pgoutput row changes (and TRUNCATEs), each change with its
LSN and its transaction's commit LSN, no snapshot, streamed or two-phase transaction. Their replay
needs no rule that depends on a line's place in the input, so the staged Parquet copy
(:func:`pgrecv.spark.read.staged.read_records`: one more read and a write of every line, and ranks,
split offsets and row ids for the positional rules) buys them nothing.

For such an input, one narrow pass (every field of the staged envelope except the row images)
checks every line as the staged read would, collects the relation records, and counts each
transaction's changes by table and op. Those rows (one per transaction and table) stay cached:
their commit LSNs decide which changes are committed, and their counts give each table's facts
(``engine.facts.plain_facts``) without another pass. The replay's pass then reads the JSON again, with
only the fields it needs. The commit LSNs are those of the first pass, so a transaction appended
to a file meanwhile is neither applied by this run nor counted in its position.

Anything else, or any line the checks would name, makes :func:`read_plain` return None and the
run takes the staged path, which reports it with file:line. Inputs whose first lines show them
not plain (:func:`looks_plain`) take the staged path without the first pass. A large input of one
table skips the first pass over its changes (:func:`pgrecv.spark.read.lean.read_lean`); the checks
its main job makes over every line are here (:meth:`Plain.records`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from pgrecv.spark.files import input_urls, spelling
from pgrecv.spark.read.envelope import (
    ENVELOPE_FIELDS,
    LSN_FIELDS,
    LSN_PATTERN,
    json_read,
    lsn_expr,
    named_last,
)
from pgrecv.spark.read.places import place, ranked_bits
from pgrecv.spark.replay import committed as rp
from pgrecv.spark.schema import quoted
from pgrecv.spark.stores import SourceFile

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Observation, SparkSession


# ``PGRECV_SPARK_DIRECT=0`` sends every input through the staged copy (for comparing the two).
ENABLED = os.environ.get("PGRECV_SPARK_DIRECT", "1") != "0"

# Records a plain input may hold; any other op (snapshot, stream_*, *prepare*) needs the staged path.
PLAIN_OPS = ("relation", "type", "origin", "message", "begin", "commit", *rp.CHANGE_OPS)


def _name(field: str) -> str:
    return field.split(" ", 1)[0]


# The staged envelope's fields with the same types, so that a line fails to parse here when it
# would there (the first pass refers to each, or Spark would leave it unparsed). The row images
# must be JSON objects (or null) for a direct read, which may have the reader parse them as
# structs: an empty struct checks that without reading them.
NARROW = ", ".join(f if _name(f) not in ("new", "old") else f"{_name(f)} struct<>" for f in ENVELOPE_FIELDS)
# what the replay reads of each change (rp.KEEP and the LSNs), with the envelope's types
_WANTED = {"op", "schema", "table", "tables", "new", "old", "unchanged_toast", "old_unchanged_toast"}
_WANTED |= {"json_nulls", "old_json_nulls", "xid", "commit_time", "lsn", "commit_lsn", "gid", "snapshot_lsn"}
CHANGE_FIELDS = [f for f in ENVELOPE_FIELDS if _name(f) in _WANTED]
_BEGUN = "_begun"  # the lean read's column (few transactions): the line's begun transaction's commit LSN


@dataclass
class Plain:
    spark: SparkSession
    urls: list[str]
    structure: rp.Structure
    commits: DataFrame | None  # the commit LSNs (``c``) of the first pass, cached: what counts as committed
    truncates: int
    toast: int  # row changes with unchanged TOAST values
    per: DataFrame | None  # the first pass's cached rows: counts per transaction and table
    last_commit: int | None  # the highest commit LSN with a commit record (None: no commit)
    # the commit LSNs of changes without a commit record (a transaction cut at a file's end), or
    # None when there are more than UNCOMMITTED_LISTED of them
    uncommitted: list[int] | None
    # the lean read (:func:`pgrecv.spark.read.lean.read_lean`): its structural pass's count of row
    # changes and its checksum of each line's part and commit LSN (:func:`lean_checksum`; of few
    # transactions, of each change's place, :func:`begun_checksum`), which the main job's must
    # equal; else None
    lean_sums: tuple[int, int, int] | None = None
    # the lean read of few transactions (:func:`pgrecv.spark.read.lean.read_lean`): the commit LSN
    # of every transaction whose begin its structural pass saw, by its text (a row change of any
    # other fails the main job); else None
    lean_begins: dict[str, int] | None = None
    # the tables with a row change or a TRUNCATE in the input (None: not counted, a lean read)
    changed: set[tuple[str, str]] | None = None
    # the lean read's counts, taken by the main job (:meth:`observed`)
    observation: Observation | None = field(default=None, repr=False)
    counts: dict[str, Any] | None = None  # what it counted, once the main job's files are written

    @property
    def lean(self) -> bool:
        """Whether this is the lean read's (its main job checks and counts every line)."""
        return self.lean_sums is not None or self.lean_begins is not None

    def commit_keys(self) -> DataFrame:
        """The commit LSNs, to semi-join changes to, with ``rp.commit_hint``'s join hint."""
        assert self.commits is not None  # a lean read names its transactions instead
        return rp.commit_hint(self.commits, self.structure)

    def keep(self) -> Column | None:
        """The committed changes as a predicate over ``commit_lsn_i``, when the first pass could
        list the uncommitted ones (else None: join to :meth:`commit_keys`). A change of the input
        has a commit record if its commit LSN is not listed uncommitted; a line appended after the
        first pass is kept only below the highest commit it saw (pgoutput writes transactions in
        commit order, so a transaction added meanwhile is left for the next run). A filter, not a
        join: no broadcast of every commit LSN, nor a sort and merge of them with the changes for
        OLTP's millions of one-change transactions."""
        from pyspark.sql import functions as F

        if self.uncommitted is None:
            return None
        if self.last_commit is None:
            return F.lit(False)
        c = F.col("commit_lsn_i")
        rule = c <= F.lit(self.last_commit)
        return rule & ~c.isin(*self.uncommitted) if self.uncommitted else rule

    def committed_counts(self) -> DataFrame | None:
        """The cached rows of committed changes (one per transaction and table), by the rule of
        :meth:`keep` (no bound: these rows are the input as the first pass saw it), or by the
        broadcast join; None when neither applies (the join would sort and merge them)."""
        from pyspark.sql import functions as F

        assert self.per is not None  # a lean read counts in its main job instead
        rows = self.per.where(F.col("k").isNotNull() & F.col("schema").isNotNull())
        if self.uncommitted is not None:
            return rows.where(~F.col("k").isin(*self.uncommitted)) if self.uncommitted else rows
        if rp.broadcasts_commits(self.structure):
            return rows.join(self.commit_keys(), F.col("k") == F.col("c"), "left_semi")
        return None

    def records(self, images: str | None = None, applied: int | None = None) -> DataFrame:
        """The records as the replay reads them (rp.committed), over the JSON itself. ``images``:
        the row images' type when every change is of one table without json columns (a struct
        of its columns' texts, which the JSON reader then parses in its one pass: the replay
        would otherwise keep each image's text and parse it again). The lean read's records
        (``applied``: its table's position) are also checked and counted on the way."""
        from pyspark.sql import functions as F

        lean = self.lean
        # the lean read parses every field of every line, as the first pass does (FAILFAST: a
        # value of the wrong type fails the job); otherwise only what the replay reads
        wanted = [f for f in ENVELOPE_FIELDS if _name(f) != "_corrupt"] if lean else CHANGE_FIELDS
        fields = [f if images is None or _name(f) not in ("new", "old") else f"{_name(f)} {images}" for f in wanted]
        reader = json_read(self.spark).schema(", ".join(fields))
        lines = (reader.option("mode", "FAILFAST") if lean else reader).json(self.urls)
        # checked by the first pass (or the lean read's check): no pattern to match again
        lsns = {n: lsn_expr(F.col(n), checked=True) for n in LSN_FIELDS}
        path = F.col("_metadata.file_path")
        if lean:
            begun = self.lean_begins is not None
            if begun:
                # each line's number, as the structural pass numbered it (read_begins): the same
                # files in the same splits, one row per line that is not blank
                lines = self._lean_begun(lines.withColumn(_NUM, F.monotonically_increasing_id()))
            ok = _lean_ok([_name(f) for f in fields], begun)
            # a change of another table (no relation record of it: the staged read names it)
            (schema, table), *_ = self.structure.relations
            other = F.col("op").isin(*rp.ROW_OPS) & ((F.col("schema") != schema) | (F.col("table") != table))
            lines = lines.where(_lean_checked(ok & ~other))
            if begun:
                # a begun transaction's commit LSN comes with its begin (converting each line's
                # text took longer than the join)
                lsns["commit_lsn"] = F.when(F.col(_BEGUN).isNotNull(), F.col(_BEGUN)).otherwise(lsns["commit_lsn"])
            # a line the lean read does not take fails its job, and the ordinary way names it:
            # the lean read needs no line's file
            path = F.lit(None).cast("string")
        # Ties in (commit LSN, change LSN) are copies of one change (an at-least-once delivery)
        # or the rows of one COPY (one WAL record, each row of its own key), which replay alike in
        # any order: the positions that order them in the staged copy are constants here.
        out = lines.select(
            *[F.col(f"`{_name(f)}`") for f in fields if _name(f) in _WANTED],
            *([F.col(_NUM)] if lean and self.lean_begins is not None else []),
            path.alias("_path"),
            F.lit(0).alias("_rank"),
            F.lit(0).cast("bigint").alias("_blk"),
            F.lit(0).cast("bigint").alias("_mid"),
            *[lsns[n].alias(f"{n}_i") for n in LSN_FIELDS],
        )
        return self._lean_counted(out, applied).drop(_NUM) if lean else out

    def _lean_begun(self, lines: DataFrame) -> DataFrame:
        """The lean read's lines with ``_BEGUN``: the commit LSN of the transaction whose begin
        the structural pass saw with the line's ``commit_lsn`` text (NULL: none). A broadcast
        join on the text: each row change must have one (:func:`_lean_ok`), which also checks its
        commit LSN's spelling (the structural pass matched every begin's against the pattern)."""
        import pyarrow as pa
        from pyspark.sql import functions as F

        assert self.lean_begins is not None
        # from Arrow: a local relation, broadcast without a Spark job of its own (a list of rows
        # makes an RDD, whose collect was 0.07-0.2 s before the main job could start)
        texts = pa.array(list(self.lean_begins), pa.string())
        lsns = pa.array(list(self.lean_begins.values()), pa.int64())
        begun = self.spark.createDataFrame(pa.table({f"{_BEGUN}_t": texts, _BEGUN: lsns}))
        return lines.join(F.broadcast(begun), F.col("commit_lsn") == F.col(f"{_BEGUN}_t"), "left_outer")

    def _lean_counted(self, records: DataFrame, applied: int | None) -> DataFrame:
        """The lean read's records with its Observation of the table's live changes."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        row = F.col("op").isin(*rp.ROW_OPS)
        part = lean_class(F.col("op"))
        sums = lean_checksum([(F.concat(part, F.col("commit_lsn")), F.when(part.isNotNull(), 1).otherwise(0))])
        keep = self.keep()
        live = row & (keep if keep is not None else F.lit(True))
        if applied is not None:
            live = live & (F.col("commit_lsn_i") > F.lit(applied))
        self.observation = Observation("pgrecv-lean")
        return records.observe(
            self.observation,
            F.count(F.when(row, 1)).alias("rows"),
            F.count(F.when(~row, 1)).alias("others"),
            *[F.count(F.when(live & (F.col("op") == o), 1)).alias(o) for o in rp.ROW_OPS],
            F.max(F.when(live, F.col("commit_lsn_i"))).alias("position"),
            # (of few transactions, each change's joined commit LSN against its place's)
            *(sums if self.lean_begins is None else begun_checksum(F.col("commit_lsn_i"), F.col(_NUM), row)),
        )

    def observed(self) -> dict[str, Any]:
        """The lean main job's counts (after it ran): ``rows`` (row-change lines read), ``others``
        (the other lines), each op's live changes, ``position`` (the highest commit LSN among
        them, None: none), and the row changes' checksum ``h1``, ``h2`` (:func:`lean_checksum`)."""
        assert self.observation is not None
        return dict(self.observation.get)


# The most commit LSNs of uncommitted changes that Plain.keep lists in its filter (a hash set in
# the plan); past that, the changes are joined to the commit LSNs.
UNCOMMITTED_LISTED = 10_000

SNIFF_BYTES = 64 << 10  # of each file's head that looks_plain reads
SNIFF_FILES = 16  # files it reads: the driver's work stays bounded, however many files there are
# files that Spark's reader decompresses (by their names): their bytes are not lines to judge
_CODECS = (".gz", ".bz2", ".deflate", ".lz4", ".snappy", ".zst")


def heads(files: list[SourceFile]) -> Iterator[bytes]:
    """The first :data:`SNIFF_BYTES` of each of the first :data:`SNIFF_FILES` files that Spark
    does not decompress (a file that cannot be read is left to the read proper, which reports it)."""
    for f in files[:SNIFF_FILES]:
        if f.name.endswith(_CODECS):
            continue
        try:
            with f.open("rb") as fh:
                yield fh.read(SNIFF_BYTES)
        except OSError:
            continue


def looks_plain(files: list[SourceFile]) -> bool:
    """False when the whole lines in the first :data:`SNIFF_BYTES` of one of the first
    :data:`SNIFF_FILES` files already show an input that is not plain (test_decoding's changes
    without LSNs, a two-phase or streamed transaction, a line that is not a JSON object): the
    staged read then runs at once, instead of after a first pass that would only have found that
    out. True decides nothing: the first pass checks every line."""
    for head in heads(files):
        for line in head.split(b"\n")[:-1]:  # the last piece may be cut
            if not line.strip():
                continue
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                return False
            if not isinstance(rec, dict):
                return False
            op = rec.get("op")
            if op not in PLAIN_OPS or rec.get("gid") is not None or rec.get("snapshot_lsn") is not None:
                return False
            if op in rp.CHANGE_OPS and (rec.get("lsn") is None or rec.get("commit_lsn") is None):
                return False
    return True


def read_plain(spark: SparkSession, files: list[SourceFile], links: Path) -> Plain | None:
    """The input read directly if it is plain (see the module's docstring), else None."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    urls = input_urls(files, links)
    rank = {spelling(spark, u): i for i, u in enumerate(urls)}
    narrow = (
        json_read(spark)
        .schema(NARROW)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt")
        .json(urls)
        .select(
            "*",
            F.col("_metadata.file_path").alias("_f"),
            F.col("_metadata.file_block_start").alias("_b"),
            F.monotonically_increasing_id().alias("_m"),
        )
    )
    op = F.col("op")

    def not_lsn(c: Column) -> Column:
        return c.isNotNull() & ~c.rlike(LSN_PATTERN)

    # A transaction's lines are grouped by their commit LSN, checked and converted per line: one
    # aggregate. (Until 2026-12-01, by its text, checked and converted per group in a second
    # aggregate: as fast for 500-change transactions, but OLTP's one-change ones make the groups
    # about as many as the lines, and 2M of them took 30-47 s against 24-27 s so.)
    in_txn = op.isin("begin", "commit", *rp.ROW_OPS)
    bad = F.col("_corrupt").isNotNull() | op.isNull() | F.col("v").isNull() | (F.col("v") != 1)
    bad = bad | not_lsn(F.col("lsn")) | not_lsn(F.col("snapshot_lsn")) | not_lsn(F.col("commit_lsn"))
    is_change = op.isin(*rp.CHANGE_OPS)
    other = (
        ~op.isin(*PLAIN_OPS)
        | F.col("gid").isNotNull()
        | F.col("snapshot_lsn").isNotNull()
        | (is_change & (F.col("commit_lsn").isNull() | F.col("lsn").isNull()))
        | ((op == "relation") & (F.col("schema").isNull() | F.col("table").isNull() | F.col("columns").isNull()))
        # a row change that names no table, a TRUNCATE without its tables: the staged read names it
        | (op.isin(*rp.ROW_OPS) & (F.col("schema").isNull() | F.col("table").isNull()))
        | ((op == "truncate") & F.col("tables").isNull())
    )
    rel = F.struct(
        F.struct(F.col("_f").alias("f"), F.col("_b").alias("b"), F.col("_m").alias("m")).alias("p"),
        "schema",
        "table",
        "replica_identity",
        "key",
        "columns",
    )
    # One job: a row per transaction and table (a transaction's begin and commit in its row of no
    # table; its changes counted by op in a row per table), one per relation record (grouped by
    # the record itself: a list aggregate here would make Spark sort every line) and one for every
    # other line, summed. The rows stay cached: their commit LSNs are what this run counts as
    # committed, and their counts are the tables' facts (``engine.facts.plain_facts``).
    row = op.isin(*rp.ROW_OPS)
    # a line's place: its file's rank, split and row (comparable across files), as one long where
    # the bits suffice (:mod:`.places`), else a struct (which makes Spark sort every line)
    ranks = F.create_map(*[F.lit(x) for kv in rank.items() for x in kv]) if rank else None
    file_rank = F.element_at(ranks, F.col("_f")) if ranks is not None else F.lit(0)
    bits = ranked_bits(spark, files)
    if bits is not None:
        pos = place(bits[0], file_rank, bits[1])
    else:
        pos = F.struct(file_rank.alias("r"), F.col("_b").alias("b"), F.col("_m").alias("m"))
    per = (
        narrow.groupBy(
            F.when(in_txn, lsn_expr(F.col("commit_lsn"), checked=True)).alias("k"),
            F.when(row, F.col("schema")).alias("schema"),
            F.when(row, F.col("table")).alias("table"),
            F.when(op == "relation", rel).alias("r"),
        )
        .agg(
            F.count(F.lit(1)).alias("n"),
            # a line of a file not in the list as Spark spells it: no place (the staged read)
            F.count(F.when(bad | file_rank.isNull(), 1)).alias("bad"),
            # every field parsed: a value of the wrong type makes its line corrupt, as when staged
            F.count(F.when(_all_null([_name(f) for f in ENVELOPE_FIELDS if _name(f) != "_corrupt"]), 1)).alias(
                "_parsed"
            ),
            F.count(F.when(other & ~bad, 1)).alias("other"),
            F.count(F.when(op == "truncate", 1)).alias("truncates"),
            F.collect_set(F.when(op == "truncate", F.col("tables"))).alias("truncated"),
            F.count(F.when(row & (F.size("unchanged_toast") > 0), 1)).alias("toast"),
            *[F.count(F.when(op == o, 1)).alias(o) for o in rp.ROW_OPS],
            F.max(op == "begin").alias("begin"),
            F.max(op == "commit").alias("commit"),
            # where the transaction's lines are (:func:`_outside`)
            F.count(F.when(op == "commit", 1)).alias("commits"),
            F.min(F.when(op == "begin", pos)).alias("bpos"),
            F.max(F.when(op == "commit", pos)).alias("cpos"),
            F.min(F.when(row, pos)).alias("lo"),
            F.max(F.when(row, pos)).alias("hi"),
        )
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    txn = F.col("k").isNotNull() & F.col("schema").isNull()
    head = per.agg(
        *[F.sum(c).alias(c) for c in ("n", "bad", "other", "truncates", "toast")],
        F.collect_list("r").alias("r"),
        F.count(F.when(txn & F.col("commit"), 1)).alias("transactions"),
        F.count(F.when(txn & F.col("begin") & ~F.col("commit"), 1)).alias("incomplete"),
        F.max(F.when(txn & F.col("commit"), F.col("k"))).alias("last_commit"),
        F.collect_set(F.when(F.col("schema").isNotNull(), F.struct("schema", "table"))).alias("rows"),
        F.array_distinct(F.flatten(F.collect_set("truncated"))).alias("truncated"),  # a few: distinct table lists
    ).first()
    assert head is not None
    rels = head["r"] or []
    rank_of = F.shiftright("cpos", bits[1]) if bits is not None else F.col("cpos.r")
    if head["bad"] or head["other"] or _outside(per) or _beyond(per, rank_of, list(rank)):
        per.unpersist()
        return None
    st = rp.Structure(lines=int(head["n"] or 0), transactions=head["transactions"], incomplete=head["incomplete"])
    for r in sorted(rels, key=lambda r: (rank[r["p"]["f"]], r["p"]["b"], r["p"]["m"])):
        st.relations.setdefault((r["schema"], r["table"]), []).append(rp.relation_record(r))
    if rp.unrelated(head, st):  # a table changed without its relation record: the staged read names the line
        per.unpersist()
        return None
    commits = per.where(txn & F.col("commit")).select(F.col("k").alias("c"))
    # changes whose commit LSN has no commit record: a small aggregate over the cached rows (two
    # per transaction), to filter on instead of joining the changes to every commit LSN
    open_ = (
        per.where(F.col("k").isNotNull())
        .groupBy("k")
        .agg(F.max("commit").alias("commit"), F.max(F.col("schema").isNotNull()).alias("changes"))
        .where(F.col("changes") & ~F.col("commit"))
        .limit(UNCOMMITTED_LISTED + 1)
        .collect()
    )
    uncommitted = sorted(r["k"] for r in open_) if len(open_) <= UNCOMMITTED_LISTED else None
    changed = {(r["schema"], r["table"]) for r in head["rows"] or []}
    changed |= {(t["schema"], t["table"]) for ts in head["truncated"] or [] for t in ts or []}
    return Plain(
        spark,
        urls,
        st,
        commits,
        int(head["truncates"] or 0),
        int(head["toast"] or 0),
        per,
        head["last_commit"],
        uncommitted,
        changed=changed,
    )


def _outside(per: DataFrame) -> bool:
    """Whether a committed transaction's changes may lie outside it: before its first begin (if
    the input has one) or after its last commit, in input order (the staged read then judges each change by its place:
    ``staged._outside_transaction``). Exact for a transaction sent once; of one sent more than once
    (a redelivery, a cut copy), only a change outside the span of all its copies is seen here; a
    copy cut by the input's end lies past its last commit too, and the staged read, which judges
    each line by its place, takes it (a stray change before such a copy cannot be told from one in
    it by these spans). From the cached rows, two a transaction: a small job."""
    from pyspark.sql import functions as F

    per_txn = (
        per.where(F.col("k").isNotNull())
        .groupBy("k")
        .agg(
            F.sum("commits").alias("commits"),
            F.min("bpos").alias("bpos"),
            F.max("cpos").alias("cpos"),
            F.min("lo").alias("lo"),
            F.max("hi").alias("hi"),
        )
    )
    b, c, lo, hi = F.col("bpos"), F.col("cpos"), F.col("lo"), F.col("hi")
    inside = (b.isNull() | (b < lo)) & (hi < c)  # no begin: begun in an earlier file (not judged)
    return bool(per_txn.where(lo.isNotNull() & (F.col("commits") > 0) & ~inside).limit(1).count())


def _beyond(per: DataFrame, rank_of: Column, names: list[str]) -> bool:
    """Whether a commit record lies past the last commit LSN its file's name claims
    (``envelope.named_last``; the staged read names it): a row per file (``rank_of`` the last
    commit's place: the file's rank, ``names[rank]`` its name), from the cached rows."""
    from pyspark.sql import functions as F

    files = per.where(F.col("commits") > 0).groupBy(rank_of.alias("i")).agg(F.max("k").alias("c"))
    return any(_past_name(names[r["i"]], r["c"]) for r in files.collect())


def _past_name(path: str, commit: int | None) -> bool:
    claimed = named_last(path)
    return claimed is not None and commit is not None and commit > claimed


def _all_null(names: list[str]) -> Column:
    from pyspark.sql import functions as F

    out = F.lit(True)
    for n in names:
        out = out & F.col(quoted(n)).isNull()
    return out


# The lean read (:mod:`.lean`): its switches, and the checks its main job makes (Plain.records).
LEAN = os.environ.get("PGRECV_SPARK_LEAN", "1") != "0"
LEAN_MIN_BYTES = 32 << 20  # of input; below, the first pass's facts choose cheaper plans (one task)
LEAN_FAILED = "pgrecv: the input needs the first pass"  # raise_error's text
# bytes of input per row change, to estimate their number without counting them when choosing the
# one pass (lines of pgoutput changes are rarely shorter, so the estimate errs towards the one pass)
LEAN_LINE_BYTES = 160
_MOD = 2147483647  # the checksum's terms: two hashes of a commit LSN's text, each below 2^31


class LeanDeclined(Exception):
    """The lean read cannot apply this input; the run starts over without it."""


def lean_class(op: Column) -> Column:
    """A line's part in its transaction, by its op: ``r`` a row change, ``b`` its begin, ``c`` its
    commit, NULL none (the structural pass takes the same from pgrecv's first bytes)."""
    from pyspark.sql import functions as F

    return F.when(op.isin(*rp.ROW_OPS), F.lit("r")).when(op == "begin", F.lit("b")).when(op == "commit", F.lit("c"))


def lean_checksum(terms: list[tuple[Column, Column]]) -> list[Column]:
    """Two sums over texts (each weighted by its number of lines), which the structural pass and
    the main job both take over each line's part and commit LSN (:func:`lean_class`): equal sums
    say that the main job parsed the ops and commit LSNs that the structural pass took from the
    lines' text (not, say, a column named commit_lsn, or a second "op" key)."""
    from pyspark.sql import functions as F

    def total(h: Callable[[Column], Column]) -> Column:
        out = F.lit(0).cast("bigint")
        for text, weight in terms:
            out = out + F.pmod(h(text), F.lit(_MOD)) * weight
        return F.sum(out)

    return [total(F.xxhash64).alias("h1"), total(F.hash).alias("h2")]


_MOD2 = 2147483629  # the other prime of begun_checksum
_NUM = "_num"  # the lean read of few transactions: a line's number in its Spark partition


def begun_checksum(lsn: Column, num: Column, row: Column) -> list[Column]:
    """Two sums over the row changes, each term its commit LSN's weight times its line's number
    (both mod a prime), which the main job of the lean read of few transactions takes and
    :func:`begun_sums` gives from the structural pass's runs of changes in each transaction: equal
    sums say that each change's commit LSN is that of the transaction it lies in (``lean._spans``),
    also where two changes swapped places. Integer arithmetic, each term below 2^31: the sums are
    compared mod their prime (:func:`sums_match`)."""
    from pyspark.sql import functions as F

    def total(p: int) -> Column:
        weight = F.pmod(lsn, F.lit(p)) + F.lit(1)
        return F.sum(F.when(row, F.pmod(weight * F.pmod(num, F.lit(p)), F.lit(p))))

    return [total(_MOD).alias("h1"), total(_MOD2).alias("h2")]


def begun_sums(runs: list[tuple[int, int, int]]) -> tuple[int, int, int]:
    """:func:`begun_checksum` (with the count of changes) of ``runs``: (commit LSN, first and
    last line number) of consecutive lines that are changes of one transaction."""
    count = sum(hi - lo + 1 for _, lo, hi in runs)
    h = [sum((lsn % p + 1) * ((lo + hi) * (hi - lo + 1) // 2) for lsn, lo, hi in runs) % p for p in (_MOD, _MOD2)]
    return count, h[0], h[1]


def sums_match(plain: Plain, got: dict[str, Any]) -> bool:
    """Whether the lean main job's counts ``got`` give the structural pass's sums."""
    if plain.lean_sums is None:
        return True
    h1, h2 = got["h1"] or 0, got["h2"] or 0
    if plain.lean_begins is not None:
        h1, h2 = h1 % _MOD, h2 % _MOD2
    return plain.lean_sums == (got["rows"], h1, h2)


def _lsn_ok(c: Column) -> Column:
    """NULL or an LSN's text."""
    return c.isNull() | c.rlike(LSN_PATTERN)


def _lean_ok(names: list[str], begun: bool) -> Column:
    """What the first pass would take of a line, for the lean read's main job (every field in
    ``names`` referred to, so that the reader parses each). ``begun``: the lean read of few
    transactions, whose row changes must have a begun transaction's commit LSN (``_BEGUN``)."""
    from pyspark.sql import functions as F

    op, commit = F.col("op"), F.col("commit_lsn")
    row = op.isin(*rp.ROW_OPS)
    ok = (F.col("v") == 1) & op.isin(*PLAIN_OPS) & (op != "truncate")
    ok = ok & F.col("gid").isNull() & F.col("snapshot_lsn").isNull() & _lsn_ok(F.col("lsn"))
    # a row change's commit LSN is one the structural pass took from its text and checked (the
    # checksum of lean_settle says so), or the text of a begin it checked (Plain._lean_begun)
    ok = ok & F.when(row, F.col(_BEGUN).isNotNull() if begun else commit.isNotNull()).otherwise(_lsn_ok(commit))
    no_toast = F.coalesce(F.size("unchanged_toast"), F.lit(0)) == 0  # size(NULL) is NULL
    ok = ok & (~row | (F.col("lsn").isNotNull() & no_toast))
    ok = ok & (~row | (F.col("schema").isNotNull() & F.col("table").isNotNull()))  # the staged read names it
    return ok & ~_all_null(names)


def _lean_checked(ok: Column) -> Column:
    """A filter that keeps every row and fails the job at one where ``ok`` is not true."""
    from pyspark.sql import functions as F

    return F.when(F.coalesce(ok, F.lit(False)), F.lit(True)).otherwise(F.raise_error(F.lit(LEAN_FAILED)))
