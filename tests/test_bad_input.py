"""Bad input at every public entry point gets a specific error that names the argument, what was
expected and what came; on the command line: a non-zero exit and one line on stderr.

Tables, one row per bad input: ``fp8dit.attention``, ``attention_varlen``, ``select_backend``,
the diffusers backend ``"fp8dit"`` with ``enable``/``disable``/``set_recipe``, and
``fp8dit demo|bench|check``. Cases already in test_api.py, test_bench_check.py, test_demo.py and
test_diffusers.py are not repeated. Every case fails in validation, before a kernel runs.

Also: the plan cache under threads with keys of several devices, and (GPU only) attention on
concurrent CUDA streams and on two devices against serial runs, bitwise.
"""

import re
import sys
import threading

import numpy as np
import pytest
import torch

import fp8dit
from fp8dit import plan as plan_mod
from fp8dit.plan import PlanKey
from fp8dit.testing import make_qkv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BF16 = torch.bfloat16


def _t(*shape, dtype=BF16, device=DEVICE):
    return torch.randn(*shape, device=device).to(dtype)


def _qkv(H=2, Hkv=None, S=8, D=64, layout="NHD"):
    """Tiny dense q, k, v: [1, S, H, D] (NHD) or [1, H, S, D] (HND)."""
    Hkv = H if Hkv is None else Hkv
    q, k, v = _t(1, S, H, D), _t(1, S, Hkv, D), _t(1, S, Hkv, D)
    if layout == "HND":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    return q, k, v


def _packed(T=10, H=2, D=64):
    """Packed q, k, v [T, H, D] and the offsets of two sequences (4 and 6 tokens)."""
    cu = torch.tensor([0, 4, T], dtype=torch.int32)
    return _t(T, H, D), _t(T, H, D), _t(T, H, D), cu


def _att(mutate=None, **kw):
    def call():
        q, k, v = _qkv()
        if mutate is not None:
            q, k, v = mutate(q, k, v)
        return fp8dit.attention(q, k, v, **kw)
    return call


def _varlen(mutate=None, *, cu_q=None, cu_k=None, max_q=10, max_k=10, **kw):
    def call():
        q, k, v, cu = _packed()
        if mutate is not None:
            q, k, v = mutate(q, k, v)
        cq = cu if cu_q is None else cu_q()
        ck = cu if cu_k is None else cu_k()
        return fp8dit.attention_varlen(q, k, v, cq, ck, max_q, max_k, **kw)
    return call


def _select(mutate=None, **kw):
    def call():
        q, k, v = _qkv()
        if mutate is not None:
            q, k, v = mutate(q, k, v)
        return fp8dit.select_backend(q, k, v, **kw)
    return call


NAMES = r"one of .*"  # the recipe list is fp8dit.RECIPES (test_recipe_errors_list_every_recipe)
F8 = torch.float8_e4m3fn

