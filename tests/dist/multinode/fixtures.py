"""pytest fixtures for the multi-node tests: test hosts that are always torn down, even when a test fails."""
from __future__ import annotations

import atexit
import signal

import pytest

from dstoolkit.runtime.testhosts.hosts import TestHosts, reap_stale, unavailable_reason


def _sigterm_to_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")  # pytest then runs fixture finalizers (hosts come down)


@pytest.fixture(scope="module")
def two_hosts(request):
    """Two test hosts joined by a veth pair; skipped with the reason when namespaces cannot be made."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    reap_stale()  # hosts left by an earlier run that was killed before its teardown
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm_to_interrupt)  # `timeout`/CI cancel: still tear down
    hosts = TestHosts(2)
    # Finalizer (and atexit, for an interpreter exit that skips finalizers) first: a half-built set is removed.
    request.addfinalizer(hosts.down)
    atexit.register(hosts.down)
    hosts.up()
    return hosts
