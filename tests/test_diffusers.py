"""The diffusers backend "fp8dit": registration, guard on diffusers internals, tiny Wan, LSE."""

# TRITON_INTERPRET=1 (no GPU) is set by conftest.py before triton is imported.

import logging
import os
import subprocess
import sys
import types

import pytest
import torch

pytest.importorskip("diffusers")

import diffusers.models.attention_dispatch as ad  # noqa: E402
from conftest import explain_with_fp8dit  # noqa: E402

import fp8dit  # noqa: E402
from fp8dit.integrations import diffusers as fd  # noqa: E402
from fp8dit.integrations.capture import attention_layer_outputs  # noqa: E402
from fp8dit.testing import attention_ref, error_stats  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


pytestmark = pytest.mark.usefixtures("diffusers_state", "fp8_at_any_length")




# ---------------------------------------------------------------------------------------------
# Guard on diffusers internals
# ---------------------------------------------------------------------------------------------


def test_guard_diffusers_internals_fit():
    problems = fd.diffusers_internals_problems()
    assert problems == [], (
        "fp8dit's diffusers adapter relies on private diffusers internals that changed: "
        + "; ".join(problems)
    )


def test_guard_fails_loudly_when_internals_change(monkeypatch):
    monkeypatch.delattr(ad, "_templated_context_parallel_attention")

    def changed_op(ctx, q, k, v, mask=None):
        pass

    monkeypatch.setattr(ad, "_native_attention_forward_op", changed_op)
    problems = fd.diffusers_internals_problems()
    assert any("_templated_context_parallel_attention" in p for p in problems)
    assert any("_native_attention_forward_op" in p for p in problems)
    with pytest.raises(RuntimeError, match="does not fit diffusers .*_templated_context_parallel"):
        fd.register()


def test_backend_is_registered_once():
    member = fd.register()
    again = fd.register()
    names = ad.AttentionBackendName
    assert again is member and names("fp8dit") is member and names.FP8DIT is member
    assert "fp8dit" in {m.value for m in names.__members__.values()}
    assert names._member_names_.count("FP8DIT") == 1
    assert ad._AttentionBackendRegistry._backends[member] is fd.fp8dit_attention
    assert ad._AttentionBackendRegistry._is_context_parallel_available(member)
    assert {"return_lse", "_parallel_config", "attn_mask"} <= (
        ad._AttentionBackendRegistry._supported_arg_names[member])


# ---------------------------------------------------------------------------------------------
# Tiny Wan
# ---------------------------------------------------------------------------------------------


def test_tiny_wan_matches_native(tiny_wan):
    model, inputs = tiny_wan
    fd.disable(model)
    ref_final, ref_layers = attention_layer_outputs(model, inputs)
    fp8dit.enable(model)
    with fd.record_calls() as calls:
        final, layers = attention_layer_outputs(model, inputs)
    fd.disable(model)
    # Every call ran the FP8 kernels, the 24-key cross-attention too (no silent SDPA fallback).
    assert [c["backend"] for c in calls] == ["fp8"] * 4, calls
    assert sorted(c["k"][1] for c in calls) == [24, 24, 128, 128]
    assert {c["kernel"] for c in calls} == {"triton"}  # what the interpreter runs
    for name, ref in ref_layers.items():
        stats = error_stats(layers[name], ref)
        assert not stats.nan and stats.cos >= 0.99, (name, str(stats))
    stats = error_stats(final, ref_final)
    assert not stats.nan and stats.cos >= 0.99, str(stats)


