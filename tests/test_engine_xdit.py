"""xDiT (xfuser 0.7.0) with attention backend "fp8dit": 2 CPU processes on gloo.

One spawn of 2 ranks; on each, through xDiT's own code: ``import fp8dit.integrations.xdit``,
then xDiT's CLI arguments (``--attention_backend fp8dit`` with ``--ulysses_degree 2`` and with
``--ring_degree 2``), its engine config, model-parallel groups and runtime state (which resolves
the name), and its ``USP`` attention: Ulysses (all-to-all over heads) and ring (torch's
templated ring, merged by the LSE fp8dit returns), against the same backend in one process and
against fp64. A per-step hybrid schedule (``AttentionSchedule`` ``fp8dit,sdpa,fp8dit``) switches
backends step by step under Ulysses. Masks in ``attention_kwargs`` under Ulysses: key padding
runs FP8 over the kept keys (against the one-process call on those keys and fp64), holes
torch SDPA.

xfuser 0.7.0 does not run on a CPU-only torch as released; two shims (``_cpu_shims``), each
named with its reason, make its parallel attention run here. Nothing on the attention path is
replaced.
"""

import importlib.util

import pytest
import torch

if importlib.util.find_spec("xfuser") is None:
    pytest.skip("xfuser is not installed (tests/engines/install.sh)", allow_module_level=True)

from engines import ranks as engine_ranks  # noqa: E402

import fp8dit  # noqa: E402
from fp8dit.testing import attention_ref, error_stats  # noqa: E402

HEADS, D = 4, 64
TOKENS = 2 * 67
KEPT = 120  # keys a key-padding mask keeps
# Measured on the interpreter (int8qk-fp8pv), as for SGLang: Ulysses within cos 0.99999 of the
# one-process call, ring cos ~0.999 (each key chunk quantized on its own); against fp64 both
# within 1.0x of the one-process call's rel-L1. A wrong LSE merge moves that ratio far up.
COS_VS_ONE_PROCESS = 0.998
ERROR_RATIO_VS_FP64 = 1.25


def _qkv(seed=21):
    g = torch.Generator().manual_seed(seed)
    return tuple((torch.randn(1, HEADS, TOKENS, D, generator=g) * s).bfloat16()
                 for s in (1.4, 1.4, 1.0))  # xDiT's [B, H, S, D]


def _masks():
    """SDPA's boolean [B, 1, 1, Sk] masks: key padding (the first KEPT keys), and holes."""
    padding = torch.ones(1, 1, 1, TOKENS, dtype=torch.bool)
    padding[..., KEPT:] = False
    holes = torch.ones(1, 1, 1, TOKENS, dtype=torch.bool)
    holes[..., 10:20] = False
    return padding, holes


def _cpu_shims():
    """What xfuser 0.7.0 lacks on a machine without a GPU (not fp8dit's part): it gates its
    device probe and its sequence parallelism on ``torch.cuda.is_available()``, and names the
    device by torch's build (a CUDA build without a GPU is "cuda" to it). Four answers change,
    nothing on the attention path:

    * its device name is "cpu" (no ``torch.cuda.set_device`` in ``init_distributed_environment``);

    * ``xfuser.envs`` reads a CUDA version at import and raises without an accelerator
      ("No Accelerators ... available"): its device-version probe answers None, as it does on
      MPS and NPU;
    * its package check reports yunchang (the sequence-parallel kit, installed) missing without
      CUDA, and the config then refuses ``sp_degree`` 2: it reports what the import finds;
    * ``xfuser.model_executor.layers.usp`` binds yunchang's process-group holder, which
      ``initialize_model_parallel`` fills, only with CUDA (ring attention reads its ring group
      there): bound to the same holder (``_apply_usp_shim``).

    The first two apply when ``xfuser.envs`` loads (the package import reads them at once).
    """
    import importlib.abc
    import sys

    if torch.cuda.is_available() or "xfuser.envs" in sys.modules:
        return

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if fullname != "xfuser.envs":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            real = spec.loader

            class Loader(importlib.abc.Loader):
                def create_module(self, spec):
                    return real.create_module(spec)

                def exec_module(self, module):
                    real.exec_module(module)
                    module.get_device_version = lambda: None
                    # a CUDA build of torch without a GPU: xfuser names the device by the build
                    module._is_cuda = lambda: False
                    module.get_device_name = lambda: "cpu"
                    info = module.PACKAGES_CHECKER.get_packages_info()
                    info["has_long_ctx_attn"] = importlib.util.find_spec("yunchang") is not None

            spec.loader = Loader()
            return spec

    sys.meta_path.insert(0, Finder())


