"""Sum a pytest run's ``--durations=0`` report by test file, for tests/file_seconds.json.

tests/conftest.py hands the files out to the test processes longest first by these sums, so that
no slow file starts last and runs alone. Run the suite with ``--durations=0`` (CI's run says it
well enough: ``PYTEST_ADDOPTS=--durations=0 .ci/run > log``), then
``python tools/file_seconds.py log > tests/file_seconds.json``.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict

LINE = re.compile(r"^\s*(\d+(?:\.\d+)?)s (?:call|setup|teardown)\s+(tests/\S+?\.py)::")


def main(path: str) -> None:
    seconds: defaultdict[str, float] = defaultdict(float)
    with open(path, encoding="utf-8", errors="replace") as log:
        for line in log:
            if m := LINE.match(line):
                seconds[m.group(2)] += float(m.group(1))
    ranked = dict(sorted(((f, round(s)) for f, s in seconds.items()), key=lambda kv: -kv[1]))
    json.dump(ranked, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/file_seconds.py PYTEST_LOG > tests/file_seconds.json")
    main(sys.argv[1])
