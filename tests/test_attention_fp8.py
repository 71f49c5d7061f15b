"""The FP8 path end to end (quantization, persistent attention, merge) against fp64.

On CPU these run the real Triton kernels through the interpreter (conftest sets
TRITON_INTERPRET=1). Bounds: rel-L1 <= 0.07 and cos >= 0.997 on i.i.d. normal inputs (the
machinery's bound), and no more than 1.5x the error of a pure-torch emulation of the recipe.
"""

import math

import pytest
import torch

import fp8dit
from fp8dit import attend
from fp8dit.recipes import RECIPES, get_recipe
from fp8dit.testing import (
    attention_emulated,
    attention_ref,
    attention_varlen_ref,
    error_stats,
    make_qkv,
)

REL_L1_MAX = 0.07
COS_MIN = 0.997
EMULATION_FACTOR = 1.5
LSE_ABS_MAX = 0.05

# (B, Sq, Sk, H, Hkv, D, causal, splits): a covering subset of B {1,2} x S {1,17,113,128,239,
# 1000} x H {1,3,5} x D {64,72,128} x GQA 4:1 x causal x forced splits {1,3}.
CASES = [
    (1, 1, 1, 1, 1, 64, False, None),
    (2, 17, 17, 3, 3, 64, True, None),
    (1, 113, 113, 5, 5, 72, False, 3),
    (2, 128, 128, 1, 1, 128, True, 1),
    (1, 239, 239, 3, 3, 128, False, None),
    (1, 1000, 1000, 1, 1, 64, False, 3),
    (1, 1000, 1000, 4, 1, 72, True, None),
    (2, 239, 113, 4, 1, 128, False, 3),
    (1, 17, 1000, 5, 5, 64, True, None),
    (2, 113, 239, 3, 3, 72, True, 3),
    (1, 128, 17, 1, 1, 128, False, 1),
    (2, 1, 239, 4, 1, 64, False, 3),
]


def _ids(c):
    B, Sq, Sk, H, Hkv, D, causal, splits = c
    return f"B{B}-Sq{Sq}-Sk{Sk}-H{H}:{Hkv}-D{D}-{'causal' if causal else 'full'}-s{splits}"


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_fp8_matches_fp64(case, device):
    B, Sq, Sk, H, Hkv, D, causal, splits = case
    q, k, v = make_qkv(B, H, Sq, D, Hkv=Hkv, Sk=Sk, device=device, seed=Sq * 7 + D)
    out, lse = fp8dit.attention(q, k, v, is_causal=causal, backend="fp8", return_lse=True,
                                num_splits=splits)
    ref, ref_lse = attention_ref(q, k, v, is_causal=causal, return_lse=True)
    st = error_stats(out, ref)
    assert not st.nan
    assert out.shape == q.shape and out.dtype == q.dtype
    assert st.rel_l1 <= REL_L1_MAX and st.cos >= COS_MIN, st
    emu = error_stats(attention_emulated(q, k, v, get_recipe(None), is_causal=causal), ref)
    assert st.rel_l1 <= EMULATION_FACTOR * emu.rel_l1 + 1e-3, (st, emu)
    assert (lse.double() - ref_lse).abs().max() <= LSE_ABS_MAX


def _sm90() -> bool:
    # (a ROCm GPU's capability is its gfx number: gfx90a reads 9.0)
    return (torch.cuda.is_available() and torch.version.hip is None
            and torch.cuda.get_device_capability() == (9, 0))


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_gluon_ws_kernel_matches_fp64(case, monkeypatch):
    """The warp-specialized Gluon kernel, forced, on the same cases: its masked steps (odd
    lengths, causal diagonals, split-KV chunks) against fp64 with the Triton kernel's bounds.
    The interpreter cannot run Gluon: GPU only."""
    if not _sm90():
        pytest.skip("needs an sm_90 GPU")
    monkeypatch.setenv("FP8DIT_KERNEL", "gluon-ws")
    B, Sq, Sk, H, Hkv, D, causal, splits = case
    dev = torch.device("cuda")
    _, launch = attend.plan_for([Sq] * B, [Sk] * B, varlen=False, num_heads=H,
                                num_kv_heads=Hkv, head_dim=D, is_causal=causal, device=dev,
                                num_splits=splits)
    assert launch.kernel == "gluon-ws"
    test_fp8_matches_fp64(case, "cuda")