# (id, call, env, exception, regex naming the argument, what was expected and what came)
LIBRARY_CASES = [
    # -- fp8dit.attention: tensors -------------------------------------------------------------
    ("att-q-float8", _att(lambda q, k, v: (q.to(F8), k.to(F8), v.to(F8))), {}, TypeError,
     r"q: expected a floating-point dtype \(bfloat16, float16 or float32\), "
     r"got torch\.float8_e4m3fn"),
    ("att-q-complex", _att(lambda q, k, v: (torch.complex(q.float(), q.float()), k, v)), {},
     TypeError, r"q: expected a floating-point dtype .*got torch\.complex64"),
    ("att-q-float32-kv-bf16", _att(lambda q, k, v: (q.float(), k, v)), {}, TypeError,
     r"k: expected dtype torch\.float32 like q, got torch\.bfloat16"),
    ("att-q-meta-kv-real", _att(lambda q, k, v: (q.to("meta"), k, v)), {}, ValueError,
     rf"k: expected device meta like q, got {DEVICE}"),
    ("att-q-none", _att(lambda q, k, v: (None, k, v)), {}, TypeError,
     r"q: expected a torch\.Tensor, got NoneType"),
    ("att-k-numpy", _att(lambda q, k, v: (q, k.float().cpu().numpy(), v)), {}, TypeError,
     r"k: expected a torch\.Tensor, got ndarray"),
    ("att-hnd-k-5d", lambda: fp8dit.attention(_t(1, 2, 8, 64), _t(1, 2, 8, 64, 1),
                                              _t(1, 2, 8, 64), layout="HND"), {},
     ValueError, r"k: expected a 4-D tensor \[B, H, S, D\], got shape \(1, 2, 8, 64, 1\)"),
    ("att-hnd-v-seq-mismatch", lambda: fp8dit.attention(
        *_qkv(layout="HND")[:2], _qkv(layout="HND", S=4)[2], layout="HND"), {}, ValueError,
     r"v: expected the batch, sequence and head sizes of k \(1, 2, 8\), got shape "
     r"\(1, 2, 4, 64\)"),
    ("att-hnd-gqa-3-over-2", lambda: fp8dit.attention(
        *_qkv(H=3, Hkv=2, layout="HND"), layout="HND"), {}, ValueError,
     r"k: expected a number of kv heads that divides q's 3 heads \(GQA\), got 2"),
    ("att-gqa-more-kv-heads", lambda: fp8dit.attention(*_qkv(H=2, Hkv=4)), {}, ValueError,
     r"k: expected a number of kv heads that divides q's 2 heads \(GQA\), got 4"),
    ("att-gqa-zero-kv-heads", lambda: fp8dit.attention(*_qkv(H=2, Hkv=0)), {}, ValueError,
     r"k: expected a number of kv heads that divides q's 2 heads \(GQA\), got 0"),
    ("att-head-dim-0", lambda: fp8dit.attention(*_qkv(D=0)), {}, ValueError,
     r"q: expected head_dim of at least 1, got 0"),
    # -- fp8dit.attention: arguments -----------------------------------------------------------
    ("att-layout-lowercase", _att(layout="nhd"), {}, ValueError,
     r"layout: expected 'NHD' or 'HND', got 'nhd'"),
    ("att-layout-none", _att(layout=None), {}, ValueError,
     r"layout: expected 'NHD' or 'HND', got None"),
    ("att-scale-negative", _att(scale=-0.125), {}, ValueError,
     r"scale: expected a finite positive float, got -0\.125"),
    ("att-scale-inf", _att(scale=float("inf")), {}, ValueError,
     r"scale: expected a finite positive float, got inf"),
    ("att-scale-zero", _att(scale=0), {}, ValueError,
     r"scale: expected a finite positive float, got 0"),
    ("att-scale-tensor", _att(scale=torch.tensor(0.125)), {}, TypeError,
     r"scale: expected a float or None, got Tensor"),
    ("att-scale-bool", _att(scale=True), {}, TypeError,
     r"scale: expected a float or None, got bool"),
    ("att-num-splits-0", _att(num_splits=0), {}, ValueError,
     r"num_splits: expected None or a positive integer, got 0"),
    ("att-num-splits-negative", _att(num_splits=-3), {}, ValueError,
     r"num_splits: expected None or a positive integer, got -3"),
    ("att-num-splits-float", _att(num_splits=2.5), {}, TypeError,
     r"num_splits: expected None or a positive integer, got float"),
    ("att-num-splits-str", _att(num_splits="2"), {}, TypeError,
     r"num_splits: expected None or a positive integer, got str"),
    ("att-num-splits-bool", _att(num_splits=True), {}, TypeError,
     r"num_splits: expected None or a positive integer, got bool"),
    ("att-is-causal-str", _att(is_causal="yes"), {}, TypeError,
     r"is_causal: expected True or False, got 'yes'"),
    ("att-is-causal-none", _att(is_causal=None), {}, TypeError,
     r"is_causal: expected True or False, got None"),
    ("att-return-lse-int", _att(return_lse=1), {}, TypeError,
     r"return_lse: expected True or False, got 1"),
    ("att-backend-none", _att(backend=None), {}, ValueError,
     r"backend: expected one of auto, fp8, sdpa, got None"),
    ("att-recipe-int", _att(recipe=3), {}, TypeError,
     r"recipe: expected a recipe name \(str\) or None, got int"),
    # An unknown recipe fails on every path, not only where the FP8 path runs.
    ("att-recipe-unknown-sdpa", _att(recipe="nope", backend="sdpa"), {}, ValueError,
     rf"recipe: expected {NAMES}, got 'nope'"),
    ("att-recipe-unknown-fallback", _att(lambda q, k, v: (q.float(), k.float(), v.float()),
                                         recipe="nope"), {}, ValueError,
     rf"recipe: expected {NAMES}, got 'nope'"),
    ("att-env-recipe", _att(), {"FP8DIT_RECIPE": "nope"}, ValueError,
     rf"FP8DIT_RECIPE: expected {NAMES}, got 'nope'"),
    ("att-env-recipe-sdpa", _att(backend="sdpa"), {"FP8DIT_RECIPE": "int8"}, ValueError,
     rf"FP8DIT_RECIPE: expected {NAMES}, got 'int8'"),
    # -- fp8dit.select_backend -----------------------------------------------------------------
    ("sel-k-int", _select(lambda q, k, v: (q, 1, v)), {}, TypeError,
     r"k: expected a torch\.Tensor, got int"),
    ("sel-q-float8", _select(lambda q, k, v: (q.to(F8), k, v)), {}, TypeError,
     r"q: expected a floating-point dtype .*got torch\.float8_e4m3fn"),
    ("sel-v-float32", _select(lambda q, k, v: (q, k, v.float())), {}, TypeError,
     r"v: expected dtype torch\.bfloat16 like q, got torch\.float32"),
    ("sel-gqa-3-over-2", lambda: fp8dit.select_backend(*_qkv(H=3, Hkv=2)), {}, ValueError,
     r"k: expected a number of kv heads that divides q's 3 heads \(GQA\), got 2"),
    ("sel-layout", _select(layout="hnd"), {}, ValueError,
     r"layout: expected 'NHD' or 'HND', got 'hnd'"),
    ("sel-backend", _select(backend="triton"), {}, ValueError,
     r"backend: expected one of auto, fp8, sdpa, got 'triton'"),
    ("sel-is-causal", _select(is_causal="no"), {}, TypeError,
     r"is_causal: expected True or False, got 'no'"),
    # -- fp8dit.attention_varlen: tensors ------------------------------------------------------
    ("var-q-float8", _varlen(lambda q, k, v: (q.to(F8), k.to(F8), v.to(F8))), {}, TypeError,
     r"q: expected a floating-point dtype .*got torch\.float8_e4m3fn"),
    ("var-q-none", _varlen(lambda q, k, v: (None, k, v)), {}, TypeError,
     r"q: expected a torch\.Tensor, got NoneType"),
    ("var-k-2d", _varlen(lambda q, k, v: (q, k[:, 0], v)), {}, ValueError,
     r"k: expected a 3-D tensor \[T, H, D\], got shape \(10, 64\)"),
    ("var-v-tokens", _varlen(lambda q, k, v: (q, k, v[:5])), {}, ValueError,
     r"v: expected \[Tk, Hkv\] = \(10, 2\) like k, got shape \(5, 2, 64\)"),
    ("var-kv-head-dim", _varlen(lambda q, k, v: (q, k[..., :32], v[..., :32])), {}, ValueError,
     r"k: expected head_dim 64 like q, got 32"),
    ("var-gqa-3-over-2", _varlen(lambda q, k, v: (_t(10, 3, 64), k, v)), {}, ValueError,
     r"k: expected a number of kv heads that divides q's 3 heads \(GQA\), got 2"),
    ("var-v-float16", _varlen(lambda q, k, v: (q, k, v.half())), {}, TypeError,
     r"v: expected dtype torch\.bfloat16 like q, got torch\.float16"),
    ("var-k-meta", _varlen(lambda q, k, v: (q, k.to("meta"), v.to("meta"))), {}, ValueError,
     rf"k: expected device {DEVICE}.* like q, got meta"),
    # -- fp8dit.attention_varlen: offsets and lengths ------------------------------------------
    ("var-cu-list", _varlen(cu_q=lambda: [0, 4, 10]), {}, TypeError,
     r"cu_seqlens_q: expected a torch\.Tensor, got list"),
    ("var-cu-int16", _varlen(cu_q=lambda: torch.tensor([0, 4, 10], dtype=torch.int16)), {},
     TypeError, r"cu_seqlens_q: expected dtype int32 or int64, got torch\.int16"),
    ("var-cu-2d", _varlen(cu_q=lambda: torch.tensor([[0, 4, 10]], dtype=torch.int32)), {},
     ValueError, r"cu_seqlens_q: expected a 1-D tensor of batch \+ 1 offsets, got \(1, 3\)"),
    ("var-cu-one-offset", _varlen(cu_q=lambda: torch.tensor([0], dtype=torch.int32)), {},
     ValueError, r"cu_seqlens_q: expected a 1-D tensor of batch \+ 1 offsets, got \(1\)"),
    ("var-cu-negative-length", _varlen(cu_q=lambda: torch.tensor([0, -4, 10])), {}, ValueError,
     r"cu_seqlens_q: expected non-decreasing offsets, got \[0, -4, 10\]"),
    ("var-cu-huge-length", _varlen(cu_k=lambda: torch.tensor([0, 4, 2**40])), {}, ValueError,
     r"cu_seqlens_k: expected the last offset to equal the packed token count 10, "
     r"got 1099511627776"),
    ("var-cu-meta", _varlen(cu_k=lambda: torch.tensor([0, 4, 10]).to("meta")), {}, ValueError,
     r"cu_seqlens_k: expected a tensor with values \(cpu or cuda\), got a meta tensor"),
    ("var-max-seqlen-none", _varlen(max_q=None), {}, TypeError,
     r"max_seqlen_q: expected an integer, got NoneType"),
    ("var-max-seqlen-str", _varlen(max_k="10"), {}, TypeError,
     r"max_seqlen_k: expected an integer, got str"),
    ("var-max-seqlen-float", _varlen(max_q=6.5), {}, TypeError,
     r"max_seqlen_q: expected an integer, got float"),
    ("var-max-seqlen-bool", _varlen(max_q=True), {}, TypeError,
     r"max_seqlen_q: expected an integer, got bool"),
    ("var-max-seqlen-negative", _varlen(max_q=-1), {}, ValueError,
     r"max_seqlen_q: expected at least the longest sequence \(6\), got -1"),
    ("var-max-seqlen-zero", _varlen(max_k=0), {}, ValueError,
     r"max_seqlen_k: expected at least the longest sequence \(6\), got 0"),
    # -- fp8dit.attention_varlen: arguments ----------------------------------------------------
    ("var-scale-nan", _varlen(scale=float("nan")), {}, ValueError,
     r"scale: expected a finite positive float, got nan"),
    ("var-scale-negative", _varlen(scale=-1.0), {}, ValueError,
     r"scale: expected a finite positive float, got -1\.0"),
    ("var-scale-str", _varlen(scale="0.1"), {}, TypeError,
     r"scale: expected a float or None, got str"),
    ("var-num-splits-0", _varlen(num_splits=0), {}, ValueError,
     r"num_splits: expected None or a positive integer, got 0"),
    ("var-is-causal-int", _varlen(is_causal=1), {}, TypeError,
     r"is_causal: expected True or False, got 1"),
    ("var-backend", _varlen(backend="fa3"), {}, ValueError,
     r"backend: expected one of auto, fp8, sdpa, got 'fa3'"),
    ("var-recipe-unknown-sdpa", _varlen(recipe="nope", backend="sdpa"), {}, ValueError,
     rf"recipe: expected {NAMES}, got 'nope'"),
    ("var-env-recipe", _varlen(), {"FP8DIT_RECIPE": "nope"}, ValueError,
     rf"FP8DIT_RECIPE: expected {NAMES}, got 'nope'"),
]


