"""The lean read: a large input of one table without the first pass over its changes.

A large input of one table, applied in latest mode by the one pass (``engine._one_pass_fits``),
skips :func:`pgrecv.spark.read.direct.read_plain`. A structural pass (:func:`read_lean`) parses
only the lines that are not row changes (it tells pgrecv's row changes, begins and commits by
their first bytes, and takes their commit LSN's text from after their first ``"commit_lsn":"``)
and reduces them by commit LSN to what the driver needs: the relation records, the transactions
with a begin and no commit (few: a transaction cut at a file's end), the highest commit per file,
and a checksum of each line's part and commit LSN. An input of few transactions (estimated from
its head) takes a cheaper structural pass instead, which takes the row changes by their first
bytes without reading them, collects every begin's commit LSN (at most :data:`LEAN_BEGUN`), which
the main job joins each row change to, and finds the numbers of the lines that lie in each
transaction (:func:`_spans`), which the main job's checksum of each change's own commit LSN and
line number must match (it numbers its lines as this pass does: the same files in the same
splits). Either pass finds a change after its transaction's commit or inside another (as
``direct._outside`` does). The main job
(:meth:`pgrecv.spark.read.direct.Plain.records`), which reads every line anyway, checks each line
as the first pass would, and counts the table's changes, the other lines and the same checksum
over what it parsed (an Observation). A line it would refuse, or anything the lean read does not
cover (unchanged TOAST values, a change or commit of a transaction without a begin, other lines,
ops or commit LSNs than the structural pass's, a change of no begun transaction), fails that
job or its commit, before anything is
committed, and the run starts over on the ordinary way
(:class:`pgrecv.spark.read.direct.LeanDeclined`), which names the line. bench/NOTES.md: 1M events
onto a 200k-row table, warm rounds 5.3-6.1 s against 7.7-8.6 s. Until 2026-12-05 the driver
collected every begin (a broadcast join found each change's) for every input, which bounded the
lean read to 50,000 transactions: OLTP's one-change transactions took the first pass. Reading each
row change's commit LSN costs about 1 s per 1M lines, which inputs of few large transactions
need not pay (bench/NOTES.md, 2026-12-05).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pgrecv.output.format import FORMAT_VERSION
from pgrecv.spark.files import input_urls, literal_read, spelling
from pgrecv.spark.inputs import parse_lsn
from pgrecv.spark.read.direct import (
    NARROW,
    PLAIN_OPS,
    UNCOMMITTED_LISTED,
    Plain,
    _lsn_ok,
    _past_name,
    begun_sums,
    lean_checksum,
    lean_class,
)
from pgrecv.spark.read.direct import heads as direct_heads
from pgrecv.spark.read.envelope import JSON_LIMITS, LSN_PATTERN, lsn_expr
from pgrecv.spark.read.places import SPLIT_BITS, largest, place, split_shift
from pgrecv.spark.replay import committed as rp
from pgrecv.spark.stores import SourceFile

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, Row, SparkSession

# the most transactions without a commit record the structural pass lists (the main job's filter)
LEAN_OPEN = UNCOMMITTED_LISTED
# transactions, estimated from the input's head, up to which the structural pass skips row changes
# and collects the begins; the most begins it collects (broadcast to the main job; past them, the
# other structural pass runs): the estimate has a margin, a wrong one costs a pass
LEAN_FEW = 20_000
LEAN_BEGUN = 50_000
_COMMIT_KEY = '"commit_lsn":"'
_PARTS = {"r": rp.ROW_OPS, "b": ("begin",), "c": ("commit",)}


def _firsts(ops: tuple[str, ...]) -> list[str]:
    """The first bytes of pgrecv's lines of these ops."""
    return [head for o in ops for head in (f'{{"v":{FORMAT_VERSION},"op":"{o}",', f'{{"op":"{o}",')]


