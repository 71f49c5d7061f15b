"""Run the real Triton kernels through the interpreter when there is no GPU.

TRITON_INTERPRET must be set before triton is imported, hence at the top of conftest.
"""

import os

import pytest

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = "cuda" if _HAS_CUDA else "cpu"

if os.environ.get("PYTEST_XDIST_WORKER") and not _HAS_CUDA:
    # pytest -n N: N workers share the cores; one torch thread each keeps them from
    # oversubscribing (the interpreter's work is Python, one core per worker anyway).
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if _HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return DEVICE


def explain_with_fp8dit(model, inputs: dict):
    """``torch._dynamo.explain`` of one forward of a diffusers ``model`` with fp8dit enabled
    (fp8dit disabled and dynamo reset afterwards)."""
    from fp8dit.integrations import diffusers as fd

    fd.enable(model)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            return torch._dynamo.explain(model)(**inputs, return_dict=False)
    finally:
        torch._dynamo.reset()
        fd.disable(model)


@pytest.fixture
def fp8_at_any_length(monkeypatch):
    """On a GPU, ``auto`` sends short sequences (these tests' tiny models) to SDPA
    (``tuning.Crossover``): FP8DIT_BACKEND=fp8 makes ``auto`` run them FP8, as the
    interpreter does on a CPU. Tests of the FP8 path through auto use it."""
    if _HAS_CUDA:
        monkeypatch.setenv("FP8DIT_BACKEND", "fp8")


@pytest.fixture(autouse=True)
def _clean_fp8dit_env(monkeypatch):
    for var in ("FP8DIT_BACKEND", "FP8DIT_DISABLE", "FP8DIT_RECIPE", "FP8DIT_PLAN_CACHE"):
        monkeypatch.delenv(var, raising=False)


# A tiny Wan transformer (diffusers' WanTransformer3DModel, seeded random weights, bf16) and one
# input: 2 x 16 x 16 latent -> 128 tokens, 24 text tokens (cross-attention with short keys).
TINY_WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=64,
                in_channels=4, out_channels=4, text_dim=32, freq_dim=32, ffn_dim=128,
                num_layers=2, rope_max_seq_len=64)
TINY_WAN_LATENT = (2, 16, 16)
TINY_WAN_TEXT = 24


@pytest.fixture(scope="module")
def tiny_wan():
    return build_tiny_wan()


def build_tiny_wan(rope_dtype=None, *, heads=None, num_layers=None, latent=TINY_WAN_LATENT,
                   qk_gain=1.0, device=DEVICE):
    """diffusers' WanTransformer3DModel (TINY_WAN, bf16 weights) and one input; ``rope_dtype``:
    its rotary tables cast to it (float32 as diffusers builds them; ``model.to(bfloat16)``
    casts them to bf16, as most pipelines and the benchmarks do).

    ``heads`` and ``num_layers`` replace TINY_WAN's; ``latent`` is the [F, H, W] of the input
    (patch 1 x 2 x 2: F*H*W/4 tokens); ``qk_gain`` scales the q/k RMS-norm weights (random
    weights give near-uniform attention; sharper scores make a wrong merge show); ``device``:
    where the model and input live (the context-parallel ranks build on the CPU)."""
    diffusers = pytest.importorskip("diffusers")
    config = dict(TINY_WAN)
    if heads is not None:
        config["num_attention_heads"] = heads
    if num_layers is not None:
        config["num_layers"] = num_layers
    torch.manual_seed(0)
    model = diffusers.WanTransformer3DModel(**config).to(device).eval().requires_grad_(False)
    for name, p in model.named_parameters():
        if qk_gain != 1.0 and name.endswith(("norm_q.weight", "norm_k.weight")):
            p.data.mul_(qk_gain)
        p.data = p.data.to(torch.bfloat16)
    if rope_dtype is not None:
        for name in ("freqs_cos", "freqs_sin"):
            setattr(model.rope, name, getattr(model.rope, name).to(rope_dtype))
    gen = torch.Generator(device=device).manual_seed(1)
    inputs = dict(
        hidden_states=torch.randn(1, config["in_channels"], *latent, generator=gen,
                                  device=device).bfloat16(),
        timestep=torch.tensor([700.0], device=device),
        encoder_hidden_states=torch.randn(1, TINY_WAN_TEXT, config["text_dim"], generator=gen,
                                          device=device).bfloat16(),
    )
    return model, inputs


def tiny_hunyuan_video_15():
    """diffusers' HunyuanVideo15Transformer3DModel, 2 blocks of 2 heads x 64, bf16, and one
    input: 2 x 16 x 16 video tokens (patch 1), then 20 prompt tokens (13 real), 8 glyph tokens
    (5 real) and 6 image tokens, 546 in all; the model moves the real ones first, so the first
    536 are kept. Its processor builds a [B, 1, S, S] mask in every attention call."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    model = diffusers.HunyuanVideo15Transformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=64,
        num_layers=2, num_refiner_layers=1, mlp_ratio=2.0, text_embed_dim=32,
        text_embed_2_dim=16, image_embed_dim=24, rope_axes_dim=(16, 24, 24), target_size=64,
    ).to(DEVICE).eval().requires_grad_(False).to(torch.bfloat16)
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    text_mask = torch.ones(1, 20, dtype=torch.int64, device=DEVICE)
    text_mask[:, 13:] = 0
    text_mask_2 = torch.ones(1, 8, dtype=torch.int64, device=DEVICE)
    text_mask_2[:, 5:] = 0

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=DEVICE).bfloat16()

    inputs = dict(hidden_states=randn(1, 4, 2, 16, 16),
                  timestep=torch.tensor([700.0], device=DEVICE).bfloat16(),
                  encoder_hidden_states=randn(1, 20, 32), encoder_attention_mask=text_mask,
                  encoder_hidden_states_2=randn(1, 8, 16), encoder_attention_mask_2=text_mask_2,
                  image_embeds=randn(1, 6, 24))
    return model, inputs


@pytest.fixture
def diffusers_state():
    """fp8dit's backend registered; diffusers' active backend and fp8dit's recipe restored after
    the test (enable() changes both)."""
    import diffusers.models.attention_dispatch as ad

    from fp8dit.integrations import diffusers as fd

    fd.register()
    active = ad._AttentionBackendRegistry._active_backend
    yield
    ad._AttentionBackendRegistry.set_active_backend(active)
    fd.set_recipe(None)


@pytest.fixture
def sdpa_mask_dtypes(monkeypatch):
    """The dtype of every ``attn_mask`` that reaches torch's SDPA from here on (None for no
    mask): fp8dit's fallbacks must hand it masks in the inputs' dtype (fp8dit.sdpa.sdpa_mask)."""
    import torch

    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, attn_mask=None, **kwargs):
        seen.append(None if attn_mask is None else attn_mask.dtype)
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    return seen