@pytest.mark.parametrize("call, env, exc, pattern",
                         [pytest.param(*row[1:], id=row[0]) for row in LIBRARY_CASES])
def test_library_bad_input(monkeypatch, call, env, exc, pattern):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(exc, match=pattern):
        call()


def test_recipe_errors_list_every_recipe(monkeypatch):
    """The recipe messages list fp8dit.RECIPES as it is (recipes may be added)."""
    q, k, v = _qkv()
    with pytest.raises(ValueError) as by_argument:
        fp8dit.attention(q, k, v, recipe="nope", backend="sdpa")
    monkeypatch.setenv("FP8DIT_RECIPE", "nope")
    with pytest.raises(ValueError) as by_env:
        fp8dit.attention(q, k, v, backend="sdpa")
    for msg in (str(by_argument.value), str(by_env.value)):
        assert all(name in msg for name in fp8dit.RECIPES), msg


def test_valid_edge_values_still_pass(monkeypatch):
    """The checks reject wrong types and values, not values that were always fine."""
    q, k, v, cu = _packed()
    for bound in (np.int64(6), torch.tensor(6), 2**40):
        out = fp8dit.attention_varlen(q, k, v, cu, cu, bound, bound, backend="sdpa")
        assert out.shape == q.shape
    q, k, v = _qkv()
    for name in fp8dit.RECIPES:  # every recipe, by argument and by FP8DIT_RECIPE
        assert fp8dit.attention(q, k, v, recipe=name, backend="sdpa").shape == q.shape
        monkeypatch.setenv("FP8DIT_RECIPE", name)
        assert fp8dit.attention(q, k, v, backend="sdpa").shape == q.shape


