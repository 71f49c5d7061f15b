"""The front door: ``attention``, ``attention_varlen`` and ``select_backend``.

Inputs are validated once here; everything below trusts them.
"""

from __future__ import annotations

import math
import numbers
import operator

import torch

from . import dispatch, env
from .attend import fp8_attention_fwd, fp8_attention_varlen_fwd
from .recipes import RECIPES, Recipe, get_recipe
from .rope import check_rotary, fused_rotary, rope_tables, rotate_first
from .sdpa import sdpa_attention, sdpa_attention_varlen

LAYOUTS = ("NHD", "HND")
_LAYOUT_DIMS = {"NHD": "[B, S, H, D]", "HND": "[B, H, S, D]"}


def _shape(t) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def _check_tensors(names, tensors, rank: int, rank_desc: str) -> None:
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point() or t.element_size() < 2:  # float8: no path takes it
            raise TypeError(
                f"{name}: expected a floating-point dtype (bfloat16, float16 or float32), "
                f"got {t.dtype}"
            )
        if t.dim() != rank:
            raise ValueError(
                f"{name}: expected a {rank}-D tensor {rank_desc}, got shape {_shape(t)}"
            )
    q = tensors[0]
    for name, t in zip(names[1:], tensors[1:]):
        if t.dtype != q.dtype:
            raise TypeError(f"{name}: expected dtype {q.dtype} like q, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: expected device {q.device} like q, got {t.device}")


def _check_heads(H: int, Hkv: int, D: int, Dk: int, Dv: int) -> None:
    if Dk != D:
        raise ValueError(f"k: expected head_dim {D} like q, got {Dk}")
    if Dv != D:
        raise ValueError(f"v: expected head_dim {D} like q, got {Dv}")
    if D == 0:
        raise ValueError("q: expected head_dim of at least 1, got 0")
    if H == 0:
        raise ValueError("q: expected at least 1 head, got 0")
    if Hkv == 0 or H % Hkv != 0:
        raise ValueError(
            f"k: expected a number of kv heads that divides q's {H} heads (GQA), got {Hkv}"
        )