def few_transactions(files: list[SourceFile], size: int) -> bool:
    """Whether the input's ``size`` bytes hold at most about :data:`LEAN_FEW` transactions, by the
    share of begins among the whole lines of its heads (:func:`direct.heads`). False when no head
    can tell (compressed files)."""
    sampled = begins = 0
    firsts = tuple(h.encode() for h in _firsts(("begin",)))
    for head in direct_heads(files):
        whole = head[: head.rfind(b"\n") + 1]
        sampled += len(whole)
        begins += sum(1 for line in whole.split(b"\n") if line.startswith(firsts))
    return sampled > 0 and size * begins <= LEAN_FEW * sampled


class _TooMany(Exception):
    """More begins than :data:`LEAN_BEGUN`: the other structural pass runs."""


def read_lean(spark: SparkSession, files: list[SourceFile], links: Path, size: int) -> Plain | None:
    """The structural facts of a plain input of ``size`` bytes from its lines that are not row
    changes, or None when they show it is not one for the lean read (several tables, a TRUNCATE,
    a line of a kind the first pass would send to the staged read, a change or commit without a
    begin, too many transactions without a commit). Every line is checked again by the main job
    (:meth:`Plain.records`)."""
    if few_transactions(files, size):
        try:
            return _read_begins(spark, files, links)
        except _TooMany:
            pass
    return _read_keyed(spark, files, links)


def _fit(op: Column) -> Column:
    """What the first pass would take (its ``bad`` and ``other``) of a line the structural pass
    parsed; a line taken by its first bytes, or a row change, begin or commit it parsed (written
    otherwise), is checked by the main job."""
    from pyspark.sql import functions as F

    fit = op.isin(*PLAIN_OPS) & (F.col("v") == 1) & F.col("gid").isNull() & F.col("snapshot_lsn").isNull()
    fit = fit & _lsn_ok(F.col("lsn")) & _lsn_ok(F.col("commit_lsn"))
    fit = fit & ((op != "relation") | (F.col("schema").isNotNull() & F.col("table").isNotNull()))
    return fit & ((op != "relation") | F.col("columns").isNotNull()) & (op != "truncate")


def _parsed(
    spark: SparkSession, urls: list[str], where: Column | None = None, taken: tuple[Column, Column] | None = None
) -> DataFrame:
    """The input's lines that are not blank (and ``where``): each line's fields (FAILFAST: a line
    that is not a JSON object fails the job, and the ordinary way then names it), file and
    block. ``taken``: a line's part by its first bytes and its commit LSN's text, as ``_c`` and
    ``_k``; a line with a part is not parsed (its fields NULL)."""
    from pyspark.sql import functions as F

    text = F.col("value")
    keep = F.trim(text) != ""
    parsed = text if taken is None else F.when(taken[0].isNull(), text)
    extra = [] if taken is None else [taken[0].alias("_c"), taken[1].alias("_k")]
    narrow = NARROW.replace(", _corrupt string", "")
    return (
        literal_read(spark)
        .text(urls)
        .where(keep if where is None else where & keep)
        .select(
            *extra,
            F.from_json(parsed, narrow, {"mode": "FAILFAST", **JSON_LIMITS}).alias("_j"),
            F.col("_metadata.file_path").alias("_f"),
            F.col("_metadata.file_block_start").alias("_b"),
            # the line's place within its split, counted after the filter above (Spark moves no
            # filter below a nondeterministic column): consecutive in the split (_spans)
            F.monotonically_increasing_id().alias("_m"),
        )
        .select(*["_c", "_k"][: len(extra)], "_j.*", "_f", "_b", "_m")
    )


def _relation() -> Column:
    from pyspark.sql import functions as F

    pos = F.struct(F.col("_f").alias("f"), F.col("_b").alias("b"), F.col("_m").alias("m"))
    return F.struct(pos.alias("p"), "schema", "table", "replica_identity", "key", "columns")


def _structure(st: rp.Structure, rels: list[Row], rank: dict[str, int]) -> bool:
    """Adds the relation records to ``st`` in input order; False unless they are of one table."""
    if len({(r["schema"], r["table"]) for r in rels}) != 1 or any(r["p"]["f"] not in rank for r in rels):
        return False
    for r in sorted(rels, key=lambda r: (rank[r["p"]["f"]], r["p"]["b"], r["p"]["m"])):
        st.relations.setdefault((r["schema"], r["table"]), []).append(rp.relation_record(r))
    return True


