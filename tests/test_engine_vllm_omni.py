"""vLLM-Omni (vllm-omni 0.30.0) with diffusion attention backend "fp8dit": 2 CPU processes on gloo.

One spawn of 2 ranks runs everything of vLLM-Omni once (its import takes ~10 s of CPU a process)
and saves what it saw; the tests below judge it. On each rank, through vLLM-Omni's own code:

* its plugin loader (``load_omni_general_plugins``, what every diffusion worker runs first)
  finds fp8dit's entry point, which adds ``FP8DIT`` to its backend enum;
* rank 1: the three ways to name a backend, each through vLLM-Omni's CLI parser (``vllm serve
  <model> --omni ...``), its stage-config resolution and its selector: ``--diffusion-attention-
  backend fp8dit``, ``DIFFUSION_ATTENTION_BACKEND=fp8dit``, and a per-role
  ``--diffusion-attention-config`` (fp8dit for "self", the platform default for "cross");
* rank 0, one process: vLLM-Omni's ``Attention`` layer with fp8dit selected (GQA, the layer's
  softmax scale) against :func:`fp8dit.attention` called directly and fp64; masks in
  vLLM-Omni's ``[B, Sk]`` convention (key padding FP8, holes torch SDPA), a per-query mask, a
  causal call with ``Sq != Sk`` (bottom-right) and float32 (``auto`` declines it);
* the layer under Ulysses (all-to-all over heads, GQA; then with joint text tokens appended
  rear and a key mask whose padding ends the text) and all-gather-KV, against the one-process
  call and fp64; and under ring attention, which runs vLLM-Omni's own ring kernels: fp8dit is
  not called, and without a FlashAttention ring kernel for the device (here: the CPU) vLLM-Omni
  refuses the explicit selection.

The install is tests/engines/install.sh (vllm-omni and vllm with --no-deps and the few packages
their diffusion attention and CLI parser import). Stubbed (tests/engines/stubs.py): torchvision
and torchaudio, which vLLM-Omni's CLI module imports for models and audio serving. vLLM-Omni's
platform needs three answers on a machine without a GPU (``_cpu_shims``); nothing on the
attention path is replaced.
"""

import importlib.util
import json
import os

import pytest
import torch

if importlib.util.find_spec("vllm_omni") is None:
    pytest.skip("vllm-omni is not installed (tests/engines/install.sh)", allow_module_level=True)

from engines import ranks as engine_ranks  # noqa: E402

import fp8dit  # noqa: E402
from fp8dit.testing import attention_ref, error_stats  # noqa: E402

HEADS, KV_HEADS, D = 4, 2, 64  # GQA; Ulysses: 2 query heads and 1 key/value head per rank
TOKENS = 2 * 67  # 67 per rank: no tile multiple
TEXT, TEXT_KEPT = 20, 14  # joint text tokens (appended rear) and those its mask keeps
KEPT = 120  # keys a one-process key-padding mask keeps
SCALE = 0.11  # the layer's softmax scale (not D**-0.5, so that a dropped scale shows)
CAUSAL_Q = 40  # causal call with fewer queries than keys
# Measured on the interpreter (int8qk-fp8pv), as for SGLang and xDiT: Ulysses and all-gather-KV
# within cos 0.9999 of the one-process call; against fp64 within 1.0x its rel-L1.
COS_VS_ONE_PROCESS = 0.998
ERROR_RATIO_VS_FP64 = 1.25
BACKEND_PATH = "fp8dit.integrations.vllm_omni.Fp8ditAttentionBackend"


def _qkv(seed=31, tokens=TOKENS):
    g = torch.Generator().manual_seed(seed)
    # scores of std ~2: sharper than random weights give, so a wrong head or scale shows
    return tuple((torch.randn(1, tokens, h, D, generator=g) * s).bfloat16()
                 for h, s in ((HEADS, 1.4), (KV_HEADS, 1.4), (KV_HEADS, 1.0)))


def _text_mask():
    mask = torch.zeros(1, TEXT, dtype=torch.bool)
    mask[:, :TEXT_KEPT] = True
    return mask


