"""torch.library custom ops around the FP8 launchers, with fake (meta) implementations.

The ops are functional (they allocate out and lse), so ``torch.compile(fullgraph=True)`` traces
them as single opaque nodes and CUDA graphs capture the kernels they launch. In eager mode
:mod:`fp8dit.api` calls the launchers directly (the dispatcher costs tens of microseconds).
"""

from __future__ import annotations

import torch

from .attend import fp8_attention_fwd, fp8_attention_varlen_fwd
from .key_padding import key_padding_attention
from .recipes import get_recipe


@torch.library.custom_op("fp8dit::attention_fp8", mutates_args=())
def attention_fp8(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    layout: str, scale: float, is_causal: bool, recipe: str, num_splits: int,
    rope: torch.Tensor | None = None, rope_start: int = 0, kernel: str = "",
) -> tuple[torch.Tensor, torch.Tensor]:
    # kernel: dispatch.choose's, "" to choose it here
    return fp8_attention_fwd(
        q, k, v, layout=layout, scale=scale, is_causal=is_causal, recipe=get_recipe(recipe),
        num_splits=num_splits or None, rope=rope, rope_start=rope_start, kernel=kernel or None,
    )


@attention_fp8.register_fake
def _attention_fp8_fake(q, k, v, layout, scale, is_causal, recipe, num_splits, rope=None,
                        rope_start=0, kernel=""):
    if layout == "NHD":
        B, Sq, H, _ = q.shape
    else:
        B, H, Sq, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, Sq), dtype=torch.float32)


@torch.library.custom_op("fp8dit::attention_varlen_fp8", mutates_args=())
def attention_varlen_fp8(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
    scale: float, is_causal: bool, recipe: str, num_splits: int, kernel: str = "",
) -> tuple[torch.Tensor, torch.Tensor]:
    # The plan is keyed by the lengths, so they are read on the host here (one small copy).
    cq = cu_seqlens_q.tolist()
    ck = cu_seqlens_k.tolist()
    q_lens = [b - a for a, b in zip(cq[:-1], cq[1:])]
    k_lens = [b - a for a, b in zip(ck[:-1], ck[1:])]
    return fp8_attention_varlen_fwd(
        q, k, v, q_lens, k_lens, scale=scale, is_causal=is_causal, recipe=get_recipe(recipe),
        num_splits=num_splits or None, kernel=kernel or None,
    )


@attention_varlen_fp8.register_fake
def _attention_varlen_fp8_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, is_causal, recipe,
                               num_splits, kernel=""):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("fp8dit::attention_fp8_key_padding", mutates_args=())
def attention_fp8_key_padding(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor,
    scale: float, recipe: str, return_lse: bool, rope: torch.Tensor | None = None,
    rope_start: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    # NHD inputs. The mask's key lengths are read on the host here (fp8dit.key_padding), or the
    # call runs SDPA with the mask; lse is unfilled when not asked for.
    out, lse, _ = key_padding_attention(q, k, v, attn_mask, scale=scale,
                                        recipe=get_recipe(recipe), return_lse=return_lse,
                                        rope=rope, rope_start=rope_start)
    if lse is None:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    if out.stride() != torch.empty_like(q, device="meta").stride():  # SDPA's: the fake's
        out = torch.empty_like(q).copy_(out)
    return out, lse


@attention_fp8_key_padding.register_fake
def _attention_fp8_key_padding_fake(q, k, v, attn_mask, scale, recipe, return_lse, rope=None,
                                    rope_start=0):
    B, Sq, H, _ = q.shape
    return torch.empty_like(q), q.new_empty((B, H, Sq), dtype=torch.float32)
