"""Quality guard: per-layer and per-step bf16 routing on a tiny Wan, proposals from measured
errors, and captured q/k/v that ``fp8dit check --inputs`` reads."""

# TRITON_INTERPRET=1 (no GPU) is set by conftest.py before triton is imported.

import argparse
import math
import types

import pytest
import torch

pytest.importorskip("diffusers")

import diffusers.models.attention_dispatch as ad  # noqa: E402

from fp8dit.integrations import diffusers as fd  # noqa: E402
from fp8dit.integrations.capture import capture_qkv  # noqa: E402
from fp8dit.integrations.guard import QualityPolicy, measure_captured, propose_policy  # noqa: E402
from fp8dit.testing import ErrorStats  # noqa: E402
from fp8dit.tools import check  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LAYERS = ["blocks.0.attn1", "blocks.0.attn2", "blocks.1.attn1", "blocks.1.attn2"]


pytestmark = pytest.mark.usefixtures("diffusers_state", "fp8_at_any_length")


def _forward(model, inputs):
    with fd.record_calls() as calls, torch.no_grad():
        out = model(**inputs, return_dict=False)[0]
    return out, calls


# ---------------------------------------------------------------------------------------------
# QualityPolicy on a model
# ---------------------------------------------------------------------------------------------


def test_policy_routes_layers_steps_and_recipe(tiny_wan):
    model, inputs = tiny_wan
    policy = QualityPolicy(bf16_layers=["*.attn2"], bf16_steps=[1], recipe="int8qk-bf16pv")
    try:
        assert policy.apply(model) is model
        assert fd.layer_backends(model) == {
            "blocks.0.attn1": "fp8dit", "blocks.0.attn2": "native",
            "blocks.1.attn1": "fp8dit", "blocks.1.attn2": "native",
        }
        _, calls = _forward(model, inputs)
        # Only the self-attention layers reach fp8dit, with the policy's recipe.
        assert [(c["backend"], c["recipe"], c["k"][1]) for c in calls] == \
            [("fp8", "int8qk-bf16pv", 128)] * 2
        with policy.step(1):  # a bf16 step: nothing reaches fp8dit
            assert set(fd.layer_backends(model).values()) == {"native"}
            assert _forward(model, inputs)[1] == []
        assert policy.current_step == 0 and len(_forward(model, inputs)[1]) == 2

        # As diffusers' callback: step 0 ends -> step 1 (bf16); the last step ends -> step 0.
        pipe = types.SimpleNamespace(num_timesteps=3)
        kw = {"latents": 1}
        assert policy.on_step_end(pipe, 0, 999, kw) is kw and policy.current_step == 1
        assert set(fd.layer_backends(model).values()) == {"native"}
        policy.on_step_end(pipe, 1, 500, kw)
        assert fd.layer_backends(model)["blocks.0.attn1"] == "fp8dit"
        policy.on_step_end(pipe, 2, 0, kw)
        assert policy.current_step == 0
    finally:
        fd.disable(model)
    assert fd._recipe is None  # disable() drops the policy's recipe
    assert _forward(model, inputs)[1] == []


def test_all_bf16_policy_reproduces_the_native_forward(tiny_wan):
    model, inputs = tiny_wan
    fd.disable(model)
    native, _ = _forward(model, inputs)
    try:
        QualityPolicy(bf16_layers=["*"]).apply(model)
        guarded, calls = _forward(model, inputs)
        fp8_only = QualityPolicy()
        fp8_only.apply(model)
        fp8_out, fp8_calls = _forward(model, inputs)
    finally:
        fd.disable(model)
    assert calls == [] and torch.equal(guarded, native)
    assert len(fp8_calls) == 4 and not torch.equal(fp8_out, native)


def test_policy_rejects_bad_input(tiny_wan):
    model, _ = tiny_wan
    with pytest.raises(ValueError, match=r"'blocks\.9\.\*' match no attention layer; the layers"):
        QualityPolicy(bf16_layers=["blocks.9.*"]).apply(model)
    with pytest.raises(ValueError, match="recipe: expected one of"):
        QualityPolicy(recipe="fp4")
    with pytest.raises(ValueError, match="bf16_steps: expected non-negative integers"):
        QualityPolicy(bf16_steps=[-1])
    with pytest.raises(ValueError, match="bf16_backend: expected a non-FP8"):
        QualityPolicy(bf16_backend="fp8dit")
    with pytest.raises(ValueError, match="recipe: expected one of"):
        fd.set_recipe("int8")


def test_pipeline_layer_names_are_prefixed(tiny_wan):
    model, _ = tiny_wan
    pipe = types.SimpleNamespace(transformer=model, transformer_2=model)
    policy = QualityPolicy(bf16_layers=["transformer_2.*"])
    try:
        policy.apply(pipe)
        # The same module object twice: the second pass (transformer_2) wins for every layer.
        assert set(fd.layer_backends(model).values()) == {"native"}
        assert policy.backend_for("transformer.blocks.0.attn1") == "fp8dit"
        assert policy.backend_for("transformer_2.blocks.0.attn1") == "native"
    finally:
        fd.disable(pipe)


# ---------------------------------------------------------------------------------------------
# propose_policy
# ---------------------------------------------------------------------------------------------


