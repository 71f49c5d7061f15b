"""Capture the q, k, v that a diffusers model's attention layers see, for ``fp8dit check``.

:func:`capture_qkv` is a context manager: while it is open, every call of diffusers' attention
dispatcher from a chosen layer, at a chosen denoising step, is saved as one file in the format
``fp8dit check --inputs`` reads (``{"q", "k", "v"}`` NHD, CPU copies) plus its ``layer``,
``step``, ``call``, ``scale`` and ``is_causal``. It works whatever backend the layers use
(``"fp8dit"``, ``"native"``, ...): it wraps the functions of diffusers' backend registry and
names the calling layer with forward hooks, and undoes both on exit.

Example
-------
>>> from fp8dit.integrations.capture import capture_qkv
>>> with capture_qkv(pipe, "qkv/", layers=["blocks.0.attn1", "*.attn2"], steps=[0, 25],
...                  max_q_tokens=4096) as cap:
...     pipe(prompt, num_inference_steps=50, callback_on_step_end=cap.on_step_end)
>>> cap.files[0]
PosixPath('qkv/transformer.blocks.0.attn1.step000.call0.pt')

$ fp8dit check --inputs qkv/transformer.blocks.0.attn1.step000.call0.pt

A Wan 720p self-attention layer is 3 x 774 MB in bf16: ``max_q_tokens`` keeps evenly spaced
query rows (the attention of those rows over all keys is unchanged, so their error is a fair
sample); ``max_kv_tokens`` also thins the keys and values, which changes the attention itself
(a smaller, similar problem), so prefer it only when the files must be small.
"""

from __future__ import annotations

import fnmatch
import logging
from pathlib import Path

import torch

from ..key_padding import key_lengths, key_padding_reason

__all__ = ["Capture", "attention_layer_outputs", "capture_qkv"]

logger = logging.getLogger("fp8dit")


def attention_layer_outputs(model, inputs: dict):
    """Run ``model(**inputs)`` once without gradients and return ``(final output, {name: output})``
    with the output of every attention module (after its projections) of a diffusers model:
    compare two attention backends layer by layer.

    >>> ref, ref_layers = attention_layer_outputs(model, inputs)
    """
    outs = {}
    hooks = [m.register_forward_hook(lambda mod, a, o, n=n: outs.__setitem__(n, o.detach()))
             for n, m in model.named_modules()
             if hasattr(getattr(m, "processor", None), "_attention_backend")]
    try:
        with torch.no_grad():
            final = model(**inputs, return_dict=False)[0]
    finally:
        for h in hooks:
            h.remove()
    return final, outs


def _even_rows(n: int, keep: int | None, device) -> torch.Tensor | None:
    if keep is None or keep >= n:
        return None
    return torch.linspace(0, n - 1, keep, device=device).round().long().unique()


