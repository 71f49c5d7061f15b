"""fp64 references, error metrics and input families shared by tests, benchmarks and the CLI.

The references compute in float64 on the inputs' device (chunked over query rows so that long
sequences fit), which makes them the ground truth that every recipe is measured against.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from .kernels.attention import P_SHIFT
from .kernels.common import V_GRID_PHI

__all__ = [
    "ErrorStats",
    "attention_ref",
    "attention_varlen_ref",
    "error_stats",
    "attention_emulated",
    "error_stats_per_head",
    "make_qkv",
    "tensor_abs_max",
    "FAMILIES",
]


def _to_hnd(x: torch.Tensor, layout: str) -> torch.Tensor:
    return x.transpose(1, 2) if layout == "NHD" else x


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    layout: str = "NHD",
    scale: float | None = None,
    is_causal: bool = False,
    return_lse: bool = False,
    dtype: torch.dtype = torch.float64,
    chunk: int = 2048,
):
    """Exact attention in ``dtype`` (float64 by default), GQA and top-left causal like SDPA.

    Returns out in ``dtype`` and q's layout; with ``return_lse`` also lse [B, H, Sq] (natural log).
    """
    qh, kh, vh = (_to_hnd(t, layout).to(dtype) for t in (q, k, v))
    B, H, Sq, D = qh.shape
    Hkv, Sk = kh.shape[1], kh.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    group = H // Hkv
    kh = kh.repeat_interleave(group, dim=1)
    vh = vh.repeat_interleave(group, dim=1)
    out = torch.empty(B, H, Sq, vh.shape[-1], dtype=dtype, device=qh.device)
    lse = torch.empty(B, H, Sq, dtype=dtype, device=qh.device)
    for r0 in range(0, Sq, chunk):
        r1 = min(Sq, r0 + chunk)
        s = torch.matmul(qh[:, :, r0:r1], kh.transpose(-1, -2)) * scale
        if is_causal:
            rows = torch.arange(r0, r1, device=s.device)[:, None]
            cols = torch.arange(Sk, device=s.device)[None, :]
            s = s.masked_fill(cols > rows, float("-inf"))
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s - m)
        denom = p.sum(dim=-1, keepdim=True)
        out[:, :, r0:r1] = torch.matmul(p, vh) / denom
        lse[:, :, r0:r1] = (m + torch.log(denom)).squeeze(-1)
    out = out.transpose(1, 2) if layout == "NHD" else out
    return (out, lse) if return_lse else out


def attention_varlen_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    return_lse: bool = False,
    dtype: torch.dtype = torch.float64,
):
    """Reference for packed [T, H, D] inputs; lse is [H, Tq] like flash-attn's varlen API."""
    cq = cu_seqlens_q.tolist()
    ck = cu_seqlens_k.tolist()
    H = q.shape[1]
    out = torch.zeros(q.shape[0], H, v.shape[-1], dtype=dtype, device=q.device)
    lse = torch.full((H, q.shape[0]), float("-inf"), dtype=dtype, device=q.device)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        if q1 == q0 or k1 == k0:
            continue
        o, l_ = attention_ref(
            q[None, q0:q1], k[None, k0:k1], v[None, k0:k1],
            scale=scale, is_causal=is_causal, return_lse=True, dtype=dtype,
        )
        out[q0:q1] = o[0]
        lse[:, q0:q1] = l_[0]
    return (out, lse) if return_lse else out


def attention_ref_rows(q, k, v, rows, *, batch: int = 0, scale: float | None = None):
    """fp64 attention and LSE for chosen query ``rows`` of one batch entry (NHD, MHA), one head at
    a time: the reference at lengths where the full fp64 matrix would not fit (200k tokens).

    Returns (out [len(rows), H, D] float64, lse [H, len(rows)] float64).
    """
    D = q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    outs, lses = [], []
    for h in range(q.shape[2]):
        s = (q[batch, rows, h].double() @ k[batch, :, h].double().T) * scale
        lses.append(torch.logsumexp(s, -1))
        outs.append(torch.softmax(s, -1) @ v[batch, :, h].double())
        del s
    return torch.stack(outs, 1), torch.stack(lses, 0)


