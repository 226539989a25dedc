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
