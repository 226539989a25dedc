"""How a rank ends: every process group destroyed while the interpreter is still alive.

Why (reproduced and read from a core dump, torch 2.13 CPU, gloo): a rank that returns from its script without
`destroy_process_group` reaches `Py_FinalizeEx` with the gloo worker threads (`c10d::ProcessGroupGloo::runLoop`)
still running. When one of them drops a finished work object at that moment (`~AsyncAllgatherWork`: its
tensors hold Python objects, `c10::TensorImpl::decref_pyobject`), it takes the GIL
(`pybind11::gil_scoped_acquire`); a thread taking the GIL during finalization is ended by
`PyThread_exit_thread` -> `pthread_exit`, whose forced unwind hits a `noexcept` frame -> `std::terminate`:
``terminate called without an active exception``, SIGABRT, exit -6, although the run finished. A bare gloo
script (init, 20 all_reduce + all_gather, return) aborted 5 times in 10 runs; the same with
`destroy_process_group` at the end 0 in 10 (benchmarks/clean_exit.py has the counts for dstoolkit's jobs).

The fix has two halves, both before finalization:

1. Destroy the groups (`destroy_process_group`, DeepSpeed's `deepspeed.comm.destroy_process_group` first).
2. Release the group objects themselves. Destroying a group does *not* stop its gloo workers: the worker threads
   are joined only by `~ProcessGroupGloo`, which runs when the last reference to the group object goes
   (measured, torch 2.13: 7 threads after `destroy_process_group` while a reference is held, 1 once it is
   dropped; `shutdown()` and `abort()` on the gloo backend leave them running too). A finished HF Trainer run
   still holds its groups after destroy, in every parameter (`param._dp_group`), the `DeepSpeedEngine`
   (`data_parallel_group`, `seq_data_parallel_group`), the ZeRO optimizer (`dp_process_group`), a list and two
   closure cells per rank, so its workers lived into `Py_FinalizeEx` and the abort above could still happen
   (1 in 36 jobs in benchmarks/clean_exit.py; twice in one CI run). The exit handler therefore replaces every
   reference to a destroyed group it can find by None (`release_groups`: attributes, dict values, list items,
   closure cells, function defaults, lru_caches) and drops its own; the group's destructor then joins the
   workers while the interpreter is alive (tests/dist/test_rank_exit.py: the thread count returns to what it was
   before `init_process_group`). The program has ended when this runs: no code of the user's uses the groups
   after it. A reference it cannot reach (one held from C++) keeps that group's workers alive as before.

* `end_ranks()` -- a finished run: barrier (every rank's last collective is done), then destroy.
* `install_exit_guard()` -- any way out (a normal end, an exception, `sys.exit`, a user script that never
  destroys its groups): an `atexit` handler destroys what is left, without a barrier (a peer may be gone), and
  releases every group object (half 2). atexit handlers run before the interpreter is torn down.

A rank that fails for a real reason keeps its exit code and its message: the guard only removes the abort that
would have replaced them.
"""
from __future__ import annotations

import atexit
import sys

_installed = False
_destroyed: list = []  # the group objects destroy_groups() destroyed; released at exit (release_groups)


def _initialized() -> bool:
    try:
        import torch.distributed as td
    except ImportError:
        return False
    return td.is_available() and td.is_initialized()


def _live_groups() -> list:
    """Every process-group object torch knows (the default group and each new_group)."""
    import torch.distributed as td

    return list(td.distributed_c10d._world.pg_map.keys())


def destroy_groups() -> bool:
    """Destroy every process group (DeepSpeed's references too); True if there was one to destroy.

    The group objects are kept in `_destroyed` so that `release_groups()` can drop every reference left to them."""
    if not _initialized():
        return False
    _destroyed.extend(pg for pg in _live_groups() if all(pg is not d for d in _destroyed))
    # Only a DeepSpeed the program imported can hold groups. Importing it here, at exit, would fail in a program
    # that never did (deepspeed -> concurrent.futures.process registers a threading atexit: "can't register
    # atexit after shutdown"), and the groups would not be destroyed.
    ds_comm = sys.modules.get("deepspeed.comm")
    if ds_comm is not None and ds_comm.is_initialized():
        ds_comm.destroy_process_group()
    if _initialized():  # torch's groups made without DeepSpeed, or DeepSpeed absent
        import torch.distributed as td

        td.destroy_process_group()
    return True


def _without(ids: set, seq: tuple) -> tuple:
    return tuple(None if id(v) in ids else v for v in seq)


def _is(obj, classes) -> bool:
    """isinstance by the object's real type: isinstance also reads `obj.__class__`, which runs code on a proxy
    (torch's deprecated `torch.distributed.reduce_op` warns when asked) and the scan below meets every object."""
    return issubclass(type(obj), classes)


def _holds(ids: set, seq) -> bool:
    return any(id(v) in ids for v in seq)


def _scrub(ids: set, container) -> int:
    """In a dict (values) or a list (items): a group -> None, a tuple holding a group -> a copy with None there."""
    n = 0
    if isinstance(container, dict):
        items = list(dict.items(container))  # dict.items: a dict subclass's own items() may run code
    else:
        items = list(enumerate(container))
    for key, v in items:
        if id(v) in ids:
            container[key] = None
            n += 1
        elif type(v) is tuple and _holds(ids, v):
            container[key] = _without(ids, v)
            n += 1
    return n


