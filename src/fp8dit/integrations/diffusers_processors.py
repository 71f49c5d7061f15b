"""Attention processors that send a diffusers model's attention through diffusers' dispatcher
where the model's own processor calls torch SDPA directly.

diffusers picks an attention backend per processor (``processor._attention_backend``, which
``set_attention_backend`` sets). Processors written before the dispatcher existed have no such
attribute and call ``F.scaled_dot_product_attention`` themselves, so ``set_attention_backend``
passes them by without a word. CogVideoX's (``CogVideoXAttnProcessor2_0`` and its fused-QKV
twin, diffusers 0.42) are such processors: without these replacements a CogVideoX pipeline runs
torch SDPA in every layer whatever backend is set.

:class:`CogVideoXDispatchProcessor` computes what diffusers' CogVideoX processors compute, in
the same order and layout, and hands the attention itself to ``dispatch_attention_fn``: with
diffusers' ``"native"`` backend it gives bitwise the same output as the processor it replaces
(``tests/test_diffusers_processors.py`` holds it to that on a tiny model, and fails when a
diffusers release changes the original), and every backend, fp8dit's included, now reaches
those layers.

:class:`HunyuanVideo15KeyMaskProcessor` replaces a processor that does dispatch, for speed:
diffusers' HunyuanVideo 1.5 processor builds a ``[B, 1, S, S]`` mask, (kept query) & (kept key),
in every attention call (a ``repeat`` and an ``&`` with its transpose: 22 ms per call on the
H200 at 480p, 2026-12-04, as long as fp8dit's attention itself), which fp8dit then reads back
(1.1 ms) to find the kept keys. Given fp8dit, it hands over the ``[B, 1, 1, S]``
key mask and builds nothing of size S^2. The kept tokens' outputs are the same bits (fp8dit runs the
same kernel over the same kept keys either way); only the dropped text tokens' own rows differ
(zeros under the S^2 mask, attention over the kept keys here), and nothing reads those: they
are masked as keys in every layer and dropped with the text at the model's end. With any other
backend it builds diffusers' mask and computes bitwise what diffusers' processor computes.

:class:`WanRotaryProcessor` replaces Wan's processor, for speed too: diffusers' rotates q and k
with eager element-wise ops (12.6 ms per layer at Wan2.2 720p on an H200, 2026-12-04) before
handing them over; given fp8dit, it hands over the rotary tables instead, and fp8dit rotates
the rows as its quantization loads them (``fp8dit.attention(rotary=...)``), in diffusers'
arithmetic: the quantized Q, K and V are the same bits, and so is the layer's output (on the
GPU with fp32 tables, LSE's q . mean(K) term may differ in its last bits; split-KV merges leave
that term out of the pieces' weights). Every other call (other backends, context
parallelism, cross-attention, image conditioning) runs diffusers' processor itself.
:class:`HunyuanVideoRotaryProcessor` (HunyuanVideo 1.0) does the same with diffusers'
``apply_rotary_emb`` arithmetic on the video tokens (the text tokens after them stay as they
are), key mask included; so do the CogVideoX and HunyuanVideo 1.5 replacements above when their
layer's backend is fp8dit (CogVideoX's text tokens come first).

:data:`REPLACEMENTS` maps the replaced classes' names to a factory;
``fp8dit.integrations.diffusers.route_through_dispatcher`` does the swapping.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

__all__ = ["CogVideoXDispatchProcessor", "HunyuanVideo15KeyMaskProcessor",
           "HunyuanVideoRotaryProcessor", "REPLACEMENTS", "REPLACEMENT_TYPES",
           "WanRotaryProcessor", "replacement_for"]

# The call signature of the processors replaced here (diffusers 0.42; CogVideoX's and
# HunyuanVideo 1.5's are the same). A release that changes it changed what the processor does;
# replacing it then could lose a new argument, so it is left alone (CogVideoX's layers then keep
# running torch SDPA, which ``route_through_dispatcher`` reports).
_CALL = ("self", "attn", "hidden_states", "encoder_hidden_states", "attention_mask",
         "image_rotary_emb")
_WAN_CALL = _CALL[:-1] + ("rotary_emb",)


def _check_backend_names(arg: str, names):
    if isinstance(names, str) or not all(isinstance(b, str) for b in names):
        raise TypeError(f"{arg}: expected an iterable of diffusers backend names, got {names!r}")
    return frozenset(names)


def _layer_backend_in(processor, names) -> bool:
    """Whether the layer's next call goes to one of ``names`` and no context parallelism."""
    if processor._parallel_config is not None:  # context parallelism: diffusers' own way
        return False
    backend = processor._attention_backend
    if backend is None:  # what dispatch_attention_fn will pick: the active backend
        from diffusers.models.attention_dispatch import _AttentionBackendRegistry
        backend = _AttentionBackendRegistry.get_active_backend()[0]
    return getattr(backend, "value", backend) in names