class Capture:
    """The context manager :func:`capture_qkv` returns; ``files`` lists what it wrote."""

    def __init__(self, pipe_or_model, out_dir, *, layers=None, steps=None,
                 max_q_tokens: int | None = None, max_kv_tokens: int | None = None,
                 max_calls: int | None = None):
        from . import diffusers as fd

        self._target = pipe_or_model
        self.out_dir = Path(out_dir)
        if isinstance(layers, str):
            layers = [layers]
        self.layers = None if layers is None else tuple(layers)
        self.steps = None if steps is None else frozenset(int(s) for s in steps)
        for name, value in (("max_q_tokens", max_q_tokens), ("max_kv_tokens", max_kv_tokens),
                            ("max_calls", max_calls)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"{name}: expected None or a positive integer, got {value!r}")
        self.max_q_tokens, self.max_kv_tokens, self.max_calls = (max_q_tokens, max_kv_tokens,
                                                                 max_calls)
        names = list(fd.layer_backends(pipe_or_model))  # CogVideoX's too (routed on entry)
        if self.layers is not None:
            unmatched = [p for p in self.layers
                         if not any(fnmatch.fnmatchcase(n, p) for n in names)]
            if unmatched:
                raise ValueError(
                    f"layers: {', '.join(map(repr, unmatched))} match no attention layer; the "
                    f"layers are: {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}"
                )
        self.current_step = 0
        self.files: list[Path] = []
        self.skipped: list[str] = []
        self._stack: list[str] = []
        self._calls: dict[tuple[str, int], int] = {}
        self._hooks: list = []
        self._wrapped: dict = {}
        self._registry = None
        self._routed: list[str] = []

    # -- steps ------------------------------------------------------------------------------------

    def step(self, i: int) -> None:
        """Make ``i`` the current denoising step (files are named and selected by it)."""
        self.current_step = int(i)

    def on_step_end(self, pipe, i: int, t, callback_kwargs: dict) -> dict:
        """diffusers' ``callback_on_step_end``: step ``i`` ended, the next calls are step i+1."""
        self.current_step = i + 1
        return callback_kwargs

    # -- the context ------------------------------------------------------------------------------

    def __enter__(self) -> Capture:
        from . import diffusers as fd
        from .guard import _layers

        fd.register()  # imports diffusers' dispatcher (and makes "fp8dit" a backend)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        # CogVideoX's processors call torch SDPA themselves: route them through the dispatcher
        # (bitwise the same under "native") for the time of the capture.
        self._routed = fd.route_through_dispatcher(self._target)
        registry = fd._dispatch()._AttentionBackendRegistry
        self._registry = registry
        for name, fn in list(registry._backends.items()):
            wrapped = self._wrap(fn)
            registry._backends[name] = wrapped
            self._wrapped[name] = (fn, wrapped)
        modules = {}
        for prefix, model in fd._models(self._target):
            for name, module in model.named_modules():
                modules[".".join(p for p in (prefix, name) if p)] = module
        for layer, _ in _layers(self._target):
            module = modules[layer]
            self._hooks.append(module.register_forward_pre_hook(self._enter_hook(layer)))
            self._hooks.append(module.register_forward_hook(self._exit_hook, always_call=True))
        return self

    def _enter_hook(self, layer: str):
        def hook(module, args):
            self._stack.append(layer)

        return hook

    def _exit_hook(self, module, args, output):
        # Returns None: a forward hook's return value would replace the layer's output.
        if self._stack:
            self._stack.pop()

    def __exit__(self, *exc) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self._stack.clear()
        backends = self._registry._backends
        for name, (fn, wrapped) in self._wrapped.items():
            if backends.get(name) is wrapped:  # leave anything registered since alone
                backends[name] = fn
        self._wrapped.clear()
        if self._routed:
            from . import diffusers as fd

            fd.restore_processors(self._target, self._routed)
            self._routed = []

    def _wrap(self, fn):
        def capturing_backend(**kwargs):
            self._maybe_save(kwargs)
            return fn(**kwargs)

        capturing_backend.__wrapped__ = fn
        return capturing_backend

    def _maybe_save(self, kw: dict) -> None:
        if not self._stack:
            return
        layer, step = self._stack[-1], self.current_step
        if self.layers is not None and not any(fnmatch.fnmatchcase(layer, p)
                                               for p in self.layers):
            return
        if self.steps is not None and step not in self.steps:
            return
        q, k, v = kw["query"], kw["key"], kw["value"]
        mask, kept = kw.get("attn_mask"), None
        if mask is not None:
            # fp8dit check takes no mask: a key-padding mask (HunyuanVideo's) is saved as the
            # keys it keeps, which is the same attention; any other would measure another one.
            why = (key_padding_reason(mask, q.shape[0], k.shape[1], q.shape[1])
                   if isinstance(mask, torch.Tensor) else "attn_mask is no tensor")
            lens = None
            if why is None:
                lens, why = key_lengths(mask, q.shape[0], k.shape[1], q.shape[1])
            if lens is not None and len(set(lens)) > 1:
                lens, why = None, f"its key lengths differ across the batch ({list(lens)})"
            if lens is None:
                self.skipped.append(f"{layer} step {step}: attn_mask is set ({why})")
                return
            kept = lens[0]
            k, v = k[:, :kept], v[:, :kept]
        n = self._calls.get((layer, step), 0)
        if self.max_calls is not None and n >= self.max_calls:
            return
        self._calls[(layer, step)] = n + 1
        rows_q = _even_rows(q.shape[1], self.max_q_tokens, q.device)
        rows_kv = _even_rows(k.shape[1], self.max_kv_tokens, k.device)
        with torch.no_grad():
            if rows_q is not None:
                q = q.index_select(1, rows_q)
            if rows_kv is not None:
                k, v = k.index_select(1, rows_kv), v.index_select(1, rows_kv)
            q, k, v = (t.detach().to("cpu", copy=True).contiguous() for t in (q, k, v))
        path = self.out_dir / f"{layer}.step{step:03d}.call{n}.pt"
        torch.save({
            "q": q, "k": k, "v": v, "layout": "NHD", "layer": layer, "step": step, "call": n,
            "scale": kw.get("scale"), "is_causal": bool(kw.get("is_causal", False)),
            "q_len": int(kw["query"].shape[1]),
            "kv_len": int(kw["key"].shape[1] if kept is None else kept),
            "key_padding": kept is not None,  # the keys a key-padding mask kept (sliced)
            "context_parallel": kw.get("_parallel_config") is not None,
        }, path)
        self.files.append(path)


def capture_qkv(pipe_or_model, out_dir, *, layers=None, steps=None,
                max_q_tokens: int | None = None, max_kv_tokens: int | None = None,
                max_calls: int | None = None) -> Capture:
    """Record q, k, v of chosen attention layers and steps into ``out_dir`` (a context manager).

    Parameters
    ----------
    pipe_or_model : DiffusionPipeline or ModelMixin
        As for :func:`fp8dit.enable`; layer names get the pipeline attribute as a prefix
        (``"transformer.blocks.0.attn1"``), like
        :class:`fp8dit.integrations.guard.QualityPolicy` uses them.
    out_dir : str or Path
        Folder for the files ``<layer>.step<NNN>.call<n>.pt`` (created if missing).
    layers : iterable of str, optional
        Layer names or ``fnmatch`` patterns; default all attention layers.
    steps : iterable of int, optional
        Denoising steps to capture (default all); the step advances through
        ``callback_on_step_end=cap.on_step_end`` or ``cap.step(i)``, starting at 0.
    max_q_tokens, max_kv_tokens : int, optional
        Keep at most this many evenly spaced query rows (key/value rows); see the module notes.
    max_calls : int, optional
        Files per layer and step at most (classifier-free guidance calls a layer twice a step).

    Returns
    -------
    Capture, whose ``files`` lists the written paths and ``skipped`` the calls left out (an
    ``attn_mask`` other than key padding, which ``fp8dit check`` cannot apply; a key-padding
    mask that keeps the same prefix of keys in the whole batch, HunyuanVideo's, is saved as
    the kept keys, ``"key_padding": True``). Files saved from a context-parallel
    run hold each rank's local shard (``"context_parallel": True``).
    """
    return Capture(pipe_or_model, out_dir, layers=layers, steps=steps,
                   max_q_tokens=max_q_tokens, max_kv_tokens=max_kv_tokens, max_calls=max_calls)
