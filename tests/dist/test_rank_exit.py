"""A finished rank's gloo workers are joined before the interpreter exits (dstoolkit/runtime/rankexit.py).

`destroy_process_group` alone leaves the workers running while anything still refers to a group object; the
script below holds its groups the ways a finished HF Trainer / DeepSpeed run was found to (an attribute, a list,
a closure cell, a class attribute, a slot, a function default captured after init, an untracked dict in a module
global, an lru_cache keyed by the group) and checks, by the thread count in /proc, that `destroy_groups()` + `release_groups()` leaves
only the threads the process had before `init_process_group`.
"""
import subprocess
import sys

import pytest

from dstoolkit.runtime.train.launch import free_port

pytestmark = pytest.mark.dist

SCRIPT = r'''
import functools, os, sys
import torch, torch.distributed as dist
from dstoolkit.runtime import rankexit


def threads():
    return len(os.listdir("/proc/self/task"))


before = threads()
dist.init_process_group("gloo")
sub = dist.new_group([0, 1])
world = dist.group.WORLD
t = torch.ones(4)
dist.all_reduce(t)
dist.all_reduce(t, group=sub)


class Engine:
    CLASS_GROUP = None  # a class attribute set after init

    def __init__(self, g):
        self.dp_group = g


class Slotted:
    __slots__ = ("group",)

    def __init__(self, g):
        self.group = g


Engine.CLASS_GROUP = world
slotted = Slotted(sub)


engine = Engine(sub)
held = [world, sub]
def closure(g=world):  # a default captured after init (torch.distributed.nn.functional does this)
    return lambda: (g, sub)
fn = closure()
NAMES = {"dp": sub}  # str keys, atomic values: a dict the garbage collector does not track


@functools.lru_cache(None)
def size_of(g):
    return dist.get_world_size(g)


size_of(sub)
running = threads()
rankexit.destroy_groups()
after_destroy = threads()
replaced = rankexit.release_groups()
# One write per rank (the newline inside it): print writes the text and the newline apart, and two ranks'
# writes interleave on the shared pipe.
sys.stdout.write(f"RANK{os.environ['RANK']} before={before} running={running} after_destroy={after_destroy} "
      f"released={threads()} replaced={replaced} engine={type(engine.dp_group).__name__} "
      f"names={type(NAMES['dp']).__name__} default={type(closure.__defaults__[0]).__name__} "
      f"cls={type(Engine.CLASS_GROUP).__name__} slot={type(slotted.group).__name__}\n")
sys.stdout.flush()
'''


def test_release_groups_joins_the_gloo_workers_a_finished_run_still_refers_to(tmp_path):
    (tmp_path / "s.py").write_text(SCRIPT)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        f"--master_port={free_port()}", "s.py"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = sorted(ln for ln in p.stdout.splitlines() if ln.startswith("RANK"))
    assert len(lines) == 2, p.stdout
    for ln in lines:
        f = dict(kv.split("=") for kv in ln.split()[1:])
        assert int(f["running"]) > int(f["before"]), ln  # the groups' workers were running
        assert int(f["after_destroy"]) == int(f["running"]), ln  # destroy alone leaves them (why release exists)
        assert int(f["released"]) == int(f["before"]), ln  # every worker joined
        assert f["engine"] == f["names"] == f["default"] == f["cls"] == f["slot"] == "NoneType", ln
        assert int(f["replaced"]) >= 6, ln


FAILING = r'''
import os, sys, time
import torch, torch.distributed as dist
from dstoolkit.runtime import rankexit

rankexit.install_rank_guards("test")
dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
if os.environ["RANK"] == "1":
    raise ValueError("rank 1 found a bad batch")
dist.all_reduce(t)  # rank 0 waits in a collective its peer never joins
time.sleep(60)
'''


def test_a_rank_that_fails_for_a_real_reason_still_exits_non_zero_with_its_reason(tmp_path):
    """The exit guard turns a finished run's exit into 0; it must not hide a real failure: the job's exit
    status is non-zero, the rank's exception is on screen, and the peer stuck in a collective does not hang it."""
    (tmp_path / "f.py").write_text(FAILING)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        f"--master_port={free_port()}", "f.py"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0, p.stderr[-3000:]
    assert "ValueError: rank 1 found a bad batch" in p.stderr, p.stderr[-3000:]
    assert "destroying the process groups at exit failed" not in p.stderr, p.stderr[-3000:]
