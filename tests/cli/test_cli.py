"""The command tree: every command has help, generated docs are current, errors map to exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import orjson
import psycopg
import pytest
from click.testing import CliRunner

from pgrecv.cli.main import cli, main
from pgrecv.errors import ExitCode
from pgrecv.pg.server import TempServer

ROOT = Path(__file__).resolve().parents[2]


def all_commands() -> list[str]:
    assert isinstance(cli, click.Group)
    return sorted(cli.commands)


@pytest.mark.parametrize("name", all_commands())
def test_every_command_has_help(name: str) -> None:
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    command = cli.commands[name]  # type: ignore[attr-defined]
    assert command.help and command.help.strip(), f"{name} has no help text"
    for param in command.params:
        if isinstance(param, click.Option):
            assert param.help, f"{name} {param.opts} has no help text"


def test_generated_docs_are_current() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_docs.py"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_man_page_lists_every_command_and_exit_code() -> None:
    text = (ROOT / "man" / "pgrecv.1").read_text()
    for name in all_commands():
        assert f"pgrecv {name}".replace("-", "\\-") in text  # roff escapes hyphens
    for code in ExitCode:
        assert f"\\fB{int(code)}\\fR" in text


def _readme_exit_codes() -> dict[int, str]:
    """The README's exit-code table, code -> meaning (cells unescaped)."""
    section = (ROOT / "README.md").read_text().split("\n## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| code ")]
    table = {}
    for row in rows:
        code, meaning = row.removeprefix("| ").removesuffix(" |").split(" | ", 1)
        table[int(code)] = meaning.replace("\\|", "|")
    return table


def _man_exit_codes() -> dict[int, str]:
    """The man page's EXIT STATUS entries, code -> text with roff's bold and escapes removed."""
    text = (ROOT / "man" / "pgrecv.1").read_text()
    section = text.split(".SH EXIT STATUS\n", 1)[1].split("\n.SH ", 1)[0]
    entries = {}
    for item in section.split(".TP\n")[1:]:
        tag, body = item.rstrip("\n").split("\n", 1)
        code = int(tag.removeprefix("\\fB").removesuffix("\\fR"))
        entries[code] = body.replace("\\fB", "`").replace("\\fR", "`").replace("\\-", "-").replace("\\e", "\\")
    return entries


def test_exit_codes_agree_in_enum_readme_and_man_page() -> None:
    """ExitCode's descriptions are the only source: the README table and the man page say the same."""
    assert _readme_exit_codes() == {int(code): code.description for code in ExitCode}
    assert _man_exit_codes() == {int(code): f"{code.name}: {code.description}." for code in ExitCode}
    assert all(code.description for code in ExitCode)


def test_bash_completion_is_valid_and_completes(tmp_path: Path) -> None:
    script = ROOT / "completions" / "pgrecv.bash"
    probe = (
        f"source {script}; COMP_WORDS=(pgrecv pe); COMP_CWORD=1; _pgrecv; echo ${{COMPREPLY[@]}};"
        " COMP_WORDS=(pgrecv peek --format ''); COMP_CWORD=3; _pgrecv; echo ${COMPREPLY[@]}"
    )
    proc = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
    out = proc.stdout.splitlines()
    assert out[0] == "peek"
    assert out[1].split() == ["auto", "jsonl", "pretty", "raw", "debezium", "debezium-schema"]


def test_help_does_not_import_pyspark() -> None:
    code = "import sys; from pgrecv.cli.main import main\ntry:\n main(['--help'])\nexcept SystemExit: pass\n"
    code += "assert 'pyspark' not in sys.modules, sorted(sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pgrecv", *args], capture_output=True, text=True)


def test_usage_error_exit_code() -> None:
    proc = run("peek")
    assert proc.returncode == ExitCode.USAGE
    assert "--slot" in proc.stderr


def test_version() -> None:
    from pgrecv import __version__

    proc = run("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"pgrecv {__version__}"


def test_contradicting_password_flags() -> None:
    proc = run("slots", "-w", "-W")
    assert proc.returncode == ExitCode.USAGE
    assert proc.stderr.count("\n") == 1 and "contradict" in proc.stderr


def test_connection_refused_is_one_line_without_password() -> None:
    proc = run("slots", "-d", "postgresql://alice:s3cr3t-pw@127.0.0.1:1/db", "-w", "-vv")
    assert proc.returncode == ExitCode.CONNECTION, proc.stderr
    assert "s3cr3t-pw" not in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("pgrecv: error:")]
    assert len(errors) == 1 and errors[0].startswith("pgrecv: error: cannot connect")


