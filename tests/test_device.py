"""fp8dit.device: what each GPU is and supports, and what the dispatcher does with it.

ROCm builds of torch are pretended here (``torch.version.hip`` and the device properties): on
them AMD GPUs are ``"cuda"`` devices whose capability is the gfx number (gfx90a reads (9, 0)
like Hopper), so nothing may take a capability of 9.0 for an sm_90 GPU there.
"""

from types import SimpleNamespace

import pytest
import torch

from fp8dit import attend, device, dispatch, tuning
from fp8dit.recipes import DEFAULT_RECIPE, get_recipe

GPU = torch.device("cuda", 0)


@pytest.fixture
def rocm(monkeypatch):
    """A ROCm torch with one AMD GPU of the architecture set by the returned function; the
    Gluon kernel taken as verified on this Triton release (so only the device keeps it off)."""
    gpu = {"arch": "gfx942"}
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(
        gcnArchName=f"{gpu['arch']}:sramecc+:xnack-", multi_processor_count=304))
    # gfx90a, gfx942, gfx950 all read 9.x: never evidence of an sm_90 GPU on ROCm
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(dispatch, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(device, "_AMD_TARGETS", {})
    monkeypatch.setattr(attend, "_sm_count", lambda index: 304)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("FP8DIT_KERNEL", raising=False)
    monkeypatch.delenv("FP8DIT_BACKEND", raising=False)

    def set_arch(arch):
        gpu["arch"] = arch
        device._AMD_TARGETS.clear()

    here = tuning.VerifiedRelease(dispatch.triton_release(), "(this test)", "", "")
    with tuning.override(gluon_releases=(here,)):
        yield set_arch


def _fake(d=128, dtype=torch.bfloat16):
    return SimpleNamespace(device=GPU, shape=(1, 8, 2, d), dtype=dtype, requires_grad=False)


def _choose(backend, q, n=75600, causal=False):
    return dispatch.choose(backend, q, q, q, is_causal=causal, q_lens=[n], k_lens=[n])


def test_formats_are_the_ocp_one_and_its_half():
    """fnuz's values are e4m3fn's halved: every finite e4m3fn value x has x / 2 in fnuz with the
    same bits when positive, so scaling to 224 and P to 2^7 keeps the OCP path's codes."""
    ocp = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    fnuz = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fnuz).float()
    assert torch.equal(ocp / 2, fnuz)
    fn, fz = device.E4M3FN, device.E4M3FNUZ
    assert (fn.max, fz.max) == (torch.finfo(fn.dtype).max, torch.finfo(fz.dtype).max)
    assert fz.scale_max == fn.scale_max / 2 and fz.p_shift == fn.p_shift - 1
    for fmt in (fn, fz):
        assert 2.0 ** fmt.p_shift <= fmt.scale_max <= fmt.max
        assert fmt.constexprs() == {"FP8_MAX": fmt.scale_max, "FP8_FNUZ": fmt.fnuz}


def test_amd_targets_formats_and_reasons(rocm):
    assert device.is_hip()
    tgt = device.target_of(GPU)
    assert (tgt.arch, tgt.hip, tgt.fp8, tgt.warp_size) == ("gfx942", True, device.E4M3FNUZ, 64)
    assert device.fp8_unsupported_reason(GPU, dispatch._device_capability) is None
    rocm("gfx950")
    assert device.fp8_format(GPU) is device.E4M3FN
    assert device.fp8_unsupported_reason(GPU, dispatch._device_capability) is None
    for arch in ("gfx90a", "gfx1100"):  # MI250 (no fp8 MFMA), an RDNA3 card
        rocm(arch)
        why = device.fp8_unsupported_reason(GPU, dispatch._device_capability)
        assert why and arch in why and "gfx942" in why and "gfx950" in why
        with pytest.raises(ValueError, match=arch):
            device.fp8_format(GPU)