# diffusers backends whose calls get rotary tables instead of rotated q and k (fp8dit's: it
# rotates as it quantizes)
ROTARY_BACKENDS = frozenset({"fp8dit"})


def _takes_tables(processor) -> bool:
    """Whether the layer's next call goes to fp8dit's own backend function (no context
    parallelism), which can take the rotary tables, and the processor's ``fuse_rotary`` is
    on. One wrapped (fp8dit.integrations.capture's, a user's hook)
    gets the dispatcher's call with the
    rotated q and k it expects."""
    if not processor.fuse_rotary or not _layer_backend_in(processor, ROTARY_BACKENDS):
        return False
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry

    from .diffusers import fp8dit_attention
    return any(fn is fp8dit_attention
               for name, fn in _AttentionBackendRegistry._backends.items()
               if getattr(name, "value", name) in ROTARY_BACKENDS)


def _video_rotary(image_rotary_emb, start: int, rows: int, head_dim: int):
    """diffusers' ``apply_rotary_emb`` tables as an :class:`fp8dit.Rotary` over tokens
    ``start .. start + rows``, or None when their size is not that (diffusers' own call then
    raises or broadcasts as it does)."""
    from ..rope import Rotary

    cos, sin = image_rotary_emb
    if cos.numel() != rows * head_dim or sin.numel() != rows * head_dim:
        return None
    return Rotary(cos, sin, start, "apply_rotary_emb")


def _append_added_qkv(attn, encoder_hidden_states, query, key, value):
    """The HunyuanVideo processors' conditioning tokens (added projections and norms, diffusers'
    order) appended after the video tokens' q, k, v."""
    enc = [proj(encoder_hidden_states).unflatten(2, (attn.heads, -1))
           for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)]
    if attn.norm_added_q is not None:
        enc[0] = attn.norm_added_q(enc[0])
    if attn.norm_added_k is not None:
        enc[1] = attn.norm_added_k(enc[1])
    return (torch.cat([t, e], dim=1) for t, e in zip((query, key, value), enc))


def _split_out(attn, hidden_states, encoder_hidden_states):
    """The HunyuanVideo processors' output: the conditioning tokens split off the end, each
    part through its output projection (diffusers' steps)."""
    if encoder_hidden_states is not None:
        n = encoder_hidden_states.shape[1]
        hidden_states, encoder_hidden_states = hidden_states[:, :-n], hidden_states[:, -n:]
        if getattr(attn, "to_out", None) is not None:
            hidden_states = attn.to_out[1](attn.to_out[0](hidden_states))
        if getattr(attn, "to_add_out", None) is not None:
            encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
    return hidden_states, encoder_hidden_states


