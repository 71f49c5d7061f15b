"""Two CPU processes on gloo: spawn, wait with a deadline, collect what each rank saved."""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

import pytest
import torch

WORLD = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, fn, port, out_dir, args):
    torch.set_num_threads(1)  # 2 ranks on 2 cores
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD))
    result = fn(rank, port, *args)
    torch.save(result, Path(out_dir) / f"rank{rank}.pt")


def run(fn, *args, timeout_s: float = 240.0) -> list:
    """Run ``fn(rank, port, *args)`` in WORLD spawned processes (torch.multiprocessing) and
    return what each returned (saved with torch.save), rank by rank. ``fn`` sets up its own
    process group (gloo, ``tcp://127.0.0.1:port`` or env://). A rank that raises fails the test
    with its traceback; ranks past ``timeout_s`` are killed and fail it."""
    import torch.multiprocessing as mp

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the CPU ranks run fp8dit's kernels through Triton's interpreter "
                    "(TRITON_INTERPRET=1, set by conftest.py without a GPU)")
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.start_processes(_entry, args=(fn, free_port(), tmp, args), nprocs=WORLD,
                                 join=False, start_method="spawn")
        t0 = time.monotonic()
        try:
            while not ctx.join(timeout=1):
                if time.monotonic() - t0 > timeout_s:
                    pytest.fail(f"the {WORLD} ranks did not finish in {timeout_s:.0f} s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join()
        print(f"\n{WORLD} ranks: {time.monotonic() - t0:.1f} s")
        return [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def check_against_one_process(got, one, ref, what, cos_min, error_ratio_max):
    """A rank's output ``got`` against the one-process call's ``one`` (cosine at least
    ``cos_min``) and both against the fp64 ``ref`` (``got``'s rel-L1 at most
    ``error_ratio_max`` times ``one``'s: a wrong LSE merge moves that ratio far up)."""
    from fp8dit.testing import error_stats

    vs_one, vs_ref, one_vs_ref = error_stats(got, one), error_stats(got, ref), \
        error_stats(one, ref)
    ratio = vs_ref.rel_l1 / max(one_vs_ref.rel_l1, 1e-12)
    print(f"{what}: vs one process {vs_one}; vs fp64 {vs_ref} (x{ratio:.2f} the one-process "
          f"call's rel-L1)")
    assert not vs_one.nan and vs_one.cos >= cos_min, (what, vs_one)
    assert ratio <= error_ratio_max, (what, vs_ref, one_vs_ref)
