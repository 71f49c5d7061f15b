"""Exact Q/K balancing of the ``balance`` recipes: per (sequence, kv head), matrices ``Mq`` and
``Mk`` with ``Mq @ Mk.T = I``, so ``(q @ Mq) @ (k @ Mk).T = q @ k.T``: the scores are unchanged,
only the values that get quantized change. The Hadamard rotation of the ``rotate`` recipes is
their last factor.

Why: one int8 scale per Q token and per K block is set by the largest value it covers. Channel
outliers (a few channels several times larger) are spread by the rotation alone; what it cannot
spread is an imbalance between Q and K: a Q bias shared by all tokens (the rotation turns it
into a dense offset that still sets every Q token's scale), or a channel large in one of Q, K
and not in the other. Moving magnitude from the larger side to the smaller one makes the two
rounding errors, which multiply the other side's values, smaller together: the score error of
one Q token and one key grows like rms(q') * rms(k'), which the transform lowers.

The transform, from channel sums over the kv head's queries (all query heads of its group) and
keys (after rotary embedding; K after its mean is removed), in float64:

1. Rank one along Q's mean direction ``u``: ``Pq = I + (a - 1) u u^T`` shrinks Q along ``u``
   by ``a``, ``Pk = I + (1/a - 1) u u^T`` stretches K along it by ``1/a`` (``Pq Pk = I``).
   With ``E(q.u)^2 = m``, the rest of Q's second moment ``M``, K's variance along ``u`` ``n``
   and the rest ``N``, rms(q') * rms(k') ~ sqrt((M + a^2 m)(N + n / a^2)), least at
   ``a^4 = M n / (m N)``; ``a`` is kept in [1/32, 1] (only Q's mean is shrunk).
2. Per channel ``c``: ``q_c / s_c`` and ``k_c * s_c`` with ``s_c^4 = E q'_c^2 / E k'_c^2``
   (SmoothQuant's balance at alpha = 1/2, on second moments), kept in [2^-6, 2^6].
3. The rotation ``R``: ``Mq = Pq diag(1/s) R``, ``Mk = Pk diag(s) R``.

The quantization applies them without the matrices, from three vectors per (sequence, kv
head) and side (:func:`balance_vectors`): ``x @ Mq = ((x + (x . u)(a - 1) u) / s) @ R``, the
rotation by a fast Walsh-Hadamard transform (``kernels.quantize._rotate``).

Second moments after step 1 take Q's and K's channels as uncorrelated (only channel sums and
sums of squares are gathered); a wrong guess there makes the balance less good, never the
scores wrong: any ``a`` and ``s`` give an exact transform.
"""

from __future__ import annotations

import torch

from .kernels.balance import balance_vectors_kernel, channel_moments_kernel

ALPHA_MIN = 1.0 / 32
S_LIMIT = 64.0