# ---------------------------------------------------------------------------------------------
# diffusers: the registered backend function and enable / disable / set_recipe
# ---------------------------------------------------------------------------------------------


def _backend_fn():
    pytest.importorskip("diffusers")
    import diffusers.models.attention_dispatch as ad

    from fp8dit.integrations import diffusers as fd

    member = fd.register()
    return ad._AttentionBackendRegistry._backends[member]


def _mask(B=1, Sk=8):
    return torch.ones(B, Sk, dtype=torch.bool, device=DEVICE)


def _be(mutate=None, **kw):
    def call():
        q, k, v = _qkv()
        if mutate is not None:
            q, k, v = mutate(q, k, v)
        return _backend_fn()(q, k, v, **kw)
    return call


def _fd(fn_name, *args, **kw):
    def call():
        pytest.importorskip("diffusers")
        from fp8dit.integrations import diffusers as fd

        return getattr(fd, fn_name)(*args, **kw)
    return call


class _Model:
    """Enough of a diffusers model for enable() to get as far as its policy."""

    def set_attention_backend(self, name):
        raise AssertionError("enable() must fail before it touches a model")

    def modules(self):
        return iter(())


class _Policy:
    def __init__(self, recipe):
        self.recipe = recipe

    def backend_for(self, layer_name):
        return "fp8dit"


