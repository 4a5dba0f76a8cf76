"""The key-range search of pgrecv.verify.compare on two in-memory sides: random tables with random
differences, each found with its kind and its count; an equal table costs one level."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

import pytest

from pgrecv.verify import compare as cmp
from pgrecv.verify.compare import BITS, Leaf, compare


def _h(text: str) -> int:
    return int(hashlib.md5(text.encode()).hexdigest()[:15], 16)


class MemorySide:
    def __init__(self, rows: dict[int, str]) -> None:
        self.rows = [(_h(str(k)), (str(k),), v) for k, v in rows.items()]

    def _in(self, h: int, depth: int, within: Sequence[int] | None) -> bool:
        return within is None or (h & ((1 << (BITS * depth)) - 1)) in set(within)

    def buckets(self, depth: int, within: Sequence[int] | None) -> dict[int, tuple[int, int]]:
        out: dict[int, tuple[int, int]] = {}
        for h, key, v in self.rows:
            if self._in(h, depth - 1, within):
                b = h & ((1 << (BITS * depth)) - 1)
                n, s = out.get(b, (0, 0))
                out[b] = (n + 1, s + _h(key[0] + "|" + v))
        return out

    def leaves(self, depth: int, buckets: Sequence[int]) -> list[Leaf]:
        return [Leaf(key, _h(key[0] + "|" + v), (key[0], v)) for h, key, v in self.rows if self._in(h, depth, buckets)]


@pytest.mark.parametrize("seed", range(12))
def test_random_differences_are_each_found(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice([0, 1, 50, 3000, 20000])
    pg = {k: f"v{k}" for k in range(n)}
    lake = dict(pg)
    missing = set(rng.sample(sorted(pg), min(n, rng.randint(0, 30))))
    for k in missing:
        del lake[k]
    changed = set(rng.sample(sorted(lake), min(len(lake), rng.randint(0, 30))))
    for k in changed:
        lake[k] = "other"
    extra = {n + i for i in range(rng.randint(0, 30))}
    for k in extra:
        lake[k] = "new"
    diff = compare(MemorySide(pg), MemorySide(lake), ["id", "v"])
    assert (diff.missing, diff.extra, diff.changed) == (len(missing), len(extra), len(changed))
    assert diff.equal == (not (missing or extra or changed))
    assert (diff.rows_pg, diff.rows_lake) == (len(pg), len(lake))
    assert [k for (k,) in diff.missing_keys] == [str(k) for k in sorted(missing)][: cmp.SAMPLES]
    assert all(c.columns == ("v",) for c in diff.changed_rows)
    if diff.equal:
        assert diff.scans == 1  # an equal table: one scan of each side


def test_the_row_budget_makes_counts_lower_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cmp, "ROW_BUDGET", 100)
    pg = {k: "a" for k in range(5000)}
    lake = {k: "b" for k in range(5000)}
    diff = compare(MemorySide(pg), MemorySide(lake), ["id", "v"])
    assert not diff.exact and not diff.equal and 0 < diff.changed <= 100