def _joint_qkv():
    """The image tokens with the joint text appended rear, its padding dropped from the keys."""
    q, k, v = _qkv()
    tq, tk, tv = _qkv(seed=32, tokens=TEXT)
    return (torch.cat([q, tq], 1), *(torch.cat([a, b[:, :TEXT_KEPT]], 1)
                                     for a, b in ((k, tk), (v, tv))))


def _masks():
    """vLLM-Omni's key masks ``[B, Sk]``: key padding (the first KEPT keys kept), and holes."""
    padding = torch.zeros(1, TOKENS, dtype=torch.bool)
    padding[:, :KEPT] = True
    holes = torch.ones(1, TOKENS, dtype=torch.bool)
    holes[:, 10:20] = False
    return padding, holes


def _cpu_shims():
    """What vLLM-Omni 0.30.0 lacks on a machine without a GPU (not fp8dit's part). Three answers
    change, nothing on the attention path:

    * vLLM's CUDA platform module (which vLLM-Omni's CUDA platform subclasses) imports vLLM's
      compiled CUDA ops, which need ``libcuda``: an empty module stands for them where they do
      not load (backend selection and the diffusion attention path call none of them);
    * vLLM-Omni's platform is its CUDA platform, as on a GPU machine: its detection asks NVML for
      a GPU, finds none and falls back to an "unspecified" platform that has no backend selection
      and no forward route. It is set before vLLM-Omni's diffusion modules bind it at import;
    * that platform's compute-capability probe asks torch.cuda (no driver here): it answers None
      ("unknown", as vLLM's platform API allows), which its selection reads as no FlashAttention
      (the default becomes TORCH_SDPA) and which leaves an explicit selection validated as on
      any GPU.

    Ranks also create their gloo process group before vLLM-Omni's ``init_distributed_environment``
    (which then keeps it): created there, it would next pick a CUDA device.
    """
    import sys
    import types

    try:
        import vllm._C_stable_libtorch  # noqa: F401
    except ImportError:
        sys.modules["vllm._C_stable_libtorch"] = types.ModuleType("vllm._C_stable_libtorch")
    import vllm_omni.platforms as platforms
    from vllm_omni.platforms.cuda.platform import CudaOmniPlatform

    CudaOmniPlatform.get_device_capability = classmethod(lambda cls, device_id=0: None)
    platforms.current_omni_platform = CudaOmniPlatform()


def _rank(rank, port):
    os.environ["HF_HUB_OFFLINE"] = "1"  # the CLI's model is a local folder
    stubbed = []
    if rank == 1:  # the CLI parser's module imports them (before vLLM-Omni's first import)
        from engines import stubs

        stubbed = stubs.install("torchvision", "torchaudio")
    _cpu_shims()
    from vllm_omni.plugins import load_omni_general_plugins

    load_omni_general_plugins()  # what vLLM-Omni's engine and diffusion workers run first
    from vllm_omni.diffusion.attention.backends.registry import DiffusionAttentionBackendEnum
    from vllm_omni.diffusion.distributed import parallel_state as ps

    import fp8dit.integrations.vllm_omni as fv

    member = DiffusionAttentionBackendEnum.__members__.get("FP8DIT")
    res = {"member": None if member is None else member.value, "stubbed": stubbed,
           "problems": fv.vllm_omni_internals_problems()}
    if rank == 0:
        res.update(_one_process())
        res["misfit_log"] = _misfit_logged(fv)
    else:
        res["routes"] = _selection_routes()
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         world_size=2, rank=rank)
    ps.init_distributed_environment(world_size=2, rank=rank, local_rank=rank,
                                    distributed_init_method=f"tcp://127.0.0.1:{port}",
                                    backend="gloo")
    for mode, degrees in (("ulysses", dict(ulysses_degree=2)),
                          ("allgather", dict(allgather_degree=2)),
                          ("ring", dict(ring_degree=2))):
        ps.initialize_model_parallel(sequence_parallel_size=2, backend="gloo", **degrees)
        res[mode] = _parallel(rank, mode, degrees)
        torch.distributed.barrier()
        ps.destroy_model_parallel()
    ps.destroy_distributed_environment()
    return res


