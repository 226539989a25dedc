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


def command_line(words: Sequence[str], env: Sequence[tuple[str, str]] = ()) -> str:
    """A command to print for the user to copy: each word shell-quoted, after `NAME=value` assignments."""
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env), *(shlex.quote(w) for w in words)])
