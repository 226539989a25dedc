"""DeepSpeed's checkpoint tools talk while they work: ds_to_universal prints its steps and draws tqdm bars on
stderr, zero_to_fp32 prints "Processing zero checkpoint ..." lines on stdout and a "Loading checkpoint shards" bar.
`ckpt reshard` and `ckpt export` print their own two lines; `quiet_tool` keeps DeepSpeed's chatter out of them for
the duration of one call, in-process: its prints (stdout) go nowhere and its tqdm bars are made disabled. Errors stay
visible: they are exceptions (the verbs turn them into one line), and stderr and logging are left as they are, so a
warning still shows.
"""
from __future__ import annotations

import contextlib
import functools
import io
import types
from typing import Iterator


@contextlib.contextmanager
def quiet_tool(module: types.ModuleType) -> Iterator[None]:
    """Run a block calling DeepSpeed tool `module` (deepspeed.checkpoint.ds_to_universal,
    deepspeed.utils.zero_to_fp32) without its prints or its progress bars.

    The module's `tqdm` global (the tqdm module, or the tqdm class imported from it) is swapped for one that makes
    every bar with disable=True, and restored when the block ends; stdout is redirected to a discarded buffer.
    """
    import tqdm as tqdm_module

    silent = functools.partial(tqdm_module.tqdm, disable=True)
    had = getattr(module, "tqdm", None)
    if had is tqdm_module:
        swap: object = types.SimpleNamespace(tqdm=silent)
    elif had is tqdm_module.tqdm:
        swap = silent
    else:
        swap = had  # not tqdm as we know it: left alone
    try:
        if had is not None:
            module.tqdm = swap
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        if had is not None:
            module.tqdm = had
