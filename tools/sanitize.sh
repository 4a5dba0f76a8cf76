#!/bin/sh
# Builds pgrecv's C extension (pgrecv/_copyfast.c) with AddressSanitizer and UndefinedBehavior-
# Sanitizer and runs the tests of the native encoders against that build.
#
#   tools/sanitize.sh                  # the native tests, PostgreSQL versions as PGRECV_TEST_VERSIONS says
#   tools/sanitize.sh -k malformed     # extra arguments go to pytest
#
# The worktree's own build is left alone: the package and its tests are copied to a private
# temporary directory (mktemp -d), the sanitized module is built there and imported from there
# (the script checks it is). Any ASan report or undefined behaviour aborts the run: exit status
# non-zero. Leak checking is off (CPython keeps memory alive on purpose). Needs gcc or clang with
# the sanitizer runtimes; run from anywhere, with the worktree's .venv.
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$root/.venv/bin/python}
cc=${CC:-gcc}
work=$(mktemp -d "${TMPDIR:-/tmp}/pgrecv-sanitize.XXXXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

cp -R "$root/pgrecv" "$root/tests" "$root/pyproject.toml" "$work/"
rm -f "$work"/pgrecv/_copyfast*.so
include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
"$cc" -shared -fPIC -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all \
    -Wall -Wextra -Werror -I"$include" "$root/pgrecv/_copyfast.c" -o "$work/pgrecv/_copyfast$suffix"

runtime=$("$cc" -print-file-name=libasan.so)
ubsan=$("$cc" -print-file-name=libubsan.so)
cd "$work"
# The runtimes must be loaded first, in the Python process only: LD_PRELOAD is dropped before the
# tests start the PostgreSQL servers.
LD_PRELOAD="$runtime $ubsan" \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
PYTHONDONTWRITEBYTECODE=1 \
"$python" - "$work" "$@" <<'PY'
import os
import sys

os.environ.pop("LD_PRELOAD", None)
work = sys.argv[1]
sys.path.insert(0, work)
from pgrecv import _copyfast  # noqa: E402
from pgrecv.native import copyfast  # noqa: E402

assert _copyfast.__file__.startswith(work), f"not the sanitized build: {_copyfast.__file__}"
assert copyfast is _copyfast, "PGRECV_NO_NATIVE is set: nothing native to test"
print(f"sanitized build: {_copyfast.__file__}", flush=True)
import pytest  # noqa: E402

tests = ["tests/output/test_fastpath.py", "tests/snapshot/test_snapshot_fast.py", "tests/output/test_jsonl_format.py"]
# pump(): `pgrecv start` run in this process (main()), so the sanitized loop reads a real stream
tests += ["tests/stream/test_bulk.py"]
# This one starts Pythons of its own, which would load the sanitized build without its runtime.
tests += ["--deselect", "tests/output/test_fastpath.py::test_fallback_switch"]
# --capture=sys: a sanitizer report goes to the real stderr, not to a capture lost at the abort
raise SystemExit(pytest.main(["-q", "-p", "no:cacheprovider", "--capture=sys", *tests, *sys.argv[2:]]))
PY
