"""The warp-specialized kernel's shipped PTX (``fp8dit.prebuilt``): built from this kernel source by
triton 3.6, specialized as real launches specialize, and built by the releases that take it into
the code that was measured (triton 3.6's PTX assembled by ptxas 12.9), on the CPU.
"""

import hashlib
import itertools
import json
import lzma
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import triton

from fp8dit import attend, prebuilt, tuning
from fp8dit.kernels import attention_sm90_ws as ws

RELEASE = ".".join(triton.__version__.split(".")[:2])
TOOLS = os.path.join(os.path.dirname(__file__), "tools")
# The main kv loop's exponentials as the measured code issues them: at most this many MUFU in a
# row. Built by triton 3.8 the D=128 loop issued each 128-key half's 64 back to back, and ran
# 19% slower (H100, 2026-12-06; docs/triton_releases.md).
MAX_MUFU_RUN = 8
BINDIR = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
# A Triton packed without the ptxas its wheel bundles (slimmed for a machine without a package
# registry) takes the release's own build everywhere; every pip install of 3.6-3.9 has it.
needs_bundled_ptxas = pytest.mark.skipif(
    not os.path.exists(os.path.join(BINDIR, "ptxas")),
    reason="this Triton installation lacks the ptxas its wheel bundles")


def _shipped_configs():
    tuned = tuning.current()
    return ({(dp, False) for dp in tuned.gluon_tiles}
            | {(dp, True) for dp in tuned.gluon_causal_tiles})


def _here():
    return (tuning.VerifiedRelease(RELEASE, "(this test)", "", ""),)


def test_shipped_ptx_is_built_from_this_kernel_source():
    man = prebuilt.manifest()
    assert man["source_sha256"] == prebuilt.source_hash(), (
        "kernels/attention_sm90_ws.py changed since its PTX was built: run "
        "`python tests/tools/sm90_ptx.py write` with triton 3.6")
    assert man["triton"].startswith("3.6.")
    names = {prebuilt.config_name(dp, c) for dp, c in _shipped_configs()}
    assert set(man["configs"]) == names
    for dp, causal in _shipped_configs():
        entry = man["configs"][prebuilt.config_name(dp, causal)]
        assert entry["constexprs"] == prebuilt.config_constexprs(dp, causal)
        text = lzma.decompress((prebuilt.PTX_DIR / entry["file"]).read_bytes())
        assert hashlib.sha256(text).hexdigest() == entry["sha256"]
        # nothing of the machine it was built on
        assert b"/home/" not in text and b"/work/" not in text and b".debug_" not in text


@pytest.mark.skipif(RELEASE != "3.6", reason="the shipped PTX is triton 3.6's build: rebuilt "
                                              "and compared with triton 3.6 only")
