"""tracectl's exit statuses: one table for every command. Each command's `--help` ends with the
rows that apply to it (`epilog`), and `tracectl.cli.main` maps every domain error and gRPC status
that reaches it onto this table, printing one line (never a traceback).

    0    done
    1    the work failed: a job or a stage did not succeed, or a service refused the request or
         could not be reached (its status code and reason are printed)
    2    bad input, nothing was started: a flag, an unreadable or malformed file or config, or a
         request the service refused as INVALID_ARGUMENT (the message names the flag or field)
    3    stored data is damaged: an artifact such as a run's manifest.json fails its sha256 check
         or does not parse (the message says what to delete or re-run)
    4    `envs generate` finished, but some candidate environment was rejected
    130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import textwrap

from trace_common.errors import ArtifactCorrupted, InvalidArgument, TraceError

OK, FAILED, BAD_INPUT, CORRUPTED, REJECTED, INTERRUPTED = 0, 1, 2, 3, 4, 130

ROWS = {
    OK: "done",
    FAILED: "the work failed: a job did not succeed, or a service refused or could not be reached",
    BAD_INPUT: "bad input, nothing started: a flag, an unreadable or malformed file, or a request the "
               "service refused as INVALID_ARGUMENT",
    CORRUPTED: "stored data is damaged (sha256 mismatch or unparseable): the message says what to delete "
               "or re-run",
    REJECTED: "generate finished, but some candidate environment was rejected (the table says why)",
}

#: gRPC status name -> exit status (any other status: FAILED).
STATUS = {"INVALID_ARGUMENT": BAD_INPUT, "DATA_LOSS": CORRUPTED}


def for_error(err: TraceError) -> int:
    if isinstance(err, InvalidArgument):
        return BAD_INPUT
    if isinstance(err, ArtifactCorrupted):
        return CORRUPTED
    return FAILED


def for_status(code_name: str) -> int:
    return STATUS.get(code_name, FAILED)


def epilog(*codes: int, **meaning: str) -> str:
    """The exit-status lines of a command's --help: `codes` from ROWS, in order; `meaning` gives a
    command's own wording for a code (keyword `c1` for status 1, ...) or a code ROWS lacks."""
    rows = [(code, meaning.get(f"c{code}", ROWS.get(code, ""))) for code in codes] + [(INTERRUPTED, "interrupted")]
    return "\n".join(["exit status:", *(textwrap.fill(text, width=96, initial_indent=f"  {code:<5}",
                                                     subsequent_indent=" " * 7) for code, text in rows)])