def _config(**parallel):
    """vLLM-Omni's diffusion config with fp8dit as the default backend."""
    from vllm_omni.diffusion.data import DiffusionParallelConfig, OmniDiffusionConfig

    return OmniDiffusionConfig.from_kwargs(
        diffusion_attention_config={"default": {"backend": "fp8dit"}},
        parallel_config=DiffusionParallelConfig(
            sequence_parallel_size=2 if parallel else 1, **parallel))


def _layer(causal=False, **kwargs):
    from vllm_omni.diffusion.attention.layer import Attention

    return Attention(num_heads=HEADS, head_size=D, causal=causal, softmax_scale=SCALE,
                     num_kv_heads=KV_HEADS, **kwargs)


def _parallel(rank, mode, degrees):
    """One mode of sequence parallelism: vLLM-Omni's layer on this rank's tokens."""
    from vllm_omni.diffusion.attention.backends.abstract import AttentionMetadata
    from vllm_omni.diffusion.config import set_current_diffusion_config
    from vllm_omni.diffusion.forward_context import set_forward_context

    import fp8dit.integrations.vllm_omni as fv

    config = _config(**degrees)
    q, k, v = _qkv()
    local = slice(rank * TOKENS // 2, (rank + 1) * TOKENS // 2)
    ql, kl, vl = (t[:, local] for t in (q, k, v))
    res = {}
    with set_current_diffusion_config(config), set_forward_context(omni_diffusion_config=config):
        layer = _layer()
        res.update(impl=type(layer.attention).__name__,
                   strategy=type(layer.parallel_strategy).__name__)
        with fv.ENGINE.record_calls() as calls, torch.no_grad():
            try:
                res["out"] = layer(ql, kl, vl)
            except Exception as e:  # ring: vLLM-Omni's own refusal, judged by the test
                res["error"] = f"{type(e).__name__}: {e}"
        res["calls"] = list(calls)
        if mode == "ring":
            runner = layer.ring_runner
            res["ring_runner"] = (type(runner).__name__, runner.attn_backend_pref,
                                  runner.attn_backend_explicit)
        if mode == "ulysses":
            tq, tk, tv = _qkv(seed=32, tokens=TEXT)  # the same on both ranks, as the model's
            joint = AttentionMetadata(joint_query=tq, joint_key=tk, joint_value=tv,
                                      joint_strategy="rear", joint_attn_mask=_text_mask())
            with fv.ENGINE.record_calls() as calls, torch.no_grad():
                res["joint"] = layer(ql, kl, vl, joint)
                res["holes"] = layer(ql, kl, vl, AttentionMetadata(attn_mask=_masks()[1]))
            res["joint_calls"] = list(calls)
    return res


def _one_process():
    """Rank 0 without parallelism: vLLM-Omni's layer with fp8dit selected, masks, fallbacks."""
    from vllm_omni.diffusion.attention.backends.abstract import AttentionMetadata
    from vllm_omni.diffusion.config import set_current_diffusion_config

    import fp8dit.integrations.vllm_omni as fv

    q, k, v = _qkv()
    res = {}
    with set_current_diffusion_config(_config()):
        layer, causal = _layer(), _layer(causal=True)
        backend = layer.attn_backend
        res["backend"] = dict(name=backend.get_name(), path=f"{backend.__module__}."
                              f"{backend.__qualname__}", masks=backend.supports_attention_mask(),
                              platforms=backend.supported_platforms,
                              head_sizes=(min(backend.get_supported_head_sizes()),
                                          max(backend.get_supported_head_sizes())))
        with fv.ENGINE.record_calls() as calls, torch.no_grad():
            res["layer"] = layer(q, k, v)
            res["direct"] = fp8dit.attention(q, k, v, scale=SCALE)
            res["masked"] = [layer(q, k, v, AttentionMetadata(attn_mask=m)) for m in _masks()]
            per_query = torch.ones(1, 1, TOKENS, TOKENS, dtype=torch.bool).tril()
            res["per_query"] = layer(q, k, v, AttentionMetadata(attn_mask=per_query))
            res["causal"] = causal(q[:, :CAUSAL_Q], k, v)
            res["fp32"] = layer(q.float(), k.float(), v.float())
        res["calls"] = list(calls)
    res["joint_one"] = fp8dit.attention(*_joint_qkv(), scale=SCALE)  # Ulysses' one process
    return res


def _misfit_logged(fv):
    """The entry point with vLLM-Omni's enum reported moved: a warning, no exception (vLLM-Omni
    calls general plugins unguarded in every process)."""
    import logging

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__()
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    keep, light = Keep(), fv._problems_light
    logging.getLogger("fp8dit").addHandler(keep)
    fv._problems_light = lambda: ["DiffusionAttentionBackendEnum moved (simulated)"]
    try:
        fv.register_plugin()
    finally:
        fv._problems_light = light
        logging.getLogger("fp8dit").removeHandler(keep)
    return keep.lines


# Each route: the CLI's arguments after the model, and the environment it runs in.
ROUTES = {
    "cli": (["--diffusion-attention-backend", "fp8dit", "--ulysses-degree", "2"], {}),
    "env": (["--ulysses-degree", "2"], {"DIFFUSION_ATTENTION_BACKEND": "fp8dit"}),
    "per_role": (["--diffusion-attention-config",
                  json.dumps({"per_role": {"self": {"backend": "fp8dit"}}})], {}),
}


def _selection_routes():
    """Each route through `vllm serve <model> --omni ...` as vLLM-Omni's CLI parses it
    (``vllm_omni.entrypoints.cli.main``), its stage-config resolution (what its server hands
    the diffusion stage) and its selector, per attention role."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        for sub in ("transformer", "vae"):
            os.makedirs(os.path.join(model, sub))
        with open(os.path.join(model, "model_index.json"), "w") as f:  # a diffusers layout
            f.write('{"_class_name": "WanPipeline", "_diffusers_version": "0.40.0"}')
        return _resolve_routes(model)


def _resolve_routes(model):
    from vllm_omni.config.resolver import resolve_omni_config
    from vllm_omni.diffusion.attention.selector import get_attn_backend_for_role
    from vllm_omni.entrypoints.cli import serve
    from vllm_omni.entrypoints.utils import prepare_stage_config_inputs
    from vllm_omni.utils.tracking_parser import TrackingArgumentParser

    serve._ensure_vllm_platform()
    parser = TrackingArgumentParser()
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    for cmd in serve.cmd_init():
        cmd.subparser_init(subparsers).set_defaults(dispatch_function=cmd.cmd)
    routes = {}
    for name, (argv, env) in ROUTES.items():
        os.environ.update(env)
        try:
            args = parser.parse_args(["serve", model, "--omni", *argv])
            serve.OmniServeCommand().validate(args)
            kwargs = args.get_explicit_kwargs_dict()
            kwargs.pop("model", None)
            inputs = prepare_stage_config_inputs(args.model_tag, kwargs, trust_remote_code=None)
            resolved = resolve_omni_config(
                inputs.model, trust_remote_code=None, cli_overrides=inputs.kwargs,
                deploy_config_path=inputs.deploy_config_path,
                stage_overrides=inputs.stage_overrides,
                strategy_config_path=inputs.strategy_config_path)
        finally:
            for var in env:
                del os.environ[var]
        (stage,) = resolved.stage_configs
        config = stage.diffusion_config
        selected = {role: get_attn_backend_for_role(role, D, config.diffusion_attention_config)[0]
                    for role in ("self", "cross")}
        routes[name] = dict(ulysses=stage.parallel_config.ulysses_degree, **{
            role: (cls.get_name(), f"{cls.__module__}.{cls.__qualname__}")
            for role, cls in selected.items()})
    return routes


@pytest.fixture(scope="module")
def ranks():
    return engine_ranks.run(_rank)


def test_vllm_omni_plugin_registers_and_internals_fit(ranks):
    """vLLM-Omni's plugin loader ran fp8dit's entry point in each process (the member's value is
    the backend's class path), and everything private the adapter relies on is where it expects
    it (a new vLLM-Omni release that moves one fails here with the list)."""
    for r in ranks:
        assert r["member"] == BACKEND_PATH, r["member"]
        assert r["problems"] == [], (
            "fp8dit/integrations/vllm_omni.py no longer fits this vLLM-Omni: "
            + "; ".join(r["problems"]))
    assert ranks[1]["stubbed"] in ([], ["torchvision"], ["torchaudio"],
                                   ["torchvision", "torchaudio"])


def test_vllm_omni_misfit_is_logged_not_raised(ranks):
    lines = ranks[0]["misfit_log"]
    assert len(lines) == 1 and "does not fit vllm-omni" in lines[0] \
        and "(simulated)" in lines[0] and "'fp8dit' is not registered" in lines[0], lines


@pytest.mark.parametrize("route", list(ROUTES))
def test_vllm_omni_routes_select_fp8dit(ranks, route):
    r = ranks[1]["routes"][route]
    assert r["self"] == ("FP8DIT", BACKEND_PATH), r
    if route == "per_role":  # the other roles keep the platform's default (here: SDPA)
        assert r["cross"][0] == "SDPA", r
    else:
        assert r["cross"] == r["self"] and r["ulysses"] == 2, r


def test_vllm_omni_backend_declares(ranks):
    assert ranks[0]["backend"] == dict(name="FP8DIT", path=BACKEND_PATH, masks=True,
                                       platforms=("cuda", "rocm"), head_sizes=(1, 256))


def test_vllm_omni_layer_matches_fp8dit_attention(ranks):
    """vLLM-Omni's layer (GQA, its softmax scale) runs fp8dit: the same bits as
    :func:`fp8dit.attention` called directly, and as close to fp64."""
    r = ranks[0]
    q, k, v = _qkv()
    assert r["calls"][0]["backend"] == "fp8" and r["calls"][0]["k"] == (1, TOKENS, KV_HEADS, D)
    assert torch.equal(r["layer"], r["direct"])
    stats = error_stats(r["layer"], attention_ref(q, k, v, scale=SCALE))
    print(f"one process: vs fp64 {stats}")
    assert not stats.nan and stats.cos > 0.999, stats
    wrong_scale = error_stats(r["layer"], attention_ref(q, k, v))
    assert wrong_scale.rel_l1 > 3 * stats.rel_l1, (wrong_scale, stats)  # the scale is read


def test_vllm_omni_masks_causal_and_fallbacks(ranks):
    """vLLM-Omni's ``[B, Sk]`` key mask that pads the end runs FP8 over the kept keys; one with
    holes, a per-query ``[B, 1, Sq, Sk]`` mask, causal with ``Sq != Sk`` (bottom-right, as its
    FLASH_ATTN) and float32 run torch SDPA, each with its reason."""
    r = ranks[0]
    q, k, v = _qkv()
    calls = [(c["backend"], c["reason"]) for c in r["calls"][1:]]
    assert calls[0] == ("fp8", "key-padding mask: FP8 over the kept keys"), calls
    assert calls[1] == ("sdpa", "fallback: attn_mask keeps keys that are not a prefix (the "
                        "padding must come last)"), calls
    assert calls[2][0] == "sdpa" and "is no key-padding mask" in calls[2][1], calls
    assert calls[3][0] == "sdpa" and "aligns the mask bottom-right" in calls[3][1], calls
    assert calls[4][0] == "sdpa" and "float32" in calls[4][1], calls
    padding, holes = r["masked"]
    kept = torch.cat([torch.arange(10), torch.arange(20, TOKENS)])
    for got, keys in ((padding, slice(0, KEPT)), (holes, kept)):
        stats = error_stats(got, attention_ref(q, k[:, keys], v[:, keys], scale=SCALE))
        assert not stats.nan and stats.cos > 0.999, stats
    per_query = attention_ref(q, k, v, scale=SCALE, is_causal=True)  # the mask is tril
    assert error_stats(r["per_query"], per_query).cos > 0.9999
    bottom_right = torch.ones(CAUSAL_Q, TOKENS, dtype=torch.bool).tril(TOKENS - CAUSAL_Q)
    ref = torch.nn.functional.scaled_dot_product_attention(
        *(t.double().transpose(1, 2) for t in (q[:, :CAUSAL_Q], k, v)), attn_mask=bottom_right,
        scale=SCALE, enable_gqa=True).transpose(1, 2)
    assert error_stats(r["causal"], ref).cos > 0.9999
    assert r["fp32"].dtype == torch.float32
    assert error_stats(r["fp32"], attention_ref(q, k, v, scale=SCALE)).cos > 0.9999


def _check(got, one, ref, what):
    engine_ranks.check_against_one_process(got, one, ref, what, COS_VS_ONE_PROCESS,
                                           ERROR_RATIO_VS_FP64)


@pytest.mark.parametrize("mode", ["ulysses", "allgather"])
def test_vllm_omni_sequence_parallel_matches_one_process(ranks, mode):
    """vLLM-Omni's Ulysses (all tokens, half the heads per rank) and all-gather-KV (this rank's
    queries, all keys) hand fp8dit the rank's attention; merged back by vLLM-Omni, it matches
    the one-process call and fp64."""
    q, k, v = _qkv()
    one = ranks[0]["layer"]  # the one-process call (the same bits as fp8dit.attention)
    ref = attention_ref(q, k, v, scale=SCALE)
    half = TOKENS // 2
    shapes = {"ulysses": ((1, TOKENS, HEADS // 2, D), (1, TOKENS, KV_HEADS // 2, D)),
              "allgather": ((1, half, HEADS, D), (1, TOKENS, KV_HEADS, D))}[mode]
    for rank, r in enumerate(ranks):
        res = r[mode]
        assert res["impl"] == "Fp8ditAttentionImpl", res["impl"]
        assert res["strategy"] == {"ulysses": "UlyssesParallelAttention",
                                   "allgather": "AllGatherKVParallelAttention"}[mode]
        assert [(c["backend"], c["q"], c["k"]) for c in res["calls"]] == [("fp8", *shapes)], \
            res["calls"]
        local = slice(rank * half, (rank + 1) * half)
        _check(res["out"], one[:, local], ref[:, local], f"{mode} rank {rank}")


def test_vllm_omni_ulysses_joint_text_and_masks(ranks):
    """Ulysses with joint text tokens appended rear, their mask padding the end of the text:
    vLLM-Omni joins the masks into one key mask that keeps a prefix, which runs FP8 over the
    kept keys; a mask with holes runs torch SDPA with it."""
    q, k, v = _qkv()
    one, ref = ranks[0]["joint_one"], attention_ref(*_joint_qkv(), scale=SCALE)
    kept = torch.cat([torch.arange(10), torch.arange(20, TOKENS)])
    holes_ref = attention_ref(q, k[:, kept], v[:, kept], scale=SCALE)
    half = TOKENS // 2
    for rank, r in enumerate(ranks):
        res = r["ulysses"]
        assert [(c["backend"], c["reason"], c["k"]) for c in res["joint_calls"]] == [
            ("fp8", "key-padding mask: FP8 over the kept keys",
             (1, TOKENS + TEXT, KV_HEADS // 2, D)),
            ("sdpa", "fallback: attn_mask keeps keys that are not a prefix (the padding must "
             "come last)", (1, TOKENS, KV_HEADS // 2, D))], res["joint_calls"]
        rows = torch.cat([torch.arange(rank * half, (rank + 1) * half),
                          torch.arange(TOKENS, TOKENS + TEXT)])  # this rank's image, all text
        _check(res["joint"], one[:, rows], ref[:, rows], f"ulysses joint rank {rank}")
        local = slice(rank * half, (rank + 1) * half)
        assert error_stats(res["holes"], holes_ref[:, local]).cos > 0.9999


def test_vllm_omni_ring_runs_its_own_kernels(ranks):
    """Ring attention bypasses the backend: vLLM-Omni's ring runner takes the selection
    ("fp8dit", explicit) and runs its own FlashAttention ring kernels, never fp8dit's. Without
    one for the device (here the CPU) it refuses the explicit selection instead of running
    SDPA (docs/integrations.md)."""
    for r in ranks:
        res = r["ring"]
        assert res["impl"] == "Fp8ditAttentionImpl" and res["calls"] == [], res
        assert res["ring_runner"] == ("RingParallelAttention", "fp8dit", True), res
        assert res.get("error") == ("RuntimeError: fp8dit was explicitly selected, but no "
                                    "compatible ring kernel is available for device cpu."), res
