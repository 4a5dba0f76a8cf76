#!/usr/bin/env python3
"""How long `pgrecv --help` and each command's `--help` take, against the bare interpreter's start.

Each is run ``--runs`` times as a fresh process through the installed ``pgrecv`` script (what a user
types), taking turns with ``python -c pass`` (the floor no CLI in Python goes under) and with
``python -c "import click"`` (the floor of a Click CLI); prints each one's median wall time, the
ratio to the bare interpreter, and whether psycopg, rich or pyspark were imported (they must
not be: a test checks it too, tests/cli/test_help_imports.py). Target: a median of 0.1 s or less
on the development machine (issue 60); absolute times vary up to 2x between runs there, so read
the ratios too.

    python bench/help.py [--runs 21] [--command start ...] [--against DIR]

``--against DIR`` also times the pgrecv source tree in DIR (another checkout, e.g. a ``git worktree``
of an earlier commit, through PYTHONPATH), taking turns with this one: a before/after in one run.

``--installed`` also times a regular install, as users get one (``pip install .``: no editable
install's import finder, which setuptools puts in front of every start of a flat-layout project
installed with ``-e``, about 30 ms), built from this tree into a throwaway venv whose dependencies
are this interpreter's (a path entry to its site-packages, so nothing is downloaded but the build
backend).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HEAVY = ("psycopg", "rich", "pyspark")
_MODULES = (
    "import sys\nfrom pgrecv.cli.main import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
    "print(' '.join(sorted(sys.modules)), file=sys.stderr)\n"
)


def _wall(argv: list[str], env: dict[str, str] | None) -> float:
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    return time.perf_counter() - started


def _heavy(args: list[str], env: dict[str, str] | None) -> list[str]:
    # run in the tree timed: with -c the working directory comes first in sys.path
    cwd = None if env is None else env.get("PYTHONPATH")
    proc = subprocess.run(
        [sys.executable, "-c", _MODULES, *args], capture_output=True, text=True, env=env, cwd=cwd, check=True
    )
    modules = proc.stderr.split()
    return sorted({m.split(".")[0] for m in modules if m.split(".")[0] in HEAVY})


def _regular_install(where: Path) -> Path:
    """pgrecv installed from ROOT as a user installs it, into a venv in ``where``; its script."""
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # a path line: the dependencies, without running the .pth files there (the editable finder)
    (Path(site) / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(ROOT)], check=True
    )
    return venv / "bin" / "pgrecv"


def main() -> None:
    from pgrecv.cli.main import cli

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--command", nargs="*", default=None, help="commands to time (default: all)")
    ap.add_argument("--against", type=Path, default=None, help="another pgrecv source tree to time, taking turns")
    ap.add_argument("--installed", action="store_true", help="also time a regular (not editable) install")
    args = ap.parse_args()
    script = shutil.which("pgrecv", path=str(Path(sys.executable).parent)) or shutil.which("pgrecv")
    if script is None:
        raise SystemExit("no pgrecv script: pip install -e .")
    commands = sorted(cli.commands) if args.command is None else args.command
    here = {**os.environ, "PYTHONPATH": str(ROOT)}
    cases: dict[str, tuple[list[str], dict[str, str] | None]] = {
        "python -c pass": ([sys.executable, "-c", "pass"], None),
        "python -c 'import click'": ([sys.executable, "-c", "import click"], None),
        "pgrecv --help": ([script, "--help"], here),
        **{f"pgrecv {c} --help": ([script, c, "--help"], here) for c in commands},
    }
    if args.against is not None:
        there = {**os.environ, "PYTHONPATH": str(args.against.resolve())}
        cases["against: pgrecv --help"] = ([script, "--help"], there)
        for c in commands:
            cases[f"against: pgrecv {c} --help"] = ([script, c, "--help"], there)
    scratch = tempfile.TemporaryDirectory(prefix="pgrecv-help-")
    if args.installed:
        regular = _regular_install(Path(scratch.name))
        cases["installed: python -c pass"] = ([str(regular.parent / "python"), "-c", "pass"], None)
        cases["installed: pgrecv --help"] = ([str(regular), "--help"], None)
        for c in commands:
            cases[f"installed: pgrecv {c} --help"] = ([str(regular), c, "--help"], None)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for argv, env in cases.values():  # warm the page cache and the bytecode
        _wall(argv, env)
    for _ in range(args.runs):
        for name, (argv, env) in cases.items():
            times[name].append(_wall(argv, env))
    floor = statistics.median(times["python -c pass"])
    print(f"{args.runs} runs each, taking turns; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"{'command':42} {'median':>8} {'min':>8} {'max':>8} {'x bare':>7}  heavy imports")
    worst = 0.0
    for name, (argv, env) in cases.items():
        med = statistics.median(times[name])
        heavy = "" if "pgrecv" not in name else (", ".join(_heavy(argv[1:], env)) or "none")
        if "pgrecv" in name and not name.startswith("against"):
            worst = max(worst, med)
        print(
            f"{name:42} {med * 1000:7.1f}ms {min(times[name]) * 1000:7.1f}ms {max(times[name]) * 1000:7.1f}ms "
            f"{med / floor:6.2f}x  {heavy}"
        )
    print(f"slowest pgrecv median: {worst * 1000:.1f} ms (target <= 100 ms): {'met' if worst <= 0.1 else 'NOT met'}")
    scratch.cleanup()


if __name__ == "__main__":
    main()
