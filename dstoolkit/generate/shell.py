"""Shell text the launch scripts share: a default a variable takes from the environment, and a printed command.
No torch import.
"""
from __future__ import annotations

import shlex
from typing import Sequence


def env_default(var: str, value: str) -> list[str]:
    """Two lines that set `var` from the environment, else to `value` exactly, whatever characters it holds.

    The value is single-quoted (`shlex.quote`) in an assignment of its own and read through the expansion:
    ``VAR_DEFAULT='/path with space'`` then ``VAR="${VAR:-$VAR_DEFAULT}"``. It never goes inside
    ``"${VAR:-...}"`` itself: there bash keeps single quotes as characters (a shlex-quoted path gains literal
    quotes), an unpaired one is a syntax error that no escape fixes (``\\'`` stays two characters), and an
    unescaped ``}`` ends the word.
    """
    return [f"{var}_DEFAULT={shlex.quote(value)}", f'{var}="${{{var}:-${var}_DEFAULT}}"']


def require_set(var: str, why: str, *, me: str = "$ME") -> str:
    """One line that stops the script (exit 2) before anything starts when `var` is unset or empty, saying
    ``ME: VAR is not set: WHY`` on stderr. `me` and `why` go inside double quotes: generated text only (no spec
    value), which may use ``$ME`` / ``$((...))``."""
    return f'if [ -z "${{{var}:-}}" ]; then echo "{me}: {var} is not set: {why}" >&2; exit 2; fi'


def node_rank_why(nodes) -> str:
    """`require_set`'s reason for NODE_RANK in a launch of `nodes` nodes, one wording for every launch script:
    `nodes` a number, or a shell variable such as "$NNODES" where the script reads the node count at run time."""
    last = nodes - 1 if isinstance(nodes, int) else f"$(({str(nodes).lstrip('$')} - 1))"
    return f"a {nodes}-node launch runs this script on every node with NODE_RANK=<this node's rank, 0..{last}>"


def command_line(words: Sequence[str], env: Sequence[tuple[str, str]] = ()) -> str:
    """A command to print for the user to copy: each word shell-quoted, after `NAME=value` assignments."""
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env), *(shlex.quote(w) for w in words)])


REAP_GRACE_S = 30
"""How long processes under a launcher may outlive it after a forwarded SIGINT / SIGTERM before they are killed
(torchrun's agent waits 30 s for its workers after passing a signal on, then SIGKILLs them: torch/distributed/
elastic/agent/server/api.py `_shutdown` -> `PContext.close`). `dstoolkit train` (cli/train.py
`run_forwarding_signals`) and every generated launch script (`run_forwarding_signals_lines`) use it."""


def run_forwarding_signals_lines(cmd_var: str = "CMD", *, me: str = "launch.sh") -> list[str]:
    """Shell lines that run the command in the array `cmd_var` until it ends, stopping the whole job on TERM / INT.

    The rule `dstoolkit train` follows (cli/train.py `run_forwarding_signals`), in bash: the launcher runs as a job
    of its own (`set -m`: its own process group, so a signal for the script reaches every process the launcher
    started in it), never `exec`ed: the deepspeed runner exits on SIGTERM without stopping its
    `deepspeed.launcher.launch` child, whose ranks then train on, re-parented to init. On TERM / INT the script
    notes every process under the launcher, passes the signal to the launcher's group (torchrun and
    `deepspeed.launcher.launch` stop their ranks; torchrun's are in sessions of their own, out of the group), waits
    for the launcher, gives what is left `REAP_GRACE_S` seconds, SIGKILLs it, says one line and exits 128 + the
    signal's number (130 INT, 143 TERM; torchrun itself exits 1). A second signal kills what is left at once.
    Otherwise the script exits with the launcher's code.
    """
    return [
        "# Run the launcher as a job of its own (its own process group), not exec'ed: on TERM / INT every process",
        "# under it is stopped (the deepspeed runner alone exits on SIGTERM and leaves its ranks training), then",
        f"# {me} exits 143 (TERM) / 130 (INT). Processes still alive {REAP_GRACE_S} s after the launcher are killed.",
        "job_tree() {  # the pids under $1, itself included (from ps)",
        "  ps -A -o pid= -o ppid= | awk -v root=\"$1\" '{p[$1] = $2} END {t[root] = 1; n = 1; while (n) {n = 0;",
        "    for (c in p) if (!(c in t) && (p[c] in t)) {t[c] = 1; n = 1}} for (c in t) print c}'",
        "}",
        "stop_job() {  # $1: the signal's name, $2: the exit code; a second TERM / INT kills what is left at once",
        '  STOP_RC="$2"; if [ -z "$LAUNCHER_PID" ]; then exit "$STOP_RC"; fi',
        '  STOP_TREE="$(job_tree "$LAUNCHER_PID")"',
        f"  trap 'kill -KILL -- -\"$LAUNCHER_PID\" $STOP_TREE 2>/dev/null; echo \"{me}: killed the launcher and "
        "its ranks\" >&2; exit \"$STOP_RC\"' TERM INT",
        '  kill -"$1" -- -"$LAUNCHER_PID" 2>/dev/null || kill -"$1" "$LAUNCHER_PID" 2>/dev/null || true',
        '  wait "$LAUNCHER_PID" 2>/dev/null || true',
        '  local t pid left',
        f"  for ((t = 0; t < {REAP_GRACE_S}; t++)); do",
        '    left=""; for pid in $STOP_TREE; do if kill -0 "$pid" 2>/dev/null; then left="$left $pid"; fi; done',
        '    if [ -z "$left" ]; then break; fi; sleep 1',
        "  done",
        '  if [ -n "$left" ]; then kill -KILL $left 2>/dev/null || true; fi',
        f'  echo "{me}: interrupted by SIG$1: the launcher and its ranks were stopped" >&2',
        '  exit "$STOP_RC"',
        "}",
        'LAUNCHER_PID=""',
        "trap 'stop_job TERM 143' TERM",
        "trap 'stop_job INT 130' INT",
        "set -m",
        # stdin from /dev/null, as bash gives a background job without job control: under `set -m` the job is out
        # of the terminal's foreground group, and a read from the terminal (ssh / pdsh of a multi-node launcher, a
        # breakpoint in a rank) would stop it with SIGTTIN and hang the launch
        f'"${{{cmd_var}[@]}}" </dev/null &',
        "LAUNCHER_PID=$!",
        "set +m",
        'RC=0; wait "$LAUNCHER_PID" || RC=$?',
        'exit "$RC"',
    ]