def merge_by_lse(parts) -> torch.Tensor:
    """Combine attention outputs over disjoint kv ranges, as ring attention does.

    ``parts``: iterable of (out [B, S, H, D] (NHD), lse [B, H, S], natural log). Each part is
    weighted by exp(lse_i - logsumexp_j lse_j), in float64, one part at a time (running max and
    sum), so only one part is held besides the result. Rows whose parts are all empty (lse
    -inf everywhere) come out 0.
    """
    acc = m = den = None
    for out, lse in parts:
        lse = lse.double().transpose(1, 2).unsqueeze(-1)  # [B, S, H, 1], like out
        out = out.double()
        if acc is None:
            acc, m, den = torch.zeros_like(out), torch.full_like(lse, float("-inf")), \
                torch.zeros_like(lse)
        m_new = torch.maximum(m, lse)
        ref = torch.where(torch.isinf(m_new), 0.0, m_new)
        w_old, w = torch.exp(m - ref), torch.exp(lse - ref)
        acc = acc * w_old + out * w
        den = den * w_old + w
        m = m_new
    return torch.where(den > 0, acc / den.clamp_min(1e-300), 0.0)


def ring_merge(run, q, k, v, chunks: int = 4) -> torch.Tensor:
    """``run(q, k_part, v_part) -> (out, lse)`` over ``chunks`` contiguous kv ranges (NHD), merged
    by :func:`merge_by_lse`: what a ring of ``chunks`` devices computes from these partial calls.
    LSE errors that differ between a row's parts show up here in proportion to how much they
    move its weights; a shift common to all of a row's parts cancels."""
    Sk = k.shape[1]
    bounds = [round(i * Sk / chunks) for i in range(chunks + 1)]
    return merge_by_lse(run(q, k[:, a:b], v[:, a:b]) for a, b in zip(bounds, bounds[1:]) if b > a)


@dataclass(frozen=True)
class ErrorStats:
    """Error of an approximation against a reference (all computed in float64)."""

    cos: float
    rel_l1: float
    rmse: float
    max_abs: float
    nan: bool

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return (
            f"cos={self.cos:.6f} rel_l1={self.rel_l1:.4f} rmse={self.rmse:.3e} "
            f"max_abs={self.max_abs:.3e}{' NaN!' if self.nan else ''}"
        )


def error_stats(approx: torch.Tensor, ref: torch.Tensor) -> ErrorStats:
    """cos similarity, rel-L1 (sum|a-r| / sum|r|), RMSE and max-abs error, flattened."""
    a = approx.detach().to(torch.float64).flatten()
    r = ref.detach().to(torch.float64).flatten().to(a.device)
    nan = bool(torch.isnan(a).any())
    finite = torch.isfinite(r)
    a, r = a[finite], r[finite]
    if a.numel() == 0:
        return ErrorStats(1.0, 0.0, 0.0, 0.0, nan)
    diff = a - r
    denom = r.abs().sum().clamp_min(1e-300)
    cos = torch.nn.functional.cosine_similarity(a, r, dim=0, eps=1e-300)
    return ErrorStats(
        cos=float(cos),
        rel_l1=float(diff.abs().sum() / denom),
        rmse=float(diff.pow(2).mean().sqrt()),
        max_abs=float(diff.abs().max()),
        nan=nan,
    )


def error_stats_per_head(approx: torch.Tensor, ref: torch.Tensor, layout: str = "NHD"):
    """One :class:`ErrorStats` per head (dim 2 for NHD, 1 for HND)."""
    dim = 2 if layout == "NHD" else 1
    return [
        error_stats(approx.select(dim, h), ref.select(dim, h)) for h in range(approx.shape[dim])
    ]


# ---------------------------------------------------------------------------------------------
# Input families
# ---------------------------------------------------------------------------------------------


