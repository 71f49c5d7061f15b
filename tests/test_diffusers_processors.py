"""CogVideoX through diffusers: its processors call torch SDPA themselves, so fp8dit replaces
them with ones that go through diffusers' dispatcher (fp8dit.integrations.diffusers_processors).
HunyuanVideo 1.5's processor builds a [B, 1, S, S] mask in every call; fp8dit's replacement
hands fp8dit the key mask instead.
"""

# TRITON_INTERPRET=1 (no GPU) is set by conftest.py before triton is imported.

import logging

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

import diffusers.models.attention_processor as ap  # noqa: E402
from conftest import build_tiny_wan, explain_with_fp8dit, tiny_hunyuan_video_15  # noqa: E402

import fp8dit  # noqa: E402
from fp8dit.integrations import diffusers as fd  # noqa: E402
from fp8dit.integrations import diffusers_processors as dp  # noqa: E402
from fp8dit.integrations.capture import capture_qkv  # noqa: E402
from fp8dit.integrations.guard import QualityPolicy  # noqa: E402
from fp8dit.testing import error_stats  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
LAYERS = ["transformer_blocks.0.attn1", "transformer_blocks.1.attn1"]

pytestmark = pytest.mark.usefixtures("diffusers_state", "fp8_at_any_length")


def tiny_cogvideox(fused: bool = False):
    """diffusers' CogVideoXTransformer3DModel, 2 layers of 2 heads x 32, RoPE on (as CogVideoX
    1.5 and 5B), bf16, and one input: 3 latent frames of 8 x 8 -> 48 video + 8 text tokens."""
    from diffusers import CogVideoXTransformer3DModel
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    torch.manual_seed(0)
    model = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=32, in_channels=4, out_channels=4,
        time_embed_dim=32, text_embed_dim=16, num_layers=2, sample_width=8, sample_height=8,
        sample_frames=9, patch_size=2, max_text_seq_length=8,
        use_rotary_positional_embeddings=True,
    ).to(DEVICE).eval().requires_grad_(False)
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    if fused:
        model.fuse_qkv_projections()
    cos, sin = get_3d_rotary_pos_embed(embed_dim=32, crops_coords=((0, 0), (4, 4)),
                                       grid_size=(4, 4), temporal_size=3, device=DEVICE)
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    inputs = dict(
        hidden_states=torch.randn(1, 3, 4, 8, 8, generator=gen, device=DEVICE).bfloat16(),
        encoder_hidden_states=torch.randn(1, 8, 16, generator=gen, device=DEVICE).bfloat16(),
        timestep=torch.tensor([500], device=DEVICE), image_rotary_emb=(cos, sin),
    )
    return model, inputs