def _apply_usp_shim():
    from xfuser.model_executor.layers import usp
    from yunchang.globals import PROCESS_GROUP

    if usp.PROCESS_GROUP is None:
        usp.PROCESS_GROUP = PROCESS_GROUP


class _Pipeline:
    """What xDiT's runtime state reads of a pipeline: its transformer's config."""

    class transformer:  # noqa: N801
        class config:  # noqa: N801
            num_attention_heads, attention_head_dim, patch_size, in_channels = HEADS, D, 2, 4


def _rank(rank, port):
    _cpu_shims()
    import argparse

    from xfuser.config import xFuserArgs
    from xfuser.core.distributed import (
        get_runtime_state,
        init_distributed_environment,
        initialize_model_parallel,
        initialize_runtime_state,
    )
    from xfuser.core.distributed.attention_schedule import AttentionSchedule
    from xfuser.core.distributed.parallel_state import destroy_model_parallel
    from xfuser.model_executor.layers import usp

    import fp8dit.integrations.xdit as fx  # registers "fp8dit"

    res = {"problems": fx.xdit_internals_problems()}
    init_distributed_environment(rank=rank, world_size=2, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{port}")
    q, k, v = _qkv()
    local = slice(rank * TOKENS // 2, (rank + 1) * TOKENS // 2)
    ql, kl, vl = (t[:, :, local] for t in (q, k, v))
    for mode, degrees in (("ulysses", ("--ulysses_degree", "2")),
                          ("ring", ("--ring_degree", "2"))):
        parser = argparse.ArgumentParser()
        xFuserArgs.add_cli_args(parser)
        args = parser.parse_args(["--model", "unused", "--attention_backend", "fp8dit",
                                  *degrees])
        config, _ = xFuserArgs.from_cli_args(args).create_config()
        sp = config.parallel_config.sp_config
        initialize_model_parallel(sequence_parallel_degree=2, ulysses_degree=sp.ulysses_degree,
                                  ring_degree=sp.ring_degree, backend="gloo")
        _apply_usp_shim()
        initialize_runtime_state(pipeline=_Pipeline(), engine_config=config)
        state = get_runtime_state()
        with fx.ENGINE.record_calls() as calls, torch.no_grad():
            out = usp.USP(ql, kl, vl)
        one = fx.attend(fx.ENGINE, q, k, v, layout="HND")  # the same backend, one process
        res[mode] = dict(selected=state.attention_backend.name, out=out, one=one,
                         calls=list(calls))
        if mode == "ulysses":  # a per-step hybrid schedule, as --hybrid_attn_schedule sets
            schedule = AttentionSchedule.from_comma_delimited_string("fp8dit,sdpa,fp8dit")
            state.set_attention_schedule(schedule, total_steps=3)
            steps = []
            for _ in range(3):
                state.increment_step_counter()  # xDiT's per-step switch
                with fx.ENGINE.record_calls() as calls, torch.no_grad():
                    step_out = usp.USP(ql, kl, vl)
                steps.append((state.attention_backend.name, len(calls), step_out))
            res["hybrid"] = steps
            # masks in attention_kwargs, over the gathered keys (Ulysses: all keys per call)
            with fx.ENGINE.record_calls() as calls, torch.no_grad():
                res["masked"] = [usp.USP(ql, kl, vl, attention_kwargs={"attn_mask": m})
                                 for m in _masks()]
            res["masked_calls"] = list(calls)
        torch.distributed.barrier()
        destroy_model_parallel()
    return res


@pytest.fixture(scope="module")
def ranks():
    return engine_ranks.run(_rank)


def test_xdit_internals_fit(ranks):
    assert ranks[0]["problems"] == [], (
        "fp8dit/integrations/xdit.py no longer fits this xDiT: " + "; ".join(
            ranks[0]["problems"]))


@pytest.mark.parametrize("mode", ["ulysses", "ring"])
def test_xdit_cli_selects_fp8dit_and_matches_one_process(ranks, mode):
    q, k, v = _qkv()
    ref = attention_ref(q, k, v, layout="HND")
    for rank, r in enumerate(ranks):
        res = r[mode]
        assert res["selected"] == "FP8DIT"
        assert {c["backend"] for c in res["calls"]} == {"fp8"}, res["calls"]
        if mode == "ulysses":  # all tokens, half the heads; no LSE asked for
            assert [(c["q"], c["lse"]) for c in res["calls"]] == [
                ((1, HEADS // 2, TOKENS, D), None)], res["calls"]
        else:  # one call per key chunk, each returning the LSE [B, H, S]
            assert [(c["q"], c["k"], c["lse"]) for c in res["calls"]] == [
                ((1, HEADS, TOKENS // 2, D),) * 2 + ((1, HEADS, TOKENS // 2),)] * 2, res["calls"]
        local = slice(rank * TOKENS // 2, (rank + 1) * TOKENS // 2)
        got, one, exact = res["out"], res["one"][:, :, local], ref[:, :, local]
        vs_one, vs_ref, one_vs_ref = error_stats(got, one), error_stats(got, exact), \
            error_stats(one, exact)
        ratio = vs_ref.rel_l1 / max(one_vs_ref.rel_l1, 1e-12)
        print(f"{mode} rank {rank}: vs one process {vs_one}; vs fp64 {vs_ref} (x{ratio:.2f})")
        assert not vs_one.nan and vs_one.cos >= COS_VS_ONE_PROCESS, vs_one
        assert ratio <= ERROR_RATIO_VS_FP64, (vs_ref, one_vs_ref)


def test_xdit_hybrid_schedule_switches_per_step(ranks):
    for r in ranks:
        steps = r["hybrid"]
        assert [(name, n) for name, n, _ in steps] == [("FP8DIT", 1), ("SDPA", 0), ("FP8DIT", 1)]
        assert torch.equal(steps[0][2], r["ulysses"]["out"])
        assert error_stats(steps[1][2], steps[0][2]).cos > 0.999  # SDPA: the same attention


def test_xdit_masks_under_ulysses(ranks):
    """``attention_kwargs["attn_mask"]`` through xDiT's USP (Ulysses): a key-padding mask runs
    FP8 over the kept keys (against the one-process call on those keys and fp64); a mask with
    holes runs torch SDPA with it."""
    q, k, v = _qkv()
    kept = torch.cat([torch.arange(10), torch.arange(20, TOKENS)])
    ref = attention_ref(q, k[:, :, :KEPT], v[:, :, :KEPT], layout="HND")
    one = fp8dit.attention(q, k[:, :, :KEPT], v[:, :, :KEPT], layout="HND")
    ref_holes = attention_ref(q, k[:, :, kept], v[:, :, kept], layout="HND")
    for rank, r in enumerate(ranks):
        assert [(c["backend"], c["reason"], c["k"]) for c in r["masked_calls"]] == [
            ("fp8", "key-padding mask: FP8 over the kept keys", (1, HEADS // 2, TOKENS, D)),
            ("sdpa", "fallback: attn_mask keeps keys that are not a prefix (the padding must "
             "come last)", (1, HEADS // 2, TOKENS, D))], r["masked_calls"]
        local = slice(rank * TOKENS // 2, (rank + 1) * TOKENS // 2)
        got, holes = r["masked"]
        vs_one, vs_ref, one_vs_ref = (error_stats(got, one[:, :, local]),
                                      error_stats(got, ref[:, :, local]),
                                      error_stats(one[:, :, local], ref[:, :, local]))
        ratio = vs_ref.rel_l1 / max(one_vs_ref.rel_l1, 1e-12)
        print(f"key padding rank {rank}: vs one process {vs_one}; vs fp64 {vs_ref} "
              f"(x{ratio:.2f})")
        assert not vs_one.nan and vs_one.cos >= COS_VS_ONE_PROCESS, vs_one
        assert ratio <= ERROR_RATIO_VS_FP64, (vs_ref, one_vs_ref)
        assert error_stats(holes, ref_holes[:, :, local]).cos > 0.9999
