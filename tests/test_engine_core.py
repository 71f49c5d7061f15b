"""The core shared by the serving-engine adapters (fp8dit.integrations.engine_core), no engine
needed: layouts, LSE layouts, scale, the SDPA fallback and its log line, varlen.

On the GPU when there is one (the compiled kernels; FP8 at these short lengths through
``fp8_at_any_length``), else on CPU tensors through the interpreter: CPU tensors on a GPU machine
run SDPA, as TRITON_INTERPRET is set only without a GPU (conftest.py)."""

import logging
import math

import pytest
import torch

from fp8dit.integrations.engine_core import Engine, attend, attend_varlen
from fp8dit.testing import attention_ref, attention_varlen_ref, error_stats

pytestmark = pytest.mark.usefixtures("fp8_at_any_length")


def _qkv(sq=70, sk=70, h=2, d=64, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)  # on the CPU: the same values on either device
    return tuple(torch.randn(1, n, h, d, generator=g).bfloat16().to(device)
                 for n in (sq, sk, sk))


@pytest.mark.parametrize("layout,lse_layout", [("NHD", "BHS"), ("HND", "BHS"), ("NHD", "BSH")])
def test_layouts_scale_and_lse_layouts(layout, lse_layout, device):
    q, k, v = _qkv(device=device)
    scale = 0.1
    ref, ref_lse = attention_ref(q, k, v, scale=scale, return_lse=True)  # NHD, [B, H, S]
    engine = Engine("test")
    args = (q, k, v) if layout == "NHD" else tuple(t.transpose(1, 2) for t in (q, k, v))
    with engine.record_calls() as calls:
        out, lse = attend(engine, *args, layout=layout, scale=scale, return_lse=True,
                          lse_layout=lse_layout)
    assert calls[0]["backend"] == "fp8", calls
    if layout == "HND":
        out = out.transpose(1, 2)
    if lse_layout == "BSH":
        assert lse.shape == (1, 70, 2) and lse.is_contiguous()
        lse = lse.transpose(1, 2)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert error_stats(out, ref).cos > 0.999
    assert (lse.double() - ref_lse).abs().max() < 0.03


@pytest.mark.parametrize("layout,lse_layout", [("NHD", "BHS"), ("HND", "BSH")])
def test_key_padding_mask_runs_fp8_over_the_kept_keys(layout, lse_layout, device):
    """SDPA's boolean [B, 1, 1, Sk] key mask keeping a prefix per sequence: FP8 over the kept
    keys, against fp64 over those keys (lengths 30 and 40 of 40: one sequence unpadded)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, n, 2, 64, generator=g).bfloat16().to(device)
               for n in (50, 40, 40))
    keep = torch.ones(2, 1, 1, 40, dtype=torch.bool, device=device)
    keep[0, ..., 30:] = False
    engine = Engine("test")
    args = (q, k, v) if layout == "NHD" else tuple(t.transpose(1, 2) for t in (q, k, v))
    with engine.record_calls() as calls:
        out, lse = attend(engine, *args, layout=layout, attn_mask=keep, return_lse=True,
                          lse_layout=lse_layout)
    assert [(c["backend"], c["reason"]) for c in calls] == [
        ("fp8", "key-padding mask: FP8 over the kept keys")], calls
    if layout == "HND":
        out = out.transpose(1, 2)
    if lse_layout == "BSH":
        lse = lse.transpose(1, 2)
    for b, n in enumerate((30, 40)):
        ref, ref_lse = attention_ref(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n],
                                     return_lse=True)
        stats = error_stats(out[b:b + 1], ref)
        assert not stats.nan and stats.cos > 0.999, (b, stats)
        assert (lse[b:b + 1].double() - ref_lse).abs().max() < 0.03


def test_key_padding_mask_under_torch_compile(device):
    """Under torch.compile (fullgraph) the masked call goes through fp8dit's custom op: the same
    result as eager, no graph break."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 40, 64, generator=g).bfloat16().to(device)
               for _ in range(3))  # HND
    keep = torch.ones(1, 1, 1, 40, dtype=torch.bool, device=device)
    keep[..., 30:] = False
    engine = Engine("test")

    def call(q, k, v, keep):
        return attend(engine, q, k, v, layout="HND", attn_mask=keep, return_lse=True)

    out, lse = torch.compile(call, fullgraph=True, backend="eager")(q, k, v, keep)
    eager_out, eager_lse = call(q, k, v, keep)
    assert torch.equal(out, eager_out) and torch.equal(lse, eager_lse)


