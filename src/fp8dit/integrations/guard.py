"""Quality guard: keep chosen attention layers or denoising steps in bf16, and propose which.

A :class:`QualityPolicy` is what :func:`fp8dit.enable` asks per layer (``backend_for``), plus a
recipe for the FP8 layers and a per-step switch. :func:`measure_captured` measures a recipe on
tensors captured from the real model (:func:`fp8dit.integrations.capture.capture_qkv`), and
:func:`propose_policy` turns those errors into a policy: layers over the budget stay in bf16.

Example
-------
>>> from fp8dit.integrations.capture import capture_qkv
>>> with capture_qkv(pipe, "qkv/", steps=[0, 10, 40], max_q_tokens=4096) as cap:
...     pipe(prompt, num_inference_steps=50, callback_on_step_end=cap.on_step_end)
>>> policy = propose_policy(measure_captured("qkv/"), budget=0.03, bf16_steps=range(2))
>>> policy.apply(pipe)
>>> pipe(prompt, num_inference_steps=50, callback_on_step_end=policy.on_step_end)

Per-step switching sets each attention processor's backend, so under ``torch.compile`` a step
that changes the choice recompiles the transformer once (dynamo guards on the processor).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..recipes import get_recipe

__all__ = ["QualityPolicy", "measure_captured", "propose_policy"]

FP8_BACKEND = "fp8dit"


class QualityPolicy:
    """Which attention layers and denoising steps run in bf16; the recipe of the others.

    Parameters
    ----------
    bf16_layers : iterable of str
        Layer names as :func:`fp8dit.integrations.diffusers.layer_backends` prints them
        (``"blocks.0.attn1"``; ``"transformer.blocks.0.attn1"`` when enabled on a pipeline), or
        ``fnmatch`` patterns (``"*.attn2"``, ``"blocks.[0-3].*"``).
    bf16_steps : iterable of int
        Denoising steps (0-based) in which every layer runs in bf16. Needs the step to be known:
        :meth:`step` or :meth:`on_step_end` (see :meth:`apply`).
    recipe : str, optional
        Recipe of the FP8 layers (``fp8dit.recipes.RECIPES``); ``None``: ``FP8DIT_RECIPE`` or the
        default.
    bf16_backend : str
        diffusers backend of the bf16 layers and steps (``"native"``: torch SDPA in the model's
        dtype).

    Example
    -------
    >>> policy = QualityPolicy(bf16_layers=["blocks.0.*"], bf16_steps=[0, 1])
    >>> policy.apply(pipe)
    >>> pipe(prompt, callback_on_step_end=policy.on_step_end)
    """

    def __init__(self, bf16_layers: Iterable[str] = (), bf16_steps: Iterable[int] = (),
                 recipe: str | None = None, bf16_backend: str = "native"):
        if isinstance(bf16_layers, str):
            bf16_layers = [bf16_layers]
        self.bf16_layers = tuple(dict.fromkeys(bf16_layers))
        for name in self.bf16_layers:
            if not isinstance(name, str):
                raise TypeError(f"bf16_layers: expected layer names (str), got {name!r}")
        steps = []
        for s in bf16_steps:
            if isinstance(s, bool) or not isinstance(s, int) or s < 0:
                raise ValueError(f"bf16_steps: expected non-negative integers, got {s!r}")
            steps.append(s)
        self.bf16_steps = frozenset(steps)
        self.recipe = None if recipe is None else get_recipe(recipe).name
        if not isinstance(bf16_backend, str) or bf16_backend == FP8_BACKEND:
            raise ValueError(f"bf16_backend: expected a non-FP8 diffusers backend name such as "
                             f"'native', got {bf16_backend!r}")
        self.bf16_backend = bf16_backend
        self.current_step = 0
        self._targets: list = []

    def __repr__(self) -> str:
        return (f"QualityPolicy(bf16_layers={list(self.bf16_layers)}, "
                f"bf16_steps={sorted(self.bf16_steps)}, recipe={self.recipe!r})")

    # -- what the diffusers adapter asks ----------------------------------------------------------

    def keeps_bf16(self, layer_name: str) -> bool:
        """Whether the layer is kept in bf16 at every step."""
        return any(fnmatch.fnmatchcase(layer_name, p) for p in self.bf16_layers)

    def backend_for(self, layer_name: str, step: int | None = None) -> str:
        """diffusers backend of a layer at ``step`` (default: the current step)."""
        step = self.current_step if step is None else step
        if step in self.bf16_steps or self.keeps_bf16(layer_name):
            return self.bf16_backend
        return FP8_BACKEND

    # -- applying it -------------------------------------------------------------------------------

    def apply(self, pipe_or_model):
        """``fp8dit.enable(pipe_or_model, policy=self)``, remembering the model(s) for :meth:`step`.

        Starts at step 0. Returns ``pipe_or_model``.
        """
        from . import diffusers as fd

        layers = list(fd.layer_backends(pipe_or_model))  # CogVideoX's too, before enable
        unmatched = [p for p in self.bf16_layers
                     if not any(fnmatch.fnmatchcase(layer, p) for layer in layers)]
        if unmatched:
            raise ValueError(
                f"bf16_layers: {', '.join(map(repr, unmatched))} match no attention layer; the "
                f"layers are: {', '.join(layers[:8])}{', ...' if len(layers) > 8 else ''}"
            )
        self.current_step = 0
        fd.enable(pipe_or_model, policy=self)
        if all(t is not pipe_or_model for t in self._targets):
            self._targets.append(pipe_or_model)
        return pipe_or_model

    def step(self, i: int) -> _StepScope:
        """Make ``i`` the current step and route every applied layer accordingly.

        Works as a call (``policy.step(i)``) or as a context manager that restores the previous
        step on exit (``with policy.step(i): transformer(...)``).
        """
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise ValueError(f"step: expected a non-negative integer, got {i!r}")
        previous = self.current_step
        self._switch(i)
        return _StepScope(self, previous)

    def on_step_end(self, pipe, i: int, t, callback_kwargs: dict) -> dict:
        """diffusers' ``callback_on_step_end``: step ``i`` ended, route step ``i + 1``.

        After the pipeline's last step (``pipe.num_timesteps``) it goes back to step 0, so the
        next call of the pipeline starts right.
        """
        nxt = i + 1
        total = getattr(pipe, "num_timesteps", None)
        if isinstance(total, int) and nxt >= total:
            nxt = 0
        self._switch(nxt)
        return callback_kwargs

    def _switch(self, i: int) -> None:
        changed = (i in self.bf16_steps) != (self.current_step in self.bf16_steps)
        self.current_step = i
        if changed:
            for target in self._targets:
                _route(target, self)


class _StepScope:
    def __init__(self, policy: QualityPolicy, previous: int):
        self._policy, self._previous = policy, previous

    def __enter__(self) -> QualityPolicy:
        return self._policy

    def __exit__(self, *exc) -> None:
        self._policy._switch(self._previous)


def _layers(pipe_or_model):
    """(layer name, attention processor) of a model or a pipeline's transformer(s), named as
    :func:`fp8dit.integrations.diffusers.layer_backends` names them."""
    from . import diffusers as fd

    for prefix, model in fd._models(pipe_or_model):
        for name, processor in fd._attention_processors(model):
            yield ".".join(p for p in (prefix, name) if p), processor


def _route(pipe_or_model, policy: QualityPolicy) -> None:
    """Set every attention processor's backend to ``policy.backend_for(layer)``."""
    from . import diffusers as fd

    names = fd._dispatch().AttentionBackendName
    for layer, processor in _layers(pipe_or_model):
        processor._attention_backend = names(policy.backend_for(layer))


