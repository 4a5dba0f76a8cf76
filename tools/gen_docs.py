#!/usr/bin/env python3
"""Generate man/pgrecv.1 and completions/pgrecv.{bash,zsh,fish} from the Click command tree.

Run with no arguments to write the files, or ``--check`` to fail when they are out of date
(the test suite does, so every new command or option is documented and completable).
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pgrecv import __version__  # noqa: E402
from pgrecv.cli import cli  # noqa: E402
from pgrecv.errors import ExitCode  # noqa: E402

EXIT_MEANING = {
    ExitCode.OK: "Success.",
    ExitCode.INTERNAL: "An unexpected internal error (a bug; run with -v and report it).",
    ExitCode.USAGE: "Bad command line: unknown option, missing or invalid value.",
    ExitCode.CONNECTION: "Cannot connect or authenticate, or the connection was lost.",
    ExitCode.SERVER_CONFIG: "Server configuration or privileges: wal_level, REPLICATION, missing plugin.",
    ExitCode.SLOT: "Replication slot missing, already existing, or active elsewhere.",
    ExitCode.PUBLICATION: "Publication missing, or several and none chosen.",
    ExitCode.DECODE: "Data from the server that the decoder cannot read.",
    ExitCode.OUTPUT: "Cannot write the output or make it durable (nothing was consumed).",
    ExitCode.INPUT: "Bad input files.",
    ExitCode.SERVER_ENV: "No PostgreSQL binaries for a throwaway server (demo).",
    ExitCode.STREAM_LOST: "The stream ended or the connection broke, and --no-loop forbids reconnecting.",
    ExitCode.SERVER: "The server refused a statement for a reason of its own; its message says which.",
    ExitCode.POSITION: "A start or resume position ahead of the server's WAL; nothing was confirmed.",
    ExitCode.UNHEALTHY: "slots --check: a slot is invalidated, lost, unreserved, inactive too long or past a limit.",
    ExitCode.PARTLY_APPLIED: "spark-apply: some tables were held back (each named with the fix); the rest applied.",
    ExitCode.INTERRUPTED: "Interrupted by SIGINT.",
}


def commands() -> list[tuple[str, click.Command]]:
    assert isinstance(cli, click.Group)
    return sorted(cli.commands.items())


def options(cmd: click.Command) -> Iterator[click.Option]:
    for p in cmd.params:
        if isinstance(p, click.Option) and not p.hidden:
            yield p
    yield from ()


def short_help(cmd: click.Command) -> str:
    return cmd.get_short_help_str(limit=200)


def value_kind(opt: click.Option) -> str:
    """'' for flags, 'file', 'dir', 'choice:a b c' or 'value'."""
    if opt.is_flag or opt.count:
        return ""
    if isinstance(opt.type, click.Choice):
        return "choice:" + " ".join(str(c) for c in opt.type.choices)
    if opt.metavar == "FILE":
        return "file"
    if opt.metavar == "DIR":
        return "dir"
    return "value"


# --- man page ---------------------------------------------------------------------------


def _roff(text: str) -> str:
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + ln) if ln.startswith((".", "'")) else ln for ln in text.splitlines())


def _opt_synopsis(opt: click.Option) -> str:
    names = ", ".join(f"\\fB{_roff(n)}\\fR" for n in opt.opts + opt.secondary_opts)
    kind = value_kind(opt)
    if kind:
        metavar = opt.metavar or (opt.type.name.upper() if not kind.startswith("choice") else "")
        if kind.startswith("choice:"):
            metavar = "{" + "|".join(kind[7:].split()) + "}"
        names += f" \\fI{_roff(metavar)}\\fR"
    return names


def _help(cmd: click.Command) -> str:
    """Paragraphs of the command's help, each on one line, separated by .PP."""
    text = inspect.cleandoc(cmd.help or "").replace("\b\n", "")
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]
    return "\n.PP\n".join(_roff(p) for p in paragraphs)


def man_page() -> str:
    out = [
        f'.TH PGRECV 1 "" "pgrecv {__version__}" "User Commands"',
        ".SH NAME",
        "pgrecv \\- consume PostgreSQL logical replication as typed events",
        ".SH SYNOPSIS",
        "\\fBpgrecv\\fR [\\fB\\-\\-version\\fR] \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
        ".SH DESCRIPTION",
        _help(cli),
        ".SH COMMANDS",
    ]
    for name, cmd in commands():
        out += [".SS " + _roff(f"pgrecv {name}"), _help(cmd)]
        for opt in options(cmd):
            out += [".TP", _opt_synopsis(opt), _roff(opt.help or "")]
            if opt.show_default and opt.default not in (None, False, ()):
                out.append(_roff(f"Default: {opt.default}."))
    out += [".SH EXIT STATUS", ".TP"]
    rows = []
    for code in ExitCode:
        rows += [".TP", f"\\fB{int(code)}\\fR", _roff(f"{code.name}: {EXIT_MEANING[code]}")]
    out += rows[1:]
    out += [
        ".SH ENVIRONMENT",
        "libpq's variables (PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD, PGSERVICE, PGPASSFILE, ...)"
        " apply to every connection, as do service files and ~/.pgpass.",
        ".SH SEE ALSO",
        "\\fBpg_recvlogical\\fR(1), \\fBpsql\\fR(1)",
        "",
    ]
    return "\n".join(out)


# --- completions --------------------------------------------------------------------------


def _sh_words(words: list[str]) -> str:
    return " ".join(words)


