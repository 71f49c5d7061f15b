"""cache-dit (1.5.3) with attention backend "fp8dit": 2 CPU processes on gloo.

One spawn of 2 ranks; on each, through cache-dit's own code: ``import
fp8dit.integrations.cache_dit``, then a tiny diffusers ``WanTransformer3DModel``

* under ``cache_dit.enable_cache(model, attention_backend="fp8dit")`` (one process: cache-dit
  sets diffusers' backend, fp8dit's diffusers adapter runs it);
* under ``enable_cache(model, parallelism_config=ParallelismConfig(ulysses_size=2,
  attention_backend="fp8dit"))`` and ``ring_size=2``: cache-dit splits the tokens, patches Wan's
  processor and runs its own Ulysses and ring attention around fp8dit (the ring merging the LSE
  fp8dit returns), against the one-process fp8dit forward and the bf16 forward;
* a key-padding mask through cache-dit's own dispatcher in one process (FP8 over the kept keys,
  against fp64), and under Ulysses, where it goes to cache-dit's native backend (cache-dit takes
  no mask under its ring attention, native backend included).

One CPU shim (``_cpu_shim``), named with its reason: cache-dit's ring merges partial outputs
with its fused Triton op, registered for CUDA only; on CPU its own torch merge runs (the code
path cache-dit takes where its kernels do not import). Nothing on the attention path is
replaced.
"""

import importlib.util

import pytest
import torch

if importlib.util.find_spec("cache_dit") is None:
    pytest.skip("cache-dit is not installed (tests/engines/install.sh)", allow_module_level=True)

from conftest import TINY_WAN_TEXT, build_tiny_wan  # noqa: E402
from engines import ranks as engine_ranks  # noqa: E402

import fp8dit  # noqa: E402
from fp8dit.testing import attention_ref, error_stats  # noqa: E402