class CogVideoXDispatchProcessor:
    """CogVideoX's joint text-video self-attention with the attention through diffusers'
    dispatcher.

    Parameters
    ----------
    fused : bool
        Whether the layer's projections are fused (``attn.to_qkv``, after diffusers'
        ``fuse_qkv_projections``) or separate (``to_q``, ``to_k``, ``to_v``).
    original : object, optional
        The processor this one replaces, kept so that it can be put back.
    """

    # diffusers' backend selection reads these two (``set_attention_backend``,
    # ``attention_backend(...)``, context parallelism's ``_parallel_config``).
    _attention_backend = None
    _parallel_config = None
    # False: q and k rotated in torch first, as diffusers' processor does (a comparison peer)
    fuse_rotary = True

    def __init__(self, fused: bool = False, original=None):
        self.fused = bool(fused)
        self.original = original

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(fused={self.fused}, "
                f"backend={getattr(self._attention_backend, 'value', self._attention_backend)})")

    def __call__(self, attn, hidden_states: torch.Tensor, encoder_hidden_states: torch.Tensor,
                 attention_mask: torch.Tensor | None = None,
                 image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.embeddings import apply_rotary_emb

        from .diffusers import rotary_attention

        text_seq_length = encoder_hidden_states.size(1)
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
        batch_size, sequence_length, _ = hidden_states.shape

        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length,
                                                         batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1,
                                                 attention_mask.shape[-1])

        if self.fused:
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = (attn.to_q(hidden_states), attn.to_k(hidden_states),
                                 attn.to_v(hidden_states))
        head_dim = key.shape[-1] // attn.heads
        # [B, H, S, D] as the original computes them, so norms and RoPE round the same way.
        query, key, value = (t.view(batch_size, -1, attn.heads, head_dim).transpose(1, 2)
                             for t in (query, key, value))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        rotary = None
        if (image_rotary_emb is not None and attention_mask is None
                and not attn.is_cross_attention and _takes_tables(self)):
            # fp8dit turns the video tokens as it quantizes them, in apply_rotary_emb's bits
            rotary = _video_rotary(image_rotary_emb, text_seq_length,
                                   sequence_length - text_seq_length, head_dim)
        if image_rotary_emb is not None and rotary is None:  # RoPE on the video tokens only
            query[:, :, text_seq_length:] = apply_rotary_emb(query[:, :, text_seq_length:],
                                                             image_rotary_emb)
            if not attn.is_cross_attention:
                key[:, :, text_seq_length:] = apply_rotary_emb(key[:, :, text_seq_length:],
                                                               image_rotary_emb)

        # The dispatcher takes [B, S, H, D]: views, no copy ("native" permutes them back).
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))
        if rotary is not None:
            hidden_states = rotary_attention(query, key, value, rotary)
        else:
            hidden_states = dispatch_attention_fn(
                query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
                backend=self._attention_backend, parallel_config=self._parallel_config,
            )
        hidden_states = hidden_states.reshape(batch_size, -1, attn.heads * head_dim)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        encoder_hidden_states, hidden_states = hidden_states.split(
            [text_seq_length, hidden_states.size(1) - text_seq_length], dim=1)
        return hidden_states, encoder_hidden_states