DIFFUSERS_CASES = [
    # The SDPA fallback (a mask or dropout) used to reach .shape / torch errors unchecked.
    ("be-query-str-with-mask", _be(lambda q, k, v: ("q", k, v), attn_mask=_mask()), {},
     TypeError, r"q: expected a torch\.Tensor, got str"),
    ("be-mask-str", _be(attn_mask="causal"), {}, TypeError,
     r"attn_mask: expected None or a torch\.Tensor, got str"),
    ("be-mask-shape", _be(attn_mask=torch.ones(3, 5, dtype=torch.bool)), {}, ValueError,
     r"attn_mask: expected a shape that broadcasts to \[B, H, Sq, Sk\] = \(1, 2, 8, 8\) "
     r"\(or \[B, Sk\]\), got \(3, 5\)"),
    ("be-dropout-negative", _be(dropout_p=-0.5), {}, ValueError,
     r"dropout_p: expected a float in \[0, 1\], got -0\.5"),
    ("be-dropout-over-1", _be(dropout_p=1.5), {}, ValueError,
     r"dropout_p: expected a float in \[0, 1\], got 1\.5"),
    ("be-dropout-nan", _be(dropout_p=float("nan")), {}, ValueError,
     r"dropout_p: expected a float in \[0, 1\], got nan"),
    ("be-dropout-str", _be(dropout_p="0.1"), {}, TypeError,
     r"dropout_p: expected a float in \[0, 1\], got str"),
    ("be-mask-gqa-3-over-2", lambda: _backend_fn()(*_qkv(H=3, Hkv=2), attn_mask=_mask()), {},
     ValueError, r"k: expected a number of kv heads that divides q's 3 heads \(GQA\), got 2"),
    ("be-mask-dtype-mix", _be(lambda q, k, v: (q, k.half(), v), attn_mask=_mask()), {},
     TypeError, r"k: expected dtype torch\.bfloat16 like q, got torch\.float16"),
    ("be-mask-query-3d", _be(lambda q, k, v: (q[0], k, v), attn_mask=_mask()), {}, ValueError,
     r"q: expected a 4-D tensor \[B, S, H, D\], got shape \(8, 2, 64\)"),
    ("be-mask-scale-negative", _be(attn_mask=_mask(), scale=-1.0), {}, ValueError,
     r"scale: expected a finite positive float, got -1\.0"),
    # The FP8 path (no mask) goes through fp8dit.attention's checks.
    ("be-scale-nan", _be(scale=float("nan")), {}, ValueError,
     r"scale: expected a finite positive float, got nan"),
    ("be-is-causal-str", _be(is_causal="x"), {}, TypeError,
     r"is_causal: expected True or False, got 'x'"),
    ("be-return-lse-str", _be(return_lse="yes"), {}, TypeError,
     r"return_lse: expected True or False, got 'yes'"),
    ("be-key-head-dim", _be(lambda q, k, v: (q, k[..., :32], v)), {}, ValueError,
     r"k: expected head_dim 64 like q, got 32"),
    ("be-env-recipe", _be(), {"FP8DIT_RECIPE": "nope"}, ValueError,
     rf"FP8DIT_RECIPE: expected {NAMES}, got 'nope'"),
    # set_recipe / enable / disable
    ("set-recipe-unknown", _fd("set_recipe", "nope"), {}, ValueError,
     rf"recipe: expected {NAMES}, got 'nope'"),
    ("set-recipe-empty", _fd("set_recipe", ""), {}, ValueError,
     rf"recipe: expected {NAMES}, got ''"),
    ("set-recipe-int", _fd("set_recipe", 3), {}, TypeError,
     r"recipe: expected a recipe name \(str\) or None, got int"),
    ("enable-none", lambda: fp8dit.enable(None), {}, TypeError,
     r"pipe_or_model: expected a diffusers model .*got NoneType"),
    ("enable-policy-recipe-unknown", lambda: fp8dit.enable(_Model(), policy=_Policy("fp4")),
     {}, ValueError, rf"policy\.recipe: expected {NAMES}, got 'fp4'"),
    ("enable-policy-recipe-int", lambda: fp8dit.enable(_Model(), policy=_Policy(8)), {},
     TypeError, r"policy\.recipe: expected a recipe name \(str\) or None, got int"),
    ("disable-str", _fd("disable", "pipe"), {}, TypeError,
     r"pipe_or_model: expected a diffusers model .*got str"),
]


