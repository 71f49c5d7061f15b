"""NVIDIA GPUs other than Hopper: their tiles (``tuning.nvidia_tiles``) run as accurately as
sm_90's, and ``auto`` runs SDPA on them, saying why (nothing was timed there).

The tiles change the order of the reductions (row maxima and sums per kv block, the PV
accumulation), and sm_89's pointer loads are another code path: each tile set is checked
against fp64, on small shapes. Their tiles are launch parameters (block sizes, warps, stages,
pointer loads instead of descriptors), so any of these GPUs runs any of them: without a GPU on
CPU tensors through the interpreter standing in for the architecture
(``fp8dit.device.interpret_as``), with one (sm_90 in the GPU suite) compiled for that GPU, the
dispatcher reading the architecture's capability (:func:`arch_tiles`). The interpreter is
there only without a GPU (conftest.py sets TRITON_INTERPRET before triton is imported).
"""

import contextlib
import logging
from types import SimpleNamespace

import pytest
import torch
from conftest import DEVICE

import fp8dit
from fp8dit import attend, device, dispatch, tuning
from fp8dit.testing import attention_ref, error_stats, make_qkv

GPU = torch.device("cuda", 0)
ARCHS = device.NVIDIA_CHECKED_ARCHS


@contextlib.contextmanager
def arch_tiles(arch: str):
    """Calls in the block run ``arch``'s tiles: on CPU tensors the interpreter stands in for
    it; on a GPU the dispatcher reads ``arch``'s capability ("sm_89": (8, 9), its tiles and the
    Triton kernel) and Triton compiles for the GPU at hand."""
    if DEVICE == "cpu":
        with device.interpret_as(arch):
            yield
        return
    capability = divmod(int(arch.removeprefix("sm_")), 10)
    assert device.nvidia_arch(capability) == arch
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dispatch, "_capability", lambda index: capability)
        yield


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("d,causal", [(64, False), (128, True), (200, False)])
def test_arch_tiles_match_fp64_like_sm90_tiles(arch, d, causal):
    """Against fp64, within 1.3x the rel-L1 and LSE error of sm_90's tiles on the same inputs
    (lengths not tile multiples: the masked loop runs)."""
    q, k, v = make_qkv(1, 2, 203, d, device=DEVICE, seed=11)
    ref, ref_lse = attention_ref(q, k, v, is_causal=causal, return_lse=True)
    base, base_lse = fp8dit.attention(q, k, v, backend="fp8", is_causal=causal,
                                      return_lse=True)
    with arch_tiles(arch):
        launch = attend.tile_config(attend.padded_head_dim(d), q.device)
        assert launch.tiles == tuning.current().nvidia_tiles[arch][attend.padded_head_dim(d)]
        out, lse = fp8dit.attention(q, k, v, backend="fp8", is_causal=causal, return_lse=True)
    st, st90 = error_stats(out, ref), error_stats(base, ref)
    assert not st.nan and st.cos > 0.999, st
    assert st.rel_l1 <= 1.3 * st90.rel_l1 + 1e-3, (st, st90)
    lse_err = (lse.double() - ref_lse).abs().max()
    assert lse_err <= 1.3 * (base_lse.double() - ref_lse).abs().max() + 1e-3, lse_err


def test_pointer_loads_give_the_descriptors_result():
    """sm_89's pointer loads read the same tiles as the descriptors: the same tiles with either
    load style give bitwise the same output, for the two-term recipe's residuals too."""
    q, k, v = make_qkv(1, 2, 150, 128, device=DEVICE, seed=3)
    for recipe in ("int8qk-fp8pv", "int8x2qk-fp8pv", "int8qk-bf16pv"):
        outs = []
        for ptr in (False, True):
            with arch_tiles("sm_89"), \
                    tuning.override(nvidia_tiles={"sm_89": {128: dict(ptr_loads=ptr)}}):
                outs.append(fp8dit.attention(q, k, v, backend="fp8", recipe=recipe))
        torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


@pytest.fixture
def nvidia_gpu(monkeypatch):
    """An NVIDIA GPU of the capability set through the returned dict (no GPU needed)."""
    cap = {"value": (8, 9)}
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(dispatch, "_capability", lambda index: cap["value"])
    monkeypatch.setattr(attend, "_sm_count", lambda index: 100)
    for name in ("TRITON_INTERPRET", "FP8DIT_KERNEL", "FP8DIT_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    return cap


def _choose(backend, n=75600, d=128):
    q = SimpleNamespace(device=GPU, shape=(1, n, 2, d), dtype=torch.bfloat16,
                        requires_grad=False)
    return dispatch.choose(backend, q, q, q, is_causal=False, q_lens=[n], k_lens=[n])


@pytest.mark.parametrize("cap,arch", [((8, 9), "sm_89"), ((10, 0), "sm_100"),
                                      ((12, 0), "sm_120")])
def test_auto_runs_sdpa_where_nothing_was_timed_and_fp8_runs_the_checked_tiles(
        nvidia_gpu, cap, arch, caplog):
    nvidia_gpu["value"] = cap
    dispatch._logged.clear()
    with caplog.at_level(logging.WARNING, logger="fp8dit"):
        choices = [_choose("auto", n) for n in (4096, 75600)]
    want = (f"FP8 compiled and checked for {arch} but never timed there (timed on sm_90 "
            "(NVIDIA H100, H200, 2026-12-04)); backend='fp8' runs it")
    for c in choices:
        assert c.backend == "sdpa" and c.reason.endswith(f"({'fp8 unavailable: ' + want})")
    # one line, once, whatever the call's length
    assert [r.getMessage() for r in caplog.records] == [
        f"fp8dit: falling back to sdpa: fp8 unavailable: {want}"]
    q = SimpleNamespace(device=GPU, shape=(1, 8, 2, 128))
    assert dispatch.fp8_not_preferred_reason(q, "triton", 10**6) == want
    fp8 = _choose("fp8")
    assert fp8.backend == "fp8" and fp8.kernel == "triton"  # the Gluon kernel is sm_90's only
    for dp in (64, 128, 256):
        launch = attend.tile_config(dp, GPU, "triton")
        assert launch.tiles == tuning.current().nvidia_tiles[arch][dp]


def test_measured_and_unknown_architectures(nvidia_gpu):
    nvidia_gpu["value"] = (9, 0)  # Hopper: the H200's crossovers, as measured
    assert _choose("auto").backend == "fp8"
    assert attend.tile_config(128, GPU, "triton").tiles == tuning.current().tiles[128]
    nvidia_gpu["value"] = (10, 3)  # neither compiled for nor timed: sm_90's tiles if asked
    c = _choose("auto")
    assert c.backend == "sdpa" and "FP8 neither compiled nor timed for sm_103" in c.reason
    assert _choose("fp8").backend == "fp8"
    assert attend.tile_config(128, GPU, "triton").tiles == tuning.current().tiles[128]
    # a measured architecture joins tuning.measured_archs, and auto takes its crossovers
    with tuning.override(measured_archs={"sm_103": tuning.MeasuredArch("B300", "", "")}):
        assert _choose("auto").backend == "fp8"


def test_interpret_as_nvidia_checks_the_name():
    with device.interpret_as("sm_120") as tgt:
        assert not tgt.hip and tgt.fp8 is device.E4M3FN and tgt.warp_size == 32
    with pytest.raises(ValueError, match="expected one of sm_89, sm_100, sm_120, got 'sm_90'"):
        with device.interpret_as("sm_90"):
            pass