class HunyuanVideo15KeyMaskProcessor:
    """HunyuanVideo 1.5's joint self-attention (diffusers' ``HunyuanVideo15AttnProcessor2_0``),
    handing fp8dit the key mask instead of a per-call ``[B, 1, S, S]`` mask.

    Parameters
    ----------
    original : object, optional
        The processor this one replaces, kept so that it can be put back; its backend and
        context-parallel settings carry over.
    key_mask_backends : iterable of str
        diffusers backends given the ``[B, 1, 1, S]`` key mask. Every other backend, and every
        context-parallel call, gets diffusers' own ``[B, 1, S, S]`` mask. Default: fp8dit only,
        so that the other backends compute bitwise what diffusers' processor does (benchmarks
        add ``"native"`` to time SDPA given the cheaper mask too).
    """

    _attention_backend = None
    _parallel_config = None
    # False: q and k rotated in torch first, as diffusers' processor does (a comparison peer)
    fuse_rotary = True

    def __init__(self, original=None, key_mask_backends=("fp8dit",)):
        self.original = original
        self.key_mask_backends = _check_backend_names("key_mask_backends", key_mask_backends)
        for attr in ("_attention_backend", "_parallel_config"):
            if getattr(original, attr, None) is not None:
                setattr(self, attr, getattr(original, attr))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(key_mask_backends={sorted(self.key_mask_backends)}, "
                f"backend={getattr(self._attention_backend, 'value', self._attention_backend)})")

    def _key_mask_for_backend(self) -> bool:
        return _layer_backend_in(self, self.key_mask_backends)

    def __call__(self, attn, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 image_rotary_emb: torch.Tensor | None = None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.embeddings import apply_rotary_emb

        from .diffusers import rotary_attention

        # diffusers' steps, in its order, so that every backend rounds the same way.
        query = attn.to_q(hidden_states).unflatten(2, (attn.heads, -1))
        key = attn.to_k(hidden_states).unflatten(2, (attn.heads, -1))
        value = attn.to_v(hidden_states).unflatten(2, (attn.heads, -1))
        query = attn.norm_q(query)
        key = attn.norm_k(key)
        rotary = None
        if image_rotary_emb is not None and _takes_tables(self):
            # fp8dit turns the video tokens (the first ones) as it quantizes them
            rotary = _video_rotary(image_rotary_emb, 0, query.shape[1], query.shape[-1])
        if image_rotary_emb is not None and rotary is None:  # RoPE on the video tokens
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
            key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
        if encoder_hidden_states is not None:  # the text, glyph and image tokens, appended
            query, key, value = _append_added_qkv(attn, encoder_hidden_states, query, key,
                                                  value)

        batch_size, seq_len = query.shape[:2]
        if attention_mask is not None:  # [B, conditioning tokens]; the video tokens are kept
            attention_mask = F.pad(attention_mask, (seq_len - attention_mask.shape[1], 0),
                                   value=True).bool()
            keys = attention_mask.view(batch_size, 1, 1, seq_len)
            if self._key_mask_for_backend():
                attention_mask = keys
            else:  # diffusers' (kept query) & (kept key)
                rows = keys.repeat(1, 1, seq_len, 1)
                attention_mask = (rows & rows.transpose(2, 3)).bool()

        if rotary is not None:
            hidden_states = rotary_attention(query, key, value, rotary, attention_mask)
        else:
            hidden_states = dispatch_attention_fn(
                query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
                backend=self._attention_backend, parallel_config=self._parallel_config,
            )
        return _split_out(attn, hidden_states.flatten(2, 3).to(query.dtype),
                          encoder_hidden_states)


class _RotaryReplacement:
    """What the Wan and HunyuanVideo 1.0 replacements share: the original processor, whose
    ``__call__`` runs every call that is not fused, and its backend and context-parallel
    settings (carried over)."""

    _attention_backend = None
    _parallel_config = None
    # False: q and k rotated in torch first, as diffusers' processor does (a comparison peer)
    fuse_rotary = True

    def __init__(self, original):
        self.original = original
        self._diffusers_call = type(original).__call__
        for attr in ("_attention_backend", "_parallel_config"):
            if getattr(original, attr, None) is not None:
                setattr(self, attr, getattr(original, attr))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}("
                f"backend={getattr(self._attention_backend, 'value', self._attention_backend)})")


class WanRotaryProcessor(_RotaryReplacement):
    """Wan's attention (diffusers' ``WanAttnProcessor``), handing fp8dit the rotary tables
    instead of rotated copies of q and k.

    Parameters
    ----------
    original : WanAttnProcessor
        The processor this one replaces: every call that is not fused runs its ``__call__``
        (with this processor's backend and context-parallel settings, which start as its).
    """

    def __init__(self, original):
        from diffusers.models.transformers import transformer_wan

        super().__init__(original)
        self._qkv = transformer_wan._get_qkv_projections

    def __call__(self, attn, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None):
        if (rotary_emb is None or encoder_hidden_states is not None or attention_mask is not None
                or attn.add_k_proj is not None or not _takes_tables(self)):
            return self._diffusers_call(self, attn, hidden_states, encoder_hidden_states,
                                        attention_mask, rotary_emb)
        from .diffusers import rotary_attention

        # diffusers' steps, in its order, with the rotation left to fp8dit
        query, key, value = self._qkv(attn, hidden_states, None)
        query = attn.norm_q(query)
        key = attn.norm_k(key)
        query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
        hidden_states = rotary_attention(query, key, value, rotary_emb)
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        hidden_states = attn.to_out[0](hidden_states)
        return attn.to_out[1](hidden_states)


