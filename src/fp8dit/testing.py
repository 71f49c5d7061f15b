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
    "StressCase",
    "STRESS_SUITE",
    "STRESS_CASES",
    "STRESS_BOUNDS",
    "make_stress_qkv",
    "stress_metrics",
    "stress_violations",
    "stress_badness",
    "emulated_runner",
    "ring_merge",
    "PVFormat",
    "PV_FORMATS",
    "PV_TODAY",
    "attention_blockwise_emulated",
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


def _emulated_qk(qh, kh, recipe, *, scale: float, block_n: int, qk_amax=None,
                 exact_qk: bool = False):
    """Q and K of ``recipe`` rounded as the kernels round them (fp32 HND [B, H, S, D] in),
    dequantized: (q_dq [B, H, Sq, Dp], k_dq [B, Hkv, Sk, Dp], row_shift [B, H, Sq, 1] float64,
    the K-smoothing shift ``scale * q . mean(K)`` that the LSE gets back). K smoothed, Q and K
    rotated (and balanced) as the recipe says, in the kernels' padded head dim when rotating;
    K's scale per ``block_n`` keys. ``qk_amax``: (max|q|, max|k|) for per-tensor scales (the
    recipe's ``scales="tensor"``); ``exact_qk``: no rounding."""
    B, H, Sq, D = qh.shape
    Hkv, Sk = kh.shape[1], kh.shape[2]
    qmax = 127.0 if recipe.qk == "int8" else 448.0
    rnd = _int8_round if recipe.qk == "int8" else _fp8_round
    per_tensor = qk_amax is not None
    if per_tensor:
        qa, ka = qk_amax
    k_raw = kh
    k_shift = torch.zeros_like(kh[:, :, :1])
    if recipe.smooth_k:
        k_shift = kh.mean(dim=2, keepdim=True)
        kh = kh - k_shift
    row_shift = (qh.double() @ k_shift.double().repeat_interleave(H // Hkv, 1).transpose(-1, -2)
                 * scale)  # [B, H, Sq, 1]
    if getattr(recipe, "rotate", False):  # in the kernels' zero-padded head dim
        from .plan import padded_head_dim
        from .quantize import hadamard

        dp = padded_head_dim(D)
        rot = hadamard(dp, "cpu").to(qh.device)
        pad = (0, dp - D)
        qh = torch.nn.functional.pad(qh, pad)
        kh = torch.nn.functional.pad(kh, pad)
        if getattr(recipe, "balance", False):
            from .balance import balance_matrices

            g = H // Hkv
            qg = qh.reshape(B, Hkv, g * Sq, dp)  # a kv head's query heads together
            kr = torch.nn.functional.pad(k_raw, pad)
            # counts on the sums' device (balance_matrices divides one by the other)
            q_count = torch.full((B, Hkv), g * Sq, device=qh.device)
            k_count = torch.full((B, Hkv), Sk, device=qh.device)
            mq, mk = balance_matrices(qg.sum(2), qg.pow(2).sum(2), q_count,
                                      kr.sum(2), kr.pow(2).sum(2), k_count, rot)
            qh = qh @ mq.repeat_interleave(g, 1)
            kh = kh @ mk
        else:
            qh = qh @ rot
            kh = kh @ rot
    if per_tensor:
        qs = torch.tensor(qa / qmax)
    else:
        qs = qh.abs().amax(-1, keepdim=True).clamp_min(1e-8) / qmax
    if getattr(recipe, "qk_terms", 1) == 2:  # hi + lo / 254, lo the rounding residual
        def rnd(x, _one=rnd):
            hi = _one(x)
            return hi + _one((x - hi) * 254.0) / 254.0
    if exact_qk:
        def rnd(x):
            return x
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
    return q_dq, k_dq, row_shift


def attention_emulated(q, k, v, recipe, *, layout: str = "NHD", scale: float | None = None,
                       is_causal: bool = False, block_n: int = 128,
                       tensor_amax: tuple[float, float, float] | None = None,
                       return_lse: bool = False, exact_qk: bool = False):
    """The recipe's quantization done in torch (fp32 math), attention in float64.

    It rounds Q, K, V and the probabilities the way the kernels do (per-token Q, per-block K
    after smoothing, per-channel V after centering with each kv block's grid stretched, P
    scaled to [0, 256] in fp8; one scale per tensor for ``scales="tensor"``; P and V in bf16
    for ``pv="bf16"``), but uses the exact row
    max instead of the kernel's running max. Kernel error should sit within a small factor of
    this emulation's error: anything more is a bug, not precision.

    ``tensor_amax``: (max|q|, max|k|, max|v|) of the whole tensors when q, k, v are slices of
    them (per-tensor recipes only; default: computed from q, k, v).

    ``return_lse``: also the log-sum-exp [B, H, Sq] (natural log, float64) of the rounded
    scores, plus the K-smoothing shift ``scale * q . mean(K)`` in full precision, as the kernels
    add it (their fp32 sum of the unrounded q).

    ``exact_qk``: Q and K kept unrounded (after the recipe's smoothing and rotation), only P and V
    rounded: the floor that the recipe's P and V rounding alone leave, whatever Q and K do.
    """
    qh, kh, vh = (_to_hnd(t, layout).to(torch.float32) for t in (q, k, v))
    B, H, Sq, D = qh.shape
    Hkv, Sk = kh.shape[1], kh.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    per_tensor = getattr(recipe, "scales", "fine") == "tensor"
    pv_bf16 = getattr(recipe, "pv", "fp8") == "bf16"
    if per_tensor:
        qa, ka, va = tensor_amax or tensor_abs_max(qh, kh, vh)
    q_dq, k_dq, row_shift = _emulated_qk(qh, kh, recipe, scale=scale, block_n=block_n,
                                         qk_amax=(qa, ka) if per_tensor else None,
                                         exact_qk=exact_qk)
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
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m) * 2.0 ** P_SHIFT.value
    if pv_bf16:
        p8 = p.float().to(torch.bfloat16).double()
    else:
        p8 = _fp8_round(p.float()).double()
    den = p.sum(-1, keepdim=True)
    out = torch.matmul(p8, v_dq) / den + v_mean.repeat_interleave(g, 1)
    out = out.transpose(1, 2) if layout == "NHD" else out
    if not return_lse:
        return out
    lse = m + torch.log(den) - P_SHIFT.value * math.log(2.0) + row_shift
    return out, lse.squeeze(-1)


