"""The bf16/fp16 reference path through ``torch.nn.functional.scaled_dot_product_attention``.

It is the fallback of ``auto`` and the ``"sdpa"`` backend. SDPA returns no log-sum-exp, so when
one is asked for it is computed separately in fp32 (chunked over query rows).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def _lse_fp32(qh, kh, scale: float, is_causal: bool, chunk: int = 1024,
              attn_mask=None) -> torch.Tensor:
    B, H, Sq, _ = qh.shape
    Hkv, Sk = kh.shape[1], kh.shape[2]
    kf = kh.float().repeat_interleave(H // Hkv, dim=1)
    lse = torch.empty(B, H, Sq, device=qh.device, dtype=torch.float32)
    for r0 in range(0, Sq, chunk):
        r1 = min(Sq, r0 + chunk)
        s = torch.matmul(qh[:, :, r0:r1].float(), kf.transpose(-1, -2)) * scale
        if is_causal:
            rows = torch.arange(r0, r1, device=s.device)[:, None]
            cols = torch.arange(Sk, device=s.device)[None, :]
            s = s.masked_fill(cols > rows, float("-inf"))
        if attn_mask is not None:  # SDPA's convention: bool keeps where True, float adds
            m = attn_mask[..., r0:r1, :] if attn_mask.shape[-2] > 1 else attn_mask
            s = s.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else s + m
        lse[:, :, r0:r1] = torch.logsumexp(s, dim=-1)
    return lse


def sdpa_mask(attn_mask, dtype: torch.dtype):
    """SDPA's ``attn_mask`` for inputs of ``dtype``: a float mask of another dtype cast to it
    (boolean masks and None unchanged).

    ``F.scaled_dot_product_attention`` takes an fp32 mask with bf16/fp16 inputs, but its fused
    CUDA backends read a float mask in the inputs' dtype: the memory-efficient one refuses an
    fp32 mask, and cuDNN (which torch prefers on sm_90 with cuDNN newer than 9.15) is handed
    the fp32 buffer described as 16-bit values and reads it so, silently. A [.., 40] fp32 mask
    of 0 on 30 keys and -inf on the last 10 is then read as the bf16 halves of its first 20
    zeros: no key masked. On an H100 (torch 2.11, cuDNN 9.19, 2026-12-06) the fallback's
    outputs for three masks, such a one among them, missed cosine 0.9999 against fp64; read as
    bf16 halves, that mask gives 0.860 on the same inputs (computed on the CPU), where bf16
    attention with the mask as meant stays above 0.99999. In the inputs' dtype -inf and 0 are
    exact; other values round as those backends round them."""
    if attn_mask is not None and attn_mask.is_floating_point() and attn_mask.dtype != dtype:
        return attn_mask.to(dtype)
    return attn_mask


def sdpa_attention(q, k, v, *, layout: str, scale: float, is_causal: bool, return_lse: bool,
                   attn_mask=None):
    """Dense attention in the input dtype; lse [B, H, Sq] fp32 or None. ``attn_mask``: SDPA's
    (broadcast to [B, H, Sq, Sk]; a float one in q's dtype, :func:`sdpa_mask`)."""
    attn_mask = sdpa_mask(attn_mask, q.dtype)
    if layout == "NHD":
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    else:
        qh, kh, vh = q, k, v
    H, Hkv = qh.shape[1], kh.shape[1]
    if H != Hkv:
        kh = kh.repeat_interleave(H // Hkv, dim=1)
        vh = vh.repeat_interleave(H // Hkv, dim=1)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=attn_mask, scale=scale,
                                         is_causal=is_causal)
    if layout == "NHD":
        out = out.transpose(1, 2)
    lse = _lse_fp32(qh, kh, scale, is_causal, attn_mask=attn_mask) if return_lse else None
    return out, lse


def sdpa_attention_varlen(q, k, v, q_lens, k_lens, *, scale, is_causal, return_lse):
    """Packed [T, H, D] attention, one SDPA call per sequence; lse [H, Tq] fp32 or None."""
    out = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), -math.inf, device=q.device, dtype=torch.float32)
    q0 = k0 = 0
    for lq, lk in zip(q_lens, k_lens):
        if lq and lk:
            o, l_ = sdpa_attention(
                q[None, q0:q0 + lq], k[None, k0:k0 + lk], v[None, k0:k0 + lk],
                layout="NHD", scale=scale, is_causal=is_causal, return_lse=return_lse,
            )
            out[q0:q0 + lq] = o[0]
            if return_lse:
                lse[:, q0:q0 + lq] = l_[0]
        q0 += lq
        k0 += lk
    return out, (lse if return_lse else None)
