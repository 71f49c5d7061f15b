"""The Gluon Hopper kernels (``kernels.attention_sm90_ws``, ``FP8DIT_KERNEL=gluon-ws``).

Gluon does not run in Triton's interpreter, so on CPU this checks what can be checked without a
GPU: the quantizer's layouts the kernel relies on (interpreter), that the kernel compiles for
sm_90 with this Triton in every configuration ``attend`` launches it with, that its kv loops
use the Hopper tensor-core MMAs and how many instructions and spills they take per step
(SASS, bounds per Triton release: docs/triton_releases.md), and that nothing selects it unless
asked. Its outputs were compared with the Triton kernel's and fp64 on the H200
(triton 3.6; benchmarks/NOTES.md).
"""

import functools
import json
import os
import subprocess
import sys

import pytest
import torch
import triton

from fp8dit import attend, env, quantize
from fp8dit.recipes import DEFAULT_RECIPE, get_recipe


def _workspace(kv_perm16, S=300, D=64):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, S, 2, D, generator=g).bfloat16() for _ in range(3))
    plan, _ = attend.plan_for([S], [S], varlen=False, num_heads=2, num_kv_heads=2, head_dim=D,
                              is_causal=False, device=q.device)
    st = attend._bthd_strides(q, "NHD")
    return quantize.quantize_stage(plan, get_recipe(DEFAULT_RECIPE), 0.125, q, st, k, st, v, st,
                                kv_perm16=kv_perm16)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="interpreter test")
