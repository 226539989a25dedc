"""The ranks that share one sequence (cp, ulysses) come out of the data-parallel ones, so the layout rules that read
dp count them: tp * pp * sp divides the world (LY001) and ep divides the dp left (LY009). Before, a spec with cp or
ulysses passed both rules on dp = world / (tp * pp) and the estimator divided by an expert-data-parallel size of 0
(ZeroDivisionError in estimate.param_groups), or refused with "micro batch 1 x dp 0"."""
import textwrap

import pytest

from dstoolkit.cli import main
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.rules import check_candidate
from dstoolkit.models import get_preset
from dstoolkit.spec import SpecError, load_spec
from dstoolkit.spec.checkpoint import CheckpointPolicy

SPEC = """\
name: shards
model:
  preset: tiny-moe
cluster:
  nodes: 1
  gpus_per_node: 8
  gpu: H100-SXM
training:
  seq_len: 3072
  global_batch: 8
  micro_batch: 1
  tp: 1
  pp: 1
  ep: {ep}
  {shard}
  zero_stage: 1
"""


def write(tmp_path, ep, shard):
    p = tmp_path / "spec.yaml"
    if shard.startswith("cp"):  # context parallelism is Megatron-LM's (or torchtitan's), not DeepSpeed's (LY024)
        shard += "\n  framework: megatron"
    p.write_text(textwrap.dedent(SPEC.format(ep=ep, shard=shard)))
    return p


@pytest.mark.parametrize("shard, dp", [("cp: 4", 2), ("ulysses: 4", 2)])
def test_ep_must_divide_dp_left_by_sequence_sharding(tmp_path, shard, dp):
    field = shard.split(":")[0]
    with pytest.raises(SpecError, match=rf"training\.ep: training\.ep=4 does not divide the data-parallel size {dp} "
                                        rf"\(world 8 / \(training\.tp 1 x training\.pp 1 x training\.{field} 4\)\)"):
        load_spec(write(tmp_path, 4, shard))
    load_spec(write(tmp_path, 2, shard))  # ep 2 divides dp 2


def test_sequence_shards_must_divide_world(tmp_path):
    with pytest.raises(SpecError, match=r"training\.tp \* training\.pp \* training\.cp = 1 \* 1 \* 3 = 3 does not "
                                        r"divide the world size 8"):
        load_spec(write(tmp_path, 1, "cp: 3"))


def test_estimate_reports_instead_of_crashing(tmp_path, capsys):
    assert main(["estimate", str(write(tmp_path, 4, "cp: 4"))]) == 2
    err = capsys.readouterr().err
    assert "training.ep=4 does not divide the data-parallel size 2" in err and "Traceback" not in err


def test_sweep_drops_ep_candidates_that_do_not_divide_dp_left(tmp_path):
    spec = load_spec(write(tmp_path, "auto", "cp: 4"))
    shape = get_preset("tiny-moe")

    def cand(ep):
        return Candidate(zero_stage=1, offload_optimizer=False, offload_param=False, zeropp=False, tp=1, pp=1, ep=ep,
                         micro_batch=1, checkpoint=CheckpointPolicy(kind="none"), sequence_parallel=False, cp=4)

    v = check_candidate(spec, shape, cand(4))
    assert v is not None and v.code == "ep-dp" and "training.cp 4" in v.message
    assert check_candidate(spec, shape, cand(2)) is None
    assert main(["estimate", str(tmp_path / "spec.yaml")]) == 0  # the sweep picks ep 2