@pytest.mark.gpu
def test_gluon_ws_kernel_varlen_with_an_empty_sequence(monkeypatch):
    if not _sm90():
        pytest.skip("needs an sm_90 GPU")
    monkeypatch.setenv("FP8DIT_KERNEL", "gluon-ws")
    dev = torch.device("cuda")
    for causal in (False, True):  # test_varlen_mixed_lengths' calls run the kernel asked for
        _, launch = attend.plan_for([113, 0, 300, 1], [200, 50, 239, 17], varlen=True,
                                    num_heads=4, num_kv_heads=2, head_dim=64,
                                    is_causal=causal, device=dev)
        assert launch.kernel == "gluon-ws"
    test_varlen_mixed_lengths("cuda")
    test_varlen_empty_key_sequence_gives_zeros_and_minus_inf("cuda")


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_layouts_agree(layout, device):
    q, k, v = make_qkv(1, 3, 200, 64, layout=layout, device=device, seed=3)
    out = fp8dit.attention(q, k, v, layout=layout, backend="fp8")
    ref = attention_ref(q, k, v, layout=layout)
    assert error_stats(out, ref).rel_l1 <= REL_L1_MAX


def test_non_contiguous_inputs(device):
    # q, k, v as views into a fused qkv projection output (diffusers does this).
    qkv = torch.randn(1, 150, 3, 2, 64, device=device, dtype=torch.bfloat16)
    q, k, v = qkv.unbind(2)
    out = fp8dit.attention(q, k, v, backend="fp8")
    assert error_stats(out, attention_ref(q, k, v)).rel_l1 <= REL_L1_MAX


def test_float16_inputs(device):
    q, k, v = make_qkv(1, 2, 150, 64, dtype=torch.float16, device=device, seed=5)
    out = fp8dit.attention(q, k, v, backend="fp8")
    assert out.dtype == torch.float16
    assert error_stats(out, attention_ref(q, k, v)).rel_l1 <= REL_L1_MAX


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipe_tracks_its_emulation(name, device):
    for family in ("normal", "dit"):
        q, k, v = make_qkv(1, 2, 300, 64, family=family, device=device, seed=11)
        out = fp8dit.attention(q, k, v, backend="fp8", recipe=name)
        ref = attention_ref(q, k, v)
        st = error_stats(out, ref)
        emu = error_stats(attention_emulated(q, k, v, RECIPES[name]), ref)
        assert st.rel_l1 <= EMULATION_FACTOR * emu.rel_l1 + 1e-3, (family, st, emu)


def test_lse_is_of_the_true_scores_despite_k_smoothing(device):
    # Keys with a large common offset: smoothing removes it from the quantized scores, and the
    # LSE must put q . mean(k) back.
    q, k, v = make_qkv(1, 2, 256, 64, device=device, seed=9)
    k = (k.float() + 3.0).to(k.dtype)
    _, lse = fp8dit.attention(q, k, v, backend="fp8", return_lse=True)
    _, ref_lse = attention_ref(q, k, v, return_lse=True)
    assert (lse.double() - ref_lse).abs().max() <= LSE_ABS_MAX


def test_varlen_mixed_lengths(device):
    q_lens, k_lens = [113, 0, 300, 1], [200, 50, 239, 17]
    H, Hkv, D = 4, 2, 64
    gen = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(sum(q_lens), H, D, generator=gen, device=device).bfloat16()
    k = torch.randn(sum(k_lens), Hkv, D, generator=gen, device=device).bfloat16()
    v = torch.randn(sum(k_lens), Hkv, D, generator=gen, device=device).bfloat16()
    cu_q = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(k_lens).cumsum(0)), dtype=torch.int32)
    for causal in (False, True):
        out, lse = fp8dit.attention_varlen(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens),
                                           is_causal=causal, backend="fp8", return_lse=True)
        ref, ref_lse = attention_varlen_ref(q, k, v, cu_q, cu_k, is_causal=causal,
                                            return_lse=True)
        st = error_stats(out, ref)
        assert st.rel_l1 <= REL_L1_MAX and st.cos >= COS_MIN, st
        finite = torch.isfinite(ref_lse)
        assert (lse.double()[finite] - ref_lse[finite]).abs().max() <= LSE_ABS_MAX
        assert torch.equal(torch.isfinite(lse), finite)