# ---------------------------------------------------------------------------------------------
# Measuring captured tensors and proposing a policy
# ---------------------------------------------------------------------------------------------


def measure_captured(inputs, recipe: str | None = None, *, device=None) -> list[dict]:
    """Error of ``recipe`` against fp64 on each captured file.

    Parameters
    ----------
    inputs : str, Path or iterable of them
        A folder written by :func:`fp8dit.integrations.capture.capture_qkv` (its ``*.pt``
        files) or files in the
        ``fp8dit check --inputs`` format.
    recipe : str, optional
        Recipe to measure (default ``FP8DIT_RECIPE`` or the default recipe).
    device : optional
        Where to run (default: CUDA when available, else the CPU interpreter).

    Returns
    -------
    One dict per file: ``layer``, ``step``, ``call`` (``None`` when the file does not say),
    ``path``, ``recipe``, and the :class:`fp8dit.testing.ErrorStats` fields (``cos``,
    ``rel_l1``, ``rmse``, ``max_abs``, ``nan``).
    """
    import torch

    import fp8dit

    from ..testing import attention_ref, error_stats
    from ..tools.check import load_inputs

    paths = _captured_paths(inputs)
    rec = get_recipe(recipe).name
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    rows = []
    for path in paths:
        q, k, v = load_inputs(str(path))
        # Again for the metadata only: mmap reads no tensor data.
        meta = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        meta = meta if isinstance(meta, dict) else {}
        scale = meta.get("scale")
        q, k, v = (t.to(device) for t in (q, k, v))
        ref = attention_ref(q, k, v, scale=scale)
        qk = [t if t.dtype in (torch.bfloat16, torch.float16) else t.to(torch.bfloat16)
              for t in (q, k, v)]
        out = fp8dit.attention(*qk, scale=scale, backend="fp8", recipe=rec)
        rows.append(dict(error_stats(out, ref).as_dict(), layer=meta.get("layer"),
                         step=meta.get("step"), call=meta.get("call"), path=str(path),
                         recipe=rec))
    return rows