def _read_begins(spark: SparkSession, files: list[SourceFile], links: Path) -> Plain | None:
    """The structural pass of few transactions: row changes are taken by pgrecv's first bytes,
    not parsed, and counted per split of the input (written otherwise, they are parsed); the
    driver gets every other line with its place (each begin's and commit's commit LSN, the
    relation records) and gives each transaction the changes that lie in it (:func:`_spans`),
    which the main job checks against each change's own commit LSN (``begun_checksum``)."""
    from pyspark.sql import functions as F

    urls = input_urls(files, links)
    rank = {spelling(spark, u): i for i, u in enumerate(urls)}
    op, text = F.col("op"), F.col("value")
    skip = F.lit(False)
    for head in _firsts(rp.ROW_OPS):
        skip = skip | text.startswith(head)
    # no filter on the parsed op, which Spark would move into the text's filter, out of its
    # generated code (2.2 s for 1M lines)
    lines = _parsed(spark, urls, taken=(F.when(skip, F.lit("r")), F.lit(None).cast("string")))
    taken = F.col("_c").isNotNull()
    fit = _fit(op) & (~op.isin("begin", "commit") | F.col("commit_lsn").isNotNull())
    most = 2 * LEAN_BEGUN + 1000
    try:
        rows = (
            lines.groupBy(
                F.col("_c").alias("c"),
                F.when(~taken, F.col("_m")).alias("m"),  # every other line a group of its own
                F.col("_f").alias("f"),
                F.col("_b").alias("b"),
                F.when(fit, op).alias("op"),
                F.when(fit & op.isin("begin", "commit"), F.col("commit_lsn")).alias("k"),
                F.when(fit & (op == "relation"), _relation()).alias("r"),
            )
            .agg(F.count(F.lit(1)).alias("n"), F.min("_m").alias("m0"), F.max("_m").alias("m1"))
            .limit(most)
            .collect()
        )
    except Exception:  # a line Spark cannot parse: the ordinary way reports it
        return None
    if len(rows) >= most:
        raise _TooMany
    if any(r["op"] is None and r["c"] is None for r in rows) or any(r["f"] not in rank for r in rows):
        return None
    st = rp.Structure(lines=sum(1 for r in rows if r["c"] is None and r["op"] not in rp.ROW_OPS))
    begun: dict[str, int] = {}  # each begin's commit LSN, by its text
    commits: set[int] = set()
    for r in rows:
        if r["op"] == "begin":
            begun[r["k"]] = parse_lsn(r["k"])
        elif r["op"] == "commit":
            commits.add(parse_lsn(r["k"]))
            if _past_name(r["f"], parse_lsn(r["k"])):
                return None  # the staged read names it
    begins = set(begun.values())
    if len(begins) > LEAN_BEGUN:
        raise _TooMany
    open_ = begins - commits
    if not commits <= begins or len(open_) > LEAN_OPEN:
        return None
    if not _structure(st, [r["r"] for r in rows if r["op"] == "relation"], rank):
        return None
    spans = _spans(rows, rank)
    if spans is None:
        return None  # a change outside every transaction: the ordinary way names it
    st.transactions = len(commits)
    st.incomplete = len(open_)
    last = max(commits) if commits else None
    sums = begun_sums([(begun[k], lo, hi) for k, lo, hi in spans])
    return Plain(spark, urls, st, None, 0, 0, None, last, sorted(open_), lean_sums=sums, lean_begins=begun)