@pytest.mark.parametrize("call, env, exc, pattern",
                         [pytest.param(*row[1:], id=row[0]) for row in DIFFUSERS_CASES])
def test_diffusers_bad_input(monkeypatch, call, env, exc, pattern):
    pytest.importorskip("diffusers")
    from fp8dit.integrations import diffusers as fd

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    recipe = fd._recipe
    with pytest.raises(exc, match=pattern):
        call()
    assert fd._recipe == recipe  # a refused recipe changes nothing


def test_diffusers_dispatcher_reports_the_same_errors():
    """Through diffusers' own dispatch_attention_fn, as a model's attention calls it."""
    pytest.importorskip("diffusers")
    from diffusers.models.attention_dispatch import attention_backend, dispatch_attention_fn

    _backend_fn()
    q, k, v = _qkv(H=3, Hkv=2)
    with attention_backend("fp8dit"):
        with pytest.raises(ValueError, match=r"divides q's 3 heads \(GQA\), got 2"):
            dispatch_attention_fn(q, k, v)
        with pytest.raises(ValueError, match=r"dropout_p: expected a float in \[0, 1\]"):
            dispatch_attention_fn(*_qkv(), dropout_p=-1.0)


# ---------------------------------------------------------------------------------------------
# Command line: fp8dit demo | bench | check through fp8dit.tools.cli.main
# ---------------------------------------------------------------------------------------------

NO_DIR = "{tmp}/no-such-dir"
# A model checkpoint where captured q, k, v belong (the format errors are in test_bench_check).
WRONG_FILES = {"state.pt": {"weight": torch.zeros(2, 2)}}