def test_other_masks_and_dropout_fall_back_to_sdpa_logged_once(caplog, device):
    q, k, v = _qkv(sk=40, device=device)
    engine = Engine("test")
    holes = torch.ones(1, 1, 1, 40, dtype=torch.bool, device=device)
    holes[..., 10:20] = False  # no prefix: read from its values, SDPA with the mask
    per_query = torch.ones(1, 1, 70, 40, dtype=torch.bool, device=device)
    per_query[..., 30:] = False  # not key padding by its shape
    additive = torch.zeros(1, 1, 1, 40, device=device)
    additive[..., 30:] = -math.inf
    two_d = torch.ones(70, 40, dtype=torch.bool, device=device)  # SDPA's [Sq, Sk], not [B, Sk]
    two_d[:, 30:] = False
    with caplog.at_level(logging.WARNING, logger="fp8dit"), engine.record_calls() as calls:
        out_holes, lse_holes = attend(engine, q, k, v, attn_mask=holes, return_lse=True)
        outs = [attend(engine, q, k, v, attn_mask=m) for m in (per_query, additive, two_d)]
        attend(engine, q, k, v, attn_mask=per_query)
    kept = torch.cat([torch.arange(10), torch.arange(20, 40)]).to(device)
    ref, ref_lse = attention_ref(q, k[:, kept], v[:, kept], return_lse=True)
    assert [c["backend"] for c in calls] == ["sdpa"] * 5, calls
    assert "not a prefix" in calls[0]["reason"] and "no key-padding mask" in calls[1]["reason"]
    assert "dtype torch.float32" in calls[2]["reason"]
    # bf16 attention against fp64 on these inputs, flash-style (fp32 scores, P rounded to bf16
    # for the PV product, bf16 output) or with the scores rounded to bf16 too: 1 - cos at most
    # 6.7e-6 over 200 seeds (computed on the CPU, 2026-12-06); 1e-4 is 15 times that, so a
    # miss means a mask read wrong (fp8dit.sdpa.sdpa_mask), not precision.
    assert error_stats(out_holes, ref).cos > 0.9999
    assert (lse_holes.double() - ref_lse).abs().max() < 1e-3
    ref30 = attention_ref(q, k[:, :30], v[:, :30])
    for name, o in zip(("per-query", "additive fp32", "2-D"), outs):
        assert error_stats(o, ref30).cos > 0.9999, (name, str(error_stats(o, ref30)))
    # the engine's lines, one per reason: per-query (called twice), float, 2-D. (The holes are
    # found in the mask's values by fp8dit.key_padding, which logs that once per process.)
    lines = [r.getMessage() for r in caplog.records if "test backend" in r.getMessage()]
    assert len(lines) == 3 and all("torch SDPA instead of FP8" in m for m in lines), lines
    with pytest.raises(NotImplementedError, match="dropout"):
        attend(engine, q, k, v, dropout_p=0.1, return_lse=True)
    torch.manual_seed(0)
    assert attend(engine, q, k, v, dropout_p=0.1).shape == q.shape


def test_sdpa_fallback_gets_a_float_mask_in_the_inputs_dtype(device, sdpa_mask_dtypes):
    """An fp32 additive mask with bf16 inputs reaches SDPA in bf16, with and without dropout:
    SDPA's fused CUDA backends read a float mask in the inputs' dtype (cuDNN reads an fp32 one
    as 16-bit halves and masks nothing here; fp8dit.sdpa.sdpa_mask)."""
    q, k, v = _qkv(sk=40, device=device)
    additive = torch.zeros(1, 1, 1, 40, device=device)
    additive[..., 30:] = -math.inf
    engine = Engine("test")
    out, lse = attend(engine, q, k, v, attn_mask=additive, return_lse=True)
    attend(engine, q, k, v, attn_mask=additive, dropout_p=0.1)
    assert sdpa_mask_dtypes == [torch.bfloat16, torch.bfloat16]
    assert additive.dtype == torch.float32  # the caller's mask unchanged
    ref, ref_lse = attention_ref(q, k[:, :30], v[:, :30], return_lse=True)
    assert error_stats(out, ref).cos > 0.9999  # the bound's reason: the test above
    assert (lse.double() - ref_lse).abs().max() < 1e-3


@pytest.mark.parametrize("alignment", ["top-left", "bottom-right"])
def test_causal_with_fewer_queries_follows_the_engines_alignment(alignment, device):
    q, k, v = _qkv(sq=20, sk=50, device=device)
    engine = Engine("test", causal_alignment=alignment)
    with engine.record_calls() as calls:
        out = attend(engine, q, k, v, is_causal=True)
    rows = torch.arange(20, device=device)[:, None] + (30 if alignment == "bottom-right" else 0)
    keep = torch.arange(50, device=device)[None, :] <= rows
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2).double() for t in (q, k, v)), attn_mask=keep).transpose(1, 2)
    # top-left is the kernels' own convention; bottom-right (flash-attn's) runs SDPA
    assert calls[0]["backend"] == ("sdpa" if alignment == "bottom-right" else "fp8"), calls
    assert error_stats(out, ref).cos > 0.999


def test_varlen_lse_and_bad_input(device):
    g = torch.Generator().manual_seed(1)
    lens = [30, 1, 45]
    q, k, v = (torch.randn(sum(lens), 2, 64, generator=g).bfloat16().to(device)
               for _ in range(3))
    cu = torch.tensor([0, 30, 31, 76], dtype=torch.int32, device=device)
    engine = Engine("test")
    with engine.record_calls() as calls:
        out, lse = attend_varlen(engine, q, k, v, cu, cu, 45, 45, return_lse=True)
    assert calls[0]["backend"] == "fp8", calls
    ref, ref_lse = attention_varlen_ref(q, k, v, cu, cu, return_lse=True)
    assert lse.shape == (2, 76)
    assert error_stats(out, ref).cos > 0.999
    assert (lse.double() - ref_lse).abs().max() < 0.03
    with pytest.raises(ValueError, match="lse_layout"):
        attend(engine, *_qkv(device=device), lse_layout="SBH")
    with pytest.raises(TypeError, match="k: expected a torch.Tensor"):
        attend(engine, q[None], None, v[None])
    with pytest.raises(ValueError, match="scale"):
        attend(engine, *_qkv(device=device), scale=-1.0)
    with pytest.raises(ValueError, match="scale"):  # the SDPA fallback checks it as well
        attend(engine, *_qkv(device=device), scale=math.nan,
               attn_mask=torch.ones(1, 1, 1, 70, dtype=torch.bool, device=device))