def _normal(shape_q, shape_kv, gen, device, dtype):
    q = torch.randn(shape_q, generator=gen, device=device, dtype=torch.float32)
    k = torch.randn(shape_kv, generator=gen, device=device, dtype=torch.float32)
    v = torch.randn(shape_kv, generator=gen, device=device, dtype=torch.float32)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _dit_like(shape_q, shape_kv, gen, device, dtype):
    """Activations shaped like DiT self-attention (NHD [B, S, H, D]).

    K carries a large per-channel bias shared by all tokens, a few Q/K channels are outliers,
    scores are sharper than i.i.d. normal ones (peaked attention), and V has a per-channel
    offset. These are the properties that break per-tensor FP8 on video models.
    """
    D = shape_q[-1]
    f32 = dict(generator=gen, device=device, dtype=torch.float32)
    q = torch.randn(shape_q, **f32)
    k = torch.randn(shape_kv, **f32)
    v = torch.randn(shape_kv, **f32)
    n_out = max(1, D // 32)
    pick = torch.Generator().manual_seed(int(gen.initial_seed()))  # randperm draws on the CPU
    idx = torch.randperm(D, generator=pick)[:n_out].to(device)
    q[..., idx] *= 6.0
    k[..., idx] *= 6.0
    k_bias = 4.0 * torch.randn(shape_kv[-2:], **f32)  # per (head, channel), same for all tokens
    k = k + k_bias
    v = v + 2.0 * torch.randn(shape_kv[-2:], **f32)
    q = q * 1.6  # peaked attention: larger scores than i.i.d. normal
    return q.to(dtype), k.to(dtype), v.to(dtype)


FAMILIES = {"normal": _normal, "dit": _dit_like}


def make_qkv(
    B: int,
    H: int,
    S: int,
    D: int,
    *,
    Hkv: int | None = None,
    Sk: int | None = None,
    family: str = "normal",
    layout: str = "NHD",
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    seed: int = 0,
):
    """Fresh q, k, v of an input family, in ``layout`` (``NHD`` [B,S,H,D] or ``HND`` [B,H,S,D])."""
    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {sorted(FAMILIES)}, got {family!r}")
    Hkv = H if Hkv is None else Hkv
    Sk = S if Sk is None else Sk
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    q, k, v = FAMILIES[family]((B, S, H, D), (B, Sk, Hkv, D), gen, device, dtype)
    if layout == "HND":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    return q, k, v


# ---------------------------------------------------------------------------------------------
# Pure-torch emulation of a recipe (the "same-precision" yardstick for the kernels)
# ---------------------------------------------------------------------------------------------


def _fp8_round(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32)


def _int8_round(x: torch.Tensor) -> torch.Tensor:
    # Half away from zero, like the kernels' cast.
    return torch.where(x >= 0, torch.floor(x + 0.5), torch.ceil(x - 0.5)).clamp(-127, 127)


def _v_block_log2_scale(n_tokens: int, block_n: int, device) -> torch.Tensor:
    """Per token: its kv block's log2 V grid factor, as ``kernels.common.v_block_log2_scale``."""
    kb = (torch.arange(n_tokens, device=device) // block_n).to(torch.float32)
    r = kb * V_GRID_PHI.value
    return r - torch.floor(r)


def tensor_abs_max(*tensors) -> tuple[float, ...]:
    """Largest |x| of each tensor (the per-tensor recipe's amax), as the kernels floor it."""
    return tuple(max(float(t.float().abs().amax()), 1e-8) for t in tensors)


def attention_emulated(q, k, v, recipe, *, layout: str = "NHD", scale: float | None = None,
                       is_causal: bool = False, block_n: int = 128,
                       tensor_amax: tuple[float, float, float] | None = None):
    """The recipe's quantization done in torch (fp32 math), attention in float64.

    It rounds Q, K, V and the probabilities the way the kernels do (per-token Q, per-block K
    after smoothing, per-channel V after centering with each kv block's grid stretched, P
    scaled to [0, 256] in fp8; one scale per tensor for ``scales="tensor"``; P and V in bf16
    for ``pv="bf16"``), but uses the exact row
    max instead of the kernel's running max. Kernel error should sit within a small factor of
    this emulation's error: anything more is a bug, not precision.

    ``tensor_amax``: (max|q|, max|k|, max|v|) of the whole tensors when q, k, v are slices of
    them (per-tensor recipes only; default: computed from q, k, v).
    """
    qh, kh, vh = (_to_hnd(t, layout).to(torch.float32) for t in (q, k, v))
    B, H, Sq, D = qh.shape
    Hkv, Sk = kh.shape[1], kh.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    qmax = 127.0 if recipe.qk == "int8" else 448.0
    rnd = _int8_round if recipe.qk == "int8" else _fp8_round
    per_tensor = getattr(recipe, "scales", "fine") == "tensor"
    pv_bf16 = getattr(recipe, "pv", "fp8") == "bf16"
    if per_tensor:
        qa, ka, va = tensor_amax or tensor_abs_max(qh, kh, vh)
    if recipe.smooth_k:
        kh = kh - kh.mean(dim=2, keepdim=True)
    if getattr(recipe, "rotate", False):  # in the kernels' zero-padded head dim
        from .plan import padded_head_dim
        from .quantize import hadamard

        dp = padded_head_dim(D)
        rot = hadamard(dp, "cpu").to(qh.device)
        pad = (0, dp - D)
        qh = torch.nn.functional.pad(qh, pad) @ rot
        kh = torch.nn.functional.pad(kh, pad) @ rot
    if per_tensor:
        qs = torch.tensor(qa / qmax)
    else:
        qs = qh.abs().amax(-1, keepdim=True).clamp_min(1e-8) / qmax
    if getattr(recipe, "qk_terms", 1) == 2:  # hi + lo / 254, lo the rounding residual
        def rnd(x, _one=rnd):
            hi = _one(x)
            return hi + _one((x - hi) * 254.0) / 254.0
    q_dq = rnd(qh / qs) * qs
    if per_tensor:
        ks = torch.tensor(ka / qmax)
        k_dq = rnd(kh / ks) * ks
    else:
        nb = -(-Sk // block_n)
        kpad = torch.nn.functional.pad(kh, (0, 0, 0, nb * block_n - Sk))
        kb = kpad.view(B, Hkv, nb, block_n, kh.shape[-1])
        ks = kb.abs().amax(dim=(-1, -2), keepdim=True).clamp_min(1e-8) / qmax
        k_dq = (rnd(kb / ks) * ks).view(B, Hkv, nb * block_n, kh.shape[-1])[:, :, :Sk]
    v_mean = vh.mean(dim=2, keepdim=True) if recipe.center_v else torch.zeros_like(vh[:, :, :1])
    vc = vh - v_mean
    if pv_bf16:
        v_dq = vc.to(torch.bfloat16).float()
    else:
        if per_tensor:
            vs = torch.tensor(va / 448.0)
        else:
            vs = vc.abs().amax(dim=2, keepdim=True).clamp_min(1e-8) / 448.0
        # Block b's fp8 grid is stretched by 2^g_b (the kernels' v_block_log2_scale).
        tau = torch.exp2(_v_block_log2_scale(Sk, block_n, vh.device))[None, None, :, None]
        v_dq = _fp8_round(vc / (vs * tau)) * vs * tau
    g = H // Hkv
    k_dq = k_dq.repeat_interleave(g, 1).double()
    v_dq = v_dq.repeat_interleave(g, 1).double()
    s = torch.matmul(q_dq.double(), k_dq.transpose(-1, -2)) * scale
    if is_causal:
        rows = torch.arange(Sq, device=s.device)[:, None]
        cols = torch.arange(Sk, device=s.device)[None, :]
        s = s.masked_fill(cols > rows, float("-inf"))
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m) * 2.0 ** P_SHIFT.value
    if pv_bf16:
        p8 = p.float().to(torch.bfloat16).double()
    else:
        p8 = _fp8_round(p.float()).double()
    out = torch.matmul(p8, v_dq) / p.sum(-1, keepdim=True) + v_mean.repeat_interleave(g, 1)
    return out.transpose(1, 2) if layout == "NHD" else out