def _spans(rows: list[Row], rank: dict[str, int]) -> list[tuple[str, int, int]] | None:
    """The row changes that lie in each transaction, as runs of consecutive line numbers (``_m``)
    and the commit LSN text of the transaction they lie in, from the structural pass's groups: the
    lines of a split are numbered consecutively, so the changes taken by their first bytes fill
    the gaps between the split's other lines. A change
    lies in the transaction of the last begin before it with no commit since (a begin again
    starts it anew: a copy cut by a file's end, then the whole one). None: a change with no
    transaction begun before it, a commit of another transaction than the begun one, or a split
    whose numbers do not add up (the ordinary way decides)."""
    others: dict[tuple[str, int], list[Row]] = {}
    taken: dict[tuple[str, int], Row] = {}
    for r in rows:
        if r["c"] is not None:
            taken[(r["f"], r["b"])] = r
        else:
            others.setdefault((r["f"], r["b"]), []).append(r)
    spans: list[tuple[str, int, int]] = []
    current: str | None = None
    for split in sorted({*others, *taken}, key=lambda s: (rank[s[0]], s[1])):
        lines = sorted(others.get(split, []), key=lambda r: r["m"])
        t = taken.get(split)
        lo = min([r["m"] for r in lines] + ([t["m0"]] if t else []))
        hi = max([r["m"] for r in lines] + ([t["m1"]] if t else []))
        if hi - lo + 1 != len(lines) + (t["n"] if t else 0):
            return None
        at = lo
        ends: list[Row | None] = [*lines, None]  # None: the split's end
        for x in ends:
            m = hi + 1 if x is None else x["m"]
            last = m if x is not None and x["op"] in rp.ROW_OPS else m - 1  # (a change written otherwise)
            if last >= at:
                if current is None:
                    return None
                spans.append((current, at, last))
            at = m + 1
            if x is not None and x["op"] == "begin":
                current = x["k"]
            elif x is not None and x["op"] == "commit":
                if current != x["k"]:
                    return None
                current = None
    return spans


def _split_bits(spark: SparkSession, files: list[SourceFile]) -> int | None:
    """The low bits of a split's start that the keyed pass's places drop (:mod:`.places`); None
    (no lean read) when the confs are not sizes, or a file is too large for the bits left."""
    shift = split_shift(spark)
    return shift if shift is not None and largest(files) < 1 << (SPLIT_BITS + shift) else None


