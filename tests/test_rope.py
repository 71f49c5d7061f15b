"""Rotary position embedding fused into the quantization: ``attention(..., rotary=...)``.

The fused rotation must give bitwise what rotating q and k first (diffusers' arithmetic, Wan's
or ``apply_rotary_emb``'s: ``fp8dit.rope.apply_rotary``) and then calling attention gives, on
every path.
"""

import pytest
import torch

import fp8dit
from fp8dit.rope import apply_rotary


def _tables(S, D, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    # Wan's tables repeat each angle for the pair; random angles over several turns
    ang = (torch.rand(S, D // 2, generator=g) * 20.0).repeat_interleave(2, -1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def _qkv(B, S, H, D, device, layout="NHD", Hkv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    Hkv = Hkv or H
    shapes = [(B, S, h, D) if layout == "NHD" else (B, h, S, D) for h in (H, Hkv, Hkv)]
    q, k, v = (torch.randn(s, generator=g).to(torch.bfloat16).to(device) for s in shapes)
    k = k + 3.0 * torch.randn(D, generator=g).to(k)  # a channel bias (smooth K's job)
    return q, k, v


def _equal(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("S,H,Hkv,D,layout", [
    (200, 2, 2, 64, "NHD"),   # more than one kv block and query tile
    (77, 4, 2, 72, "HND"),    # padded head dim, GQA, other layout
])
def test_fused_rotation_is_bitwise_rotate_then_attend(device, table_dtype, S, H, Hkv, D,
                                                      layout):
    q, k, v = _qkv(2, S, H, D, device, layout, Hkv)
    cos, sin = (t.to(device) for t in _tables(S, D, table_dtype))
    qr, kr = apply_rotary(q, cos, sin, layout), apply_rotary(k, cos, sin, layout)
    want = fp8dit.attention(qr, kr, v, layout=layout, backend="fp8", return_lse=True)
    got = fp8dit.attention(q, k, v, layout=layout, backend="fp8", return_lse=True,
                           rotary=(cos, sin))
    _equal(got[0], want[0])
    _equal(got[1], want[1])
    # the rotation did something: without it the result is another one
    plain = fp8dit.attention(q, k, v, layout=layout, backend="fp8")
    assert (plain.float() - got[0].float()).abs().max() > 0.05


@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16])
def test_fused_rotation_with_split_kv_and_non_finite_rows(device, table_dtype):
    S, D = 150, 64
    q, k, v = _qkv(1, S, 2, D, device)
    q[0, 5, 1, 3] = float("nan")  # a bad query row and a bad key block stay flagged as before
    k[0, 140, 0, 10] = float("inf")
    # extreme magnitudes: products that overflow bf16 (head 0, already poisoned by the inf),
    # and products in bf16's subnormal range, which each rounding must keep as torch does
    k[0, 60, 0, :8] = 3.0e38
    q[0, 30, 0] = q[0, 30, 0] * 1e-38
    k[0, 90, 0] = k[0, 90, 0] * 1e-38
    cos, sin = (t.to(device)[None, :, None] for t in _tables(S, D, table_dtype))
    qr, kr = (apply_rotary(t, cos[0, :, 0], sin[0, :, 0]) for t in (q, k))
    want = fp8dit.attention(qr, kr, v, backend="fp8", num_splits=3)
    got = fp8dit.attention(q, k, v, backend="fp8", num_splits=3, rotary=(cos, sin))
    _equal(got, want)
    # the NaN query's row only, in its head (the inf key's block reaches all of head 0)
    assert torch.isnan(got[0, 5, 1]).all() and torch.isfinite(got[0, :5, 1]).all()


@pytest.mark.parametrize("how", ["sdpa", "per-tensor-fp8"])
def test_paths_that_do_not_fuse_rotate_first(device, how):
    S, D = 96, 64
    q, k, v = _qkv(1, S, 2, D, device)
    cos, sin = (t.to(device) for t in _tables(S, D, torch.bfloat16))
    kw = dict(backend="sdpa") if how == "sdpa" else dict(backend="fp8", recipe=how)
    want = fp8dit.attention(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v, **kw)
    _equal(fp8dit.attention(q, k, v, rotary=(cos, sin), **kw), want)


def test_rotation_under_compile_matches_eager(device):
    S, D = 130, 64
    q, k, v = _qkv(1, S, 2, D, device)
    cos, sin = (t.to(device) for t in _tables(S, D, torch.float32))

    def f(q, k, v, cos, sin):
        return fp8dit.attention(q, k, v, backend="fp8", rotary=(cos, sin))

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    _equal(compiled(q, k, v, cos, sin), f(q, k, v, cos, sin))
    assert torch._dynamo.explain(f)(q, k, v, cos, sin).graph_break_count == 0


def test_apply_rotary_is_diffusers_wan_rotation():
    pytest.importorskip("diffusers")
    from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

    # the tables of a tiny Wan latent, cast as a bf16 model casts its buffers, and fp32
    rope = WanRotaryPosEmbed(16, (1, 2, 2), 64)
    cos, sin = rope(torch.zeros(1, 4, 3, 4, 6))
    S = cos.shape[1]
    x = torch.randn(2, S, 3, 16).to(torch.bfloat16)
    for dt in (torch.float32, torch.bfloat16):
        c, s = cos.to(dt), sin.to(dt)
        # diffusers' arithmetic, written out as its Wan processor does it
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        want = torch.empty_like(x)
        want[..., 0::2] = x1 * c[..., 0::2] - x2 * s[..., 1::2]
        want[..., 1::2] = x1 * s[..., 1::2] + x2 * c[..., 0::2]
        _equal(apply_rotary(x, c[0, :, 0], s[0, :, 0]), want)


@pytest.mark.parametrize("rotary,kind,words", [
    ("cos", TypeError, "(cos, sin) pair of tensors or an fp8dit.Rotary, got str"),
    ("pair-of-three", TypeError, "(cos, sin) pair"),
    ("float64", TypeError, "rotary cos: expected float32 or q's dtype"),
    ("short", ValueError, "rotary sin: expected 32 rows of 64 channels"),
    ("mixed", TypeError, "cos and sin of one dtype"),
])
def test_bad_rotary_tables_are_named(rotary, kind, words):
    q = k = v = torch.zeros(1, 32, 2, 64, dtype=torch.bfloat16)
    c = torch.zeros(32, 64)
    arg = {"cos": "cos", "pair-of-three": (c, c, c), "float64": (c.double(), c),
           "short": (c, c[:16]), "mixed": (c, c.bfloat16())}[rotary]
    with pytest.raises(kind, match=words.replace("(", r"\(").replace(")", r"\)")):
        fp8dit.attention(q, k, v, rotary=arg)


def test_rotary_needs_self_attention_and_even_head_dim():
    c = torch.zeros(32, 64)
    q = torch.zeros(1, 32, 2, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 16, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="32 queries and 16 keys"):
        fp8dit.attention(q, k, k, rotary=(c, c))
    q = torch.zeros(1, 32, 2, 63, dtype=torch.bfloat16)
    c = torch.zeros(32, 63)
    with pytest.raises(ValueError, match="even head dim.*got 63"):
        fp8dit.attention(q, q, q, rotary=(c, c))


def _hv_tables(S, D, dtype, seed=2):
    # diffusers builds repeat-interleaved tables; unequal pairs here make the test tell the
    # four columns apart (which one each output reads)
    g = torch.Generator().manual_seed(seed)
    ang = torch.rand(S, D, generator=g) * 20.0
    return ang.cos().to(dtype), ang.sin().to(dtype)


@pytest.mark.parametrize("start,rows", [(0, 150), (23, 177), (0, 200), (40, 100)])
def test_apply_rotary_is_diffusers_apply_rotary_emb(start, rows):
    pytest.importorskip("diffusers")
    from diffusers.models.embeddings import apply_rotary_emb

    S, D = 200, 64
    x = torch.randn(2, S, 3, D).to(torch.bfloat16)
    for dt in (torch.float32, torch.bfloat16):
        cos, sin = _hv_tables(rows, D, dt)
        # HunyuanVideo's (video first) and CogVideoX's (text first) pattern, in general
        want = x.clone()
        want[:, start:start + rows] = apply_rotary_emb(x[:, start:start + rows], (cos, sin),
                                                       sequence_dim=1)
        got = apply_rotary(x, cos, sin, start=start, style="apply_rotary_emb")
        _equal(got, want)
        xh = x.transpose(1, 2).contiguous()  # [B, H, S, D], diffusers' sequence_dim=2
        want = xh.clone()
        want[:, :, start:start + rows] = apply_rotary_emb(xh[:, :, start:start + rows],
                                                          (cos, sin))
        _equal(apply_rotary(xh, cos, sin, "HND", start, "apply_rotary_emb"), want)


@pytest.mark.parametrize("table_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("S,H,Hkv,D,layout,start,rows", [
    (200, 2, 2, 64, "NHD", 0, 150),    # HunyuanVideo: text after the video tokens
    (150, 4, 2, 72, "HND", 26, 124),   # CogVideoX: text first; GQA, padded head dim
    (130, 2, 2, 64, "NHD", 0, 130),    # every token
])
def test_fused_apply_rotary_emb_is_bitwise_rotate_then_attend(device, table_dtype, S, H, Hkv,
                                                              D, layout, start, rows):
    q, k, v = _qkv(2, S, H, D, device, layout, Hkv)
    cos, sin = (t.to(device) for t in _hv_tables(rows, D, table_dtype))
    rot = fp8dit.Rotary(cos, sin, start, "apply_rotary_emb")
    qr, kr = (apply_rotary(t, cos, sin, layout, start, "apply_rotary_emb") for t in (q, k))
    want = fp8dit.attention(qr, kr, v, layout=layout, backend="fp8", return_lse=True)
    got = fp8dit.attention(q, k, v, layout=layout, backend="fp8", return_lse=True, rotary=rot)
    _equal(got[0], want[0])
    _equal(got[1], want[1])
    # the style matters with these tables: Wan's arithmetic gives another result
    wan = fp8dit.attention(q, k, v, layout=layout, backend="fp8",
                           rotary=fp8dit.Rotary(cos, sin, start, "wan")
                           if table_dtype == torch.float32 else None)
    assert (wan.float() - got[0].float()).abs().max() > 0.05


def test_apply_rotary_emb_style_on_paths_that_do_not_fuse(device):
    S, D = 96, 64
    q, k, v = _qkv(1, S, 2, D, device)
    cos, sin = (t.to(device) for t in _hv_tables(80, D, torch.float16))
    rot = fp8dit.Rotary(cos, sin, 16, "apply_rotary_emb")
    qr, kr = (apply_rotary(t, cos, sin, start=16, style="apply_rotary_emb") for t in (q, k))
    for kw in (dict(backend="sdpa"), dict(backend="fp8", recipe="per-tensor-fp8")):
        _equal(fp8dit.attention(q, k, v, rotary=rot, **kw), fp8dit.attention(qr, kr, v, **kw))


def test_partial_rotation_under_compile_matches_eager(device):
    S, D = 130, 64
    q, k, v = _qkv(1, S, 2, D, device)
    cos, sin = (t.to(device) for t in _hv_tables(100, D, torch.float32))

    def f(q, k, v, cos, sin):
        return fp8dit.attention(q, k, v, backend="fp8",
                                rotary=fp8dit.Rotary(cos, sin, 30, "apply_rotary_emb"))

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    _equal(compiled(q, k, v, cos, sin), f(q, k, v, cos, sin))


@pytest.mark.parametrize("rotary,kind,words", [
    ("style", ValueError, "rotary style: expected one of wan, apply_rotary_emb, got 'hv'"),
    ("start", ValueError, r"rotary start: expected an int in \[0, 32\).*got 32"),
    ("bool-start", ValueError, "rotary start: .*got True"),
    ("too-many-rows", ValueError, "rotary cos: expected 1 to 22 rows of 64 channels .* from "
                                  "token 10 of 32, got shape 32x64"),
    ("not-tensors", TypeError, "expected cos and sin tensors, got list and Tensor"),
    ("float64", TypeError, "rotary sin: expected float32, float16 or bfloat16, got "
                           "torch.float64"),
])
def test_bad_rotary_descriptions_are_named(rotary, kind, words):
    q = torch.zeros(1, 32, 2, 64, dtype=torch.bfloat16)
    c = torch.zeros(32, 64)
    R = fp8dit.Rotary
    arg = {"style": R(c, c, 0, "hv"), "start": R(c, c, 32), "bool-start": R(c, c, True),
           "too-many-rows": R(c, c, 10, "apply_rotary_emb"), "not-tensors": R([1], c),
           "float64": R(c, c.double(), 0, "apply_rotary_emb")}[rotary]
    with pytest.raises(kind, match=words):
        fp8dit.attention(q, q, q, rotary=arg)