class HunyuanVideoRotaryProcessor(_RotaryReplacement):
    """HunyuanVideo 1.0's attention (diffusers' ``HunyuanVideoAttnProcessor2_0``), handing
    fp8dit the rotary tables instead of rotated copies of the video tokens' q and k.

    Parameters
    ----------
    original : HunyuanVideoAttnProcessor2_0
        The processor this one replaces: every call that is not fused runs its ``__call__``
        (with this processor's backend and context-parallel settings, which start as its).
    """

    def __call__(self, attn, hidden_states: torch.Tensor,
                 encoder_hidden_states: torch.Tensor | None = None,
                 attention_mask: torch.Tensor | None = None,
                 image_rotary_emb: torch.Tensor | None = None):
        rotary = None
        if image_rotary_emb is not None and _takes_tables(self):
            # the tokens turned: the video ones, first in the sequence
            rotary = _video_rotary(image_rotary_emb, 0, hidden_states.shape[1],
                                   attn.to_q.out_features // attn.heads)
        if rotary is None:
            return self._diffusers_call(self, attn, hidden_states, encoder_hidden_states,
                                        attention_mask, image_rotary_emb)
        from .diffusers import rotary_attention

        # diffusers' steps, in its order, with the rotation left to fp8dit
        if attn.add_q_proj is None and encoder_hidden_states is not None:
            hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)
        query, key, value = (proj(hidden_states).unflatten(2, (attn.heads, -1))
                             for proj in (attn.to_q, attn.to_k, attn.to_v))
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if attn.add_q_proj is not None and encoder_hidden_states is not None:
            query, key, value = _append_added_qkv(attn, encoder_hidden_states, query, key,
                                                  value)
        hidden_states = rotary_attention(query, key, value, rotary, attention_mask)
        return _split_out(attn, hidden_states.flatten(2, 3).to(query.dtype),
                          encoder_hidden_states)


def _hunyuan_video(original):
    return HunyuanVideoRotaryProcessor(original)


def _wan(original):
    from diffusers.models.transformers import transformer_wan

    # the projection helper its __call__ uses (diffusers 0.42); gone: left alone
    if not callable(getattr(transformer_wan, "_get_qkv_projections", None)):
        return None
    return WanRotaryProcessor(original)


def _cogvideox(fused: bool):
    def make(original):
        return CogVideoXDispatchProcessor(fused=fused, original=original)
    return make


def _hunyuan_video_15(original):
    return HunyuanVideo15KeyMaskProcessor(original=original)


# Class name (in diffusers.models) -> factory(original) of its replacement.
REPLACEMENTS = {
    "CogVideoXAttnProcessor2_0": _cogvideox(fused=False),
    "FusedCogVideoXAttnProcessor2_0": _cogvideox(fused=True),
    "HunyuanVideo15AttnProcessor2_0": _hunyuan_video_15,
    "HunyuanVideoAttnProcessor2_0": _hunyuan_video,
    "WanAttnProcessor": _wan,
}
REPLACEMENT_TYPES = (CogVideoXDispatchProcessor, HunyuanVideo15KeyMaskProcessor,
                     HunyuanVideoRotaryProcessor, WanRotaryProcessor)
# the call signature each replaced class must have (default _CALL)
_SIGNATURES = {"WanAttnProcessor": _WAN_CALL}


def replacement_for(processor):
    """A dispatching replacement of ``processor``, or None when fp8dit has none (or when the
    processor's class is not diffusers' own or its call signature changed)."""
    cls = type(processor)
    make = REPLACEMENTS.get(cls.__name__)
    if make is None or not cls.__module__.startswith("diffusers."):
        return None
    if tuple(inspect.signature(cls.__call__).parameters) != _SIGNATURES.get(cls.__name__, _CALL):
        return None
    return make(processor)