def forward(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def processor_classes(model):
    return [type(model.get_submodule(layer).processor).__name__ for layer in LAYERS]


@pytest.mark.parametrize("fused", [False, True])
def test_replacement_computes_bitwise_what_diffusers_own_processor_does(fused):
    # The guard on diffusers' CogVideoX processor: a release that changes what it computes
    # fails here, before a user's output quietly differs.
    model, inputs = tiny_cogvideox(fused)
    own = "FusedCogVideoXAttnProcessor2_0" if fused else "CogVideoXAttnProcessor2_0"
    assert processor_classes(model) == [own] * 2
    assert fd.layer_backends(model) == dict.fromkeys(LAYERS, fd.TORCH_SDPA)
    ref = forward(model, inputs)
    assert fd.route_through_dispatcher(model) == LAYERS
    assert fd.route_through_dispatcher(model) == []  # already routed
    assert processor_classes(model) == ["CogVideoXDispatchProcessor"] * 2
    assert set(fd.layer_backends(model).values()) == {"native"}
    assert torch.equal(forward(model, inputs), ref)
    with pytest.raises(TypeError, match="layers: expected None or a list of layer names"):
        fd.restore_processors(model, LAYERS[0])  # a name, not a list of names
    with pytest.raises(TypeError, match="layers: expected None or a list of layer names, got 3"):
        fd.restore_processors(model, 3)
    with pytest.raises(TypeError, match="pipe_or_model: expected a diffusers model"):
        fd.route_through_dispatcher("CogVideoX")
    assert fd.restore_processors(model, [LAYERS[1]]) == [LAYERS[1]]
    assert fd.restore_processors(model) == [LAYERS[0]]
    assert processor_classes(model) == [own] * 2
    assert torch.equal(forward(model, inputs), ref)


def test_enable_runs_every_cogvideox_layer_fp8_and_disable_restores():
    model, inputs = tiny_cogvideox()
    ref = forward(model, inputs)
    assert fp8dit.enable(model) is model
    assert fd.layer_backends(model) == dict.fromkeys(LAYERS, "fp8dit")
    with fd.record_calls() as calls:
        out = forward(model, inputs)
    # Joint attention over the 8 text and 48 video tokens, FP8 in both layers.
    assert [(c["backend"], c["q"], c["k"]) for c in calls] == [("fp8", (1, 56, 2, 32),
                                                                (1, 56, 2, 32))] * 2, calls
    stats = error_stats(out, ref)
    assert not stats.nan and stats.cos >= 0.99, str(stats)
    assert not torch.equal(out, ref)  # FP8 did run: its rounding shows
    fd.disable(model)
    assert processor_classes(model) == ["CogVideoXAttnProcessor2_0"] * 2
    assert fd.layer_backends(model) == dict.fromkeys(LAYERS, fd.TORCH_SDPA)
    assert torch.equal(forward(model, inputs), ref)


def test_quality_policy_and_a_refused_policy_on_cogvideox():
    model, inputs = tiny_cogvideox()
    policy = QualityPolicy(bf16_layers=["transformer_blocks.0.*"])
    policy.apply(model)
    try:
        assert fd.layer_backends(model) == {LAYERS[0]: "native", LAYERS[1]: "fp8dit"}
        with fd.record_calls() as calls:
            forward(model, inputs)
        assert [c["backend"] for c in calls] == ["fp8"]  # block 0 ran native (not recorded)
    finally:
        fd.disable(model)

    class TypoInTheLastLayer:
        def backend_for(self, layer_name):
            return "fp8" if layer_name == LAYERS[1] else "fp8dit"

    with pytest.raises(ValueError, match=r"policy.backend_for\('transformer_blocks.1.attn1'\)"):
        fd.enable(model, policy=TypoInTheLastLayer())
    # Nothing changed: diffusers' own processors are back.
    assert processor_classes(model) == ["CogVideoXAttnProcessor2_0"] * 2


def test_processors_without_a_replacement_are_reported_not_touched(monkeypatch, caplog):
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = ap.Attention(query_dim=32, heads=2, dim_head=16)  # AttnProcessor2_0

        def set_attention_backend(self, name):  # what _models looks for in a model
            raise AssertionError("not called here")

    holder = Holder()
    monkeypatch.setattr(fd, "_logged", set())
    with caplog.at_level(logging.WARNING, logger="fp8dit"):
        assert fd.route_through_dispatcher(holder) == []
    assert type(holder.attn.processor) is ap.AttnProcessor2_0
    assert "AttnProcessor2_0, which calls torch SDPA directly" in caplog.text
    assert fd.layer_backends(holder) == {"attn": fd.TORCH_SDPA}

    # A CogVideoX processor whose call changed (a new diffusers release) is left alone too.
    model, _ = tiny_cogvideox()
    monkeypatch.setattr(dp, "_CALL", dp._CALL + ("new_argument",))
    assert fd.route_through_dispatcher(model) == []
    assert processor_classes(model) == ["CogVideoXAttnProcessor2_0"] * 2


def test_capture_saves_cogvideox_calls_and_puts_the_processors_back(tmp_path):
    model, inputs = tiny_cogvideox()
    with capture_qkv(model, tmp_path, layers=["*.attn1"]) as cap:
        forward(model, inputs)
    assert [p.name for p in cap.files] == [f"{layer}.step000.call0.pt" for layer in LAYERS]
    saved = torch.load(cap.files[0])
    assert saved["q"].shape == (1, 56, 2, 32) and saved["layer"] == LAYERS[0]
    assert processor_classes(model) == ["CogVideoXAttnProcessor2_0"] * 2


def test_no_graph_break_in_a_compiled_cogvideox_forward():
    model, inputs = tiny_cogvideox()
    explanation = explain_with_fp8dit(model, inputs)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert "fp8dit.attention_fp8" in "".join(g.code for g in explanation.graphs)


HV15_LAYERS = ["transformer_blocks.0.attn", "transformer_blocks.1.attn"]


def test_hunyuan_video_15_replacement_computes_bitwise_what_diffusers_does_natively():
    # The guard on diffusers' HunyuanVideo 1.5 processor: with any backend but fp8dit the
    # replacement builds diffusers' [B, 1, S, S] mask and computes the same bits.
    model, inputs = tiny_hunyuan_video_15()
    ref = forward(model, inputs)
    owns = {n: type(model.get_submodule(n).processor).__name__ for n in HV15_LAYERS}
    assert set(owns.values()) == {"HunyuanVideo15AttnProcessor2_0"}
    assert fd.route_through_dispatcher(model) == HV15_LAYERS  # the token refiner's: no twin
    assert fd.route_through_dispatcher(model) == []
    new = model.get_submodule(HV15_LAYERS[0]).processor
    assert isinstance(new, dp.HunyuanVideo15KeyMaskProcessor)
    assert not new._key_mask_for_backend()  # native, diffusers' default
    assert torch.equal(forward(model, inputs), ref)
    model.set_attention_backend("native")  # set on the replacement, carried back by restore
    assert fd.restore_processors(model) == HV15_LAYERS
    back = model.get_submodule(HV15_LAYERS[0]).processor
    assert type(back).__name__ == "HunyuanVideo15AttnProcessor2_0"
    assert back._attention_backend.value == "native"
    assert torch.equal(forward(model, inputs), ref)
    with pytest.raises(TypeError, match="key_mask_backends: expected an iterable"):
        dp.HunyuanVideo15KeyMaskProcessor(key_mask_backends="fp8dit")


def test_hunyuan_video_15_forward_benchmark_key_mask_peer(monkeypatch):
    # bench_forward's HunyuanVideo 1.5 "auto-keymask" baseline: native SDPA given the key mask.
    from pathlib import Path

    import torch.nn.functional as F

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_forward import give_sdpa_the_key_mask

    model, inputs = tiny_hunyuan_video_15()
    ref = forward(model, inputs)
    give_sdpa_the_key_mask(model)
    model.set_attention_backend("native")
    masks, sdpa = [], F.scaled_dot_product_attention

    def recording(*args, attn_mask=None, **kwargs):
        masks.append(None if attn_mask is None else tuple(attn_mask.shape))
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    out = forward(model, inputs)
    # The token refiner's own call (its mask) first, then both blocks with the key mask.
    assert masks[-2:] == [(1, 1, 1, 546)] * 2, masks
    stats = error_stats(out, ref)
    assert stats.cos >= 0.9999 and stats.rel_l1 <= 0.01, str(stats)


def hunyuan_video_15_both_masks(model, inputs, caplog):
    """The forward with fp8dit set on diffusers' own processor ([B, 1, S, S] mask), then with
    fp8dit.enable (the key mask): (output, calls, warnings) of each."""
    runs = []
    for turn_on in (lambda: model.set_attention_backend("fp8dit"), lambda: fp8dit.enable(model)):
        caplog.clear()
        turn_on()
        try:
            with fd.record_calls() as calls, caplog.at_level(logging.WARNING, logger="fp8dit"):
                runs.append((forward(model, inputs), calls, caplog.text))
        finally:
            fd.disable(model)
    return runs


def test_hunyuan_video_15_gets_the_key_mask_and_the_same_video_bits(fp8_at_any_length, caplog,
                                                                    monkeypatch):
    model, inputs = tiny_hunyuan_video_15()
    ref = forward(model, inputs)
    monkeypatch.setattr(fd, "_logged", set())
    (per_query, calls, said), (keys, key_calls, key_said) = hunyuan_video_15_both_masks(
        model, inputs, caplog)
    assert [(c["backend"], c["mask"]) for c in calls] == [("fp8", (1, 1, 546, 546))] * 2, calls
    assert fd._PER_QUERY_MASK_HINT in said  # says how to skip that mask
    assert "per-query" not in key_said
    # A layer set to another backend gets diffusers' mask again.
    fp8dit.enable(model, policy=QualityPolicy(bf16_layers=[HV15_LAYERS[0]]))
    try:
        with fd.record_calls() as mixed:
            forward(model, inputs)
    finally:
        fd.disable(model)
    assert [(c["backend"], c["mask"]) for c in key_calls] == [("fp8", (1, 1, 1, 546))] * 2
    assert [c["mask"] for c in mixed] == [(1, 1, 1, 546)], mixed  # block 0 ran native
    # The video tokens (the model's output) are bitwise those of diffusers' own mask: the same
    # kernel over the same kept keys; only the dropped text tokens' rows differ, unread.
    assert torch.equal(keys, per_query)
    stats = error_stats(keys, ref)
    assert not stats.nan and stats.cos >= 0.99, str(stats)
    assert {n: type(model.get_submodule(n).processor).__name__ for n in HV15_LAYERS} == \
        dict.fromkeys(HV15_LAYERS, "HunyuanVideo15AttnProcessor2_0")


def test_hunyuan_video_15_key_mask_with_two_prompts_of_different_lengths(fp8_at_any_length,
                                                                         caplog):
    # Classifier-free guidance batches two prompts: each sequence keeps its own text length.
    model, inputs = tiny_hunyuan_video_15()
    inputs = {k: torch.cat([v, v]) if torch.is_tensor(v) and v.dim() else v
              for k, v in inputs.items()}
    inputs["encoder_attention_mask"][1, 7:] = 0  # 7 real prompt tokens, not 13
    inputs["encoder_hidden_states"][1] *= -1
    (per_query, calls, _), (keys, key_calls, _) = hunyuan_video_15_both_masks(model, inputs,
                                                                             caplog)
    assert [(c["backend"], c["mask"]) for c in calls + key_calls] == \
        [("fp8", (2, 1, 546, 546))] * 2 + [("fp8", (2, 1, 1, 546))] * 2
    assert torch.equal(keys, per_query)
    assert not torch.equal(keys[0], keys[1])


def test_hunyuan_video_15_key_mask_adds_no_graph_break():
    # The model breaks its graph twice itself (``if torch.all(image_embeds == 0)`` in its
    # forward), with any backend; the replacement processor adds none.
    model, inputs = tiny_hunyuan_video_15()
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            native = torch._dynamo.explain(model)(**inputs, return_dict=False)
    finally:
        torch._dynamo.reset()
    explanation = explain_with_fp8dit(model, inputs)
    assert explanation.graph_break_count == native.graph_break_count == 2, \
        explanation.break_reasons
    assert "fp8dit.attention_fp8_key_padding" in "".join(g.code for g in explanation.graphs)


def test_forward_benchmarks_pin_backends_past_hunyuan_token_refiner(monkeypatch):
    # HunyuanVideo's token refiner keeps diffusers' AttnProcessor2_0 (SDPA, no replacement):
    # the benchmarks' check that every model runs the backend it names must not trip on it.
    import sys
    from pathlib import Path

    from diffusers import HunyuanVideoTransformer3DModel

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    monkeypatch.delitem(sys.modules, "bench_forward", raising=False)
    from bench_forward import pin_backends

    def tiny():
        torch.manual_seed(0)
        return HunyuanVideoTransformer3DModel(
            in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=16,
            num_layers=1, num_single_layers=1, num_refiner_layers=1, text_embed_dim=16,
            pooled_projection_dim=8, rope_axes_dim=(4, 6, 6))

    models = {"sdpa-cudnn": tiny(), "fp8dit": tiny()}
    refiner = "context_embedder.token_refiner.refiner_blocks.0.attn"
    assert fd.layer_backends(models["fp8dit"])[refiner] == fd.TORCH_SDPA
    try:
        pin_backends(models)
        assert fd.layer_backends(models["fp8dit"]) == {
            "transformer_blocks.0.attn": "fp8dit", "single_transformer_blocks.0.attn": "fp8dit",
            refiner: fd.TORCH_SDPA}
        assert set(fd.layer_backends(models["sdpa-cudnn"]).values()) == {"native", fd.TORCH_SDPA}
    finally:
        for model in models.values():
            fd.disable(model)


def test_forward_benchmarks_record_calls_and_pass_rows_on(monkeypatch):
    # The shared tail of the forward benchmarks, on CPU with the timing and the report stubbed
    # (they need CUDA): one recorded fp8dit forward, its backends in every row, the modes asked.
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    monkeypatch.delitem(sys.modules, "bench_forward", raising=False)
    import bench_forward as bw

    seen = {}

    def compare(models, inputs, baseline, modes, warmup, repeats, common, model_bytes):
        seen.update(baseline=baseline, modes=modes, common=common, model_bytes=model_bytes)
        return [dict(common, mode="eager", backend="fp8dit")]

    monkeypatch.setattr(bw, "compare_forwards", compare)
    monkeypatch.setattr(bw, "report", lambda rows, out: (rows, out))
    (base, _), (fp8, inputs) = tiny_cogvideox(), tiny_cogvideox()
    models = {"sdpa-cudnn": base, "fp8dit": fp8}
    for model in models.values():
        fd.route_through_dispatcher(model)
    try:
        bw.pin_backends(models)
        args = SimpleNamespace(compile=True, cuda_graph=False, warmup=1, repeats=2, out=None)
        rows, out = bw.run_and_report(models, inputs, args, dict(model="tiny"))
    finally:
        for model in models.values():
            fd.disable(model)
    assert seen["baseline"] == "sdpa-cudnn" and seen["modes"] == ["eager", "compile"]
    assert seen["common"]["fp8dit_calls"] == ["fp8", "fp8"] and seen["common"]["model"] == "tiny"
    assert seen["common"]["timing"] == "alternating" and seen["common"]["torch"]
    assert seen["model_bytes"] == sum(p.numel() * p.element_size() for p in fp8.parameters())
    assert rows[0]["repeats"] == 2 and out is None
    from fp8dit.tools.bench import METADATA_FIELDS

    assert set(METADATA_FIELDS) <= set(seen["common"])


WAN_LAYERS = [f"blocks.{i}.attn{j}" for i in range(2) for j in (1, 2)]


@pytest.mark.parametrize("rope_dtype", [torch.float32, torch.bfloat16])
def test_wan_rotary_processor_gives_the_bits_of_diffusers_processor(rope_dtype):
    model, inputs = build_tiny_wan(rope_dtype)
    fd.register()
    model.set_attention_backend("native")
    native = forward(model, inputs)
    model.set_attention_backend("fp8dit")  # diffusers' processors: rotated copies to fp8dit
    with fd.record_calls() as stock_calls:
        stock = forward(model, inputs)
    fp8dit.enable(model)
    try:
        assert {n: type(model.get_submodule(n).processor).__name__ for n in WAN_LAYERS} == \
            dict.fromkeys(WAN_LAYERS, "WanRotaryProcessor")
        with fd.record_calls() as calls:
            fused = forward(model, inputs)
    finally:
        fd.disable(model)
    assert torch.equal(fused, stock)
    assert [(c["backend"], c.get("rotary")) for c in calls] == \
        [("fp8", "fused"), ("fp8", None)] * 2, calls  # self-attention fused, cross as before
    assert [c["q"] for c in calls] == [c["q"] for c in stock_calls]
    stats = error_stats(fused, native)
    assert not stats.nan and stats.cos >= 0.99, str(stats)
    assert {type(model.get_submodule(n).processor).__name__ for n in WAN_LAYERS} == \
        {"WanAttnProcessor"}
    # another backend (a policy's bf16 layer) runs diffusers' processor itself: its bits
    fp8dit.enable(model, policy=QualityPolicy(bf16_layers=WAN_LAYERS))
    try:
        assert torch.equal(forward(model, inputs), native)
    finally:
        fd.disable(model)


def test_wan_rotary_processor_adds_no_graph_break():
    model, inputs = build_tiny_wan(torch.bfloat16)
    explanation = explain_with_fp8dit(model, inputs)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    code = "".join(g.code for g in explanation.graphs)
    assert code.count("fp8dit.attention_fp8") == 4  # self (with the tables) and cross, x2


def test_wan_replacement_is_guarded_by_diffusers_signature(monkeypatch):
    # diffusers 0.42's WanAttnProcessor: replaced; a changed call signature or a missing
    # projection helper: left alone (a release that moves them fails the test above instead)
    from diffusers.models.transformers import transformer_wan as tw

    proc = tw.WanAttnProcessor()
    assert isinstance(dp.replacement_for(proc), dp.WanRotaryProcessor)
    monkeypatch.delattr(tw, "_get_qkv_projections")
    assert dp.replacement_for(proc) is None


@pytest.mark.gpu
def test_wan_rotary_processor_replays_in_a_cuda_graph():
    # CUDA graphs: the tables are made inside the captured region (no host read)
    model, inputs = build_tiny_wan(torch.bfloat16)
    fp8dit.enable(model)
    try:
        with fd.record_calls() as calls:
            eager = forward(model, inputs)
        assert [c.get("rotary") for c in calls] == ["fused", None] * 2, calls
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            forward(model, inputs)  # warm-up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = forward(model, inputs)
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
    finally:
        fd.disable(model)


def tiny_hunyuan_video():
    """diffusers' HunyuanVideoTransformer3DModel (1.0), one dual- and one single-stream block of
    2 heads x 64, bf16, and one input: 2 x 8 x 8 latent (patch 1) -> 128 video tokens, then 12
    prompt tokens of which 9 are real (the key mask drops the rest)."""
    torch.manual_seed(0)
    model = diffusers.HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=64,
        num_layers=1, num_single_layers=1, num_refiner_layers=1, mlp_ratio=2.0, patch_size=1,
        text_embed_dim=32, pooled_projection_dim=16, rope_axes_dim=(16, 24, 24),
    ).to(DEVICE).eval().requires_grad_(False).to(torch.bfloat16)
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    text_mask = torch.ones(1, 12, dtype=torch.int64, device=DEVICE)
    text_mask[:, 9:] = 0

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=DEVICE).bfloat16()

    inputs = dict(hidden_states=randn(1, 4, 2, 8, 8),
                  timestep=torch.tensor([700.0], device=DEVICE).bfloat16(),
                  encoder_hidden_states=randn(1, 12, 32), encoder_attention_mask=text_mask,
                  pooled_projections=randn(1, 16),
                  guidance=torch.tensor([6000.0], device=DEVICE).bfloat16())
    return model, inputs


