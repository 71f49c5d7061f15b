"""Hypothesis fuzzing of the FP8 path against fp64 (interpreter on CPU)."""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fp8dit
from fp8dit.testing import attention_ref, attention_varlen_ref, error_stats

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
REL_L1_MAX = 0.07
COS_MIN = 0.997

FUZZ = settings(max_examples=12, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(
    B=st.integers(1, 2),
    Sq=st.integers(1, 400),
    Sk=st.integers(1, 400),
    Hkv=st.integers(1, 3),
    group=st.sampled_from([1, 2, 4]),
    D=st.sampled_from([32, 64, 72, 80, 96, 128, 160]),
    causal=st.booleans(),
    splits=st.sampled_from([None, 1, 2, 3]),
    layout=st.sampled_from(["NHD", "HND"]),
    seed=st.integers(0, 2**16),
)
def test_fuzz_dense(B, Sq, Sk, Hkv, group, D, causal, splits, layout, seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    H = Hkv * group
    shape_q = (B, Sq, H, D) if layout == "NHD" else (B, H, Sq, D)
    shape_k = (B, Sk, Hkv, D) if layout == "NHD" else (B, Hkv, Sk, D)
    q = torch.randn(shape_q, generator=g, device=DEVICE).bfloat16()
    k = torch.randn(shape_k, generator=g, device=DEVICE).bfloat16()
    v = torch.randn(shape_k, generator=g, device=DEVICE).bfloat16()
    out, lse = fp8dit.attention(q, k, v, layout=layout, is_causal=causal, backend="fp8",
                                return_lse=True, num_splits=splits)
    ref, ref_lse = attention_ref(q, k, v, layout=layout, is_causal=causal, return_lse=True)
    s = error_stats(out, ref)
    assert not s.nan and torch.isfinite(out.float()).all()
    assert s.rel_l1 <= REL_L1_MAX and s.cos >= COS_MIN, s
    assert (lse.double() - ref_lse).abs().max() <= 0.05


@FUZZ
@given(
    lens=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), min_size=1, max_size=4),
    H=st.integers(1, 3),
    D=st.sampled_from([64, 72, 128]),
    causal=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fuzz_varlen(lens, H, D, causal, seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q_lens = [a for a, _ in lens]
    k_lens = [b for _, b in lens]
    q = torch.randn(sum(q_lens), H, D, generator=g, device=DEVICE).bfloat16()
    k = torch.randn(sum(k_lens), H, D, generator=g, device=DEVICE).bfloat16()
    v = torch.randn(sum(k_lens), H, D, generator=g, device=DEVICE).bfloat16()
    cu_q = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(k_lens).cumsum(0).tolist(), dtype=torch.int32)
    out, lse = fp8dit.attention_varlen(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens),
                                       is_causal=causal, backend="fp8", return_lse=True)
    ref, ref_lse = attention_varlen_ref(q, k, v, cu_q, cu_k, is_causal=causal, return_lse=True)
    assert torch.isfinite(out.float()).all()
    if ref.numel():
        s = error_stats(out, ref)
        assert s.rel_l1 <= REL_L1_MAX or ref.abs().sum() == 0, s
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    if finite.any():
        assert (lse.double()[finite] - ref_lse[finite]).abs().max() <= 0.05


