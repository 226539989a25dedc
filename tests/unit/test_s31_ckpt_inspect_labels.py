"""`ckpt inspect` labels (s31 findings 16a, 16b).

16a. At ZeRO-0 the optimizer (Adam moments and, for bf16/fp16, the fp32 masters) is saved inside
     mp_rank_00_model_states.pt; inspect said "states optimizer yes" but "optimizer states 0" bytes. Now those
     bytes (the distinct storages under `optimizer`, from the pickled metadata) count as optimizer states, the rest
     of the file as model states, and a note says where they are.
16b. ZeRO-3's fp32 partitions (`fp32_flat_groups`) are pickled through torch._tensor._rebuild_from_type_v2 (a
     tensor with Python attributes), which the metadata reader did not know: "master ?". Now "master float32".
Real ZeRO-0 / ZeRO-3 checkpoints: tests/dist/test_s31_ckpt_real.py.
"""
from __future__ import annotations

import pytest

from dstoolkit.ckpt.inspect import inspect_checkpoint
from dstoolkit.cli import main

torch = pytest.importorskip("torch")


def _storage_bytes(obj) -> int:
    """Bytes of the distinct storages of the tensors in `obj`, as torch counts them."""
    seen: dict[int, int] = {}

    def walk(o):
        if isinstance(o, torch.Tensor):
            seen[o.untyped_storage().data_ptr()] = o.untyped_storage().nbytes()
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)

    walk(obj)
    return sum(seen.values())


def _zero0(root):
    pytest.importorskip("transformers")
    from tests.unit.test_ckpt_fuzz_export import _zero0 as make

    return make(root)[0]


def test_zero0_optimizer_bytes_are_counted_inside_the_model_states_file(tmp_path, capsys):
    ck = _zero0(tmp_path / "ck")
    f = ck / "step_00000002" / "mp_rank_00_model_states.pt"
    states = torch.load(f, weights_only=False)
    opt_bytes = _storage_bytes(states["optimizer"])
    assert opt_bytes > 0
    info = inspect_checkpoint(ck)
    assert info.optimizer_states and info.optimizer_state_bytes == opt_bytes  # before: 0
    assert info.model_state_bytes == f.stat().st_size - opt_bytes
    assert info.model_state_bytes >= _storage_bytes(states["module"])
    assert info.model_state_bytes + info.optimizer_state_bytes + info.other_bytes == info.total_bytes
    assert info.dtypes == {"model": "bfloat16", "optimizer": "float32", "master": "float32"}
    assert any(n.startswith(f"the optimizer states ({opt_bytes} bytes: moments and fp32 masters) are inside "
                            "mp_rank_00_model_states.pt") for n in info.notes)
    assert main(["ckpt", "inspect", str(ck)]) == 0
    bytes_line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("bytes"))
    assert bytes_line.endswith(f"model states {info.model_state_bytes}, optimizer states {opt_bytes}")


def test_tied_and_viewed_tensors_count_once(tmp_path):
    from dstoolkit.ckpt.torchzip import read_meta, storage_bytes_of

    base = torch.zeros(10)
    obj = {"a": base, "b": base, "c": base[2:5], "d": torch.ones(3, dtype=torch.bfloat16)}
    torch.save(obj, tmp_path / "x.pt")
    assert storage_bytes_of(read_meta(tmp_path / "x.pt")) == 40 + 6 == _storage_bytes(obj)


def test_zero3_master_partition_dtype_is_read(tmp_path):
    """DeepSpeed's ZeRO-3 fp32 partition carries attributes, so torch pickles it with _rebuild_from_type_v2."""
    tag = tmp_path / "global_step1"
    tag.mkdir()
    flat = torch.zeros(8)
    flat.ds_id = 0  # what makes torch's __reduce_ex__ take the _rebuild_from_type_v2 path
    for r in range(2):
        torch.save({"module": None, "param_shapes": [{"w": torch.Size([4, 4])}], "buffer_names": [],
                    "global_steps": 1, "dp_world_size": 2, "mp_world_size": 1, "ds_version": "0.19.8",
                    "ds_config": {"zero_optimization": {"stage": 3}}, "lr_scheduler": None},
                   tag / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
        torch.save({"optimizer_state_dict": {
            "zero_stage": 3, "fp32_flat_groups": [flat],
            "optimizer_state_dict": {"state": {0: {"exp_avg": torch.zeros(8), "exp_avg_sq": torch.zeros(8)}},
                                     "param_groups": [{"lr": 1e-3}]}}},
            tag / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    (tmp_path / "latest").write_text("global_step1")
    info = inspect_checkpoint(tmp_path)
    assert info.complete and info.zero_stage == 3
    assert info.dtypes.get("master") == "float32"  # before: "?"