HEADS = 4  # Ulysses: 2 per rank
LAYERS = 1
LATENT = (2, 14, 18)  # -> 2 x 7 x 9 = 126 tokens, 63 per rank
TOKENS = LATENT[0] * (LATENT[1] // 2) * (LATENT[2] // 2)
TEXT = TINY_WAN_TEXT
LSE_TOKENS = 2 * 67  # direct calls with the LSE: 67 per rank, no tile multiple
LSE_ERROR_RATIO = 1.5  # max-abs LSE error over the one-process call's
QK_GAIN = 2.0  # sharper scores than random weights give, so that a wrong merge shows
# Measured on the interpreter (int8qk-fp8pv): the final output under Ulysses and ring within
# cos 0.9999 of the one-process fp8dit forward; against bf16 every path within 1.1x of the
# one-process fp8dit forward's rel-L1.
COS_VS_ONE_PROCESS = 0.999
COS_VS_BF16 = 0.995
ERROR_RATIO_VS_BF16 = 1.25


def _tiny_wan():
    return build_tiny_wan(heads=HEADS, num_layers=LAYERS, latent=LATENT, qk_gain=QK_GAIN,
                          device="cpu")


def _lse_qkv():
    g = torch.Generator().manual_seed(6)
    return tuple((torch.randn(1, LSE_TOKENS, HEADS, 64, generator=g) * s).bfloat16()
                 for s in (1.4, 1.4, 1.0))


def _masked_qkv():
    g = torch.Generator().manual_seed(5)
    return tuple(torch.randn(1, 16, 2, 64, generator=g).bfloat16() for _ in range(3))


def _key_padding_mask():
    mask = torch.ones(1, 1, 1, 16, dtype=torch.bool)  # SDPA's convention: the first 13 keys
    mask[..., 13:] = False
    return mask


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def _cpu_shim():
    """cache-dit 1.5.3 registers its fused ring merge (``cache_dit_triton_ops``) for CUDA only
    and takes it whenever its kernels import: without CUDA, its torch merge instead."""
    from cache_dit.distributed.core import _templated_ring

    if not torch.cuda.is_available():
        _templated_ring.fused_merge_attn_states = None


def _rank(rank, port):
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         rank=rank, world_size=2)
    import cache_dit

    import fp8dit.integrations.cache_dit as fc
    from fp8dit.integrations import diffusers as fd

    _cpu_shim()
    res = {"problems": fc.cache_dit_internals_problems()}
    model, inputs = _tiny_wan()
    res["bf16"] = _forward(model, inputs)
    cache_dit.enable_cache(model, attention_backend="fp8dit")  # one process
    with fd.record_calls() as calls:
        res["one"] = _forward(model, inputs)
    res["one_calls"] = list(calls)
    # a key-padding mask through cache-dit's own dispatcher, one process
    from cache_dit.attention import _dispatch_attention_fn

    q, k, v = _masked_qkv()
    with fc.ENGINE.record_calls() as calls:
        res["masked_one"] = _dispatch_attention_fn(q, k, v, attn_mask=_key_padding_mask(),
                                                   backend="fp8dit")
    res["masked_one_calls"] = list(calls)
    for mode, size in (("ulysses", dict(ulysses_size=2)), ("ring", dict(ring_size=2))):
        model, inputs = _tiny_wan()
        config = cache_dit.ParallelismConfig(attention_backend="fp8dit", **size)
        cache_dit.enable_cache(model, parallelism_config=config)
        with fc.ENGINE.record_calls() as calls, fd.record_calls() as diffusers_calls:
            out = _forward(model, inputs)
        res[mode] = dict(out=out, calls=list(calls), diffusers_calls=list(diffusers_calls))
        # cache-dit's Ulysses / ring attention called directly, with the LSE
        cp = next(m for m in model.modules() if getattr(m, "_cp_config", None) is not None)
        q, k, v = _lse_qkv()
        local = slice(LSE_TOKENS // 2 * rank, LSE_TOKENS // 2 * (rank + 1))
        with fc.ENGINE.record_calls() as calls:
            res[mode]["lse_out"] = fc.fp8dit_attention(q[:, local], k[:, local], v[:, local],
                                                       return_lse=True,
                                                       _cp_config=cp._cp_config)
        res[mode]["lse_calls"] = list(calls)
        if mode == "ulysses":  # a mask under context parallelism: cache-dit's native backend
            q, k, v = _masked_qkv()
            local = slice(8 * rank, 8 * rank + 8)
            with fc.ENGINE.record_calls() as calls:  # the mask over the gathered keys
                res["masked_cp"] = fc.fp8dit_attention(q[:, local], k[:, local], v[:, local],
                                                       attn_mask=_key_padding_mask(),
                                                       _cp_config=cp._cp_config)
            res["masked_cp_calls"] = list(calls)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return res


@pytest.fixture(scope="module")
def ranks():
    return engine_ranks.run(_rank)


def test_cache_dit_internals_fit(ranks):
    assert ranks[0]["problems"] == [], (
        "fp8dit/integrations/cache_dit.py no longer fits this cache-dit: " + "; ".join(
            ranks[0]["problems"]))


def test_cache_dit_one_process_runs_fp8dit(ranks):
    calls = ranks[0]["one_calls"]
    # self- and cross-attention of both blocks, through diffusers' dispatcher
    assert len(calls) == 2 * LAYERS and {c["backend"] for c in calls} == {"fp8"}
    stats = error_stats(ranks[0]["one"], ranks[0]["bf16"])
    print(f"one process vs bf16: {stats}")
    assert not stats.nan and stats.cos > COS_VS_BF16


@pytest.mark.parametrize("mode", ["ulysses", "ring"])
def test_cache_dit_parallel_matches_one_process(ranks, mode):
    one, bf16 = ranks[0]["one"], ranks[0]["bf16"]
    one_vs_bf16 = error_stats(one, bf16)
    for rank, r in enumerate(ranks):
        res = r[mode]
        assert res["calls"] and {c["backend"] for c in res["calls"]} == {"fp8"}, res["calls"]
        self_attn = [c for c in res["calls"] if c["k"][1] != TEXT]
        cross = [c for c in res["calls"] if c["k"][1] == TEXT]
        # cross-attention: this rank's queries against all text keys, all heads, no LSE
        assert [(c["q"], c["lse"]) for c in cross] == [((1, TOKENS // 2, HEADS, 64), None)]
        if mode == "ulysses":  # all tokens, half the heads
            assert [c["q"] for c in self_attn] == [(1, TOKENS, HEADS // 2, 64)], self_attn
        else:  # one call per key chunk, each returning the LSE [B, S, H]
            assert [(c["q"], c["lse"]) for c in self_attn] == [
                ((1, TOKENS // 2, HEADS, 64), (1, TOKENS // 2, HEADS))] * 2, self_attn
        assert res["diffusers_calls"] == []  # cache-dit's patched processor: its dispatcher
        out = res["out"]
        vs_one, vs_bf16 = error_stats(out, one), error_stats(out, bf16)
        ratio = vs_bf16.rel_l1 / max(one_vs_bf16.rel_l1, 1e-12)
        print(f"{mode} rank {rank}: vs one process {vs_one}; vs bf16 {vs_bf16} (x{ratio:.2f})")
        assert not vs_one.nan and vs_one.cos >= COS_VS_ONE_PROCESS, vs_one
        assert vs_bf16.cos >= COS_VS_BF16 and ratio <= ERROR_RATIO_VS_BF16, (vs_bf16,
                                                                             one_vs_bf16)


@pytest.mark.parametrize("mode", ["ulysses", "ring"])
def test_cache_dit_parallel_lse_against_fp64(ranks, mode):
    q, k, v = _lse_qkv()
    ref, ref_lse = attention_ref(q, k, v, return_lse=True)
    one, one_lse = fp8dit.attention(q, k, v, return_lse=True)
    one_err = (one_lse.double() - ref_lse).abs().max().item()  # the one-process call's
    for rank, r in enumerate(ranks):
        local = slice(LSE_TOKENS // 2 * rank, LSE_TOKENS // 2 * (rank + 1))
        out, lse = r[mode]["lse_out"]
        assert lse.shape == (1, LSE_TOKENS // 2, HEADS) and lse.dtype == torch.float32
        assert {c["backend"] for c in r[mode]["lse_calls"]} == {"fp8"}
        err = (lse.double() - ref_lse.transpose(1, 2)[:, local]).abs().max().item()
        vs_ref, one_vs_ref = error_stats(out, ref[:, local]), error_stats(one[:, local],
                                                                          ref[:, local])
        ratio = vs_ref.rel_l1 / one_vs_ref.rel_l1
        print(f"{mode} rank {rank} (direct): vs fp64 {vs_ref} (x{ratio:.2f} one process); "
              f"lse max abs err {err:.2e} (one process: {one_err:.2e})")
        assert not vs_ref.nan and ratio <= ERROR_RATIO_VS_BF16, (vs_ref, one_vs_ref)
        assert err <= LSE_ERROR_RATIO * one_err, (err, one_err)


def test_cache_dit_mask_under_context_parallelism_runs_native(ranks):
    q, k, v = _masked_qkv()
    for rank, r in enumerate(ranks):
        assert r["masked_cp_calls"] == []  # cache-dit's native backend, not fp8dit
        ref = attention_ref(q[:, 8 * rank:8 * rank + 8], k[:, :13], v[:, :13])
        assert error_stats(r["masked_cp"], ref).cos > 0.9999


def test_cache_dit_key_padding_mask_in_one_process_runs_fp8dit(ranks):
    q, k, v = _masked_qkv()
    ref = attention_ref(q, k[:, :13], v[:, :13])
    for r in ranks:
        assert [(c["backend"], c["reason"]) for c in r["masked_one_calls"]] == [
            ("fp8", "key-padding mask: FP8 over the kept keys")], r["masked_one_calls"]
        stats = error_stats(r["masked_one"], ref)
        assert not stats.nan and stats.cos > 0.999, stats