@FUZZ
@given(
    Sq=st.integers(1, 300),
    Sk=st.integers(1, 300),
    data=st.data(),
    Hkv=st.integers(1, 2),
    group=st.sampled_from([1, 3]),
    D=st.sampled_from([64, 72, 128]),
    splits=st.sampled_from([None, 2]),
    layout=st.sampled_from(["NHD", "HND"]),
    seed=st.integers(0, 2**16),
)
def test_fuzz_dense_key_lengths(Sq, Sk, data, Hkv, group, D, splits, layout, seed):
    """The dense launcher over a prefix of each sequence's keys (key-padding masks,
    ``fp8dit.key_padding``); the dropped keys hold NaN, which must never reach the output."""
    from fp8dit.attend import fp8_attention_fwd
    from fp8dit.recipes import get_recipe

    lens = data.draw(st.lists(st.integers(0, Sk), min_size=1, max_size=3), label="k_lens")
    B, H = len(lens), Hkv * group
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(B, Sq, H, D, generator=g, device=DEVICE).bfloat16()
    k = torch.randn(B, Sk, Hkv, D, generator=g, device=DEVICE).bfloat16()
    v = torch.randn(B, Sk, Hkv, D, generator=g, device=DEVICE).bfloat16()
    kg, vg = k.clone(), v.clone()
    for b, n in enumerate(lens):
        kg[b, n:] = float("nan")
        vg[b, n:] = float("nan")
    args = [t if layout == "NHD" else t.transpose(1, 2) for t in (q, kg, vg)]
    out, lse = fp8_attention_fwd(*args, layout=layout, scale=D ** -0.5, is_causal=False,
                                 recipe=get_recipe(None), num_splits=splits, k_lens=lens)
    if layout == "HND":
        out = out.transpose(1, 2)
    assert torch.isfinite(out.float()).all()
    for b, n in enumerate(lens):
        if n == 0:
            assert out[b].abs().max() == 0 and torch.isneginf(lse[b]).all()
            continue
        ref, ref_lse = attention_ref(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n],
                                     return_lse=True)
        s = error_stats(out[b:b + 1], ref)
        assert s.rel_l1 <= REL_L1_MAX and s.cos >= COS_MIN, (b, n, s)
        assert (lse[b:b + 1].double() - ref_lse).abs().max() <= 0.05


@FUZZ
@given(
    S=st.integers(2, 200),
    data=st.data(),
    D=st.sampled_from([64, 128]),
    shared=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fuzz_per_query_masks(S, data, D, shared, seed):
    """HunyuanVideo 1.5's per-call masks ((valid query) & (valid key), valid tokens first)
    through ``fp8dit.key_padding``: FP8 over the kept keys, zeros for the dropped query rows;
    a mask whose rows keep different keys runs SDPA with it, never a wrong FP8 answer."""
    from fp8dit import key_padding as kp
    from fp8dit.recipes import get_recipe

    lens = data.draw(st.lists(st.integers(1, S), min_size=1, max_size=3), label="valid")
    B, H = len(lens), 2
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q, k, v = (torch.randn(B, S, H, D, generator=g, device=DEVICE).bfloat16() for _ in range(3))
    valid = torch.arange(S, device=DEVICE)[None, :] < torch.tensor(lens, device=DEVICE)[:, None]
    if shared:  # one mask row set for the whole batch
        valid, lens = valid[:1], [lens[0]] * B
    rows = valid[:, None, None, :].repeat(1, 1, S, 1)
    mask = rows & rows.transpose(2, 3)
    broken = data.draw(st.booleans(), label="broken") and lens[0] > 1
    if broken:  # the first valid query keeps one key less: rows differ
        mask[0, 0, 0, lens[0] - 1] = False
    out, lse, reason = kp.key_padding_attention(q, k, v, mask, scale=D ** -0.5,
                                                recipe=get_recipe(None), return_lse=True)
    if broken:
        assert reason is not None and "rows keep different keys" in reason
        return
    assert reason is None and torch.isfinite(out.float()).all()
    for b, n in enumerate(lens):
        ref, ref_lse = attention_ref(q[b:b + 1, :n], k[b:b + 1, :n], v[b:b + 1, :n],
                                     return_lse=True)
        s = error_stats(out[b:b + 1, :n], ref)
        assert s.rel_l1 <= REL_L1_MAX and s.cos >= COS_MIN, (b, n, s)
        assert (lse[b:b + 1, :, :n].double() - ref_lse).abs().max() <= 0.05
        assert torch.all(out[b, n:] == 0) and torch.isneginf(lse[b, :, n:]).all()


@pytest.mark.parametrize("D", [256, 200])
def test_large_head_dims(D):
    g = torch.Generator(device=DEVICE).manual_seed(D)
    q, k, v = (torch.randn(1, 150, 2, D, generator=g, device=DEVICE).bfloat16() for _ in range(3))
    out = fp8dit.attention(q, k, v, backend="fp8")
    s = error_stats(out, attention_ref(q, k, v))
    assert s.rel_l1 <= REL_L1_MAX and s.cos >= COS_MIN, s