# ---------------------------------------------------------------------------------------------
# P·V formats: the kernels' blockwise online softmax with other roundings of P and V
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PVFormat:
    """How an attention kernel rounds P and V for its P·V dot, as
    :func:`attention_blockwise_emulated` emulates it (docs/accuracy.md, "P·V formats, in
    emulation").

    ``p``: ``"fp8"``, e4m3 of 256 * P, P against the row's running max (today's kernels);
    ``"u8"``, round(255 * P) to nearest even as an unsigned 8-bit integer, P against
    ``p_ref``; ``"u8x2"``, that and its rounding residual as a second 8-bit term (hi + lo / 255:
    two P·V dots); ``"s7"``, round(127 * P) in [0, 127], what an int8 x int8 dot takes as it is
    (Triton's dot has no unsigned 8-bit operand; u8 P goes there as round(255 * P) - 128 with
    the block's V sums preset in the accumulator); ``"exact"``.

    ``p_ref`` (integer P): ``"running"``, the row's running max; ``"block"``, the row's max over
    this kv block, so every block spends all 255 steps on its own keys (its weight
    2^(block max - running max) is one more per-row factor on the accumulator's rescale).

    ``v``: ``"fp8"``, e4m3 per channel after centering, the grid stretched per kv block
    (today's); ``"int8"``, round(v / s) after centering (half away from zero, as the kernels'
    cast), s from ``v_scale``; ``"exact"``. ``v_scale`` (int8): ``"channel"``, the channel's
    amax / 127; ``"channel-block"``, per channel and kv block (a per-column factor on every
    block's P·V); ``"block"``, one per kv block (a per-block scalar, free in the rescale; for
    rotated V, whose channels are alike).

    ``v_rotate``: ``"rms"``, centered V's channels scaled to a unit RMS over the tokens, then
    rotated by a Hadamard matrix along the head dim, before rounding (the output is rotated back
    and rescaled once per row): a spike or a massive token spreads over channels of one size
    instead of setting one channel's step; ``"plain"``, rotated without the scaling (an outlier
    channel then spreads into every channel); ``"none"``.

    ``row_sum``: the softmax denominator from ``"exact"`` P (fp32 adds of the unrounded P, the
    Triton kernel), ``"f16"`` (P in [0, 255] rounded to fp16: a row-sum dot of an f16 copy of P
    with ones) or ``"rounded"`` (the very P of the P·V dot: the warp-specialized kernel's
    row-sum dot). The LSE uses the same sum.
    """

    name: str
    p: str = "fp8"
    p_ref: str = "running"
    v: str = "fp8"
    v_scale: str = "channel"
    v_rotate: str = "none"
    row_sum: str = "exact"

    def __post_init__(self):
        ok = (self.p in ("fp8", "u8", "u8x2", "s7", "exact")
              and self.p_ref in ("running", "block")
              and self.v in ("fp8", "int8", "exact")
              and self.v_scale in ("channel", "channel-block", "block")
              and self.v_rotate in ("none", "rms", "plain")
              and self.row_sum in ("exact", "f16", "rounded"))
        if not ok:
            raise ValueError(f"P·V format {self.name!r}: unknown p/p_ref/v/v_scale/v_rotate/"
                             f"row_sum in {self}")
        if self.p == "fp8" and self.p_ref != "running":
            raise ValueError(f"P·V format {self.name!r}: fp8 P is taken against the running max")
        if self.v != "int8" and self.v_scale != "channel":
            raise ValueError(f"P·V format {self.name!r}: v_scale is for int8 V")