# (id, argv, env, regex of the one stderr line: the option, what was expected and what came)
CLI_CASES = [
    ("cmd-unknown", ["render"], {}, r"fp8dit: error: argument .*invalid choice: 'render'"),
    ("demo-preset", ["demo", "--preset", "nope"], {},
     r"fp8dit demo: error: argument --preset: invalid choice: 'nope' \(choose from .*tiny"),
    ("demo-layers-0", ["demo", "--layers", "0"], {},
     r"argument --layers: expected an integer of at least 1, got '0'"),
    ("demo-steps-negative", ["demo", "--steps", "-1"], {},
     r"argument --steps: expected an integer of at least 1, got '-1'"),
    ("demo-seed-str", ["demo", "--seed", "one"], {},
     r"argument --seed: invalid int value: 'one'"),
    ("demo-out-no-dir", ["demo", "--out", NO_DIR + "/x.png"], {},
     r"argument --out: expected a file path in an existing directory, got '.*no-such-dir/x\.png'"),
    ("demo-unknown-option", ["demo", "--frames", "81"], {},
     r"unrecognized arguments: --frames 81"),
    ("demo-env-recipe", ["demo"], {"FP8DIT_RECIPE": "nope"},
     rf"fp8dit demo: error: FP8DIT_RECIPE: expected {NAMES}, got 'nope'"),
    ("demo-env-backend", ["demo"], {"FP8DIT_BACKEND": "cudnn"},
     r"fp8dit demo: error: FP8DIT_BACKEND: expected one of auto, fp8, sdpa, got 'cudnn'"),
    # bench checks its arguments before it looks for a GPU
    ("bench-shape-3", ["bench", "--shape", "1,2,3"], {},
     r"fp8dit bench: error: --shape: expected B,H,S,D.*got '1,2,3' \(3 values\)"),
    ("bench-preset", ["bench", "--preset", "nope"], {},
     r"fp8dit bench: error: --preset: unknown preset 'nope'; expected 'all', 'models' or one of"),
    ("bench-recipe", ["bench", "--recipe", "nope"], {},
     rf"fp8dit bench: error: --recipe: expected {NAMES}, got 'nope'"),
    ("bench-env-recipe", ["bench", "--smoke"], {"FP8DIT_RECIPE": "nope"},
     rf"fp8dit bench: error: FP8DIT_RECIPE: expected {NAMES}, got 'nope'"),
    ("bench-layout", ["bench", "--layout", "BSHD"], {},
     r"argument --layout: invalid choice: 'BSHD'"),
    ("bench-warmup-negative", ["bench", "--smoke", "--warmup", "-1"], {},
     r"--warmup: expected a positive number, got -1"),
    ("bench-sets-0", ["bench", "--sets", "0"], {}, r"--sets: expected a positive number, got 0"),
    ("bench-max-ms-nan", ["bench", "--max-ms", "nan"], {},
     r"--max-ms: expected a positive number, got nan"),
    ("bench-plot-no-dir", ["bench", "--smoke", "--plot", NO_DIR + "/b.png"], {},
     r"--plot(: expected a file path in an existing directory, got '.*no-such-dir/b\.png'"
     r"| needs matplotlib)"),
    ("bench-from-json-missing", ["bench", "--from-json", "{tmp}/none.json"], {},
     r"--from-json: .*none\.json: no rows \(missing or empty file\)"),
    # check
    ("check-preset", ["check", "--preset", "nope"], {},
     r"fp8dit check: error: --preset: unknown preset 'nope'"),
    ("check-inputs-state-dict", ["check", "--inputs", "{tmp}/state.pt"], {},
     r"--inputs: .*state\.pt is a dict without key\(s\) 'q', 'k', 'v' \(has 'weight'\)"),
    ("check-out-json-no-dir", ["check", "--out-json", NO_DIR + "/c.json"], {},
     r"--out-json: expected a file path in an existing directory, got '.*no-such-dir/c\.json'"),
    ("check-plot-no-dir", ["check", "--plot", NO_DIR + "/c.png"], {},
     r"--plot(: expected a file path in an existing directory, got '.*no-such-dir/c\.png'"
     r"| needs matplotlib)"),
    ("check-seed-str", ["check", "--seed", "x"], {}, r"argument --seed: invalid int value: 'x'"),
]


@pytest.mark.parametrize("argv, env, pattern",
                         [pytest.param(*row[1:], id=row[0]) for row in CLI_CASES])