def test_propose_policy_picks_layers_over_budget():
    errors = {"a.attn1": 0.05, "a.attn2": 0.01, "b.attn1": 0.02}
    p = propose_policy(errors, budget=0.03, recipe="int8qk-fp8pv")
    assert p.bf16_layers == ("a.attn1",) and p.recipe == "int8qk-fp8pv"
    assert p.backend_for("a.attn1") == "native" and p.backend_for("b.attn1") == "fp8dit"
    assert propose_policy(errors, budget=0.0).bf16_layers == ("a.attn1", "a.attn2", "b.attn1")
    assert propose_policy(errors, budget=1.0).bf16_layers == ()
    # Several steps per layer: the worst decides. NaN is over any budget.
    per_step = {("x", 0): 0.01, ("x", 5): 0.09, ("y", 0): 0.02, ("z", 3): float("nan")}
    p = propose_policy(per_step, budget=0.03, bf16_steps=[0])
    assert p.bf16_layers == ("x", "z") and p.bf16_steps == {0}
    assert p.errors["x"] == 0.09 and math.isinf(p.errors["z"])
    # ErrorStats values and the cos metric (1 - cos against the budget).
    stats = {"u": ErrorStats(0.9990, 0.03, 0, 0, False), "w": ErrorStats(0.99999, 0.002, 0, 0,
                                                                          False)}
    assert propose_policy(stats, budget=1e-4, metric="cos").bf16_layers == ("u",)
    with pytest.raises(ValueError, match="budget"):
        propose_policy(errors, budget=-1)
    with pytest.raises(ValueError, match="rows with a 'layer' key"):
        propose_policy([{"rel_l1": 0.1}], budget=0.03)


# ---------------------------------------------------------------------------------------------
# capture -> fp8dit check --inputs -> measure -> propose
# ---------------------------------------------------------------------------------------------


def test_capture_feeds_check_and_a_proposal(tiny_wan, tmp_path, capsys):
    model, inputs = tiny_wan
    registry = ad._AttentionBackendRegistry
    originals = dict(registry._backends)
    try:
        fd.enable(model)
        with capture_qkv(model, tmp_path / "full", layers=["blocks.0.*"]) as full:
            _forward(model, inputs)
        with capture_qkv(model, tmp_path / "qkv", layers=["blocks.0.attn1", "*.attn2"],
                         steps=[1], max_q_tokens=48, max_calls=1) as cap:
            _, calls = _forward(model, inputs)  # step 0: not captured
            cap.on_step_end(None, 0, 999, {})
            _forward(model, inputs)
            _forward(model, inputs)  # step 1 again: max_calls=1 keeps the first
    finally:
        fd.disable(model)
    # Everything put back: the registry's functions, no hooks left.
    assert registry._backends == originals
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    assert [c["backend"] for c in calls] == ["fp8"] * 4  # capturing did not change the routing

    names = sorted(p.name for p in cap.files)
    assert names == ["blocks.0.attn1.step001.call0.pt", "blocks.0.attn2.step001.call0.pt",
                     "blocks.1.attn2.step001.call0.pt"]
    saved = torch.load(cap.out_dir / "blocks.0.attn1.step001.call0.pt", weights_only=True)
    assert saved["layer"] == "blocks.0.attn1" and saved["step"] == 1 and saved["q_len"] == 128
    assert saved["q"].shape == (1, 48, 2, 64) and saved["k"].shape == (1, 128, 2, 64)
    assert saved["q"].dtype == torch.bfloat16 and saved["q"].device.type == "cpu"
    # The 48 kept query rows are rows of the full capture (same inputs, same step content).
    whole = torch.load(full.out_dir / "blocks.0.attn1.step000.call0.pt", weights_only=True)
    rows = torch.linspace(0, 127, 48).round().long()
    assert torch.equal(saved["q"], whole["q"][:, rows]) and torch.equal(saved["k"], whole["k"])
    assert torch.load(cap.out_dir / "blocks.0.attn2.step001.call0.pt",
                      weights_only=True)["k"].shape[1] == 24

    # fp8dit check --inputs reads it.
    p = argparse.ArgumentParser()
    check.add_arguments(p)
    rc = check.run(p.parse_args(["--inputs", str(cap.files[0]), "--recipes", "int8qk-fp8pv"]))
    out = capsys.readouterr().out
    assert rc == 0 and f"file:{cap.files[0].name}" in out, out

    # Measured per layer, then proposed: a budget between the layers' errors keeps the worse.
    rows = measure_captured(cap.out_dir, "int8qk-fp8pv")
    assert sorted(r["layer"] for r in rows) == ["blocks.0.attn1", "blocks.0.attn2",
                                                "blocks.1.attn2"]
    assert all(0 < r["rel_l1"] < 0.1 and not r["nan"] for r in rows), rows
    errs = sorted(r["rel_l1"] for r in rows)
    policy = propose_policy(rows, budget=(errs[0] + errs[1]) / 2)
    worst = [r["layer"] for r in rows if r["rel_l1"] > errs[0]]
    assert sorted(policy.bf16_layers) == sorted(worst) and policy.recipe == "int8qk-fp8pv"


def test_capture_rejects_unknown_layers(tiny_wan, tmp_path):
    model, _ = tiny_wan
    with pytest.raises(ValueError, match="'attn3' match no attention layer"):
        capture_qkv(model, tmp_path, layers=["attn3"])
    with pytest.raises(ValueError, match="max_q_tokens: expected None or a positive integer"):
        capture_qkv(model, tmp_path, max_q_tokens=0)