def _read_keyed(spark: SparkSession, files: list[SourceFile], links: Path) -> Plain | None:
    """The structural pass of any number of transactions: each line keyed by its commit LSN (a
    row change's, begin's and commit's taken from its text), reduced in Spark."""
    from pyspark.sql import functions as F

    urls = input_urls(files, links)
    spelled = [spelling(spark, u) for u in urls]
    rank = {s: i for i, s in enumerate(spelled)}
    op, text = F.col("op"), F.col("value")
    # A row change as pgrecv writes it is told by its first bytes, which skips its parse for the
    # price of reading its line (the JSON reader's filter pushdown tokenizes all of it: 0.87 s
    # against 0.46 s for 2M lines); its commit LSN is the text after its first "commit_lsn" key.
    # A line that starts so and is not one (another "op" key later on, which the JSON reader would
    # take instead), or whose first such key is not the envelope's (a column of that name), is not
    # lost: the main job counts the lines it reads that are not row changes and sums the commit
    # LSNs it parsed; if either is not this pass's, the run declines the lean read
    # (:func:`engine.facts.lean_settle`). (Looking for a second key here took 0.8 s per 1M lines.)
    taken_as: Column = F.lit(None).cast("string")
    for part, ops in _PARTS.items():
        for head in _firsts(ops):
            taken_as = F.when(text.startswith(head), F.lit(part)).otherwise(taken_as)
    at = F.instr(text, _COMMIT_KEY)
    after = F.substring_index(text.substr(at + F.lit(len(_COMMIT_KEY)), F.lit(48)), '"', 1)
    files_ = F.create_map(*[F.lit(x) for s, i in rank.items() for x in (s, i)])
    # a line taken by its head is parsed as NULL
    lines = _parsed(spark, urls, taken=(taken_as, F.when(taken_as.isNotNull() & (at > 0), after)))
    fit = _fit(op)
    cls = F.coalesce(F.col("_c"), lean_class(op))
    key = F.when(cls.isNotNull(), F.coalesce(F.col("_k"), F.col("commit_lsn"))).alias("k")
    commit = cls == "c"
    shift = _split_bits(spark, files)
    if shift is None:
        return None
    # a line's place in its file, as one long (a struct in an aggregate's buffer would make Spark
    # sort every line: 1.1 s more per 3M lines): its split's start, then its number in the split
    pos = place(shift)
    file_ = F.xxhash64(F.col("_f"))
    # per commit LSN's text (NULL: a line of no transaction, by its op; NULL op: one the first pass
    # would not take, or a change, begin or commit without a commit LSN): its begins, commits, row
    # changes, and the files of its commits
    per = lines.groupBy(
        key,
        F.when(key.isNull() & cls.isNull() & fit, op).alias("o"),
        F.when(fit & (op == "relation"), _relation()).alias("r"),
    ).agg(
        F.count(F.lit(1)).alias("n"),
        *[F.count(F.when(cls == c, 1)).alias(f"n_{c}") for c in _PARTS],
        F.min(F.when(commit, files_[F.col("_f")])).alias("f0"),
        F.max(F.when(commit, files_[F.col("_f")])).alias("f1"),
        # where its lines are (as direct._outside): its first begin, last commit, first and last
        # change, and its files
        F.min(F.when(cls == "b", pos)).alias("bpos"),
        F.max(F.when(commit, pos)).alias("cpos"),
        F.min(F.when(cls == "r", pos)).alias("lo"),
        F.max(F.when(cls == "r", pos)).alias("hi"),
        F.min(file_).alias("h0"),
        F.max(file_).alias("h1"),
    )
    k = F.col("k")
    good = k.rlike(LSN_PATTERN) & (F.col("n_b") > 0)
    # a change before its transaction's first begin or after its last commit, or a transaction
    # with changes in more than one file (a copy cut by a file's end, then the whole one: places
    # in two files are not compared here): the ordinary way judges it
    one_file = F.col("h0") == F.col("h1")
    inside = F.col("lo").isNull() | (one_file & (F.col("bpos") < F.col("lo")) & (F.col("hi") < F.col("cpos")))
    ok = good & (F.col("n_c") > 0) & (F.col("f0") == F.col("f1")) & inside
    kind = F.when(k.isNull(), "-").when(ok, "ok").when(good & (F.col("n_c") == 0), "open").otherwise("bad")
    listed = LEAN_OPEN
    try:
        rows = (
            per.groupBy(
                kind.alias("kind"),
                "o",
                "r",
                F.when(kind != "ok", k).alias("k"),
                F.when(kind == "ok", F.col("f1")).alias("f"),
            )
            .agg(
                F.sum("n").alias("n"),
                F.sum("n_r").alias("rn"),
                F.count(F.lit(1)).alias("t"),
                F.max(F.when(kind == "ok", lsn_expr(k, checked=True))).alias("hi"),
                *lean_checksum([(F.concat(F.lit(c), k), F.col(f"n_{c}")) for c in _PARTS]),
            )
            .limit(listed + len(urls) + 1000)
            .collect()
        )
    except Exception:  # a line Spark cannot parse: the ordinary way reports it
        return None
    if len(rows) >= listed + len(urls) + 1000:
        return None
    st = rp.Structure(lines=sum(r["n"] - r["rn"] for r in rows))
    open_: list[int] = []
    last, rels, committed = None, [], 0
    sums = [sum(r["rn"] for r in rows), sum(r["h1"] or 0 for r in rows), sum(r["h2"] or 0 for r in rows)]
    for r in rows:
        if r["kind"] == "bad" or (r["kind"] == "-" and r["o"] is None):
            return None  # a change or commit without its begin, a line the first pass would not take
        if r["kind"] == "open":
            open_.append(parse_lsn(r["k"]))
        elif r["kind"] == "ok":
            if r["f"] is None or _past_name(spelled[r["f"]], r["hi"]):
                return None  # the staged read names it
            committed += r["t"]
            last = r["hi"] if last is None else max(last, r["hi"])
        elif r["o"] == "relation":
            rels.append(r["r"])
    if len(open_) > LEAN_OPEN or not _structure(st, rels, rank):
        return None
    st.transactions = committed
    st.incomplete = len(open_)
    return Plain(spark, urls, st, None, 0, 0, None, last, sorted(open_), lean_sums=(sums[0], sums[1], sums[2]))