def test_cli_bad_input(monkeypatch, capsys, tmp_path, argv, env, pattern):
    from fp8dit.tools import cli

    for name, obj in WRONG_FILES.items():
        torch.save(obj, tmp_path / name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # nothing may be written where the tests run
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        rc = cli.main(argv)  # any exception but SystemExit fails the test: no traceback
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    assert rc not in (0, None)
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert re.search(pattern, lines[0]), lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(WRONG_FILES)  # wrote nothing


def test_check_inputs_with_mixed_dtypes_runs(tmp_path, capsys):
    """q float16, k bfloat16, v float32 in one file: one kernel dtype, not a row of errors."""
    from fp8dit.tools import cli

    q, k, v = make_qkv(1, 2, 16, 64, dtype=torch.float32, seed=3)
    path = tmp_path / "mixed.pt"
    torch.save({"q": q.half(), "k": k.bfloat16(), "v": v}, path)
    rc = cli.main(["check", "--inputs", str(path), "--recipes", "sdpa", "--no-speed"])
    out = capsys.readouterr().out
    assert rc == 0, out
    row = next(line for line in out.splitlines() if line.startswith("sdpa "))
    assert "Error" not in row and float(row.split()[2]) > 0.999


# ---------------------------------------------------------------------------------------------
# The plan cache under threads, with keys that differ only in their device
# ---------------------------------------------------------------------------------------------


def _plan_key(S: int, causal: bool, device: str) -> PlanKey:
    return PlanKey(q_lens=(S,), k_lens=(S,), varlen=False, num_heads=2, num_kv_heads=2,
                   head_dim=64, is_causal=causal, block_m=64, block_n=64, num_programs=4,
                   num_splits=None, device=device)


def test_plan_cache_threads_per_device_keys(monkeypatch):
    # build_plan never touches the device; only Plan.tables() would (not called here).
    limit = 4
    monkeypatch.setenv("FP8DIT_PLAN_CACHE", str(limit))
    devices = ("cpu", "cuda", "cuda:0", "cuda:1")
    keys = [_plan_key(S, S == 192, dev) for S in (64, 130, 192) for dev in devices]
    assert len(set(keys)) == len(keys) == 12
    plan_mod.clear_plan_cache()
    n_threads, rounds = 2 * len(keys), 25
    barrier = threading.Barrier(n_threads)
    errors, sizes = [], []

    def worker(i):
        key = keys[i % len(keys)]
        try:
            barrier.wait()
            for _ in range(rounds):
                plan = plan_mod.get_plan(key)
                if plan.key != key or plan.key.device != key.device:
                    errors.append(f"thread {i} asked for {key}, got {plan.key}")
                sizes.append(plan_mod.plan_cache_info()["size"])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often: interleave inside get_plan
    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old_interval)
    assert not errors, errors[:5]
    assert len(sizes) == n_threads * rounds and max(sizes) <= limit
    # LRU order, with keys that differ only in device: the least recently used one goes.
    plan_mod.clear_plan_cache()
    same_shape = [_plan_key(64, False, dev) for dev in devices]
    first = [plan_mod.get_plan(k) for k in same_shape]
    assert len({id(p) for p in first}) == limit
    assert [p.key.device for p in first] == list(devices)
    assert plan_mod.get_plan(same_shape[0]) is first[0]  # hit; now the most recent
    plan_mod.get_plan(_plan_key(130, False, "cuda:1"))  # evicts same_shape[1] ("cuda")
    assert plan_mod.plan_cache_info()["size"] == limit
    assert plan_mod.get_plan(same_shape[0]) is first[0]
    assert plan_mod.get_plan(same_shape[1]) is not first[1]  # was evicted, rebuilt
    plan_mod.clear_plan_cache()


# ---------------------------------------------------------------------------------------------
# GPU: concurrent streams and devices give the serial results, bitwise
# ---------------------------------------------------------------------------------------------


def _run_all(inputs):
    return [fp8dit.attention(q, k, v, backend="fp8", return_lse=True) for q, k, v in inputs]


def _assert_bitwise(got, want):
    for i, ((o, lse), (o_ref, lse_ref)) in enumerate(zip(got, want)):
        assert torch.equal(o, o_ref), f"output {i} differs from the serial run"
        assert torch.equal(lse, lse_ref), f"lse {i} differs from the serial run"


@pytest.mark.gpu
def test_concurrent_streams_match_serial_bitwise():
    dev = torch.device("cuda")
    # Two inputs share a shape (one plan, built and uploaded inside the concurrent phase).
    shapes = [(1, 16, 8192, 128), (1, 16, 8192, 128), (2, 5, 3001, 64)]
    inputs = [make_qkv(B, H, S, D, device=dev, seed=i) for i, (B, H, S, D) in enumerate(shapes)]
    _run_all([make_qkv(1, 2, 200, D, device=dev) for D in (64, 128)])  # compile the kernels
    plan_mod.clear_plan_cache()
    main = torch.cuda.current_stream(dev)
    streams = [torch.cuda.Stream(dev) for _ in inputs]
    for _ in range(3):
        got = []
        for stream, (q, k, v) in zip(streams, inputs):
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                got.append(fp8dit.attention(q, k, v, backend="fp8", return_lse=True))
        for stream in streams:
            main.wait_stream(stream)
        torch.cuda.synchronize(dev)
        want = _run_all(inputs)
        torch.cuda.synchronize(dev)
        _assert_bitwise(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_devices_match_serial_bitwise():
    devs = [torch.device("cuda", i) for i in range(2)]
    base = make_qkv(1, 16, 8192, 128, device="cpu", seed=7)
    inputs = [tuple(t.to(d) for t in base) for d in devs]
    plan_mod.clear_plan_cache()
    # Both devices' work is queued before either is waited for; the current device is not
    # switched: a caller with tensors on cuda:1 does not have to.
    got = _run_all(inputs)
    for d in devs:
        torch.cuda.synchronize(d)
    want = []
    for x, d in zip(inputs, devs):
        want += _run_all([x])
        torch.cuda.synchronize(d)
    _assert_bitwise(got, want)
    assert all(o.device == d for (o, _), d in zip(got, devs))
    if torch.cuda.get_device_name(0) == torch.cuda.get_device_name(1):
        assert torch.equal(got[0][0].cpu(), got[1][0].cpu())