def _captured_paths(inputs) -> list[Path]:
    if isinstance(inputs, (str, Path)):
        p = Path(inputs)
        if p.is_dir():
            paths = sorted(p.glob("*.pt"))
            if not paths:
                raise FileNotFoundError(f"inputs: no *.pt files in {p}")
            return paths
        return [p]
    return [Path(x) for x in inputs]


def _error_of(value, metric: str) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, Mapping):
        if value.get("nan"):
            return math.inf
        return float(value[metric])
    if getattr(value, "nan", False):
        return math.inf
    return float(getattr(value, metric))


def propose_policy(check_results, budget: float, *, metric: str = "rel_l1",
                   recipe: str | None = None, bf16_steps: Iterable[int] = (),
                   bf16_backend: str = "native") -> QualityPolicy:
    """A policy that keeps every layer whose error exceeds ``budget`` in bf16.

    Parameters
    ----------
    check_results
        Per-layer errors: a mapping ``{layer: error}`` or ``{(layer, step): error}``, or rows
        with a ``"layer"`` key such as :func:`measure_captured` returns. An error is a float, an
        :class:`fp8dit.testing.ErrorStats` or a dict with ``metric``; NaN counts as over budget.
        A layer measured at several steps or calls is judged by its worst one.
    budget : float
        Largest acceptable error (e.g. rel-L1 0.03).
    metric : str
        Field of the error to compare (``"rel_l1"``, ``"rmse"``, ``"max_abs"``); for ``"cos"``
        the test is ``1 - cos > budget``.
    recipe, bf16_steps, bf16_backend
        Passed to :class:`QualityPolicy` (``recipe`` defaults to the rows' recipe when they
        all name the same one).

    Returns
    -------
    QualityPolicy, with ``.errors`` (the worst error per layer) and ``.budget`` attached.

    Example
    -------
    >>> propose_policy({"blocks.0.attn1": 0.05, "blocks.1.attn1": 0.01}, budget=0.03)
    QualityPolicy(bf16_layers=['blocks.0.attn1'], bf16_steps=[], recipe=None)
    """
    if not (isinstance(budget, (int, float)) and budget >= 0 and math.isfinite(budget)):
        raise ValueError(f"budget: expected a finite non-negative number, got {budget!r}")
    if isinstance(check_results, Mapping):
        items = [(k[0] if isinstance(k, tuple) else k, v) for k, v in check_results.items()]
        recipes = set()
    else:
        rows = list(check_results)
        missing = [r for r in rows if not isinstance(r, Mapping) or r.get("layer") is None]
        if missing:
            raise ValueError("check_results: expected rows with a 'layer' key (as "
                             f"measure_captured returns), got {missing[0]!r}")
        items = [(r["layer"], r) for r in rows]
        recipes = {r.get("recipe") for r in rows}
    worst: dict[str, float] = {}
    for layer, value in items:
        err = _error_of(value, metric)
        if metric == "cos":
            err = 1.0 - err
        if math.isnan(err):
            err = math.inf
        worst[layer] = max(worst.get(layer, -math.inf), err)
    if recipe is None and len(recipes) == 1:
        recipe = next(iter(recipes))
    over = sorted(layer for layer, err in worst.items() if err > budget)
    policy = QualityPolicy(bf16_layers=over, bf16_steps=bf16_steps, recipe=recipe,
                           bf16_backend=bf16_backend)
    policy.errors = worst
    policy.budget = budget
    return policy