def bash() -> str:
    cmds = [n for n, _ in commands()]
    top = [o for p in cli.params if isinstance(p, click.Option) for o in p.opts] + ["--help"]
    lines = [
        "# bash completion for pgrecv (generated by tools/gen_docs.py; do not edit)",
        "_pgrecv() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" cmd="" i',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        case "${COMP_WORDS[i]}" in',
        f'            {"|".join(cmds)}) cmd="${{COMP_WORDS[i]}}"; break ;;',
        "        esac",
        "    done",
        '    case "$cmd" in',
        f'        "") COMPREPLY=($(compgen -W "{_sh_words(cmds + top)}" -- "$cur")); return ;;',
    ]
    for name, cmd in commands():
        opts: list[str] = ["--help"]
        value_cases: list[str] = []
        for opt in options(cmd):
            opts += opt.opts
            kind = value_kind(opt)
            pat = "|".join(opt.opts)
            if kind == "file":
                value_cases.append(f'                {pat}) COMPREPLY=($(compgen -f -- "$cur")); return ;;')
            elif kind == "dir":
                value_cases.append(f'                {pat}) COMPREPLY=($(compgen -d -- "$cur")); return ;;')
            elif kind.startswith("choice:"):
                value_cases.append(
                    f'                {pat}) COMPREPLY=($(compgen -W "{kind[7:]}" -- "$cur")); return ;;'
                )
            elif kind == "value":
                value_cases.append(f"                {pat}) return ;;")
        lines.append(f"        {name})")
        if value_cases:
            lines += ['            case "$prev" in', *value_cases, "            esac"]
        lines.append(f'            COMPREPLY=($(compgen -W "{_sh_words(opts)}" -- "$cur")) ;;')
    lines += ["    esac", "}", "complete -o default -F _pgrecv pgrecv", ""]
    return "\n".join(lines)


def _zsh_escape(text: str) -> str:
    return (
        text.replace("\\", "\\\\")
        .replace("'", "'\\''")
        .replace("[", "\\[")
        .replace("]", "\\]")
        .replace(":", "\\:")
    )


def zsh() -> str:
    lines = [
        "#compdef pgrecv",
        "# zsh completion for pgrecv (generated by tools/gen_docs.py; do not edit)",
        "",
        "_pgrecv() {",
        "    local -a commands",
        "    commands=(",
    ]
    for name, cmd in commands():
        lines.append(f"        '{name}:{_zsh_escape(short_help(cmd))}'")
    lines += [
        "    )",
        "    if (( CURRENT == 2 )); then",
        "        _describe -t commands 'pgrecv command' commands",
        "        _arguments '--version[show the version]' '--help[show help]' \\",
        "            '(-v --verbose)'{-v,--verbose}'[more detail]' '(-q --quiet)'{-q,--quiet}'[less output]'",
        "        return",
        "    fi",
        "    local cmd=${words[2]}",
        "    shift words; (( CURRENT-- ))",
        '    case "$cmd" in',
    ]
    for name, cmd in commands():
        specs = ["'--help[show help]'"]
        for opt in options(cmd):
            kind = value_kind(opt)
            desc = _zsh_escape(opt.help or "")
            action = ""
            if kind == "file":
                action = ":file:_files"
            elif kind == "dir":
                action = ":directory:_files -/"
            elif kind.startswith("choice:"):
                action = f":value:({kind[7:]})"
            elif kind == "value":
                action = f":{_zsh_escape((opt.metavar or opt.name or 'value').lower())}: "
            names = opt.opts
            repeat = "*" if (opt.multiple or opt.count) else ""
            if len(names) > 1:
                excl = "" if repeat else "(" + " ".join(names) + ")"
                specs.append(f"'{excl}'{repeat}{{{','.join(names)}}}'[{desc}]{action}'")
            else:
                specs.append(f"'{repeat}{names[0]}[{desc}]{action}'")
        lines.append(f"        {name})")
        lines.append("            _arguments \\")
        lines += [f"                {s} \\" for s in specs[:-1]]
        lines.append(f"                {specs[-1]} ;;")
    lines += ["    esac", "}", "", '_pgrecv "$@"', ""]
    return "\n".join(lines)


def _fish_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def fish() -> str:
    names = [n for n, _ in commands()]
    lines = [
        "# fish completion for pgrecv (generated by tools/gen_docs.py; do not edit)",
        "complete -c pgrecv -f",
        "complete -c pgrecv -n '__fish_use_subcommand' -l version -d 'Show the version'",
    ]
    for name, cmd in commands():
        lines.append(
            f"complete -c pgrecv -n '__fish_use_subcommand' -a {name} -d '{_fish_escape(short_help(cmd))}'"
        )
    for name, cmd in commands():
        cond = f"'__fish_seen_subcommand_from {name}'"
        for opt in options(cmd):
            parts = [f"complete -c pgrecv -n {cond}"]
            for o in opt.opts:
                parts.append(f"-l {o[2:]}" if o.startswith("--") else f"-s {o[1:]}")
            kind = value_kind(opt)
            if kind == "file":
                parts.append("-r -F")
            elif kind == "dir":
                parts.append("-r -a '(__fish_complete_directories)'")
            elif kind.startswith("choice:"):
                parts.append(f"-x -a '{kind[7:]}'")
            elif kind == "value":
                parts.append("-x")
            parts.append(f"-d '{_fish_escape(opt.help or '')}'")
            lines.append(" ".join(parts))
    lines.append("")
    _ = names
    return "\n".join(lines)


def outputs() -> dict[Path, str]:
    return {
        ROOT / "man" / "pgrecv.1": man_page(),
        ROOT / "completions" / "pgrecv.bash": bash(),
        ROOT / "completions" / "pgrecv.zsh": zsh(),
        ROOT / "completions" / "pgrecv.fish": fish(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if a generated file is out of date")
    args = parser.parse_args()
    stale = []
    for path, text in outputs().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python tools/gen_docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