PV_FORMATS: dict[str, PVFormat] = {
    f.name: f
    for f in (
        PVFormat("fp8", p="fp8", v="fp8"),
        PVFormat("fp8-rowsum-dot", p="fp8", v="fp8", row_sum="rounded"),
        # each operand's share of today's error: the other one left exact
        PVFormat("fp8-p-only", p="fp8", v="exact"),
        PVFormat("fp8-v-only", p="exact", v="fp8"),
        PVFormat("u8-running-rowsum-dot", p="u8", p_ref="running", v="int8", row_sum="rounded"),
        PVFormat("u8-running", p="u8", p_ref="running", v="int8"),
        PVFormat("u8-block", p="u8", p_ref="block", v="int8"),
        PVFormat("u8-block-rowsum-dot", p="u8", p_ref="block", v="int8", row_sum="rounded"),
        PVFormat("u8x2-block", p="u8x2", p_ref="block", v="int8"),
        PVFormat("u8-block-vblock", p="u8", p_ref="block", v="int8", v_scale="channel-block"),
        PVFormat("u8-block-vrot-plain", p="u8", p_ref="block", v="int8", v_rotate="plain"),
        PVFormat("u8-block-vrot", p="u8", p_ref="block", v="int8", v_rotate="rms"),
        PVFormat("u8-block-vrot-b", p="u8", p_ref="block", v="int8", v_rotate="rms",
                 v_scale="block"),
        PVFormat("u8-block-vrot-b-f16sum", p="u8", p_ref="block", v="int8", v_rotate="rms",
                 v_scale="block", row_sum="f16"),
        PVFormat("u8-block-vrot-b-rowsum-dot", p="u8", p_ref="block", v="int8", v_rotate="rms",
                 v_scale="block", row_sum="rounded"),
        PVFormat("s7-block-vrot-b-f16sum", p="s7", p_ref="block", v="int8", v_rotate="rms",
                 v_scale="block", row_sum="f16"),
    )
}
PV_TODAY = PV_FORMATS["fp8"]


