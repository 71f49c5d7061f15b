"""A Gluon kernel that does nothing but ``gl.warp_specialize``: the control for racecheck.

compute-sanitizer racecheck reports hazards in the warp-specialized attention kernel between a
shared-memory read near the kernel's entry and writes attributed to the kernel's ``def`` and
``gl.warp_specialize`` lines (run s5-1). In the SASS those are Triton's own partition dispatch:
the default warps write each worker warp's partition index (and at the end an exit code) into
shared memory, and the worker warps read theirs after a named barrier. This kernel has the same
dispatch and no shared memory of its own; if racecheck reports the same hazards on it, they
come from the dispatch, not from the attention kernel's buffers or barriers.

    compute-sanitizer --tool racecheck python3 benchmarks/gpu_sanitize.py --ws-control
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier


@gluon.jit
def _default_part(out_ptr):
    offs = gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))
    gl.store(out_ptr + offs, offs + 1)


@gluon.jit
def _worker_part(out_ptr):
    offs = gl.arange(0, 32, layout=gl.BlockedLayout([1], [32], [1], [0]))
    gl.store(out_ptr + 128 + offs, offs + 1)


@gluon.jit
def _worker_group_part(out_ptr):
    offs = gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))
    gl.store(out_ptr + 160 + offs, offs + 1)


@gluon.jit
def _default_waits(out_ptr, bar, n_rounds):
    offs = gl.arange(0, 128, layout=gl.BlockedLayout([1], [32], [4], [0]))
    for i in range(n_rounds):
        mbarrier.wait(bar.index(0), i & 1)
        gl.store(out_ptr + offs, offs + 1 + i)
        mbarrier.arrive(bar.index(1))


@gluon.jit
def _worker_arrives(out_ptr, bar, n_rounds):
    offs = gl.arange(0, 32, layout=gl.BlockedLayout([1], [32], [1], [0]))
    for i in range(n_rounds):
        mbarrier.wait(bar.index(1), (i & 1) ^ 1)
        gl.store(out_ptr + 128 + offs, offs + 1 + i)
        mbarrier.arrive(bar.index(0))


@gluon.jit
def ws_control_mbarrier_kernel(out_ptr, n_rounds):
    """As the attention kernel's partitions talk: through mbarriers, in a loop (ping-pong of
    two barriers between the default warps and one worker warp)."""
    bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bar.index(0), count=1)
    mbarrier.init(bar.index(1), count=1)
    gl.warp_specialize([(_default_waits, (out_ptr, bar, n_rounds)),
                        (_worker_arrives, (out_ptr, bar, n_rounds))], [1], [24])


@gluon.jit
def ws_control_kernel(out_ptr, LIKE_ATTENTION: gl.constexpr):
    if LIKE_ATTENTION:
        # the attention kernel's partitions: a 4-warp worker at 240 registers, a 1-warp one at 24
        gl.warp_specialize([(_default_part, (out_ptr,)), (_worker_group_part, (out_ptr,)),
                            (_worker_part, (out_ptr,))], [4, 1], [240, 24])
    else:
        gl.warp_specialize([(_default_part, (out_ptr,)), (_worker_part, (out_ptr,))], [1], [24])


def run_control_mbarrier(n_rounds: int = 5) -> bool:
    out = torch.zeros(160, dtype=torch.int32, device="cuda")
    ws_control_mbarrier_kernel[(2,)](out, n_rounds, num_warps=4)
    torch.cuda.synchronize()
    want = torch.cat([torch.arange(1, 129), torch.arange(1, 33)]).to(out) + n_rounds - 1
    return bool(torch.equal(out, want))


def run_control(like_attention: bool) -> bool:
    """Launch it once; True when every partition wrote its part."""
    out = torch.zeros(288 if like_attention else 160, dtype=torch.int32, device="cuda")
    ws_control_kernel[(1,)](out, like_attention, num_warps=4)
    torch.cuda.synchronize()
    parts = [torch.arange(1, 129), torch.arange(1, 33)]
    if like_attention:
        parts.append(torch.arange(1, 129))
    return bool(torch.equal(out, torch.cat(parts).to(out)))