def test_kv_perm16_stores_v_in_the_p_register_order():
    plain, perm = _workspace(False), _workspace(True)
    j = torch.arange(plain.v8t.shape[-1])
    # token j = 16a + 8h + 2c + e sits at column 16a + 4c + 2h + e
    col = (j & ~15) | (((j >> 1) & 3) << 2) | (((j >> 3) & 1) << 1) | (j & 1)
    assert sorted(col.tolist()) == j.tolist()
    assert torch.equal(perm.v8t[..., col].view(torch.uint8), plain.v8t.view(torch.uint8))
    assert not torch.equal(perm.v8t.view(torch.uint8), plain.v8t.view(torch.uint8))
    for name in ("q8", "k8", "k_scale", "v_scale", "v_mean"):
        assert torch.equal(getattr(perm, name).view(torch.uint8),
                           getattr(plain, name).view(torch.uint8)), name


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="interpreter test")
@pytest.mark.parametrize("k_scale_keys", [256, 128])
def test_256_key_blocks_k_scales_and_empty_halves(monkeypatch, k_scale_keys):
    """The warp-specialized kernel's 256-key blocks: K has one scale per block (the default,
    the larger of the two 128-key halves' scales) or per 128 keys (``K_SCALE_KEYS=128``: the
    same int8 values and scales as 128-key blocks); V's grid factor follows the 256-key
    block, and the empty second half of the last block is written (zeros), never left
    uninitialized."""
    S, D = 300, 128  # the last 256-key block holds 44 keys: its second half is empty
    monkeypatch.setattr(quantize, "K_SCALE_KEYS", k_scale_keys)

    def ws_for(block_n):
        monkeypatch.setitem(attend.TILE_OVERRIDES, 128, dict(block_n=block_n))
        monkeypatch.setattr(quantize, "K_SCALE_KEYS", k_scale_keys)
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, S, 2, D, generator=g).bfloat16() for _ in range(3))
        plan, _ = attend.plan_for([S], [S], varlen=False, num_heads=2, num_kv_heads=2,
                                  head_dim=D, is_causal=False, device=q.device)
        st = attend._bthd_strides(q, "NHD")
        # poison the workspace memory the quantizer must overwrite
        monkeypatch.setattr(torch, "empty", _poisoned(torch.empty))
        try:
            ws = quantize.quantize_stage(plan, get_recipe(DEFAULT_RECIPE), 0.125, q, st, k, st,
                                      v, st, kv_perm16=True)
        finally:
            monkeypatch.undo()
        return plan, ws, v

    plan128, ws128, v = ws_for(128)
    plan256, ws256, _ = ws_for(256)
    assert plan256.key.block_n == 256 and plan256.k_total_padded == 512
    if k_scale_keys == 128:
        assert ws256.k_sub == 2 and ws256.k_scale.shape == (2, 4)
        assert torch.equal(ws256.k_scale[:, :3], ws128.k_scale[:, :3])
        assert torch.equal(ws256.k8[:, :S].view(torch.uint8),
                           ws128.k8[:, :S].view(torch.uint8))
    else:
        assert ws256.k_sub == 1 and ws256.k_scale.shape == (2, 2)
        assert torch.equal(ws256.k_scale[:, 0], ws128.k_scale[:, :2].amax(1))
        assert torch.equal(ws256.k_scale[:, 1], ws128.k_scale[:, 2])
        assert ws256.k8[:, S:].eq(0).all()
    v8 = ws256.v8t.float()  # [Hkv, D, T_pad], kv index permuted in groups of 16
    j = torch.arange(plan256.k_total_padded)
    col = (j & ~15) | (((j >> 1) & 3) << 2) | (((j >> 3) & 1) << 1) | (j & 1)  # token -> column
    assert torch.isfinite(v8).all()
    assert torch.equal(v8[:, :, col[S:]], torch.zeros_like(v8[:, :, col[S:]]))
    # dequantized V matches V - mean with the 256-key block's grid factor
    from fp8dit.testing import _v_block_log2_scale

    grid = torch.exp2(_v_block_log2_scale(S, 256, "cpu"))
    deq = v8[0][:, col[:S]] * ws256.v_scale[0, 0][:, None] * grid[None, :]
    ref = v[0, :, 0].float().T - ws256.v_mean[0, 0][:, None]
    assert (deq - ref).abs().max() <= 0.07 * ref.abs().max()


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="interpreter test")
@pytest.mark.parametrize("bad", [None, float("nan"), float("-inf")])
def test_256_key_block_k_amax_from_the_stats_pass_is_bitwise_the_spanning_one(monkeypatch,
                                                                               bad):
    """One K scale per 256-key block taken by 128-row programs from the statistics pass's
    per-block channel max and min (``KV_QUANT_ROWS``) equals what 256-row programs compute,
    bit for bit: varlen with a second sequence starting at kv block 2, GQA, D=72 (padded
    channels), and a NaN or infinite key in the second half of a block, which must make that
    block's scale NaN and no other's (that block's int8 values, which no score uses, may
    differ)."""
    lens = [300, 520]
    T, D = sum(lens), 72
    g = torch.Generator().manual_seed(1)
    q = torch.randn(T, 4, D, generator=g).bfloat16()
    k = (torch.randn(T, 2, D, generator=g) * 2 + torch.randn(D, generator=g) * 5).bfloat16()
    v = torch.randn(T, 2, D, generator=g).bfloat16()
    if bad is not None:
        k[300 + 400, 1, 7] = bad  # second sequence, key 400: block 1, second half
    monkeypatch.setitem(attend.TILE_OVERRIDES, 128, dict(block_n=256))
    plan, _ = attend.plan_for(lens, lens, varlen=True, num_heads=4, num_kv_heads=2,
                              head_dim=D, is_causal=False, device=q.device)
    assert plan.key.block_n == 256 and plan.stats_chunk == 256  # whole kv blocks per chunk

    def ws(rows):
        monkeypatch.setitem(quantize.KV_QUANT_ROWS, 128, rows)
        st = attend._bthd_strides(q, "varlen")
        with monkeypatch.context() as m:
            m.setattr(torch, "empty", _poisoned(torch.empty))
            return quantize.quantize_stage(plan, get_recipe(DEFAULT_RECIPE), 0.125, q, st, k,
                                        attend._bthd_strides(k, "varlen"), v,
                                        attend._bthd_strides(v, "varlen"), kv_perm16=True)

    spanning, from_stats = ws(0), ws(128)
    live = from_stats.k_scale.isfinite().repeat_interleave(256, 1)[..., None]  # [Hkv, T, 1]
    for name in ("q8", "q_scale", "q_corr", "k8", "k_scale", "v8t", "v_scale", "v_mean"):
        a, b = getattr(spanning, name), getattr(from_stats, name)
        if name == "k_scale":
            assert torch.equal(a.isnan(), b.isnan()), name
            a, b = a.nan_to_num(0.0), b.nan_to_num(0.0)
        if name == "k8":
            a, b = a * live, b * live
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    # kv blocks: sequence 0 holds 0-1, sequence 1 holds 2-4 (key 400 is in its block 1)
    nan_blocks = from_stats.k_scale.isnan().nonzero().tolist()
    assert nan_blocks == ([] if bad is None else [[1, 3]])


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="interpreter test")
@pytest.mark.parametrize("knob", ["stats_prefetch", "stats_sub", "kv_rows", "q_rows", "iters",
                                  "finite_fast"])