def _pv_round_v(vc: torch.Tensor, fmt: PVFormat, block_n: int):
    """Centered V [Hkv, Sk, D] fp32 of one batch entry, rounded as ``fmt`` says: (dequantized
    float64 [Hkv, Sk, Dv], back [Hkv, Dv, D] float64 or None). Rotated (``v_rotate``), the
    values are in the rotated frame (Dv: the kernels' padded head dim) and ``out @ back``
    returns to V's."""
    Hkv, Sk, D = vc.shape
    back = None
    if fmt.v_rotate != "none":
        from .plan import padded_head_dim
        from .quantize import hadamard

        dp = padded_head_dim(D)
        rms = vc.pow(2).mean(1, keepdim=True).sqrt().clamp_min(1e-8)  # [Hkv, 1, D]
        if fmt.v_rotate == "plain":
            rms = torch.ones_like(rms)
        rot = hadamard(dp, "cpu").to(vc.device)
        vc = torch.nn.functional.pad(vc / rms, (0, dp - D)) @ rot
        back = rot.T.double()[:, :D] * rms.double()  # [Hkv, dp, D]
    if fmt.v == "exact":
        return vc.double(), back
    nb = -(-Sk // block_n)
    vb = torch.nn.functional.pad(vc, (0, 0, 0, nb * block_n - Sk)).view(Hkv, nb, block_n, -1)
    if fmt.v == "fp8":  # per channel, block b's grid stretched by 2^g_b (attention_emulated)
        vs = vc.abs().amax(1, keepdim=True).clamp_min(1e-8)[:, None] / 448.0
        tau = torch.exp2(_v_block_log2_scale(nb * block_n, block_n, vc.device))
        vs = vs * tau.view(1, nb, block_n, 1)
        vq = _fp8_round(vb / vs) * vs
    else:
        if fmt.v_scale == "channel":
            vs = vc.abs().amax(1, keepdim=True)[:, None]  # [Hkv, 1, 1, Dv]
        elif fmt.v_scale == "channel-block":
            vs = vb.abs().amax(2, keepdim=True)  # [Hkv, nb, 1, Dv]
        else:
            vs = vb.abs().amax((2, 3), keepdim=True)  # [Hkv, nb, 1, 1]
        vs = vs.clamp_min(1e-8) / 127.0
        vq = _int8_round(vb / vs) * vs
    return vq.reshape(Hkv, nb * block_n, -1)[:, :Sk].double(), back


def _pv_rows(s: torch.Tensor, vq: torch.Tensor, fmt: PVFormat, block_n: int):
    """One chunk of rows: scores s [R, Sk] float64 (natural log), rounded V [Sk, Dv] ->
    (numerator [R, Dv], denominator [R], row max [R]), both in the row max's frame."""
    R, Sk = s.shape
    nb = -(-Sk // block_n)
    sb = torch.nn.functional.pad(s, (0, nb * block_n - Sk), value=float("-inf"))
    sb = sb.view(R, nb, block_n)
    bmax = sb.amax(-1)  # [R, nb]: the row's max over each kv block
    m_run = torch.cummax(bmax, dim=-1).values  # the kernel's running max after each block
    m = m_run[:, -1:]
    ref = bmax if fmt.p_ref == "block" else m_run
    rel = torch.exp(sb - ref[..., None])  # P against its reference, in [0, 1]
    if fmt.p == "fp8":
        pq, unit = _fp8_round((rel * 2.0 ** P_SHIFT.value).float()).double(), 2.0 ** -P_SHIFT.value
    elif fmt.p == "exact":
        pq, unit = rel, 1.0
    else:
        top = 127.0 if fmt.p == "s7" else 255.0
        pq, unit = torch.round(rel * top), 1.0 / top
        if fmt.p == "u8x2":
            pq = pq + torch.round((rel * 255.0 - pq) * 255.0) / 255.0
    frame = torch.exp(ref - m)[..., None]  # [R, nb, 1]: each block's weight in the max's frame
    w = (pq * (frame * unit)).view(R, -1)[:, :Sk]
    if fmt.row_sum == "rounded":
        den = w.sum(-1)
    else:  # f16: the copy of P in [0, 255] that the row-sum dot reads
        r = (rel * 255.0).float().to(torch.float16).double() / 255.0 if fmt.row_sum == "f16" \
            else rel
        den = (r * frame).view(R, -1)[:, :Sk].sum(-1)
    return w @ vq, den, m[:, 0]


def attention_blockwise_emulated(q, k, v, recipe, pv: PVFormat = PV_TODAY, *,
                                 layout: str = "NHD", scale: float | None = None,
                                 block_n: int = 256, exact_qk: bool = False, chunk: int = 1024,
                                 rows: torch.Tensor | None = None):
    """Attention as the kernels compute it block by block, with P and V rounded per ``pv``
    (a :class:`PVFormat`); Q and K rounded as ``recipe`` says (``exact_qk``: not rounded), as
    :func:`attention_emulated` does. Returns (out in q's layout, lse [B, H, Sq]), float64.

    Per query row the keys go in kv blocks of ``block_n`` (the warp-specialized kernel's 256:
    two 128-key halves under one max, one K scale and one V grid factor per block); each block's
    P is rounded after exp against the running max (or the block's max, ``pv.p_ref``) as the
    kernel has it at that block, and weighed into the running sums; the sums themselves are
    exact (float64: the kernels' fp32 accumulation of the block sums adds far less). With
    ``pv=PV_TODAY`` this is today's recipe with the kernels' running max instead of
    attention_emulated's final one: the same error to within a few percent. Non-causal only.
    ``rows``: only these query rows (Q and K still quantized from all tokens), for long
    sequences; out and lse then hold those rows.
    """
    qh, kh, vh = (_to_hnd(t, layout).to(torch.float32) for t in (q, k, v))
    B, H, Sq, D = qh.shape
    Hkv = kh.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    q_dq, k_dq, row_shift = _emulated_qk(qh, kh, recipe, scale=scale, block_n=block_n,
                                         exact_qk=exact_qk)
    v_mean = vh.mean(dim=2, keepdim=True) if recipe.center_v else torch.zeros_like(vh[:, :, :1])
    if rows is not None:
        q_dq, row_shift = q_dq[:, :, rows], row_shift[:, :, rows]
        Sq = q_dq.shape[2]
    out = torch.empty(B, H, Sq, D, dtype=torch.float64, device=qh.device)
    lse = torch.empty(B, H, Sq, dtype=torch.float64, device=qh.device)
    for b in range(B):
        vq, back = _pv_round_v(vh[b] - v_mean[b], pv, block_n)
        for h in range(H):
            hk = h // (H // Hkv)
            kd = k_dq[b, hk].double()
            for r0 in range(0, Sq, chunk):
                r1 = min(Sq, r0 + chunk)
                s = (q_dq[b, h, r0:r1].double() @ kd.T) * scale
                num, den, m = _pv_rows(s, vq[hk], pv, block_n)
                o = num / den[:, None]
                out[b, h, r0:r1] = (o @ back[hk] if back is not None else o) + v_mean[b, hk]
                lse[b, h, r0:r1] = m + torch.log(den) + row_shift[b, h, r0:r1, 0]
    return (out.transpose(1, 2) if layout == "NHD" else out), lse


# ---------------------------------------------------------------------------------------------
# Stress suite: parameterized input families that break 8-bit attention recipes
# ---------------------------------------------------------------------------------------------
#
# Every case draws i.i.d. N(0, 1) q, k, v and adds one structure seen in DiT activations (or in
# a published error benchmark). Structures that change the size of q or k (outlier channels,
# channel biases) are followed by a per-head rescale of q and of k that brings their spread over
# tokens (the variance per channel, averaged over channels) back to 1, as the QK-norm of the
# models in docs/accuracy.md keeps their size fixed; a bias then stands "n times the spread"
# above it, and the score scale (how peaked the softmax is) follows from the structure: channel
# outliers shared by q and k align and sharpen it, a Q bias adds a per-key term. Cases that fix
# a scale themselves (``fa3``, ``normal``, ``flat``, ``peaked``, ``kbias-x20``, ``sinks``,
# ``massive-kv-x8``) are left as drawn.


def _unit_ms(x: torch.Tensor) -> torch.Tensor:
    """x [B, S, H, D] scaled per (batch, head) to a unit spread: the variance over tokens,
    averaged over channels, is 1 (a bias shared by all tokens stays out of it)."""
    return x / x.var(dim=1, keepdim=True).mean(dim=3, keepdim=True).sqrt().clamp_min(1e-12)


def _per_kv_head(draw, Hkv: int, group: int) -> torch.Tensor:
    """One draw per kv head, repeated for its ``group`` query heads: [Hkv * group, ...]."""
    return torch.stack([draw() for _ in range(Hkv)]).repeat_interleave(group, 0)


def _channel_mask(n: int, D: int, Hkv: int, group: int, gen, offset: int = 0) -> torch.Tensor:
    """[H, D] 0/1 mask of ``n`` channels per kv head (query heads share their kv head's), drawn
    at random; ``offset`` skips that many of the draw (disjoint sets from one draw)."""
    def draw():
        m = torch.zeros(D)
        m[torch.randperm(D, generator=gen)[offset:offset + n]] = 1.0
        return m
    return _per_kv_head(draw, Hkv, group)


def _rope_1d(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """x [B, S, H, D] rotated pairwise by position (1-D rotary, channels (2i, 2i+1))."""
    S, D = x.shape[1], x.shape[3]
    freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.arange(S, dtype=torch.float64)[:, None] * freq[None, :]
    cos, sin = ang.cos().float()[None, :, None, :], ang.sin().float()[None, :, None, :]
    xe, xo = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = xe * cos - xo * sin
    out[..., 1::2] = xe * sin + xo * cos
    return out


@dataclass(frozen=True)
class StressCase:
    """One input family of the stress suite.

    ``draw(gen, B, S, H, Hkv, D)`` returns fp32 q [B, S, H, D] and k, v [B, S, Hkv, D] (NHD,
    on the CPU: the draws do not depend on the device). ``D`` and ``group`` (query heads per kv
    head) override the suite's shape for the cases that test them.
    """

    name: str
    kind: str
    description: str
    draw: object
    D: int | None = None
    group: int | None = None


def _draw_normal(gamma: float = 1.0):
    def draw(gen, B, S, H, Hkv, D):
        q = torch.randn(B, S, H, D, generator=gen)
        k = torch.randn(B, S, Hkv, D, generator=gen)
        v = torch.randn(B, S, Hkv, D, generator=gen)
        return q * gamma, k, v
    return draw


def _draw_fa3(gen, B, S, H, Hkv, D):
    """FlashAttention-3's FP8 error benchmark: N(0, 1) + N(0, 100) * Bernoulli(0.001)."""
    def one(*shape):
        x = torch.randn(*shape, generator=gen)
        spike = torch.randn(*shape, generator=gen) * 10.0
        return x + spike * (torch.rand(*shape, generator=gen) < 0.001)
    return one(B, S, H, D), one(B, S, Hkv, D), one(B, S, Hkv, D)


def _draw_outliers(where: str, n: int, mag: float):
    def draw(gen, B, S, H, Hkv, D):
        q, k, v = _draw_normal()(gen, B, S, H, Hkv, D)
        g = H // Hkv
        mq = _channel_mask(n, D, Hkv, g, gen)  # query heads: their kv head's channels
        mk = mq[::g]
        if where == "diff":  # disjoint channels for K: the next n of the same draw
            gen2 = torch.Generator().manual_seed(int(torch.randint(2**31, (1,), generator=gen)))
            mk = _channel_mask(n, D, Hkv, 1, gen2)
        if where in ("q", "same", "diff"):
            q = q * (1 + (mag - 1) * mq)
        if where in ("k", "same", "diff"):
            k = k * (1 + (mag - 1) * mk)
        return _unit_ms(q), _unit_ms(k), v
    return draw


def _draw_bias(bq: float, bk: float, bv: float = 0.0, rope: bool = False):
    def draw(gen, B, S, H, Hkv, D):
        q, k, v = _draw_normal()(gen, B, S, H, Hkv, D)
        q = q + bq * torch.randn(1, 1, H, D, generator=gen)
        k = k + bk * torch.randn(1, 1, Hkv, D, generator=gen)
        v = v + bv * torch.randn(1, 1, Hkv, D, generator=gen)
        if rope:
            q, k = _rope_1d(q), _rope_1d(k)
        return _unit_ms(q), _unit_ms(k), v
    return draw


def _draw_kbias_large(gen, B, S, H, Hkv, D):
    """A K bias 20x K's spread, shared by all tokens (it shifts each row's scores alike)."""
    q, k, v = _draw_normal()(gen, B, S, H, Hkv, D)
    return q, k + 20.0 * torch.randn(1, 1, Hkv, D, generator=gen), v


def _draw_sinks(gen, B, S, H, Hkv, D):
    """Attention sinks: 4 tokens whose keys lean along a direction u (1.5x the spread) that every
    query also leans along (a Q bias of 0.5 u), with V 20x larger (a massive activation): each
    row gives them a large share of its weight (scores ~8 above the rest)."""
    q, k, v = _draw_normal()(gen, B, S, H, Hkv, D)
    g = H // Hkv
    u = torch.randn(1, 1, Hkv, D, generator=gen)
    idx = torch.randperm(S, generator=gen)[:4]
    k[:, idx] += 1.5 * u
    v[:, idx] *= 20.0
    return q + 0.5 * u.repeat_interleave(g, 2), k, v


def _draw_massive(n: int, mag: float):
    """``n`` tokens whose k and v are ``mag`` times larger (a model without QK-norm)."""
    def draw(gen, B, S, H, Hkv, D):
        q, k, v = _draw_normal()(gen, B, S, H, Hkv, D)
        idx = torch.randperm(S, generator=gen)[:n]
        k[:, idx] *= mag
        v[:, idx] *= mag
        return q, k, v
    return draw


def _draw_dit(gamma: float = 1.0):
    """The combination seen in DiT self-attention: 4 channels 8x larger shared by q and k,
    per-head channel biases in q (2x) and k (4x), a per-channel V offset (2x)."""
    def draw(gen, B, S, H, Hkv, D):
        q, k, v = _draw_normal()(gen, B, S, H, Hkv, D)
        g = H // Hkv
        m = _channel_mask(4, D, Hkv, g, gen)
        q = q * (1 + 7 * m) + 2.0 * torch.randn(1, 1, H, D, generator=gen)
        k = k * (1 + 7 * m[::g]) + 4.0 * torch.randn(1, 1, Hkv, D, generator=gen)
        v = v + 2.0 * torch.randn(1, 1, Hkv, D, generator=gen)
        return _unit_ms(q) * gamma, _unit_ms(k), v
    return draw


def _draw_v_outliers(gen, B, S, H, Hkv, D):
    """V with 4 channels 32x larger and FA3's sparse spikes; q, k normal."""
    q, k, v = _draw_normal()(gen, B, S, H, Hkv, D)
    v = v * (1 + 31 * _channel_mask(4, D, Hkv, 1, gen)[None, None])
    v = v + 10.0 * torch.randn(v.shape, generator=gen) * (torch.rand(v.shape, generator=gen)
                                                          < 0.001)
    return q, k, v


def _stress_cases() -> tuple[StressCase, ...]:
    cases = [
        StressCase("normal", "normal", "i.i.d. N(0, 1) q, k, v", _draw_normal()),
        StressCase("flat", "temperature", "normal, q x 0.25: nearly uniform softmax",
                   _draw_normal(0.25)),
        StressCase("peaked", "temperature", "normal, q x 4: a few keys take each row",
                   _draw_normal(4.0)),
        StressCase("fa3", "fa3", "FlashAttention-3's FP8 benchmark: q, k, v ~ N(0, 1) + "
                   "N(0, 100) * Bernoulli(0.001)", _draw_fa3),
    ]
    where_text = {"q": "in Q only", "k": "in K only", "same": "in Q and K, same channels",
                  "diff": "in Q and K, different channels"}
    for where in ("q", "k", "same", "diff"):
        for n in (1, 4, 16):
            for mag in (4, 32):
                cases.append(StressCase(
                    f"outliers-{where}-n{n}-x{mag}", "outlier channels",
                    f"{n} channel(s) {mag}x larger {where_text[where]}",
                    _draw_outliers(where, n, float(mag))))
    cases += [
        StressCase("bias-q", "channel bias", "per-head channel bias in Q, 3x its spread",
                   _draw_bias(3.0, 0.0)),
        StressCase("bias-k", "channel bias", "per-head channel bias in K, 3x its spread",
                   _draw_bias(0.0, 3.0)),
        StressCase("bias-qk", "channel bias", "per-head channel biases in Q and K, 3x",
                   _draw_bias(3.0, 3.0)),
        StressCase("bias-qk-rope", "channel bias", "bias-qk, then 1-D rotary: the biases turn "
                   "with position, so K's mean no longer holds them", _draw_bias(3.0, 3.0,
                                                                               rope=True)),
        StressCase("kbias-x20", "channel bias", "K bias 20x its spread, shared by all tokens",
                   _draw_kbias_large),
        StressCase("sinks", "massive tokens", "4 attention-sink tokens: keys along the queries' "
                   "shared direction, V 20x larger", _draw_sinks),
        StressCase("massive-kv-x8", "massive tokens", "4 tokens with k and v 8x larger",
                   _draw_massive(4, 8.0)),
        StressCase("v-outliers", "V outliers", "V: 4 channels 32x larger and FA3's spikes",
                   _draw_v_outliers),
        StressCase("dit", "DiT-like", "4 channels 8x shared by Q and K, channel biases in Q "
                   "(2x), K (4x) and V (2x)", _draw_dit()),
        StressCase("dit-peaked", "DiT-like", "dit with q x 2", _draw_dit(2.0)),
        StressCase("normal-d64", "head dim", "normal at head dim 64", _draw_normal(), D=64),
        StressCase("dit-d64", "head dim", "dit at head dim 64", _draw_dit(), D=64),
        StressCase("dit-gqa", "GQA", "dit with every query head on one kv head", _draw_dit(),
                   group=0),
    ]
    return tuple(cases)


STRESS_SUITE: tuple[StressCase, ...] = _stress_cases()
STRESS_CASES: dict[str, StressCase] = {c.name: c for c in STRESS_SUITE}


def make_stress_qkv(case, B: int = 1, H: int = 2, S: int = 1024, D: int = 128, *,
                    seed: int = 0, dtype: torch.dtype = torch.bfloat16,
                    device: str | torch.device = "cpu"):
    """q [B, S, H, D], k, v [B, S, Hkv, D] (NHD) of a stress case (a :class:`StressCase` or its
    name), in ``dtype`` on ``device``. The case's own head dim or GQA group overrides ``D`` or
    the kv heads (``group=0``: one kv head for all ``H``)."""
    if isinstance(case, str):
        if case not in STRESS_CASES:
            raise ValueError(f"case: expected one of {', '.join(STRESS_CASES)}, got {case!r}")
        case = STRESS_CASES[case]
    D = case.D or D
    group = 1 if case.group is None else (case.group or H)
    if H % group:
        raise ValueError(f"H: case {case.name!r} needs a multiple of {group} heads, got {H}")
    gen = torch.Generator().manual_seed(seed)
    q, k, v = case.draw(gen, B, S, H, H // group, D)
    return tuple(t.to(device=device, dtype=dtype).contiguous() for t in (q, k, v))


# Bounds of the stress suite (docs/accuracy.md): rel-L1 and cos of the output, mean |error|
# of the LSE, the output merged by LSE from four kv chunks against one call's, FA3's RMSE.
STRESS_BOUNDS = {
    "rel_l1": 0.03,
    "rel_l1_normal": 0.04,  # i.i.d. normal inputs (the fp8 P and V rounding alone: ~0.036)
    "cos": 0.999,
    "lse_mean": 0.05,
    "ring_ratio": 1.05,
    "fa3_rmse": 4.5e-3,
}
# The i.i.d. normal cases (the 0.04 rel-L1 bound) and FlashAttention-3's (the RMSE bound).
STRESS_NORMAL = ("normal", "normal-d64")
STRESS_FA3 = "fa3"
RING_CHUNKS = 4


def stress_metrics(run, q, k, v, *, ring_chunks: int = RING_CHUNKS, floor=None) -> dict:
    """Errors of ``run(q, k, v) -> (out, lse)`` (NHD, lse [B, H, S] natural log) against
    :func:`attention_ref` in float64: cos, rel-L1, RMSE, max-abs of the output; mean and max
    |error| of the LSE; ``ring_rel_l1``, the rel-L1 of the output merged by LSE from calls on
    ``ring_chunks`` kv chunks (:func:`ring_merge`), and ``ring_ratio`` = ring / one call.
    ``floor``: another ``run`` (e.g. the recipe's emulation with exact Q and K) whose rel-L1 is
    reported as ``floor_rel_l1``.
    """
    ref_out, ref_lse = attention_ref(q, k, v, return_lse=True)
    out, lse = run(q, k, v)
    st = error_stats(out, ref_out)
    fin = torch.isfinite(ref_lse)
    d = (lse.double().to(ref_lse.device) - ref_lse)[fin].abs()
    row = dict(st.as_dict(), lse_mean=float(d.mean()) if d.numel() else 0.0,
               lse_max=float(d.max()) if d.numel() else 0.0,
               lse_nan=bool(torch.isnan(lse).any()))
    del out, lse
    ring = error_stats(ring_merge(run, q, k, v, chunks=ring_chunks), ref_out).rel_l1
    row["ring_rel_l1"] = ring
    row["ring_ratio"] = ring / max(st.rel_l1, 1e-30)
    row["floor_rel_l1"] = error_stats(floor(q, k, v)[0], ref_out).rel_l1 if floor else None
    return row


def stress_violations(case: str, m: dict) -> list[str]:
    """The :data:`STRESS_BOUNDS` that metrics ``m`` of stress case ``case`` break, as text."""
    b = STRESS_BOUNDS
    out = []
    if m.get("nan") or m.get("lse_nan"):
        out.append("NaN")
    rel = b["rel_l1_normal"] if case in STRESS_NORMAL else b["rel_l1"]
    if not m["rel_l1"] <= rel:
        out.append(f"rel-L1 {m['rel_l1']:.4f} > {rel}")
    if not m["cos"] >= b["cos"]:
        out.append(f"cos {m['cos']:.5f} < {b['cos']}")
    if not m["lse_mean"] <= b["lse_mean"]:
        out.append(f"LSE {m['lse_mean']:.3f} > {b['lse_mean']}")
    if not m["ring_ratio"] <= b["ring_ratio"]:
        out.append(f"ring {m['ring_ratio']:.3f}x > {b['ring_ratio']}x")
    if case == STRESS_FA3 and not m["rmse"] <= b["fa3_rmse"]:
        out.append(f"RMSE {m['rmse']:.2e} > {b['fa3_rmse']:.1e}")
    return out


def stress_badness(case: str, m: dict) -> float:
    """The largest ratio of a metric of ``m`` to its bound (1 = on the bound; inf for NaN):
    how the suite's table sorts its rows, worst last."""
    if m.get("nan") or m.get("lse_nan"):
        return float("inf")
    b = STRESS_BOUNDS
    rel = b["rel_l1_normal"] if case in STRESS_NORMAL else b["rel_l1"]
    r = [m["rel_l1"] / rel, (1 - m["cos"]) / (1 - b["cos"]), m["lse_mean"] / b["lse_mean"],
         m["ring_ratio"] / b["ring_ratio"]]
    if case == STRESS_FA3:
        r.append(m["rmse"] / b["fa3_rmse"])
    return max(r)


def emulated_runner(recipe, *, exact_qk: bool = False):
    """``run(q, k, v) -> (out, lse)`` of :func:`attention_emulated` (NHD), for
    :func:`stress_metrics`."""
    def run(q, k, v):
        return attention_emulated(q, k, v, recipe, return_lse=True, exact_qk=exact_qk)
    return run
