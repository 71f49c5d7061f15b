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
those layers. :data:`REPLACEMENTS` maps the replaced classes' names to a factory;
``fp8dit.integrations.diffusers.route_through_dispatcher`` does the swapping.
"""

from __future__ import annotations

import inspect

import torch

__all__ = ["CogVideoXDispatchProcessor", "REPLACEMENTS", "replacement_for"]

# The call signature of the processors replaced here (diffusers 0.42). A release that changes it
# changed what the processor does; replacing it then could lose a new argument, so it is left
# alone (and the layers keep running torch SDPA, which ``route_through_dispatcher`` reports).
_COGVIDEOX_CALL = ("self", "attn", "hidden_states", "encoder_hidden_states", "attention_mask",
                   "image_rotary_emb")


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
        if image_rotary_emb is not None:  # RoPE on the video tokens only
            query[:, :, text_seq_length:] = apply_rotary_emb(query[:, :, text_seq_length:],
                                                             image_rotary_emb)
            if not attn.is_cross_attention:
                key[:, :, text_seq_length:] = apply_rotary_emb(key[:, :, text_seq_length:],
                                                               image_rotary_emb)

        # The dispatcher takes [B, S, H, D]: views, no copy ("native" permutes them back).
        hidden_states = dispatch_attention_fn(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
            attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
            backend=self._attention_backend, parallel_config=self._parallel_config,
        )
        hidden_states = hidden_states.reshape(batch_size, -1, attn.heads * head_dim)
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        encoder_hidden_states, hidden_states = hidden_states.split(
            [text_seq_length, hidden_states.size(1) - text_seq_length], dim=1)
        return hidden_states, encoder_hidden_states


def _cogvideox(fused: bool):
    def make(original):
        return CogVideoXDispatchProcessor(fused=fused, original=original)
    return make


# Class name (in diffusers.models.attention_processor) -> factory(original) of its replacement.
REPLACEMENTS = {
    "CogVideoXAttnProcessor2_0": _cogvideox(fused=False),
    "FusedCogVideoXAttnProcessor2_0": _cogvideox(fused=True),
}


def replacement_for(processor):
    """A dispatching replacement of ``processor``, or None when fp8dit has none (or when the
    processor's class is not diffusers' own or its call signature changed)."""
    cls = type(processor)
    make = REPLACEMENTS.get(cls.__name__)
    if make is None or not cls.__module__.startswith("diffusers."):
        return None
    if tuple(inspect.signature(cls.__call__).parameters) != _COGVIDEOX_CALL:
        return None
    return make(processor)