def test_set_and_unset_backend(tiny_wan):
    model, inputs = tiny_wan
    registry = ad._AttentionBackendRegistry
    assert registry.get_active_backend()[0] == "native"

    def ran():
        with fd.record_calls() as calls, torch.no_grad():
            model(**inputs, return_dict=False)
        return len(calls)

    model.set_attention_backend("fp8dit")
    assert set(fd.layer_backends(model).values()) == {"fp8dit"}
    assert ran() == 4
    fd.disable(model)
    assert set(fd.layer_backends(model).values()) == {"native"}
    assert registry.get_active_backend()[0] == "native"
    assert ran() == 0

    with ad.attention_backend("fp8dit"):
        assert ran() == 4
    assert ran() == 0

    # A Wan2.2-like pipeline: both experts.
    pipe = types.SimpleNamespace(transformer=model, transformer_2=model, vae=None)
    assert fd.enable(pipe) is pipe
    assert set(fd.layer_backends(pipe).values()) == {"fp8dit"}
    assert len(fd.layer_backends(pipe)) == 8
    fd.disable(pipe)
    assert set(fd.layer_backends(pipe).values()) == {"native"}


def test_enable_policy_and_bad_input(tiny_wan):
    model, _ = tiny_wan

    class CrossInBf16:
        def backend_for(self, layer_name):
            return "native" if layer_name.endswith("attn2") else "fp8dit"

    fd.enable(model, policy=CrossInBf16())
    try:
        assert fd.layer_backends(model) == {
            "blocks.0.attn1": "fp8dit", "blocks.0.attn2": "native",
            "blocks.1.attn1": "fp8dit", "blocks.1.attn2": "native",
        }
    finally:
        fd.disable(model)

    class Typo:
        def backend_for(self, layer_name):
            return "fp8"

    with pytest.raises(ValueError, match=r"policy.backend_for\('blocks.0.attn1'\).*got 'fp8'"):
        fd.enable(model, policy=Typo())
    fd.disable(model)

    class TypoInTheLastLayer:
        recipe = "int8qk-bf16pv"

        def backend_for(self, layer_name):
            return "fp8" if layer_name == "blocks.1.attn2" else "fp8dit"

    with pytest.raises(ValueError, match=r"policy.backend_for\('blocks.1.attn2'\)"):
        fd.enable(model, policy=TypoInTheLastLayer())
    # Nothing changed: no layer switched, the recipe not set.
    assert set(fd.layer_backends(model).values()) == {"native"}
    assert fd._recipe is None
    with pytest.raises(TypeError, match="policy: expected None or an object with a backend_for"):
        fd.enable(model, policy="fp8dit")
    with pytest.raises(TypeError, match="pipe_or_model: expected a diffusers model .* got int"):
        fd.enable(3)


# ---------------------------------------------------------------------------------------------
# Backend calls: mask fallback, LSE, ring attention
# ---------------------------------------------------------------------------------------------


