"""Whether this test process can deliver SIGINT to the shells it starts. A process started in the background by a
non-interactive shell (`nohup cmd &`, some CI runners) inherits SIGINT ignored, and bash cannot trap a signal that was
ignored when it started (bash manual, "Signals"), so a launch script's Ctrl-C rule cannot be exercised there."""
from __future__ import annotations

import signal

import pytest


def skip_if_sigint_ignored(signum: int) -> None:
    """Skip a SIGINT case when SIGINT was ignored at this process's start (Python then keeps SIG_IGN)."""
    if signum == signal.SIGINT and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        pytest.skip("SIGINT is ignored in this process (started in the background by a non-interactive shell): "
                    "the shells it starts cannot trap it; run the suite from a foreground shell to test Ctrl-C")