def test_dispatch_on_rocm_runs_fp8_on_gfx942_and_gfx950_only(rocm):
    q = _fake()
    for arch in ("gfx942", "gfx950"):
        rocm(arch)
        assert dispatch.fp8_unsupported_reason(q, q, q) is None
        choice = _choose("auto", q)
        # the Triton kernel, never the Gluon (sm_90) one, whatever the capability reads
        assert choice[:2] == ("fp8", "triton") and f"AMD {arch}" in choice.reason, choice
        # the H200's crossovers, said to be unmeasured on AMD
        short = _choose("auto", q, n=1000)
        assert short.backend == "sdpa" and "not yet measured" in short.reason, short
    for arch in ("gfx90a", "gfx1100"):
        rocm(arch)
        choice = _choose("auto", q)
        assert choice.backend == "sdpa" and arch in choice.reason, choice
        with pytest.raises(dispatch.BackendUnavailableError, match=arch):
            _choose("fp8", q)


def test_nvidia_only_kernels_are_never_chosen_on_rocm(rocm, monkeypatch):
    """A gfx90a reads capability (9, 0): neither the Gluon kernel nor cuDNN FP8 may follow."""
    from fp8dit.tools.cudnn_fp8 import CudnnFp8Attention, CudnnFp8Unavailable

    default = get_recipe(DEFAULT_RECIPE)
    for arch in ("gfx942", "gfx950"):
        rocm(arch)
        kernel, why = dispatch.choose_kernel(128, 75600, False, default, GPU)
        assert kernel == "triton" and "NVIDIA sm_90" in why, why
        monkeypatch.setenv("FP8DIT_KERNEL", "gluon-ws")  # asked for by name, still not on AMD
        kernel, why = dispatch.choose_kernel(128, 75600, False, default, GPU)
        assert kernel == "triton" and "FP8DIT_KERNEL=gluon-ws" in why, why
        monkeypatch.delenv("FP8DIT_KERNEL")
        plan, launch = attend.plan_for([75600], [75600], varlen=False, num_heads=2,
                                       num_kv_heads=2, head_dim=128, is_causal=False,
                                       device=GPU)
        tiles = tuning.current().hip_tiles[arch][128]
        assert launch.kernel == "triton" and launch.tiles == tiles
        assert launch.num_programs == 304 * tiles.programs_per_sm
        assert plan.key.block_m == tiles.block_m
    x = SimpleNamespace(device=GPU, shape=(1, 2, 8, 64))
    with pytest.raises(CudnnFp8Unavailable, match="NVIDIA CUDA GPU"):
        CudnnFp8Attention(x, x, x)


def test_nvidia_targets_keep_their_capability_rule(monkeypatch):
    monkeypatch.setattr(torch.version, "hip", None)
    tgt = device.target_of(GPU)
    assert (tgt.hip, tgt.fp8, tgt.warp_size) == (False, device.E4M3FN, 32)
    assert device.fp8_unsupported_reason(GPU, lambda dev: (9, 0)) is None
    assert device.fp8_unsupported_reason(GPU, lambda dev: (8, 9)) is None
    why = device.fp8_unsupported_reason(GPU, lambda dev: (8, 0))
    assert "8.0 has no FP8 tensor cores (needs 8.9 or newer)" in why
    assert "not supported" in device.fp8_unsupported_reason(torch.device("meta"), None)
    # dispatch reads the capability it caches (and tests pretend)
    monkeypatch.setattr(dispatch, "_capability", lambda index: (8, 0))
    monkeypatch.delenv("FP8DIT_BACKEND", raising=False)
    choice = _choose("auto", _fake())
    assert choice.backend == "sdpa" and "8.0" in choice.reason


def test_interpret_as_is_scoped_and_checked():
    cpu = torch.device("cpu")
    assert device.target_of(cpu) is device.INTERPRETER
    with device.interpret_as("gfx942") as tgt:
        assert device.target_of(cpu) is tgt and tgt.fp8 is device.E4M3FNUZ and tgt.interpreted
        with device.interpret_as("gfx950"):
            assert device.fp8_format(cpu) is device.E4M3FN
        assert device.target_of(cpu) is tgt
    assert device.target_of(cpu) is device.INTERPRETER
    with pytest.raises(ValueError, match="arch: expected one of gfx942, gfx950, got 'gfx90a'"):
        with device.interpret_as("gfx90a"):
            pass