def test_quantization_layout_knobs_give_the_same_workspace_bitwise(monkeypatch, knob):
    """The quantization's layout knobs (the statistics pass prefetching its next sub-tile, the
    GPU's K/V and Q program rows, K/V's and Q's blocks per program, quantize_kv's grid walked
    backwards, the statistics' unmasked pass for whole chunks of finite values, Q's and K's
    blocks of finite values without tests) change only how the work is cut, never a byte of
    the workspace; the GPU's statistics sub-tile (the interpreter keeps a larger one) only the
    order of the sums. Varlen with an empty query sequence and lengths that end mid-block, GQA,
    D=72, and a NaN key (its block's scale NaN)."""
    q_lens, k_lens = [300, 0, 77], [300, 520, 77]
    D = 72
    g = torch.Generator().manual_seed(2)
    q = torch.randn(sum(q_lens), 4, D, generator=g).bfloat16()
    k = (torch.randn(sum(k_lens), 2, D, generator=g) * 2
         + torch.randn(D, generator=g) * 5).bfloat16()
    v = torch.randn(sum(k_lens), 2, D, generator=g).bfloat16()
    k[300 + 130, 0, 3] = float("nan")
    monkeypatch.setitem(attend.TILE_OVERRIDES, 128, dict(block_n=256))
    plan, _ = attend.plan_for(q_lens, k_lens, varlen=True, num_heads=4, num_kv_heads=2,
                              head_dim=D, is_causal=False, device=q.device)
    assert plan.key.block_n == 256 and plan.stats_chunk == 256

    def ws():
        st = [attend._bthd_strides(t, "varlen") for t in (q, k, v)]
        with monkeypatch.context() as m:
            m.setattr(torch, "empty", _poisoned(torch.empty))
            return quantize.quantize_stage(plan, get_recipe(DEFAULT_RECIPE), 0.125, q, st[0], k,
                                        st[1], v, st[2], kv_perm16=True)

    def with_knob(on):
        if knob == "stats_prefetch":
            monkeypatch.setattr(quantize, "KV_STATS_PREFETCH", on)
        elif knob == "stats_sub":  # the GPU's sub-tile against the interpreter's default
            monkeypatch.setattr(quantize, "KV_STATS_SUB_ELEMS_INTERPRET",
                                quantize.KV_STATS_SUB_ELEMS if on else 2048)
        elif knob == "kv_rows":  # the GPU's rows (32 at D=128) against 128
            monkeypatch.setitem(quantize.KV_QUANT_ROWS, 128, rows["kv"] if on else 128)
        elif knob == "q_rows":
            monkeypatch.setitem(quantize.Q_QUANT_ROWS, 128, rows["q"] if on else 64)
        elif knob == "finite_fast":  # whole chunks unmasked (one with the NaN key), and
            # Q's and K's finite blocks without tests (their own tests count the paths taken)
            monkeypatch.setattr(quantize, "KV_STATS_FULL_FAST", on)
            monkeypatch.setattr(quantize, "Q_QUANT_FINITE_FAST", on)
            monkeypatch.setattr(quantize, "KV_QUANT_FINITE_FAST", on)
        else:  # three blocks per program (not a divisor of 4 per q tile, 8 per 256-key block),
            # and quantize_kv's grid walked backwards
            monkeypatch.setitem(quantize.Q_QUANT_ITERS, 128, 3 if on else 1)
            monkeypatch.setitem(quantize.KV_QUANT_ITERS, 128, 3 if on else 1)
            monkeypatch.setattr(quantize, "KV_QUANT_REVERSE", on)
        return ws()

    rows = {"kv": quantize.KV_QUANT_ROWS[128], "q": quantize.Q_QUANT_ROWS[128]}
    assert rows["kv"] < 128 and rows["q"] < 64 and quantize.KV_STATS_SUB_ELEMS < 2048
    base, other = with_knob(False), with_knob(True)
    assert base.k_scale.isnan().sum() == 1
    for name in ("q8", "q_scale", "q_corr", "k8", "k_scale", "v8t", "v_scale", "v_mean"):
        a, b = getattr(base, name), getattr(other, name)
        if knob == "stats_sub" and name not in ("q8", "q_scale"):
            # sums in another order: the means, and what they shift, agree to rounding
            if a.dtype.is_floating_point and a.element_size() == 4:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, equal_nan=True)
            else:
                diff = (a.float() - b.float()).abs()
                assert diff.nan_to_num(0).le(a.float().abs().nan_to_num(0) * 0.07 + 1).all()
                assert diff.nan_to_num(0).gt(0).float().mean() < 0.01, name
            continue
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name