HV_LAYERS = ["transformer_blocks.0.attn", "single_transformer_blocks.0.attn"]


def _enabled_forward(model, inputs, fuse_rotary=True):
    fp8dit.enable(model)
    for _, proc in fd._attention_processors(model):
        if isinstance(proc, dp.REPLACEMENT_TYPES):
            proc.fuse_rotary = fuse_rotary
    try:
        with fd.record_calls() as calls:
            return forward(model, inputs), calls
    finally:
        fd.disable(model)


@pytest.mark.parametrize("model_name", ["hunyuan_video", "hunyuan_video_15", "cogvideox"])
def test_fused_apply_rotary_emb_gives_the_bits_of_rotating_first(model_name):
    # HunyuanVideo 1.0 / 1.5 and CogVideoX through fp8dit.enable: the video tokens' rotation
    # fused into fp8dit's quantization gives bitwise what the same processors give when they
    # rotate q and k themselves first (diffusers' apply_rotary_emb) and hand them to fp8dit.
    build = dict(hunyuan_video=tiny_hunyuan_video, hunyuan_video_15=tiny_hunyuan_video_15,
                 cogvideox=tiny_cogvideox)[model_name]
    model, inputs = build()
    model.set_attention_backend("native")
    native = forward(model, inputs)
    fused, calls = _enabled_forward(model, inputs)
    rotated, rotated_calls = _enabled_forward(model, inputs, fuse_rotary=False)
    assert torch.equal(fused, rotated)
    rot = [c.get("rotary") for c in calls if c.get("rotary")]
    assert rot and set(rot) == {"fused"}, calls
    assert not [c for c in rotated_calls if c.get("rotary")]
    assert [(c["backend"], c["q"], c.get("mask")) for c in calls] == \
        [(c["backend"], c["q"], c.get("mask")) for c in rotated_calls]
    stats = error_stats(fused, native)
    assert not stats.nan and stats.cos >= 0.99, str(stats)


