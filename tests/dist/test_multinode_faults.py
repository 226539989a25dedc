"""Faults across two test hosts, on the generated torchrun launch (2 nodes x 2 ranks, ZeRO-2, example trainer):

- cut link (`ip link set tb0 down` on host 1 mid-run): with DIST_TIMEOUT_S=10 (launch.sh -> the trainer's
  --dist-timeout-s) every launcher exits non-zero within that timeout plus launcher teardown, instead of hanging;
- lost host (SIGKILL of every process on host 1): host 0 fails at once (its peers' sockets close);
after each, the same launch relaunched with --resume continues from the last good checkpoint and the loss
trajectory equals an uninterrupted run bitwise: every step present, nothing trained lost.
Needs root (network namespaces); skips otherwise.
"""
from __future__ import annotations

import pytest

from dstoolkit.runtime.cpu_precision import precision_for_this_cpu
from dstoolkit.runtime.testhosts import jobs, scenarios
from tests.dist.multinode.fixtures import two_hosts  # noqa: F401  (fixture)

pytestmark = [pytest.mark.dist, pytest.mark.slow]

STEPS = 8
SAVE_EVERY = 2
DATA_DELAY_S = 0.4
"""Data-iterator pause per batch in the faulted run only (trainer --data-delay-s): the fault lands mid-run;
it does not touch the numerics."""
BOUNDED = {"DIST_TIMEOUT_S": str(scenarios.PG_TIMEOUT_S)}
"""launch.sh passes it as the trainer's --dist-timeout-s: the world group and every group DeepSpeed creates later."""


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    d = tmp_path_factory.mktemp("mn_faults_gen")
    spec = d / "two_node_cpu.yaml"
    spec.write_text(scenarios.two_node_spec_text(precision=precision_for_this_cpu("bf16")))
    return scenarios.generate(spec, d / "out", ["zero2"]) / "zero2"


def _commands(hosts, sdir, launch_env):
    def commands_for(metrics, ckpt, resume, slow):
        extra = ["--data-delay-s", str(DATA_DELAY_S)] if slow else []
        return scenarios.node_commands(hosts, sdir, "torchrun", metrics, STEPS,
                                       scenarios.trainer_extra(ckpt, SAVE_EVERY, resume, extra), env=launch_env)
    return commands_for


@pytest.fixture(scope="module")
def reference(two_hosts, generated, tmp_path_factory):  # noqa: F811
    """The uninterrupted run on the same hosts, same seed, data order and checkpoint cadence."""
    d = tmp_path_factory.mktemp("mn_faults_ref")
    metrics = d / "ref.jsonl"
    argvs = _commands(two_hosts, generated, {})(metrics, d / "ref.ckpt", False, False)
    res = jobs.run_on_hosts(two_hosts, argvs, d, "ref", 600)
    assert res.ok, res.tail()
    losses = jobs.read_losses(metrics)
    assert len(losses) == STEPS, losses
    return losses


@pytest.mark.parametrize("fault", ["cut", "lost"])
def test_fault_fails_bounded_and_resume_is_bitwise(two_hosts, generated, reference, tmp_path, fault):  # noqa: F811
    launch_env = BOUNDED if fault == "cut" else {}
    fig = scenarios.fault_and_resume(two_hosts, tmp_path, fault, _commands(two_hosts, generated, launch_env),
                                     reference)
    print(fig)
    # The job ended by itself (no launcher left hanging) and reported failure.
    assert not fig["fault_timed_out"], fig
    assert any(rc not in (0, None) for rc in fig["fault_returncodes"]), fig
    assert fig["seconds_fault_to_all_exited"] < scenarios.PG_TIMEOUT_S + scenarios.DETECT_SLACK_S, fig
    # It resumed from a checkpoint taken before the fault, and nothing trained was lost: every step, bitwise.
    assert fig["resumed_from_step"] is not None and fig["resumed_from_step"] > 0, fig
    assert fig["resumed_from_step"] <= fig["steps_logged_when_stopped"], fig
    assert fig["steps_compared"] == STEPS, fig
    assert fig["bitwise_equal"], fig