def _workspaces_counting(monkeypatch, helper, knob, plan, layout, q, k, v, rope=None):
    """``ws(on)``: the quantization workspace with ``quant.<knob>`` set to ``on``, and how many
    times it called the kernel helper ``kernels.quantize.<helper>`` (wrapped: the interpreter
    calls helpers as Python functions)."""
    from fp8dit.kernels import quantize as kq

    calls = []
    inner = getattr(kq, helper)

    def counted(*args):
        calls.append(1)
        return inner(*args)

    monkeypatch.setattr(kq, helper, counted)

    def ws(on):
        monkeypatch.setattr(quantize, knob, on)
        calls.clear()
        st = [attend._bthd_strides(t, layout) for t in (q, k, v)]
        return quantize.quantize_stage(plan, get_recipe(DEFAULT_RECIPE), 0.125, q, st[0], k,
                                    st[1], v, st[2], kv_perm16=True, rope=rope), len(calls)
    return ws


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="interpreter test")
@pytest.mark.parametrize("dtype,rope", [(torch.bfloat16, False), (torch.float16, False),
                                        (torch.bfloat16, True)])
def test_statistics_unmasked_pass_takes_whole_finite_chunks_only(monkeypatch, dtype, rope):
    """With ``KV_STATS_FULL_FAST`` the masked statistics pass runs only for chunks that end past
    the sequence or hold a non-finite value (the unmasked pass found it and handed the chunk
    back); the workspace is bitwise the one without it (and the non-finite key still gives its
    block a NaN scale), with K rotated as loaded too. Counted by wrapping the masked pass,
    which the interpreter calls as a Python function."""
    k_lens = [600, 256]  # 256-token chunks: two whole + one partial, and one whole
    D = 64
    g = torch.Generator().manual_seed(4)
    q = torch.randn(sum(k_lens), 2, D, generator=g).to(dtype)
    k = (torch.randn(sum(k_lens), 2, D, generator=g) + torch.randn(D, generator=g) * 4).to(dtype)
    v = torch.randn(sum(k_lens), 2, D, generator=g).to(dtype)
    monkeypatch.setitem(attend.TILE_OVERRIDES, 64, dict(block_n=256))
    plan, _ = attend.plan_for(k_lens, k_lens, varlen=True, num_heads=2, num_kv_heads=2,
                              head_dim=D, is_causal=False, device=q.device)
    assert plan.stats_chunk == 256
    # Wan's rotary tables (fp32), K rotated as loaded
    tables = torch.randn(2, 600, D // 2, generator=g) if rope else None
    ws = _workspaces_counting(monkeypatch, "_stats_chunk_masked", "KV_STATS_FULL_FAST", plan,
                              "varlen", q, k, v, rope=tables)

    names = ("q8", "q_scale", "q_corr", "k8", "k_scale", "v8t", "v_scale", "v_mean")
    for nan_at in (None, (300, 1, 5)):  # a NaN key in sequence 0's second whole chunk
        if nan_at:
            k[nan_at] = float("nan")
        (base, n_base), (fast, n_fast) = ws(False), ws(True)
        assert n_base == 4 * 2  # every chunk of both heads
        assert n_fast == 1 * 2 + (1 if nan_at else 0)  # the partial chunks (+ the NaN one)
        for name in names:
            a, b = getattr(base, name), getattr(fast, name)
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
        assert base.k_scale.isnan().sum() == (1 if nan_at else 0)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "1", reason="interpreter test")