def test_shipped_ptx_is_triton_36s_build_of_it():
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, os.path.join(TOOLS, "sm90_ptx.py"), "check"],
                          capture_output=True, text=True, env=environ, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_launch_specializes_as_the_files_were_built():
    """Triton's own specialization rules, on this release, give the sizes of a real launch the
    compile-time treatment the files were built with (Wan2.2 720p's, a GQA head count that is
    a multiple of 16, a batch of 2)."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    def spec(value, name):
        unspecialized = name in ws.PREBUILT_UNSPECIALIZED
        return native_specialize_impl(BaseBackend, value, False, not unspecialized, True)

    for B, H, Hkv, S, D in ((1, 40, 40, 75600, 128), (2, 48, 16, 17776, 64)):
        ints = dict(o_sb=S * H * D, o_st=H * D, o_sh=D, o_sd=1, l_sb=H * S, l_sh=S, l_st=1,
                    D=D, Tq_pad=-(-S // 128) * 128 * B, Tk_pad=-(-S // 256) * 256 * B,
                    n_kblocks=-(-S // 256) * B, group=H // Hkv, Hkv=Hkv)
        for name, value in ints.items():
            got = spec(value, name)
            if name in prebuilt.ONE:
                assert got == ("constexpr", 1), name
            elif name in prebuilt.MULTIPLE_OF_16:
                assert got == ("i32", "D"), name
            else:
                assert got[0] == "i32" and not got[1], (name, got)
    assert spec(torch.zeros(4, dtype=torch.bfloat16), "out_ptr") == ("*bf16", "D")


def _launch_args(dtype=torch.bfloat16, **changes):
    ints = dict(o_sb=75600 * 5120, o_st=5120, o_sh=128, o_sd=1, l_sb=40 * 75600, l_sh=75600,
                l_st=1, D=128, Tq_pad=75648, Tk_pad=75776, n_kblocks=296, group=1, Hkv=40)
    ints.update(changes)
    pointers = {n: torch.zeros(8, dtype=torch.int32 if n in ("seq_ptr", "work_ptr",
                                                                 "work_indptr_ptr")
                               else torch.float32)
                for n in ("q_scale_ptr", "q_lse_corr_ptr", "k_scale_ptr", "v_scale_ptr",
                          "v_mean_ptr", "seq_ptr", "work_ptr", "work_indptr_ptr", "lse_ptr",
                          "part_o_ptr", "part_lse_ptr")}
    pointers["out_ptr"] = torch.zeros(8, dtype=dtype)
    return ints, pointers


@needs_bundled_ptxas
def test_which_launches_the_shipped_ptx_serves(monkeypatch):
    const = prebuilt.config_constexprs(128, False)
    monkeypatch.delenv("FP8DIT_PREBUILT", raising=False)

    def why(dtype=torch.bfloat16, constexprs=None, releases=None, **ints):
        args = _launch_args(dtype, **ints)
        with tuning.override(prebuilt_releases=_here() if releases is None else releases):
            return prebuilt.unfit_reason(128, False, dict(const, **(constexprs or {})), *args)

    assert why() is None
    assert "builds the kernel itself" in why(releases=())
    assert why(o_sd=2) == "o_sd is 2, the shipped PTX takes 1"
    assert why(D=72) == "D is 72, the shipped PTX takes a multiple of 16"
    assert why(o_st=2888) == "o_st is 2888, the shipped PTX takes a multiple of 16"
    assert why(n_kblocks=295, Hkv=24, group=2, l_sh=75601) is None  # not specialized on
    assert why(o_sb=2**31) == "a size past 32 bits"
    assert "out_ptr is torch.float16" in why(dtype=torch.float16)
    assert why(constexprs=dict(STAGES=3)) == "the shipped PTX was built for other tiles"
    ints, pointers = _launch_args()
    pointers["lse_ptr"] = torch.zeros(9)[1:]
    with tuning.override(prebuilt_releases=_here()):
        assert prebuilt.unfit_reason(128, False, const, ints, pointers) == (
            "lse_ptr is not 16-byte aligned")
        assert "no PTX shipped" in prebuilt.unfit_reason(256, False, const, *_launch_args())
        monkeypatch.setattr(prebuilt, "source_hash", lambda: "0" * 64)
        prebuilt._config_unfit.cache_clear()
        assert "another version of the kernel's source" in prebuilt.unfit_reason(
            128, False, const, *_launch_args())
        monkeypatch.setenv("FP8DIT_PREBUILT", "0")
        assert prebuilt.unfit_reason(128, False, const, *_launch_args()) == "FP8DIT_PREBUILT=0"
        monkeypatch.setenv("FP8DIT_PREBUILT", "2")
        with pytest.raises(ValueError, match="FP8DIT_PREBUILT: expected 0 or 1, got '2'"):
            prebuilt.unfit_reason(128, False, const, *_launch_args())
    prebuilt._config_unfit.cache_clear()


def test_ptx_file_is_content_addressed_and_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    prebuilt.ptx_path.cache_clear()
    path = prebuilt.ptx_path(128, False)
    assert path.endswith(".ptx") and path.startswith(str(tmp_path))
    entry = prebuilt.manifest()["configs"]["D128-dense"]
    assert entry["sha256"][:24] in path
    with open(path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == entry["sha256"]
    with open(path, "w") as f:  # a damaged copy is written again
        f.write("damaged")
    prebuilt.ptx_path.cache_clear()
    assert prebuilt.ptx_path(128, False) == path
    with open(path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == entry["sha256"]
    prebuilt.ptx_path.cache_clear()


@needs_bundled_ptxas
def test_the_launch_takes_the_shipped_ptx_where_it_fits(monkeypatch):
    """``attend`` launches the kernel with Triton's ``ir_override`` where the shipped PTX fits
    the launch, and without it where it does not (here: fp16 outputs)."""
    seen = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda **kw: seen.append(kw)

    monkeypatch.setattr(attend, "_import_gluon_ws", lambda: Recorder())
    monkeypatch.setattr(attend, "_sm_count", lambda index: 132)
    monkeypatch.delenv("FP8DIT_PREBUILT", raising=False)
    S, H, D = 3000, 2, 128
    launch = SimpleNamespace(tiles=tuning.current().gluon_tiles[128], kernel="gluon-ws")
    plan = SimpleNamespace(key=SimpleNamespace(num_heads=H, num_kv_heads=H, head_dim=D,
                                               is_causal=False, block_m=attend.GLUON_WS_BLOCK_M,
                                               block_n=256),
                           head_dim_padded=128, q_total_padded=3072, k_total_padded=3072,
                           num_programs=132)
    work = SimpleNamespace(q8=torch.zeros(H, 3072, 128, dtype=torch.int8),
                           k8=torch.zeros(H, 3072, 128, dtype=torch.int8),
                           v8t=torch.zeros(H, 128, 3072, dtype=torch.float8_e4m3fn),
                           q_scale=torch.zeros(H, 3072), q_corr=torch.zeros(H, 3072),
                           k_scale=torch.zeros(H, 12), v_scale=torch.zeros(1, H, 128),
                           v_mean=torch.zeros(1, H, 128), part_o=torch.zeros(1, 64, 128),
                           part_lse=torch.zeros(1, 64))
    tabs = {n: torch.zeros(8, dtype=torch.int32) for n in ("seq", "work", "work_indptr")}
    for dtype in (torch.bfloat16, torch.float16):
        out = torch.zeros(1, S, H, D, dtype=dtype)
        lse = torch.zeros(1, H, S)
        with tuning.override(prebuilt_releases=_here()):
            attend._attention_gluon_ws(plan, launch, work, tabs, out,
                                       attend._bthd_strides(out, "NHD"), lse,
                                       (lse.stride(0), lse.stride(1), lse.stride(2)))
    prebuilt._BUILT.clear()
    assert seen[0]["ir_override"] == prebuilt.ptx_path(128, False)
    assert "ir_override" not in seen[1]
    assert seen[0]["n_kblocks"] == 12 and seen[0]["o_sd"] == 1


def _main_loop(cubin: bytes) -> list[str]:
    sys.path.insert(0, TOOLS)
    from sm90_compile import _disassemble, mma_loops

    loop = mma_loops(_disassemble(cubin))[0]
    return [re.sub(r"^@!?U?P\w+\s+", "", t.strip()) for t in loop]


@needs_bundled_ptxas
@pytest.mark.skipif(RELEASE not in ("3.8", "3.9"),
                    reason=f"triton {RELEASE} builds the kernel itself (the shipped PTX is taken "
                           "on 3.8 and 3.9)")
@pytest.mark.parametrize("dp", [64, 128])
def test_release_builds_the_shipped_ptx_into_the_measured_code(dp, tmp_path, monkeypatch):
    """Built by this release with the shipped PTX, the dense kernel is that PTX assembled by the
    ptxas 12.9 the release bundles (not 3.9's ptxas-blackwell, measured slower), with the
    launch metadata triton 3.6 gave it: the same shared memory and warps."""
    name = prebuilt.config_name(dp, False)
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environ.update(XDG_CACHE_HOME=str(tmp_path), TRITON_CACHE_DIR=str(tmp_path / "triton"))
    proc = subprocess.run([sys.executable, os.path.join(TOOLS, "sm90_ptx.py"), "release", name,
                           str(tmp_path)], capture_output=True, text=True, env=environ,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    entry = prebuilt.manifest()["configs"][name]
    shipped = lzma.decompress((prebuilt.PTX_DIR / entry["file"]).read_bytes()).decode()
    assert (tmp_path / f"{name}.ptx").read_text() == shipped
    assert json.loads((tmp_path / f"{name}.json").read_text()) == entry["metadata"]
    # the same PTX through the bundled ptxas 12.9, by hand
    src = tmp_path / "k.ptx"
    src.write_text(shipped)
    subprocess.run([os.path.join(BINDIR, "ptxas"), "-lineinfo", "--regAllocOptLevel=2",
                    "--gpu-name=sm_90a", str(src), "-o", str(tmp_path / "k.cubin")],
                   check=True, capture_output=True)
    version = subprocess.run([os.path.join(BINDIR, "ptxas"), "--version"],
                             capture_output=True, text=True).stdout
    assert "release 12.9" in version, version
    by_hand = _main_loop((tmp_path / "k.cubin").read_bytes())
    built = _main_loop((tmp_path / f"{name}.cubin").read_bytes())
    assert built == by_hand
    ops = [t.split()[0].split(".")[0] for t in built]
    mufu_runs = [len(list(g)) for op, g in itertools.groupby(ops) if op == "MUFU"]
    assert max(mufu_runs) <= MAX_MUFU_RUN, mufu_runs
    prebuilt.ptx_path.cache_clear()


@needs_bundled_ptxas
def test_without_a_ptxas_12_the_release_builds_the_kernel_itself():
    """A Triton installation without its bundled ptxas 12.x (or one pointed at ptxas 13), where
    3.9 would assemble the shipped PTX with its ptxas-blackwell (measured slower): the launch
    takes the release's own build, and says why."""
    knobs = type(triton.knobs.nvidia)
    const = prebuilt.config_constexprs(128, False)

    def missing(self):
        raise RuntimeError("Cannot find ptxas")

    for tool, expected in ((property(missing), "no ptxas 12.8 or 12.9 to assemble it"),
                           (property(lambda self: SimpleNamespace(path="/x/ptxas",
                                                                  version="13.4")),
                            "its ptxas is 13.4")):
        descriptor = knobs.__dict__["ptxas"]  # Triton's knob, put back below
        try:
            knobs.ptxas = tool
            prebuilt._assemblers.cache_clear()
            prebuilt._config_unfit.cache_clear()
            with tuning.override(prebuilt_releases=_here()):
                why = prebuilt.unfit_reason(128, False, const, *_launch_args())
        finally:
            knobs.ptxas = descriptor
        assert why is not None and why.startswith(expected), why
    prebuilt._assemblers.cache_clear()
    prebuilt._config_unfit.cache_clear()
    with tuning.override(prebuilt_releases=_here()):
        assert prebuilt.unfit_reason(128, False, const, *_launch_args()) is None