def _check_scale(scale, D: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(D)
    # numbers.Real takes numpy scalars too (np.float64 is a float subclass, np.float32 is not).
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale: expected a float or None, got {type(scale).__name__}")
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale: expected a finite positive float, got {scale}")
    return float(scale)


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected True or False, got {value!r}")


def _check_num_splits(num_splits) -> None:
    if num_splits is None:
        return
    if isinstance(num_splits, bool) or not isinstance(num_splits, int):
        raise TypeError(
            f"num_splits: expected None or a positive integer, got {type(num_splits).__name__}"
        )
    if num_splits < 1:
        raise ValueError(f"num_splits: expected None or a positive integer, got {num_splits}")


def check_recipe(recipe, arg: str = "recipe") -> Recipe:
    """The recipe named ``recipe`` (``None``: ``FP8DIT_RECIPE`` or the default).

    Raises naming ``arg`` (``FP8DIT_RECIPE`` when the name came from the environment), so every
    path that takes a recipe (API, diffusers adapter, CLI options) says which input was wrong.
    """
    if recipe is None:
        recipe, arg = env.default_recipe(), "FP8DIT_RECIPE"
        if recipe is None:
            return get_recipe(None)
    elif not isinstance(recipe, str):
        raise TypeError(f"{arg}: expected a recipe name (str) or None, got {type(recipe).__name__}")
    try:
        return get_recipe(recipe)
    except ValueError:
        raise ValueError(
            f"{arg}: expected one of {', '.join(sorted(RECIPES))}, got {recipe!r}"
        ) from None


def _dense_dims(q, k, v, layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'NHD' or 'HND', got {layout!r}")
    _check_tensors(("q", "k", "v"), (q, k, v), 4, _LAYOUT_DIMS[layout])
    if layout == "NHD":
        B, Sq, H, D = q.shape
        Bk, Sk, Hkv, Dk = k.shape
    else:
        B, H, Sq, D = q.shape
        Bk, Hkv, Sk, Dk = k.shape
    if Bk != B:
        raise ValueError(f"k: expected batch size {B} like q, got {Bk}")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"v: expected the batch, sequence and head sizes of k {tuple(k.shape[:3])}, "
            f"got shape {_shape(v)}"
        )
    _check_heads(H, Hkv, D, Dk, v.shape[3])
    return B, H, Hkv, Sq, Sk, D


def select_backend(q, k, v, *, is_causal: bool = False, layout: str = "NHD",
                   backend: str = "auto") -> tuple[str, str]:
    """Which backend ``attention`` would run for these inputs, and why.

    Returns
    -------
    (name, reason): ``name`` is ``"fp8"`` or ``"sdpa"``; ``reason`` says why it was chosen
    (for ``"fp8"`` also which attention kernel runs and why), or why the FP8 path could not
    run. The recipe is ``FP8DIT_RECIPE`` or the default.

    Example
    -------
    >>> name, why = fp8dit.select_backend(q, k, v)
    """
    B, _, _, Sq, Sk, _ = _dense_dims(q, k, v, layout)
    _check_bool("is_causal", is_causal)
    choice = dispatch.choose(backend, q, k, v, is_causal=is_causal, q_lens=[Sq] * B,
                             k_lens=[Sk] * B, recipe=check_recipe(None))
    return choice.backend, choice.reason


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    layout: str = "NHD",
    scale: float | None = None,
    is_causal: bool = False,
    return_lse: bool = False,
    backend: str = "auto",
    recipe: str | None = None,
    num_splits: int | None = None,
    rotary=None,
):
    """Scaled dot-product attention with FP8 tensor-core kernels where they can run.

    Parameters
    ----------
    q : Tensor
        ``[B, Sq, H, D]`` for ``layout="NHD"`` (diffusers / flash-attn), ``[B, H, Sq, D]`` for
        ``"HND"``; bfloat16 or float16 for the FP8 path.
    k, v : Tensor
        ``[B, Sk, Hkv, D]`` (NHD) or ``[B, Hkv, Sk, D]`` (HND); ``H`` a multiple of ``Hkv``.
    scale : float, optional
        Softmax scale, default ``1 / sqrt(D)``.
    is_causal : bool
        Causal mask aligned top-left (query i sees keys 0..i), as in torch SDPA.
    return_lse : bool
        Also return the log-sum-exp of the scaled scores, ``[B, H, Sq]`` float32, natural log.
    backend : {"auto", "fp8", "sdpa"}
        ``auto`` (default, or ``FP8DIT_BACKEND``) uses FP8 where supported and SDPA otherwise;
        ``fp8`` raises :class:`BackendUnavailableError` when it cannot run.
    recipe : str, optional
        Accuracy recipe (``fp8dit.recipes.RECIPES``); default ``FP8DIT_RECIPE`` or
        ``"int8qk-fp8pv"``.
    num_splits : int, optional
        Force every work item into this many kv pieces (testing the split-KV merge).
    rotary : (cos, sin) or fp8dit.Rotary, optional
        Rotary position embedding to apply to q and k first, in diffusers' arithmetic and
        roundings (:mod:`fp8dit.rope`): a ``(cos, sin)`` pair of ``[S, D]`` tables (or
        diffusers' ``[1, S, 1, D]``) turns every token as diffusers' Wan processor does
        (channels 2i, 2i+1 by ``cos[..., 2i]``, ``sin[..., 2i+1]``); ``fp8dit.Rotary(cos, sin,
        start, style="apply_rotary_emb")`` as diffusers' ``apply_rotary_emb`` does
        (HunyuanVideo, CogVideoX), tokens ``start .. start + rows`` only. Self-attention only
        (``Sq == Sk``). The FP8 path rotates rows as it quantizes them, without writing
        rotated copies.

    Returns
    -------
    out, or (out, lse) with ``return_lse=True``. ``out`` has q's layout, shape and dtype.

    Example
    -------
    >>> q = k = v = torch.randn(1, 4096, 24, 128, dtype=torch.bfloat16, device="cuda")
    >>> out = fp8dit.attention(q, k, v)
    """
    B, H, Hkv, Sq, Sk, D = _dense_dims(q, k, v, layout)
    scale = _check_scale(scale, D)
    _check_bool("is_causal", is_causal)
    _check_bool("return_lse", return_lse)
    _check_num_splits(num_splits)
    rec = check_recipe(recipe)
    rot = check_rotary(rotary, q, Sq, Sk, D)
    if B == 0 or Sq == 0 or Sk == 0:
        out = torch.zeros_like(q)
        lse = torch.full((B, H, Sq), -math.inf, device=q.device, dtype=torch.float32)
        return (out, lse) if return_lse else out
    name, kernel, _ = dispatch.choose(backend, q, k, v, is_causal=is_causal, q_lens=[Sq] * B,
                                      k_lens=[Sk] * B, recipe=rec)
    rope, start = None, 0
    if rot is not None:
        if name == "fp8" and fused_rotary(q, rot, rec):  # else SDPA or unfusable
            rope, start = rope_tables(rot), rot.start
        else:
            q, k = rotate_first(q, k, rope_tables(rot), rot.start, layout)
    if name == "fp8":
        if torch.compiler.is_compiling():
            out, lse = torch.ops.fp8dit.attention_fp8(
                q, k, v, layout, scale, is_causal, rec.name, num_splits or 0, rope, start,
                kernel,
            )
        else:
            out, lse = fp8_attention_fwd(
                q, k, v, layout=layout, scale=scale, is_causal=is_causal, recipe=rec,
                num_splits=num_splits, rope=rope, rope_start=start, kernel=kernel,
            )
    else:
        out, lse = sdpa_attention(
            q, k, v, layout=layout, scale=scale, is_causal=is_causal, return_lse=return_lse
        )
    return (out, lse) if return_lse else out