def test_varlen_empty_key_sequence_gives_zeros_and_minus_inf(device):
    q = torch.randn(10, 2, 64, device=device).bfloat16()
    k = torch.randn(5, 2, 64, device=device).bfloat16()
    cu_q = torch.tensor([0, 4, 10], dtype=torch.int32)
    cu_k = torch.tensor([0, 0, 5], dtype=torch.int32)
    out, lse = fp8dit.attention_varlen(q, k, k, cu_q, cu_k, 6, 5, backend="fp8",
                                       return_lse=True)
    assert torch.all(out[:4] == 0) and torch.all(lse[:, :4] == -math.inf)
    assert torch.all(torch.isfinite(lse[:, 4:]))


def test_zero_length_returns_without_launch(device):
    q = torch.randn(1, 0, 2, 64, device=device).bfloat16()
    k = torch.randn(1, 5, 2, 64, device=device).bfloat16()
    out, lse = fp8dit.attention(q, k, k, backend="fp8", return_lse=True)
    assert out.shape == q.shape and lse.shape == (1, 2, 0)
    q = torch.randn(1, 5, 2, 64, device=device).bfloat16()
    k = torch.randn(1, 0, 2, 64, device=device).bfloat16()
    out, lse = fp8dit.attention(q, k, k, backend="fp8", return_lse=True)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)


@pytest.mark.parametrize("recipe", [None, "int8qk-fp8pv-rot"])
def test_nan_stays_in_its_row(device, recipe):
    q, k, v = make_qkv(1, 2, 200, 64, device=device, seed=2)
    q[0, 17, 1, 5] = float("nan")
    q[0, 30, 0, 0] = float("inf")
    out = fp8dit.attention(q, k, v, backend="fp8", recipe=recipe)
    bad = ~torch.isfinite(out.float()).all(dim=-1)  # [B, S, H]
    expected = torch.zeros_like(bad)
    expected[0, 17, 1] = True
    expected[0, 30, 0] = True
    assert torch.equal(bad, expected)


@pytest.mark.parametrize("recipe", [None, "int8qk-fp8pv-rot"])
def test_nan_in_keys_stays_in_its_head(device, recipe):
    # The rotation mixes a token's channels, never tokens or heads: the bad block still only
    # reaches its own head.
    q, k, v = make_qkv(1, 2, 200, 64, device=device, seed=4)
    k[0, 50, 1, 3] = float("nan")
    out = fp8dit.attention(q, k, v, backend="fp8", recipe=recipe)
    assert torch.isfinite(out[:, :, 0].float()).all()
    assert not torch.isfinite(out[:, :, 1].float()).any()


def test_extreme_magnitudes_and_degenerate_rows(device):
    q, k, v = make_qkv(1, 2, 200, 64, device=device, seed=8)
    for mag in (6e4, 1e-6):
        qs, ks, vs = (t.float() * mag for t in (q, k, v))
        qs, ks, vs = (t.to(torch.bfloat16) for t in (qs, ks, vs))
        # Scores kept O(1) so the check is of range handling, not of a one-hot softmax.
        scale = 1.0 / (mag * mag * 8.0)
        out = fp8dit.attention(qs, ks, vs, backend="fp8", scale=scale)
        ref = attention_ref(qs, ks, vs, scale=scale)
        st = error_stats(out, ref)
        assert not st.nan and st.cos >= COS_MIN, (mag, st)
    # All keys identical: every score of a row is equal, the output is the mean of V.
    k_same = k[:, :1].expand_as(k).contiguous()
    out = fp8dit.attention(q, k_same, v, backend="fp8")
    ref = attention_ref(q, k_same, v)
    assert error_stats(out, ref).rel_l1 <= REL_L1_MAX