@pytest.mark.parametrize(
    ("where", "said", "advice"),
    [
        ("host=127.0.0.1 port=1", 'connection to server at "127.0.0.1", port 1 failed: Connection refused', "running"),
        ("host={tmp} port=1", 'connection to server on socket "{tmp}/.s.PGSQL.1" failed: No such file', "running"),
        ("host=nosuchhost.invalid port=1", "nosuchhost.invalid", "check the host name given with -h (or PGHOST)"),
    ],
    ids=["refused", "no socket", "unknown host"],
)
def test_a_server_not_reached_says_which_options_to_check(tmp_path: Path, where: str, said: str, advice: str) -> None:
    """libpq's reason, without psycopg's "connection failed:" prefix, and what to check."""
    proc = run("slots", "-d", where.format(tmp=tmp_path) + " dbname=x user=x", "-w")
    assert proc.returncode == ExitCode.CONNECTION, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("pgrecv: error: cannot connect: ") and "connection failed:" not in line, line
    assert said.format(tmp=tmp_path) in line and line.endswith(
        advice
        if advice != "running"
        else "is the server running there? give its host and port with -h and -p (or PGHOST and PGPORT)"
    ), line


def test_bad_conninfo_is_a_usage_error_without_password() -> None:
    proc = run("slots", "-d", "host=x password=hunter2 nonsense")
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert "hunter2" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_bad_lsn_option() -> None:
    proc = run("peek", "--slot", "s", "--upto-lsn", "12")
    assert proc.returncode == ExitCode.USAGE
    assert "invalid LSN" in proc.stderr


def test_main_maps_errors(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["drop"])
    assert exc.value.code == ExitCode.USAGE