def balance_vectors(q_sum: torch.Tensor, q_sq: torch.Tensor, q_count: torch.Tensor,
                    k_sum: torch.Tensor, k_sq: torch.Tensor,
                    k_count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(vq, vk)`` [..., 3, Dp] float64: ``vq = (u, (a - 1) u, 1/s)``, ``vk = (u, (1/a - 1) u,
    s)`` (module docstring), the reference of ``kernels.balance.balance_vectors_kernel``.
    Every argument on one device.

    q_sum, q_sq : [..., Dp]
        Sums of q and q**2 over the rows of a kv head's queries.
    q_count : [...]
        The number of those rows (clamped to 1).
    k_sum, k_sq : [..., Dp]
        Sums of k and k**2 over the keys, before K's mean is removed.
    k_count : [...]
    """
    f64 = torch.float64
    # a head whose sums overflowed (values beyond ~1e19) or met no finite value: no balance
    bad = ~(torch.isfinite(q_sum).all(-1) & torch.isfinite(q_sq).all(-1)
            & torch.isfinite(k_sum).all(-1) & torch.isfinite(k_sq).all(-1))[..., None]
    q_sum, q_sq, k_sum, k_sq = (torch.where(bad, 0.0, t) for t in (q_sum, q_sq, k_sum, k_sq))
    nq = q_count.to(f64).clamp_min(1)[..., None]
    nk = k_count.to(f64).clamp_min(1)[..., None]
    mq = q_sum.to(f64) / nq
    eq2 = q_sq.to(f64) / nq
    vq = (eq2 - mq * mq).clamp_min(0)
    mk = k_sum.to(f64) / nk
    vk = (k_sq.to(f64) / nk - mk * mk).clamp_min(0)

    # 1. rank one along Q's mean direction
    norm = mq.norm(dim=-1, keepdim=True)
    total_q = eq2.sum(-1, keepdim=True)
    has_mean = norm * norm > 1e-6 * total_q
    u = torch.where(has_mean, mq / norm.clamp_min(1e-300), torch.zeros_like(mq))
    u2 = u * u
    m = norm * norm + (u2 * vq).sum(-1, keepdim=True)
    big_m = (total_q - m).clamp_min(0)
    n = (u2 * vk).sum(-1, keepdim=True)
    big_n = (vk.sum(-1, keepdim=True) - n).clamp_min(0)
    a4 = big_m * n / (m * big_n).clamp_min(1e-300)
    a = torch.where(has_mean & (n > 0) & (big_n > 0), a4.clamp_min(0) ** 0.25,
                    torch.ones_like(a4)).clamp(ALPHA_MIN, 1.0)
    b = 1.0 / a - 1.0
    a1 = a - 1.0

    # 2. per-channel balance on the second moments after step 1
    uvq = (u2 * vq).sum(-1, keepdim=True)
    uvk = (u2 * vk).sum(-1, keepdim=True)
    eq2p = (a * mq) ** 2 + vq + 2 * a1 * u2 * vq + a1 * a1 * u2 * uvq
    vkp = vk + 2 * b * u2 * vk + b * b * u2 * uvk
    ok = (eq2p > 0) & (vkp > 0)
    s = torch.where(ok, (eq2p / vkp.clamp_min(1e-300)) ** 0.25, torch.ones_like(eq2p))
    s = s.clamp(1.0 / S_LIMIT, S_LIMIT)
    return (torch.stack((u, a1 * u, 1.0 / s), -2), torch.stack((u, b * u, s), -2))


def transform_matrix(vec: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """``(I + u c^T) diag(w) R`` [..., Dp, Dp] float64 of vectors ``(u, c, w)`` [..., 3, Dp]
    (:func:`balance_vectors`): the matrix that ``x + (x . u) c``, times ``w``, then rotated by
    ``rot`` [Dp, Dp], applies."""
    u, c, w = (vec[..., i, :].to(torch.float64) for i in range(3))
    eye = torch.eye(u.shape[-1], dtype=torch.float64, device=u.device)
    return ((eye + u[..., :, None] * c[..., None, :]) * w[..., None, :]) @ rot.to(torch.float64)


def balance_matrices(q_sum: torch.Tensor, q_sq: torch.Tensor, q_count: torch.Tensor,
                     k_sum: torch.Tensor, k_sq: torch.Tensor, k_count: torch.Tensor,
                     rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(Mq, Mk)`` [..., Dp, Dp] float32 (module docstring) of :func:`balance_vectors`'
    arguments, ``rot`` [Dp, Dp] the orthonormal matrix applied last (the Hadamard matrix of
    ``quantize.hadamard``); float64 until the last step."""
    vq, vk = balance_vectors(q_sum, q_sq, q_count, k_sum, k_sq, k_count)
    return (transform_matrix(vq, rot).to(torch.float32),
            transform_matrix(vk, rot).to(torch.float32))


# Elements per sub-tile of the channel-sums pass (its rows: this / padded head dim): the size the
# K/V statistics pass uses under the interpreter; not tuned on a GPU.
MOMENTS_SUB_ELEMS = 2048


def balance_tables(plan, q, q_strides, k, k_strides, tabs: dict, rope_args: dict, soft: bool,
                   hip: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(vq, vk)`` [B, Hkv, 3, Dp] float32 of a call (:func:`balance_vectors`): two launches
    of :func:`fp8dit.kernels.balance.channel_moments_kernel` (Q over its heads, K over its kv
    heads), then one launch of :func:`fp8dit.kernels.balance.balance_vectors_kernel` (this
    module's :func:`balance_vectors`, which stays the reference the tests hold it to); nothing
    waits for the host, so CUDA graphs capture it.
    Strides are (batch, token, head, dim); ``tabs``: the plan's device tables (a call's copy with
    shorter key lengths counts those); ``rope_args``: the quantization's rotary arguments; ``hip``:
    an AMD GPU (no inline PTX in the rotary, ``fp8dit.device``)."""
    key = plan.key
    B, H, Hkv, D = len(key.q_lens), key.num_heads, key.num_kv_heads, key.head_dim
    Dp, chunk = plan.head_dim_padded, plan.stats_chunk
    dev = q.device
    sub = max(1, MOMENTS_SUB_ELEMS // Dp)
    moments = []
    for x, strides, heads, lens, cols in ((q, q_strides, H, key.q_lens, (0, 2)),
                                          (k, k_strides, Hkv, key.k_lens, (1, 3))):
        n_chunks = max(1, -(-max(lens, default=0) // chunk))
        out = torch.empty(B, heads, n_chunks, 2, Dp, device=dev, dtype=torch.float32)
        grid = (heads, n_chunks, B) if rope_args else (n_chunks, heads, B)
        channel_moments_kernel[grid](
            x, tabs["seq"], out, *strides, n_chunks, D,
            LEN_COL=cols[0], SRC_COL=cols[1], DP=Dp, CHUNK=chunk, SUB=sub, SOFT_CAST=soft,
            HIP=hip, num_warps=4, **rope_args,
        )
        moments.append(out)
    vq = torch.empty(B, Hkv, 3, Dp, device=dev, dtype=torch.float32)
    vk = torch.empty_like(vq)
    balance_vectors_kernel[(B * Hkv,)](
        moments[0], moments[1], tabs["seq"], vq, vk, Hkv, H // Hkv,
        moments[0].shape[2], moments[1].shape[2], DP=Dp, ALPHA_MIN=ALPHA_MIN, S_LIMIT=S_LIMIT,
        num_warps=4,
    )
    return vq, vk