def _qkv(B, Sq, Sk, H, D, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(B, Sq, H, D, generator=g, device=DEVICE).bfloat16()
    k = torch.randn(B, Sk, H, D, generator=g, device=DEVICE).bfloat16()
    v = torch.randn(B, Sk, H, D, generator=g, device=DEVICE).bfloat16()
    return q, k, v


def test_mask_falls_back_to_sdpa_logged_once(monkeypatch, caplog, sdpa_mask_dtypes):
    monkeypatch.setattr(fd, "_logged", set())
    monkeypatch.setattr("fp8dit.dispatch._logged", set())  # fp8dit.key_padding logs there
    q, k, v = _qkv(2, 64, 48, 2, 64)
    mask = torch.zeros(2, 48, dtype=torch.bool, device=DEVICE)
    mask[:, :20] = True  # keys 20.. are padding, and key 3 is dropped too: no key padding
    mask[:, 3] = False
    with caplog.at_level(logging.WARNING, logger="fp8dit"), fd.record_calls() as calls:
        for _ in range(3):
            out = ad.dispatch_attention_fn(q, k, v, attn_mask=mask, backend="fp8dit")
    logged = [r for r in caplog.records if r.name == "fp8dit" and "attn_mask" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in caplog.records]
    assert [c["backend"] for c in calls] == ["sdpa"] * 3
    assert "attn_mask" in calls[0]["reason"]
    keep = [i for i in range(20) if i != 3]
    ref = attention_ref(q, k[:, keep], v[:, keep])
    assert error_stats(out, ref).cos > 0.9999
    # a boolean mask's SDPA fallback still gives the LSE (fp32, masked); an additive one not
    out, lse = ad.dispatch_attention_fn(q, k, v, attn_mask=mask, backend="fp8dit",
                                        attention_kwargs={"return_lse": True})
    _, ref_lse = attention_ref(q, k[:, keep], v[:, keep], return_lse=True)
    assert (lse.double() - ref_lse.transpose(1, 2)).abs().max().item() < 1e-3
    bias = torch.zeros(2, 1, 1, 48, device=DEVICE).masked_fill(~mask[:, None, None], -1e4)
    with pytest.raises(NotImplementedError, match="return_lse=True is not supported when attn"):
        ad.dispatch_attention_fn(q, k, v, attn_mask=bias, backend="fp8dit",
                                 attention_kwargs={"return_lse": True})
    # the fp32 bias reaches SDPA in the inputs' dtype, as its fused CUDA backends read it
    # (fp8dit.sdpa.sdpa_mask)
    del sdpa_mask_dtypes[:]
    out = ad.dispatch_attention_fn(q, k, v, attn_mask=bias, backend="fp8dit")
    assert sdpa_mask_dtypes == [torch.bfloat16]
    assert error_stats(out, ref).cos > 0.9999


@pytest.mark.parametrize("Sq,Sk", [(113, 113), (96, 40)])  # odd self-attention; short keys
def test_lse_against_fp64(Sq, Sk):
    q, k, v = _qkv(2, Sq, Sk, 3, 64, seed=Sq)
    with fd.record_calls() as calls:
        out, lse = ad.dispatch_attention_fn(q, k, v, backend="fp8dit",
                                            attention_kwargs={"return_lse": True})
    assert calls[0]["backend"] == "fp8"
    ref, ref_lse = attention_ref(q, k, v, return_lse=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, Sq, 3) and lse.dtype == torch.float32  # diffusers' [B, S, H]
    assert error_stats(out, ref).cos >= 0.999
    err = (lse.double() - ref_lse.transpose(1, 2)).abs().max().item()
    assert err < 0.03, err


def test_ring_attention_merges_fp8dit_partials(monkeypatch):
    """diffusers' own TemplatedRingAttention, 2 ranks faked on one process, fp8dit per chunk."""
    q, k, v = _qkv(1, 80, 96, 2, 64, seed=5)
    k0, k1, v0, v1 = k[:, :48], k[:, 48:], v[:, :48], v[:, 48:]
    remote = torch.cat([k1.flatten(), v1.flatten()])

    def all_gather_tensor(buffer, gather_dim, group):  # this rank's kv, then the other rank's
        return torch.cat([buffer, remote])

    monkeypatch.setattr(ad, "funcol", types.SimpleNamespace(all_gather_tensor=all_gather_tensor))
    cp = types.SimpleNamespace(
        ring_degree=2, ulysses_degree=1, ring_anything=False, convert_to_fp32=True,
        _ring_local_rank=0, _ring_mesh=types.SimpleNamespace(get_group=lambda: None),
    )
    config = types.SimpleNamespace(context_parallel_config=cp)
    with fd.record_calls() as calls:
        out, lse = fd.fp8dit_attention(q, k0, v0, return_lse=True, _parallel_config=config)
    assert [c["k"][1] for c in calls] == [48, 48] and {c["backend"] for c in calls} == {"fp8"}
    ref, ref_lse = attention_ref(q, k, v, return_lse=True)
    assert error_stats(out, ref).cos >= 0.999
    assert (lse.double() - ref_lse.transpose(1, 2)).abs().max().item() < 0.03


def test_context_parallel_backward_is_refused():
    with pytest.raises(NotImplementedError, match="forward-only"):
        fd._cp_backward_op(None, torch.zeros(1))


# ---------------------------------------------------------------------------------------------
# DIFFUSERS_ATTN_BACKEND=fp8dit in a fresh process
# ---------------------------------------------------------------------------------------------


def test_env_var_selects_fp8dit():
    code = (
        "import torch, fp8dit.integrations.diffusers as fd\n"
        "from diffusers.models.attention_dispatch import dispatch_attention_fn, "
        "_AttentionBackendRegistry as R\n"
        f"q = torch.randn(1, 64, 2, 64, device={DEVICE!r}).bfloat16()\n"
        "with fd.record_calls() as calls:\n"
        "    dispatch_attention_fn(q, q, q)\n"
        "print(R.get_active_backend()[0].value, calls[0]['backend'])\n"
    )
    env = dict(os.environ, DIFFUSERS_ATTN_BACKEND="fp8dit")
    if DEVICE == "cpu":
        env["TRITON_INTERPRET"] = "1"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["fp8dit", "fp8"], res.stdout


def test_import_registers_the_backend_for_set_attention_backend():
    """As the README says: the import alone registers "fp8dit" (fresh process, nothing else of
    fp8dit imported or called), then a model's ``set_attention_backend`` takes it."""
    code = (
        "import torch, diffusers\n"
        "import fp8dit.integrations.diffusers as fd\n"
        "torch.manual_seed(0)\n"
        "model = diffusers.WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, "
        "attention_head_dim=64, in_channels=4, out_channels=4, text_dim=32, freq_dim=32, "
        f"ffn_dim=64, num_layers=1, rope_max_seq_len=32).to({DEVICE!r}, torch.bfloat16).eval()\n"
        "model.set_attention_backend('fp8dit')\n"
        f"x = dict(hidden_states=torch.randn(1, 4, 1, 8, 8, device={DEVICE!r}).bfloat16(), "
        f"timestep=torch.tensor([500.0], device={DEVICE!r}), "
        f"encoder_hidden_states=torch.randn(1, 8, 32, device={DEVICE!r}).bfloat16())\n"
        "with torch.no_grad(), fd.record_calls() as calls:\n"
        "    model(**x)\n"
        "print(sorted({c['backend'] for c in calls}), len(calls))\n"
    )
    # On a GPU: the compiled kernels (FP8DIT_BACKEND=fp8 from fp8_at_any_length, as these short
    # calls would run SDPA); the interpreter only without one, as test_env_var_selects_fp8dit.
    env = dict(os.environ)
    if DEVICE == "cpu":
        env["TRITON_INTERPRET"] = "1"
    env.pop("DIFFUSERS_ATTN_BACKEND", None)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    backends, n_calls = res.stdout.split("]")[0] + "]", int(res.stdout.split("]")[1])
    assert n_calls == 2, res.stdout  # one block: self- and cross-attention, both through fp8dit
    assert backends in ("['fp8']", "['fp8', 'sdpa']"), res.stdout


def test_no_graph_break_under_dynamo():
    q, k, v = _qkv(1, 96, 40, 2, 64, seed=7)

    def f(q, k, v):
        out, lse = ad.dispatch_attention_fn(q, k, v, backend="fp8dit",
                                            attention_kwargs={"return_lse": True})
        return out * 2, lse

    torch._dynamo.reset()
    try:
        explanation = torch._dynamo.explain(f)(q, k, v)
    finally:
        torch._dynamo.reset()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert "fp8dit.attention_fp8" in explanation.graphs[0].code  # the custom op, not SDPA


def test_compiled_tiny_wan_whose_calls_fall_back_has_no_graph_break(tiny_wan, monkeypatch):
    # On a GPU auto sends short calls (Wan's cross-attention to 512 text keys) to SDPA and warns
    # once; a model compiled before any eager call traced that warning and broke its graph at
    # every such layer (found on the H200). Here the preference is made to decline FP8
    # for every call, as a GPU does for these tiny rows, with nothing logged yet.
    from fp8dit import dispatch

    model, inputs = tiny_wan
    monkeypatch.setattr(dispatch, "_logged", set())
    monkeypatch.setattr(dispatch, "fp8_not_preferred_reason",
                        lambda q, kernel, tokens: "too short (test)")
    monkeypatch.delenv("FP8DIT_BACKEND", raising=False)
    explanation = explain_with_fp8dit(model, inputs)
    assert explanation.graph_break_count == 0, explanation.break_reasons