def test_psycopg_warnings_are_verbose_lines(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """psycopg's "error ignored ..." warnings come with an error pgrecv reports itself in one line:
    without a handler Python printed them above it (CI, 2026-11-29); now they are -v lines."""
    import logging

    from pgrecv.cli import options

    monkeypatch.setattr(logging.getLogger("psycopg"), "handlers", [])
    monkeypatch.setattr(logging.getLogger("psycopg"), "propagate", True)
    options.route_library_logs()
    options.route_library_logs()  # once only, however often main() runs in a process
    assert len(logging.getLogger("psycopg").handlers) == 1
    said = "error ignored terminating <psycopg.Copy [ACTIVE] (host=h user=u)>: no COPY in progress"
    monkeypatch.setattr(options.STATE, "verbose", 0)
    logging.getLogger("psycopg._copy").warning(
        "error ignored terminating %s: %s", "<psycopg.Copy [ACTIVE] (host=h user=u)>", "no COPY in progress"
    )
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(options.STATE, "verbose", 1)
    logging.getLogger("psycopg._copy").warning(
        "error ignored terminating %s: %s", "<psycopg.Copy [ACTIVE] (host=h user=u)>", "no COPY in progress"
    )
    assert capsys.readouterr().err == f"pgrecv: psycopg._copy: {said}\n"


def test_a_finished_command_skips_only_the_interpreter_teardown(db_conn: psycopg.Connection[Any]) -> None:
    """`main()` as the program ends with os._exit: exit handlers still run and what was written
    reaches standard output, but no module is freed (the object below would say so)."""
    db_conn.execute("SELECT pg_create_logical_replication_slot('leave_s', 'test_decoding')")
    dsn = db_conn.info.dsn
    code = f"""
import atexit, sys, threading, time
class Teardown:
    def __del__(self):
        sys.stderr.write("teardown ran\\n")
kept = Teardown()
atexit.register(lambda: sys.stderr.write("exit handler ran\\n"))
sys.argv = ["pgrecv", "slots", "-d", {dsn!r}, "--format", "jsonl"]
from pgrecv.cli.main import main
main()
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert proc.stderr.splitlines() == ["exit handler ran"]
    assert [orjson.loads(line)["slot_name"] for line in proc.stdout.splitlines()] == ["leave_s"]
    # with another thread alive, the usual exit: teardown included
    waiting = code.replace("main()", "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\nmain()")
    proc = subprocess.run([sys.executable, "-c", waiting], capture_output=True, text=True)
    assert proc.returncode == ExitCode.OK, proc.stderr
    assert sorted(proc.stderr.splitlines()) == ["exit handler ran", "teardown ran"]


def test_a_table_to_a_reader_that_went_away_is_an_output_error(db_conn: psycopg.Connection[Any]) -> None:
    """`pgrecv slots` draws its table with rich, whose own answer to a broken pipe is a silent exit 1."""
    db_conn.execute("SELECT pg_create_logical_replication_slot('gone_s', 'test_decoding')")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pgrecv", "slots", "-d", db_conn.info.dsn],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == ExitCode.OUTPUT, proc.stderr
    assert proc.stderr.splitlines() == ["pgrecv: error: the reader of standard output went away before all was written"]


def test_password_without_a_terminal_is_read_from_standard_input(pg_server: TempServer, tmp_path: Path) -> None:
    """-W in a process without a terminal reads the password from standard input, as psql and
    pg_recvlogical do; an input that ends at the prompt is a one-line error, not a traceback."""
    from psycopg.conninfo import make_conninfo

    hba = ["local all alice scram-sha-256"]
    with TempServer(pg_server.install, hba_lines=hba) as server:
        with psycopg.connect(server.dsn(), autocommit=True) as conn:
            conn.execute("CREATE ROLE alice LOGIN PASSWORD 'Piped-s3cret'")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["PGPASSFILE"] = str(tmp_path / "no-pgpass")
        args = [sys.executable, "-m", "pgrecv", "slots", "-d", make_conninfo(server.dsn(), user="alice"), "-W"]

        def run_with(stdin: str | None) -> subprocess.CompletedProcess[str]:
            # a session of its own: no controlling terminal (/dev/tty fails), wherever the tests run
            return subprocess.run(
                args,
                input=stdin,
                stdin=subprocess.DEVNULL if stdin is None else None,
                capture_output=True,
                text=True,
                env=env,
                start_new_session=True,
            )

        piped = run_with("Piped-s3cret\n")
        assert piped.returncode == ExitCode.OK, piped.stderr
        assert piped.stderr == "Password: \n" and "no replication slots" in piped.stdout
        ended = run_with(None)
        assert ended.returncode == ExitCode.CONNECTION, ended.stderr
        assert ended.stderr.splitlines() == [
            "Password: ",
            "pgrecv: error: no password: the input ended at the password prompt; type it there, "
            "or give it in PGPASSWORD or a ~/.pgpass file",
        ]
        wrong = run_with("Not-it\n")
        assert wrong.returncode == ExitCode.CONNECTION, wrong.stderr
        assert "password authentication failed" in wrong.stderr and "Not-it" not in wrong.stderr
        assert "Traceback" not in piped.stderr + ended.stderr + wrong.stderr


def test_a_runs_quiet_and_verbose_end_with_it() -> None:
    """The options only raise the verbosity, so a second run of ``main`` in one process (the tests
    run many) inherited the first one's ``-q`` (stop 72's CI: a psycopg warning went unshown)."""
    from pgrecv.cli import options
    from pgrecv.cli.main import main

    with pytest.raises(SystemExit):  # a run that ends in an error, after its options were taken
        main(["slots", "-q", "-d", "dbname=x host=/nonexistent"])
    assert (options.STATE.verbose, options.STATE.quiet) == (0, False)


@pytest.mark.parametrize(
    ("conf", "secret"),
    [
        ("spark.hadoop.fs.s3a.secret.key=AbcSecret1", "AbcSecret1"),
        ("spark.sql.catalog.c.jdbc.password=Hunter-22", "Hunter-22"),
        ("spark.sql.catalog.c.token=tok_9f8e7d", "tok_9f8e7d"),
        ("spark.sql.catalog.c.uri=jdbc:postgresql://db/cat?user=u&password=UrlPw77", "UrlPw77"),
    ],
)
def test_a_secret_given_with_conf_is_masked_in_messages(conf: str, secret: str) -> None:
    """A Spark or catalog message may quote a setting: the value of a --conf key that names a
    secret, or a password inside a URL, never reaches the user's terminal or --json."""
    from pgrecv.cli.spark_apply import parse_conf
    from pgrecv.pg.conn import redact

    assert parse_conf((conf,))[conf.partition("=")[0]] == conf.partition("=")[2]  # the job gets it as given
    masked = redact(f"failed: {conf.partition('=')[2]} (said the catalog)")
    assert secret not in masked and "********" in masked, masked


def test_an_ordinary_conf_value_is_not_masked() -> None:
    from pgrecv.cli.spark_apply import parse_conf
    from pgrecv.pg.conn import redact

    parse_conf(("spark.sql.shuffle.partitions=Partitions64",))
    assert redact("Partitions64 partitions") == "Partitions64 partitions"