def _check_cu_seqlens(name: str, cu: torch.Tensor, total: int, batch: int | None):
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: expected dtype int32 or int64, got {cu.dtype}")
    if cu.device.type == "meta":
        raise ValueError(f"{name}: expected a tensor with values (cpu or cuda), got a meta tensor")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name}: expected a 1-D tensor of batch + 1 offsets, got {_shape(cu)}")
    if batch is not None and cu.numel() != batch + 1:
        raise ValueError(
            f"{name}: expected {batch + 1} offsets like cu_seqlens_q, got {cu.numel()}"
        )
    vals = cu.tolist()
    if vals[0] != 0:
        raise ValueError(f"{name}: expected the first offset to be 0, got {vals[0]}")
    lens = [b - a for a, b in zip(vals[:-1], vals[1:])]
    if any(n < 0 for n in lens):
        raise ValueError(f"{name}: expected non-decreasing offsets, got {vals}")
    if vals[-1] != total:
        raise ValueError(
            f"{name}: expected the last offset to equal the packed token count {total}, "
            f"got {vals[-1]}"
        )
    return lens


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    return_lse: bool = False,
    backend: str = "auto",
    recipe: str | None = None,
    num_splits: int | None = None,
):
    """Attention over packed variable-length sequences (flash-attn's varlen convention).

    Parameters
    ----------
    q : Tensor ``[Tq, H, D]``; k, v : Tensor ``[Tk, Hkv, D]``
    cu_seqlens_q, cu_seqlens_k : int32/int64 Tensor ``[B + 1]``
        Offsets of each sequence in the packed tensors (starting at 0, ending at T).
    max_seqlen_q, max_seqlen_k : int
        Upper bounds of the sequence lengths (checked).
    Other arguments as in :func:`attention`.

    Returns
    -------
    out ``[Tq, H, D]``, or (out, lse) with lse ``[H, Tq]`` float32. A sequence with no keys
    gets zeros and lse ``-inf``.

    Example
    -------
    >>> cu = torch.tensor([0, 4096, 4096 + 512], dtype=torch.int32, device="cuda")
    >>> out = fp8dit.attention_varlen(q, k, v, cu, cu, 4096, 4096)
    """
    _check_tensors(("q", "k", "v"), (q, k, v), 3, "[T, H, D]")
    Tq, H, D = q.shape
    Tk, Hkv, Dk = k.shape
    if v.shape[:2] != k.shape[:2]:
        raise ValueError(f"v: expected [Tk, Hkv] = ({Tk}, {Hkv}) like k, got shape {_shape(v)}")
    _check_heads(H, Hkv, D, Dk, v.shape[2])
    scale = _check_scale(scale, D)
    _check_bool("is_causal", is_causal)
    _check_bool("return_lse", return_lse)
    _check_num_splits(num_splits)
    rec = check_recipe(recipe)
    q_lens = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, Tq, None)
    k_lens = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, Tk, len(q_lens))
    for name, bound, lens in (("max_seqlen_q", max_seqlen_q, q_lens),
                              ("max_seqlen_k", max_seqlen_k, k_lens)):
        if isinstance(bound, bool):
            raise TypeError(f"{name}: expected an integer, got bool")
        try:
            bound = operator.index(bound)
        except TypeError:
            raise TypeError(f"{name}: expected an integer, got {type(bound).__name__}") from None
        if bound < max(lens):
            raise ValueError(
                f"{name}: expected at least the longest sequence ({max(lens)}), got {bound}"
            )
    if Tq == 0:
        out = torch.zeros_like(q)
        lse = torch.full((H, 0), -math.inf, device=q.device, dtype=torch.float32)
        return (out, lse) if return_lse else out
    name, kernel, _ = dispatch.choose(backend, q, k, v, is_causal=is_causal, q_lens=q_lens,
                                      k_lens=k_lens, recipe=rec)
    if name == "fp8":
        if torch.compiler.is_compiling():
            out, lse = torch.ops.fp8dit.attention_varlen_fp8(
                q, k, v, cu_seqlens_q, cu_seqlens_k, scale, is_causal, rec.name,
                num_splits or 0, kernel,
            )
        else:
            out, lse = fp8_attention_varlen_fwd(
                q, k, v, q_lens, k_lens, scale=scale, is_causal=is_causal, recipe=rec,
                num_splits=num_splits, kernel=kernel,
            )
    else:
        out, lse = sdpa_attention_varlen(
            q, k, v, q_lens, k_lens, scale=scale, is_causal=is_causal, return_lse=return_lse
        )
    return (out, lse) if return_lse else out