def test_hunyuan_video_rotary_processor_masks_keys_and_restores():
    model, inputs = tiny_hunyuan_video()
    model.set_attention_backend("native")
    native = forward(model, inputs)
    out, calls = _enabled_forward(model, inputs)
    attn_calls = [c for c in calls if c.get("rotary")]
    # both blocks: 128 video + 12 text tokens, the key mask keeping 137
    assert [(c["backend"], c["q"], c["mask"]) for c in attn_calls] == \
        [("fp8", (1, 140, 2, 64), (1, 1, 1, 140))] * 2, calls
    assert {type(model.get_submodule(n).processor).__name__ for n in HV_LAYERS} == \
        {"HunyuanVideoAttnProcessor2_0"}
    # a policy's bf16 layer runs diffusers' own processor: its bits
    fp8dit.enable(model, policy=QualityPolicy(bf16_layers=HV_LAYERS))
    try:
        assert {type(model.get_submodule(n).processor).__name__ for n in HV_LAYERS} == \
            {"HunyuanVideoRotaryProcessor"}
        assert torch.equal(forward(model, inputs), native)
    finally:
        fd.disable(model)
    stats = error_stats(out, native)
    assert not stats.nan and stats.cos >= 0.99, str(stats)


def test_hunyuan_video_rotary_processor_adds_no_graph_break():
    model, inputs = tiny_hunyuan_video()
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            native = torch._dynamo.explain(model)(**inputs, return_dict=False)
    finally:
        torch._dynamo.reset()
    explanation = explain_with_fp8dit(model, inputs)
    assert explanation.graph_break_count == native.graph_break_count, \
        explanation.break_reasons
    code = "".join(g.code for g in explanation.graphs)
    assert code.count("fp8dit.attention_fp8_key_padding") >= 2


def test_forward_benchmarks_rotate_first_peer(monkeypatch):
    # the benchmarks' "fp8dit-rotate-first" model: fp8dit.enable's processors, rotation in
    # torch first; the same bits as the fused model (the test above), other calls' records
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_forward import ROTATE_FIRST, backend_models, pin_backends

    models = backend_models([], lambda: tiny_hunyuan_video()[0], [ROTATE_FIRST])
    inputs = tiny_hunyuan_video()[1]
    pin_backends(models)
    try:
        outs = {}
        for name, model in models.items():
            with fd.record_calls() as calls:
                outs[name] = forward(model, inputs)
            outs[name + " rotary"] = {c.get("rotary") for c in calls} - {None}
        assert outs["fp8dit rotary"] == {"fused"}
        assert outs[ROTATE_FIRST + " rotary"] == set()  # diffusers' own code rotated them
        assert torch.equal(outs["fp8dit"], outs[ROTATE_FIRST])
    finally:
        for model in models.values():
            fd.disable(model)