def test_query_blocks_of_finite_values_skip_the_tests_bitwise(monkeypatch):
    """With ``Q_QUANT_FINITE_FAST`` only query blocks holding a NaN or an infinity go through
    the tested path (``_q_scales_and_codes``, counted by wrapping it: the interpreter calls it
    as a Python function); codes, scales (NaN for those rows) and LSE shifts are bitwise the
    ones without it."""
    S, D = 300, 64  # 32-row blocks: 10 per head, the last one partial
    g = torch.Generator().manual_seed(5)
    q = (torch.randn(1, 2, S, D, generator=g) * 3).bfloat16()
    q[0, 0, 40, 7] = float("nan")  # head 0, block 1
    q[0, 1, 299, 0] = float("-inf")  # head 1, the partial block
    q[0, 1, 100, 3] = 3e38  # finite, near bf16's largest: stays on the fast path
    k = (torch.randn(1, 2, S, D, generator=g) + torch.randn(D, generator=g) * 4).bfloat16()
    v = torch.randn(1, 2, S, D, generator=g).bfloat16()
    monkeypatch.setitem(quantize.Q_QUANT_ROWS, 64, 32)
    plan, _ = attend.plan_for([S], [S], varlen=False, num_heads=2, num_kv_heads=2,
                              head_dim=D, is_causal=False, device=q.device)
    ws = _workspaces_counting(monkeypatch, "_q_scales_and_codes", "Q_QUANT_FINITE_FAST", plan,
                              "HND", q, k, v)

    (base, n_base), (fast, n_fast) = ws(False), ws(True)
    n_blocks = 2 * -(-S // 32)
    assert n_base == n_blocks and n_fast == 2
    for name in ("q8", "q_scale", "q_corr"):
        a, b = getattr(base, name), getattr(fast, name)
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name
    assert base.q_scale.isnan().sum() == 2


def _poisoned(empty):
    def f(*shape, **kw):
        t = empty(*shape, **kw)
        if t.dtype.is_floating_point:
            t.fill_(float("nan"))
        elif t.dtype == torch.int8:
            t.fill_(-128)
        return t
    return f


def test_kernel_choice_is_auto_by_default_and_named_kernels_are_checked(monkeypatch):
    monkeypatch.delenv("FP8DIT_KERNEL", raising=False)
    assert env.attention_kernel() == "auto"
    monkeypatch.setenv("FP8DIT_KERNEL", "gluon")
    assert env.attention_kernel() == "gluon"
    monkeypatch.setenv("FP8DIT_KERNEL", "cutlass")
    with pytest.raises(ValueError, match="FP8DIT_KERNEL: expected one of auto, triton, gluon"):
        env.attention_kernel()


def test_auto_runs_the_warp_specialized_kernel_only_where_it_measured_faster(monkeypatch):
    """``kernel_for`` on a (pretended) sm_90 GPU: long dense non-causal D=128 calls with the
    int8-QK/fp8-PV recipes go to the Gluon kernel, everything else to the Triton one."""
    # imported (and cached) under the suite's interpreter setting, as a process would once
    assert attend._gluon_sm90_module("attention_sm90_ws") is not None
    monkeypatch.delenv("FP8DIT_KERNEL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cap = {"value": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cap["value"])
    monkeypatch.setattr(attend, "WS_VERIFIED_TRITON", (attend.triton_release(),))
    gpu = torch.device("cuda", 0)
    default = get_recipe(DEFAULT_RECIPE)
    n = attend.WS_MIN_KV_TOKENS[128]

    def choice(head_dim=128, k_len=75600, causal=False, recipe=default, device=gpu):
        return attend.kernel_for(head_dim, k_len, causal, recipe, device)

    assert choice() == "gluon-ws"  # Wan 720p
    assert choice(k_len=n) == "gluon-ws"
    assert choice(k_len=n - 1) == "triton"  # Flux-like lengths measured slower on it
    assert choice(head_dim=64, k_len=17776) == "gluon-ws"  # CogVideoX
    assert choice(head_dim=64, k_len=attend.WS_MIN_KV_TOKENS[64] - 1) == "triton"
    assert choice(head_dim=256) == "triton"  # not written for it
    assert choice(head_dim=72) == "gluon-ws"  # padded to 128
    assert choice(causal=True) == "triton"  # not measured
    assert choice(recipe=get_recipe("int8qk-bf16pv")) == "triton"  # not supported
    assert choice(recipe=get_recipe("int8x2qk-fp8pv")) == "triton"  # one int8 QK dot only
    assert choice(device=torch.device("cpu")) == "triton"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert choice() == "triton"
    monkeypatch.delenv("TRITON_INTERPRET")
    cap["value"] = (10, 0)
    assert choice() == "triton"
    cap["value"] = (9, 0)
    monkeypatch.setattr(attend, "WS_VERIFIED_TRITON", ("0.0",))  # a Triton not run on a GPU
    assert choice() == "triton"
    monkeypatch.setattr(attend, "WS_VERIFIED_TRITON", (attend.triton_release(),))
    for name in ("triton", "gluon", "gluon-ws"):  # a named kernel is taken as asked
        monkeypatch.setenv("FP8DIT_KERNEL", name)
        assert choice(head_dim=64, k_len=100) == name
    # The tiles follow the choice: 128-row work items for the Gluon kernel.
    monkeypatch.delenv("FP8DIT_KERNEL")
    monkeypatch.setattr(attend, "_sm_count", lambda index: 132)
    assert attend.tile_config(128, gpu, "gluon-ws")["block_m"] == 128
    assert attend.tile_config(128, gpu, "gluon-ws")["block_n"] == attend.WS_TILES[128]["block_n"]
    assert attend.tile_config(128, gpu, "gluon-ws", is_causal=True)["block_n"] == 128
    assert attend.tile_config(128, gpu, "triton")["block_m"] == 64


def test_gluon_kernels_never_run_off_an_sm90_gpu(monkeypatch):
    # Asked for, they still never run off an sm_90 GPU (here: CPU tensors), and the plan keeps
    # the Triton kernel's tiles.
    for name in ("gluon", "gluon-ws"):
        monkeypatch.setenv("FP8DIT_KERNEL", name)
        plan, cfg = attend.plan_for([256], [256], varlen=False, num_heads=2, num_kv_heads=2,
                                    head_dim=128, is_causal=False, device=torch.device("cpu"))
        assert cfg["block_m"] == 64
        assert attend.use_gluon_sm90(plan, get_recipe(DEFAULT_RECIPE), torch.device("cpu")) \
            is None


# What the warp-specialized kernel's sm_90 SASS holds, per Triton release (major.minor; each
# measured on the x.y.0 wheel with the ptxas it bundles: 3.6 12.8, 3.8 12.9, 3.9 13.4), per
# shipped configuration (padded head dim, causal): the main kv loop's instructions per step
# and spills (LDL/STL), and the masked tail loop's spills (run once per work item: 1 of ~300
# steps at Wan 720p), both consumer warpgroups' worst. Only 3.6 ran on a GPU (the measured
# speed includes its spills); docs/triton_releases.md compares the releases.
WS_SASS_BOUNDS = {
    "3.6": {(64, False): (768, 0, 0), (128, False): (806, 1, 13),
            (64, True): (545, 0, 0), (128, True): (585, 0, 0)},
    "3.8": {(64, False): (768, 0, 0), (128, False): (805, 1, 15),
            (64, True): (550, 0, 0), (128, True): (580, 0, 0)},
    "3.9": {(64, False): (767, 0, 0), (128, False): (810, 2, 17),
            (64, True): (526, 0, 0), (128, True): (563, 0, 0)},
}


def test_gluon_ws_kernel_compiles_for_sm90_with_tensor_core_loops():
    """Every configuration ``attend`` launches the warp-specialized kernel with (recorded from
    its launch code) compiles for sm_90 with this Triton; its kv loops are tensor-core loops
    (the wgmma counts the tile shapes give), and those that spill on no measured release have
    no spills. The per-step numbers are checked against this release's measured bounds, or
    skipped on a release that has none."""
    tool = os.path.join(os.path.dirname(__file__), "tools", "sm90_compile.py")
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, tool, "--gluon"], capture_output=True, text=True,
                          env=environ, timeout=900)
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    shipped = {(dp, causal) for causal, table in ((False, attend.WS_TILES),
                                                   (True, attend.WS_CAUSAL_TILES))
               for dp in table}
    assert {(r["dp"], r["causal"]) for r in reports} == shipped, proc.stderr[-3000:]
    for rep in reports:
        assert rep["ok"], rep
        # the unmasked main loop and the masked tail loop, per consumer warpgroup
        assert len(rep["loops"]) == 4, rep
        tiles = (attend.WS_CAUSAL_TILES if rep["causal"] else attend.WS_TILES)[rep["dp"]]
        assert rep["block_n"] == tiles["block_n"], rep
        halves = rep["block_n"] // 128  # dots of 128 keys per kv step
        rowsum_dot = rep["flags"]["ROWSUM_DOT"]
        for loop in rep["loops"]:
            # QK: K = head dim in steps of 32; PV (and the row-sum dot): 128 keys in steps of 32
            assert loop["igmma"] == halves * rep["dp"] // 32, rep
            assert loop["qgmma"] == halves * 4 * (2 if rowsum_dot else 1), rep
            if rep["block_n"] == 128:  # the softmax runs under the previous block's PV dot
                assert loop["exp_under_pv"] >= 64, rep
            if (rep["dp"], rep["causal"]) != (128, False):  # no spills on any release
                assert loop["spills"] == 0, rep
        # one warp-specialized program per SM
        assert rep["shared"] <= 227 * 1024, rep
    release = ".".join(triton.__version__.split(".")[:2])
    if release not in WS_SASS_BOUNDS:
        pytest.skip(f"SASS bounds measured on triton {', '.join(WS_SASS_BOUNDS)}, not "
                    f"{triton.__version__}: the version-independent checks passed, the "
                    "per-step instruction and spill bounds were not checked")
    for rep in reports:
        main_instr, main_spills, tail_spills = WS_SASS_BOUNDS[release][rep["dp"], rep["causal"]]
        main, tail = rep["loops"][0::2], rep["loops"][1::2]
        assert max(lp["instructions"] for lp in main) <= main_instr, rep
        assert max(lp["spills"] for lp in main) <= main_spills, rep
        assert max(lp["spills"] for lp in tail) <= tail_spills, rep