def _scrub_attributes(ids: set, obj) -> int:
    """An object that holds a group as an attribute: Python 3.11 keeps instance attributes inline (no dict
    object until one is asked for), so the object itself is the referrer; its __dict__ and __slots__ are scrubbed."""
    n = 0
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except (AttributeError, TypeError):
        attrs = None
    if type(attrs) is dict:
        n += _scrub(ids, attrs)
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            try:
                if id(object.__getattribute__(obj, name)) in ids:
                    object.__setattr__(obj, name, None)
                    n += 1
            except (AttributeError, TypeError):
                pass
    return n


def _unreleased() -> list:
    """The destroyed groups something besides `_destroyed` still refers to."""
    return [pg for pg in _destroyed if sys.getrefcount(pg) > 3]  # _destroyed, the loop name, the call's argument


def release_groups() -> int:
    """Drop every reference to a destroyed group that can be found, so each group's destructor joins its gloo
    workers now (see the module docstring). Returns how many references were replaced by None.

    Where the references were found (HF Trainer and DeepSpeed runs, torch 2.13): instance attributes (such as
    `param._dp_group`, `engine.data_parallel_group`), dict values (module globals), list items, closure cells, and
    function defaults
    (`torch.distributed.nn.functional.all_reduce(..., group=group.WORLD)` and DeepSpeed's `TorchBackend.barrier`
    capture the world group when imported after `init_process_group`). A tuple or dict of atomic values is not
    tracked by the garbage collector, so `gc.get_referrers` misses it. Three passes, each only if the one before
    left a reference: the group's direct holders (`gc.get_referrers`), function defaults and `lru_cache`s (keyed
    by a group: cleared), then every tracked object's untracked containers. Only for the end of a program:
    objects that held a group hold None afterwards."""
    if not _destroyed:
        return 0
    import functools
    import gc
    import types

    ids = {id(pg) for pg in _destroyed}
    # A class's own dict is never written to directly (the type attribute cache would keep the old value):
    # a class attribute that holds a group is set with setattr.
    class_of = {id(d): t for t in gc.get_objects() if _is(t, type)
                for d in gc.get_referents(t) if type(d) is dict}
    replaced = 0
    for ref in gc.get_referrers(*_destroyed):
        if ref is _destroyed:
            continue
        if id(ref) in class_of:
            for name in [k for k, v in dict.items(ref) if id(v) in ids]:
                setattr(class_of[id(ref)], name, None)
                replaced += 1
        elif _is(ref, (dict, list)):
            replaced += _scrub(ids, ref)
        elif _is(ref, types.CellType):
            ref.cell_contents = None
            replaced += 1
        elif not _is(ref, (tuple, types.FrameType, types.FunctionType, type)):
            replaced += _scrub_attributes(ids, ref)
    if _unreleased():
        for obj in gc.get_objects():
            if _is(obj, types.FunctionType):
                if obj.__defaults__ and _holds(ids, obj.__defaults__):
                    obj.__defaults__ = _without(ids, obj.__defaults__)
                    replaced += 1
            elif _is(obj, functools._lru_cache_wrapper):
                if any(_holds(ids, k if type(k) is tuple else (k,)) or id(v) in ids
                       for c in gc.get_referents(obj) if _is(c, dict) for k, v in dict.items(c)):
                    obj.cache_clear()
                    replaced += 1
    if _unreleased():
        for obj in gc.get_objects():
            if obj is _destroyed or _is(obj, functools._lru_cache_wrapper):
                continue  # a cache's own dict is not ours to edit (cleared above when it held a group)
            for ref in gc.get_referents(obj):
                if _is(ref, (dict, list)) and not gc.is_tracked(ref) and id(ref) not in class_of:
                    replaced += _scrub(ids, ref)
    _destroyed.clear()  # the last references we know of: each group's destructor runs here
    return replaced


def end_ranks(*, barrier: bool = True) -> None:
    """End a finished run on this rank: barrier (when `barrier`), then `destroy_groups()`. Call on every rank."""
    if not _initialized():
        return
    if barrier:
        import torch.distributed as td

        td.barrier()
    destroy_groups()


def _at_exit() -> None:
    try:
        destroy_groups()
        release_groups()
    except Exception as exc:  # never turn an exit into a traceback; say what was left
        print(f"dstoolkit: destroying the process groups at exit failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)


def install_exit_guard() -> None:
    """Register (once) the atexit handler that destroys the process groups left at interpreter exit."""
    global _installed
    if not _installed:
        atexit.register(_at_exit)
        _installed = True


def install_rank_guards(who: str) -> None:
    """What every rank dstoolkit's code runs in installs first: the exit guard (above) and the torch-extension
    lock guard (`dstoolkit.runtime.jitlock.guard_jit_waits`: a rank waiting for a JIT build says so every few
    seconds; a lock whose builder is gone is removed with a line naming it). `who` prefixes the messages."""
    from dstoolkit.runtime.jitlock import guard_jit_waits

    install_exit_guard()
    guard_jit_waits(who)
