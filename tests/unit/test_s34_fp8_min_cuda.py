"""The FP8 CUDA gate (`dsconfig.fp8.check_fp8_hardware`, also behind `fp8 plan --cuda` and a spec's
cluster.cuda_version) applies the lowest CUDA of the recipe and architecture (`min_cuda`): 12.1 for every recipe
(Transformer Engine 2.x's prerequisite), 12.8 on Blackwell (sm_100+), 12.9 for block scaling. Was: CUDA was checked
only for block and on Ada, so delayed FP8 on H100 with CUDA 11.0 and mxfp8 on B200 with CUDA 12.0 passed."""
import pytest

from dstoolkit.cli import main
from dstoolkit.dsconfig.fp8 import Fp8Config, check_fp8_hardware
from dstoolkit.hardware.table import get_gpu

TE = ("Transformer Engine 2.x (what the [te] extra installs) needs CUDA 12.1+; TE 1.x, which ran FP8 on Hopper from "
      "CUDA 11.8, is not supported here")
BW = "Transformer Engine 2.x needs CUDA 12.8+ for Blackwell"
BLOCK = "Transformer Engine's FP8 block-scaled GEMM needs CUDA 12.9+"


@pytest.mark.parametrize("recipe,gpu,cuda,expect", [
    ("delayed", "H100-SXM", "11.0", f"fp8.recipe='delayed' needs CUDA >= 12.1 but CUDA is 11.0 ('H100-SXM', sm_90: "
                                    f"{TE}): upgrade CUDA"),
    ("current", "H200", "12.0", f"fp8.recipe='current' needs CUDA >= 12.1 but CUDA is 12.0 ('H200', sm_90: {TE}): "
                                "upgrade CUDA"),
    ("mxfp8", "B200", "12.0", f"fp8.recipe='mxfp8' needs CUDA >= 12.8 but CUDA is 12.0 ('B200', sm_100: {BW}): "
                              "upgrade CUDA"),
    ("delayed", "B200", "12.4", f"fp8.recipe='delayed' needs CUDA >= 12.8 but CUDA is 12.4 ('B200', sm_100: {BW}): "
                                "upgrade CUDA"),
    ("block", "H800", "12.8", f"fp8.recipe='block' needs CUDA >= 12.9 but CUDA is 12.8 ('H800', sm_90: {BLOCK}): "
                              "upgrade CUDA or use recipe 'delayed'/'current'"),
    ("block", "H100-SXM", "11.8", f"fp8.recipe='block' needs CUDA >= 12.9 but CUDA is 11.8 ('H100-SXM', sm_90: "
                                  f"{BLOCK}): upgrade CUDA"),
    ("delayed", "L40S", "12.0", f"fp8.recipe='delayed' needs CUDA >= 12.1 but CUDA is 12.0 ('L40S', sm_89: {TE}): "
                                "upgrade CUDA"),
])
def test_below_the_floor(recipe, gpu, cuda, expect):
    fmt = "hybrid" if recipe == "delayed" else "e4m3"
    assert check_fp8_hardware(Fp8Config(recipe=recipe, format=fmt), get_gpu(gpu), cuda) == [expect]


@pytest.mark.parametrize("recipe,gpu,cuda", [("delayed", "H100-SXM", "12.1"), ("current", "L40S", "12.1"),
                                             ("mxfp8", "B200", "12.8"), ("delayed", "B200", "12.8"),
                                             ("block", "H100-SXM", "12.9"), ("block", "B200", "13.0")])
def test_at_the_floor(recipe, gpu, cuda):
    fmt = "hybrid" if recipe == "delayed" else "e4m3"
    assert check_fp8_hardware(Fp8Config(recipe=recipe, format=fmt), get_gpu(gpu), cuda) == []


def test_min_cuda_is_the_strictest_floor():
    from dstoolkit.dsconfig.fp8 import min_cuda

    assert min_cuda("delayed", (9, 0)) == ((12, 1), TE)
    assert min_cuda("mxfp8", (10, 0)) == ((12, 8), BW)
    assert min_cuda("block", (10, 0)) == ((12, 9), BLOCK)


@pytest.mark.parametrize("argv,line", [
    (["--cuda", "11.0"], f"error: fp8.recipe='delayed' needs CUDA >= 12.1 but CUDA is 11.0 ('H100-SXM', sm_90: {TE})"),
    (["--gpu", "B200", "--recipe", "mxfp8", "--cuda", "12.0"],
     f"error: fp8.recipe='mxfp8' needs CUDA >= 12.8 but CUDA is 12.0 ('B200', sm_100: {BW})"),
])
def test_fp8_plan_applies_the_same_rule(capsys, argv, line):
    assert main(["fp8", "plan", "llama-3-8b", *argv]) == 1
    out = capsys.readouterr()
    assert f"{line}: upgrade CUDA" in out.out + out.err