def _on_sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not _on_sm90(), reason="the warp-specialized kernel needs an sm_90 GPU")
def test_split_kv_barriers_change_no_output_bit(monkeypatch):
    """K and V of a ring slot on their own barriers (``sm90_split_kv``, the default at head dim
    64) only change when the consumers wait, never a bit of the output or LSE: both head dims,
    an odd length (a masked last 256-key step), a 3-way split, and varlen with an empty
    sequence, each against one barrier per slot."""
    import fp8dit
    from fp8dit.testing import make_qkv

    monkeypatch.setenv("FP8DIT_KERNEL", "gluon-ws")
    tiles = {dp: dict(t) for dp, t in attend.WS_TILES.items()}

    def run(split, call):
        for dp, t in tiles.items():
            monkeypatch.setitem(attend.WS_TILES, dp, {**t, "sm90_split_kv": split})
        return call()

    for D in (64, 128):
        q, k, v = make_qkv(1, 2, 3001, D, device="cuda", seed=D)
        plan, cfg = attend.plan_for([3001], [3001], varlen=False, num_heads=2, num_kv_heads=2,
                                    head_dim=D, is_causal=False, device=q.device)
        assert attend.use_gluon_sm90(plan, get_recipe(DEFAULT_RECIPE), q.device,
                                     cfg["kernel"]) == "gluon-ws" and plan.key.block_n == 256
        for splits in (None, 3):
            call = functools.partial(fp8dit.attention, q, k, v, backend="fp8",
                                     num_splits=splits, return_lse=True)
            (o0, l0), (o1, l1) = run(False, call), run(True, call)
            assert torch.equal(o0, o1) and torch.equal(l0, l1), (D, splits)
    lens = [300, 0, 2000, 129]
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(sum(lens), 4, 64, device="cuda", generator=g, dtype=torch.bfloat16)
               for _ in range(3))
    cu = torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)

    def varlen():
        return fp8dit.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), backend="fp8")
    assert torch.equal(run(False, varlen), run(True, varlen))
