"""Boolean key-padding masks as key lengths (fp8dit.key_padding), the diffusers backend's masked
calls, and a tiny HunyuanVideo (whose every attention call carries such a mask)."""

# TRITON_INTERPRET=1 (no GPU) is set by conftest.py before triton is imported.

import logging

import pytest
import torch
import torch.nn.functional as F

from fp8dit import key_padding as kp
from fp8dit.attend import fp8_attention_fwd
from fp8dit.recipes import get_recipe
from fp8dit.testing import attention_ref, error_stats

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _qkv(B, Sq, Sk, H, D, seed=0, Hkv=None):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randn(B, Sq, H, D, generator=g, device=DEVICE).bfloat16()
    k = torch.randn(B, Sk, Hkv or H, D, generator=g, device=DEVICE).bfloat16()
    v = torch.randn(B, Sk, Hkv or H, D, generator=g, device=DEVICE).bfloat16()
    return q, k, v


def _prefix_mask(lens, Sk, shape4=True):
    m = torch.arange(Sk, device=DEVICE)[None, :] < torch.tensor(lens, device=DEVICE)[:, None]
    return m[:, None, None, :] if shape4 else m


# ---------------------------------------------------------------------------------------------
# Reading the mask
# ---------------------------------------------------------------------------------------------


def test_key_lengths_of_prefix_masks():
    assert kp.key_lengths(_prefix_mask([5, 9], 12), 2, 12) == ((5, 9), None)
    assert kp.key_lengths(_prefix_mask([5, 9], 12, shape4=False), 2, 12) == ((5, 9), None)
    assert kp.key_lengths(_prefix_mask([7], 12), 3, 12) == ((7, 7, 7), None)  # one row for all
    assert kp.key_lengths(_prefix_mask([12, 12], 12), 2, 12) == ((12, 12), None)


@pytest.mark.parametrize("case,expect", [
    ("hole", "not a prefix"),
    ("padding_first", "not a prefix"),
    ("empty_row", "drops every key"),
    ("float", "dtype torch.float32"),
    ("per_query", "not a key-padding mask"),
    ("per_head", "not a key-padding mask"),
    ("wrong_keys", "not a key-padding mask"),
])
def test_key_lengths_refuses_other_masks(case, expect):
    m = _prefix_mask([5, 9], 12)
    if case == "hole":
        m = m.clone()
        m[1, ..., 3] = False
    elif case == "padding_first":
        m = m.flip(-1)
    elif case == "empty_row":
        m = _prefix_mask([0, 9], 12)
    elif case == "float":
        m = torch.zeros(2, 1, 1, 12, device=DEVICE)
    elif case == "per_query":
        m = m.expand(2, 1, 4, 12)
    elif case == "per_head":
        m = m.expand(2, 3, 1, 12)
    elif case == "wrong_keys":
        m = _prefix_mask([5, 9], 11)
    lens, reason = kp.key_lengths(m, 2, 12)
    assert lens is None and expect in reason, reason


def _query_key_mask(lens, S):
    """HunyuanVideo 1.5's per-call mask: (valid query) & (valid key), valid tokens first."""
    valid = _prefix_mask(lens, S, shape4=False)
    rows = valid.view(len(lens), 1, 1, S).repeat(1, 1, S, 1)
    return rows & rows.transpose(2, 3)


def test_per_query_masks_of_kept_queries_and_keys():
    m = _query_key_mask([5, 9], 12)
    assert kp.key_lengths(m, 2, 12) == (None, kp.key_padding_reason(m, 2, 12))  # no Sq given
    assert kp.key_lengths(m, 2, 12, sq=12) == ((5, 9), None)
    lens, reason, dropped = kp._lengths(m, 2, 12, 12)
    assert torch.equal(dropped, ~_prefix_mask([5, 9], 12, shape4=False))
    every_row = _prefix_mask([5, 9], 12).expand(2, 1, 12, 12)  # a key mask repeated per query
    assert kp._lengths(every_row, 2, 12, 12)[::2] == ((5, 9), None)
    other = m.clone()
    other[0, 0, 2, 3] = False  # one query row keeps other keys than the rest
    assert "rows keep different keys" in kp.key_lengths(other, 2, 12, sq=12)[1]
    holes = _query_key_mask([5, 9], 12).clone()
    holes[1, 0, :, 4] = False  # the same keys in every row, but not a prefix
    assert "not a prefix" in kp.key_lengths(holes, 2, 12, sq=12)[1]
    assert "drops every key" in kp.key_lengths(_query_key_mask([0, 9], 12), 2, 12, sq=12)[1]
    cross = _prefix_mask([5, 9], 12).expand(2, 1, 7, 12)  # 7 queries x 12 keys: per query too
    assert kp.key_lengths(cross, 2, 12, sq=7) == ((5, 9), None)


@pytest.mark.parametrize("sq,sk", [(1, 1), (257, 1), (33, 513), (67, 6), (21, 141)])
def test_mask_reading_kernel_matches_torch(sq, sk, device):
    # (33, 513): one row past a 32-row block and one byte past a 128-word (512-byte) block of
    # the word kernel (tuning.mask_words: 32 rows, 128 words).
    # HunyuanVideo 1.5's per-query masks are read by one kernel (row counts, column any), as
    # int32 words where rows are contiguous: random, all-False and all-True batches, a batch
    # broadcast by stride 0, a transposed view (bytes), and views starting at each byte of a
    # word with odd row and batch strides (words; their rows start at every phase).
    gen = torch.Generator().manual_seed(sq * 1000 + sk)
    m = torch.rand(3, sq, sk, generator=gen) < 0.3
    m[1], m[2] = False, True
    wide = torch.rand(1, sk, sq, generator=gen) < 0.5
    big = torch.rand(2, sq + 1, sk + 3, generator=gen) < 0.5
    views = [big[:, 1:, o:o + sk] for o in range(4)] + [big[1:, :sq, 3:3 + sk]]
    for mm in (m, m[:1].expand(4, sq, sk), wide.transpose(1, 2), *views):
        mm = mm.to(device)
        want = (mm.sum(-1).cpu(), mm.any(-2).cpu())
        runs = [kp._row_counts_and_key_any(mm)]
        if device == "cpu" and mm.stride(-1) == 1 and sq * sk < 10_000:  # both kernels
            runs += [kp._mask_stats_launch(mm, 16, 64, 2),
                     kp._mask_stats_words_launch(mm, 8, 32, 1)]
        for counts, keys in runs:
            assert counts.dtype == torch.int64 and keys.dtype == torch.bool
            assert torch.equal(counts.cpu(), want[0]) and torch.equal(keys.cpu(), want[1])


def test_per_query_mask_runs_fp8_over_the_prefix_and_zeroes_dropped_rows():
    lens, S = [37, 64], 64
    q, k, v = _qkv(2, S, S, 2, 64, seed=11)
    kg, vg = k.clone(), v.clone()
    for b, n in enumerate(lens):
        kg[b, n:], vg[b, n:] = float("nan"), float("inf")  # never read
    out, lse, reason = kp.key_padding_attention(q, kg, vg, _query_key_mask(lens, S), scale=0.125,
                                                recipe=get_recipe(None), return_lse=True)
    assert reason is None and torch.isfinite(out).all()
    for b, n in enumerate(lens):
        ref, ref_lse = attention_ref(q[b:b + 1, :n], k[b:b + 1, :n], v[b:b + 1, :n], scale=0.125,
                                     return_lse=True)
        assert error_stats(out[b:b + 1, :n], ref).cos >= 0.999
        assert (lse[b:b + 1, :, :n].double() - ref_lse).abs().max().item() < 0.03
        assert torch.all(out[b, n:] == 0) and torch.all(lse[b, :, n:] == float("-inf"))


def test_key_lengths_cache_follows_in_place_changes(monkeypatch):
    reads = []
    real = kp._read_lengths
    monkeypatch.setattr(kp, "_read_lengths", lambda rows: reads.append(1) or real(rows))
    m = _prefix_mask([5, 9], 12)
    for _ in range(3):
        assert kp.key_lengths(m, 2, 12)[0] == (5, 9)
    assert len(reads) == 1  # read once per mask tensor
    m[0, ..., 5:8] = True  # in place: the version counter moves, so it is read again
    assert kp.key_lengths(m, 2, 12)[0] == (8, 9) and len(reads) == 2
    other = _prefix_mask([5, 9], 12)  # equal values, another tensor: its own read
    assert kp.key_lengths(other, 2, 12)[0] == (5, 9) and len(reads) == 3
    with torch.inference_mode():
        inf = _prefix_mask([4, 4], 12)
        for _ in range(2):
            assert kp.key_lengths(inf, 2, 12)[0] == (4, 4)
    assert len(reads) == 5  # inference tensors have no version counter: read every call
    assert len(kp._cache) <= kp._CACHE_SIZE


def test_key_lengths_from_many_threads():
    import concurrent.futures

    masks = [_prefix_mask([1 + i % 11, 12], 12) for i in range(40)]

    def read(i):
        return kp.key_lengths(masks[i], 2, 12)[0] == (1 + i % 11, 12)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(read, [i % 40 for i in range(400)]))
    assert len(kp._cache) <= kp._CACHE_SIZE


# ---------------------------------------------------------------------------------------------
# The FP8 path over the kept keys
# ---------------------------------------------------------------------------------------------


def test_dense_fp8_with_key_lengths_never_reads_the_padding():
    B, Sq, Sk, H, D = 3, 70, 90, 4, 64
    q, k, v = _qkv(B, Sq, Sk, H, D, seed=3, Hkv=2)
    lens = [90, 33, 0]
    kg, vg = k.clone(), v.clone()
    for b, n in enumerate(lens):  # non-finite garbage where the mask drops keys
        kg[b, n:] = float("nan")
        vg[b, n:] = float("inf")
    out, lse = fp8_attention_fwd(q, kg, vg, layout="NHD", scale=D ** -0.5, is_causal=False,
                                 recipe=get_recipe(None), k_lens=lens, num_splits=2)
    for b, n in enumerate(lens):
        if n == 0:  # no key kept: zeros and lse -inf, as the varlen path
            assert out[b].abs().max().item() == 0 and lse[b].max().item() == float("-inf")
            continue
        ref, ref_lse = attention_ref(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], return_lse=True)
        stats = error_stats(out[b:b + 1], ref)
        assert not stats.nan and stats.cos >= 0.999 and stats.rel_l1 <= 0.04, (b, str(stats))
        assert (lse[b:b + 1].double() - ref_lse).abs().max().item() < 0.03
    with pytest.raises(ValueError, match=r"k_lens: expected 3 lengths in \[0, 90\]"):
        fp8_attention_fwd(q, k, v, layout="NHD", scale=1.0, is_causal=False,
                          recipe=get_recipe(None), k_lens=[1, 2, 91])


def test_key_padding_attention_fp8_and_fallback(caplog, monkeypatch):
    monkeypatch.setattr("fp8dit.dispatch._logged", set())
    q, k, v = _qkv(2, 64, 48, 2, 64, seed=4)
    mask = _prefix_mask([20, 41], 48)
    out, lse, reason = kp.key_padding_attention(q, k, v, mask, scale=0.125,
                                                recipe=get_recipe(None), return_lse=True)
    assert reason is None
    for b, n in enumerate([20, 41]):
        ref, ref_lse = attention_ref(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], scale=0.125,
                                     return_lse=True)
        assert error_stats(out[b:b + 1], ref).cos >= 0.999
        assert (lse[b:b + 1].double() - ref_lse).abs().max().item() < 0.03
    holes = mask.clone()
    holes[0, ..., 7] = False
    with caplog.at_level(logging.WARNING, logger="fp8dit"):
        out, lse, reason = kp.key_padding_attention(q, k, v, holes, scale=0.125,
                                                    recipe=get_recipe(None), return_lse=True)
    assert "not a prefix" in reason and "not a prefix" in caplog.text
    ref = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                         attn_mask=holes, scale=0.125).transpose(1, 2)
    assert torch.equal(out, ref)  # the fallback is SDPA itself
    ref_lse = torch.logsumexp(
        (torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * 0.125)
        .masked_fill(~holes, float("-inf")), -1)
    assert (lse.double() - ref_lse).abs().max().item() < 1e-3


def test_lengths_kept_on_the_device_as_under_capture(monkeypatch):
    """What a CUDA-graph capture runs (emulated: ``_capturing`` forced): the plan for all keys,
    the lengths read by the kernels from the device, so a replay follows the mask's values.
    Lengths far under the plan's leave whole kv blocks and split pieces without a key."""
    B, Sq, Sk, H, D = 3, 70, 300, 2, 64
    q, k, v = _qkv(B, Sq, Sk, H, D, seed=21)
    recipe = get_recipe(None)
    first = _prefix_mask([300, 200, 100], Sk)
    kp.key_padding_attention(q, k, v, first, scale=0.125, recipe=recipe, return_lse=False,
                             num_splits=3)  # eager: reads the mask, marks its shape as a prefix
    monkeypatch.setattr(kp, "_capturing", lambda mask: True)
    monkeypatch.setattr(kp, "_read_lengths", lambda rows: pytest.fail("read on the host"))
    lens = [20, 299, 1]
    kg, vg = k.clone(), v.clone()
    for b, n in enumerate(lens):
        kg[b, n:] = float("nan")
        vg[b, n:] = float("inf")
    out, lse, reason = kp.key_padding_attention(q, kg, vg, _prefix_mask(lens, Sk), scale=0.125,
                                                recipe=recipe, return_lse=True, num_splits=3)
    assert reason is None
    for b, n in enumerate(lens):
        ref, ref_lse = attention_ref(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], scale=0.125,
                                     return_lse=True)
        stats = error_stats(out[b:b + 1], ref)
        assert not stats.nan and stats.cos >= 0.999 and stats.rel_l1 <= 0.04, (b, str(stats))
        assert (lse[b:b + 1].double() - ref_lse).abs().max().item() < 0.03
    # a replayed mask with a hole, or keeping nothing: NaN for that sequence only
    bad = _prefix_mask([50, 60, 0], Sk).clone()
    bad[0, ..., 10] = False
    out, lse, _ = kp.key_padding_attention(q, k, v, bad, scale=0.125, recipe=recipe,
                                           return_lse=True)
    assert out[0].isnan().all() and out[2].isnan().all() and lse[0].isnan().all()
    ref = attention_ref(q[1:2], k[1:2, :60], v[1:2, :60], scale=0.125)
    assert error_stats(out[1:2], ref).cos >= 0.999
    # a mask shape no eager call read as a prefix: SDPA with the mask under capture too
    other = _prefix_mask([5, 6, 7], Sk)[:, :, :, :-1]
    _, _, reason = kp.key_padding_attention(q, k[:, :-1], v[:, :-1], other, scale=0.125,
                                            recipe=recipe, return_lse=False)
    assert "CUDA-graph capture" in reason


# ---------------------------------------------------------------------------------------------
# diffusers: the backend's masked calls, and a tiny HunyuanVideo
# ---------------------------------------------------------------------------------------------


try:
    import diffusers
    import diffusers.models.attention_dispatch as ad

    from fp8dit.integrations import diffusers as fd
except ImportError:  # the tests above need no diffusers
    diffusers = None


@pytest.fixture
def registered(request, monkeypatch):
    if diffusers is None:
        pytest.skip("diffusers is not installed")
    request.getfixturevalue("diffusers_state")
    if DEVICE == "cuda":  # auto's length floor would send these short calls to SDPA
        monkeypatch.setenv("FP8DIT_BACKEND", "fp8")
    return fd


def _forward(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def test_backend_runs_prefix_masks_fp8_with_lse(registered):
    q, k, v = _qkv(2, 64, 48, 2, 64, seed=5)
    for mask in (_prefix_mask([20, 41], 48), _prefix_mask([20, 41], 48, shape4=False)):
        with fd.record_calls() as calls:
            out, lse = ad.dispatch_attention_fn(q, k, v, attn_mask=mask, backend="fp8dit",
                                                attention_kwargs={"return_lse": True})
        assert [c["backend"] for c in calls] == ["fp8"] and "key-padding" in calls[0]["reason"]
        assert lse.shape == (2, 64, 2)  # diffusers' [B, S, H]
        for b, n in enumerate([20, 41]):
            ref, ref_lse = attention_ref(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n],
                                         return_lse=True)
            assert error_stats(out[b:b + 1], ref).cos >= 0.999
            assert (lse[b:b + 1].double() - ref_lse.transpose(1, 2)).abs().max().item() < 0.03


def test_backend_runs_hunyuan_video_15_masks_fp8(registered):
    q, k, v = _qkv(2, 48, 48, 2, 64, seed=6)
    with fd.record_calls() as calls:
        out = ad.dispatch_attention_fn(q, k, v, attn_mask=_query_key_mask([20, 41], 48),
                                       backend="fp8dit")
    assert [c["backend"] for c in calls] == ["fp8"], calls
    ref = attention_ref(q[1:, :41], k[1:, :41], v[1:, :41])
    assert error_stats(out[1:, :41], ref).cos >= 0.999 and torch.all(out[0, 20:] == 0)


def test_no_graph_break_with_a_key_padding_mask(registered):
    q, k, v = _qkv(1, 96, 40, 2, 64, seed=7)
    mask = _prefix_mask([29], 40)

    def f(q, k, v, mask):
        return ad.dispatch_attention_fn(q, k, v, attn_mask=mask, backend="fp8dit") * 2

    torch._dynamo.reset()
    try:
        explanation = torch._dynamo.explain(f)(q, k, v, mask)
        compiled = torch.compile(f, backend="eager", fullgraph=True)(q, k, v, mask)
    finally:
        torch._dynamo.reset()
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert "fp8dit.attention_fp8_key_padding" in explanation.graphs[0].code
    eager = f(q, k, v, mask)
    assert torch.equal(compiled, eager)
    holes = mask.clone()
    holes[0, ..., 3] = False  # decided inside the op at run time: SDPA there
    torch._dynamo.reset()
    try:
        compiled = torch.compile(f, backend="eager", fullgraph=True)(q, k, v, holes)
    finally:
        torch._dynamo.reset()
    ref = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                         attn_mask=holes).transpose(1, 2)
    assert torch.equal(compiled, ref * 2)


# 2 x 16 x 16 latent -> 128 video tokens, then 24 text tokens of which the last 7 are padding.
TINY_HUNYUAN = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=64,
                    num_layers=1, num_single_layers=1, num_refiner_layers=1, mlp_ratio=2.0,
                    text_embed_dim=32, pooled_projection_dim=16, rope_axes_dim=(16, 24, 24))


def _tiny_hunyuan():
    torch.manual_seed(0)
    model = diffusers.HunyuanVideoTransformer3DModel(**TINY_HUNYUAN).to(DEVICE).eval()
    model = model.requires_grad_(False).to(torch.bfloat16)
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    text_mask = torch.ones(1, 24, dtype=torch.int64, device=DEVICE)
    text_mask[:, 17:] = 0
    inputs = dict(
        hidden_states=torch.randn(1, 4, 2, 16, 16, generator=gen, device=DEVICE).bfloat16(),
        timestep=torch.tensor([700], device=DEVICE),
        encoder_hidden_states=torch.randn(1, 24, 32, generator=gen, device=DEVICE).bfloat16(),
        encoder_attention_mask=text_mask,
        pooled_projections=torch.randn(1, 16, generator=gen, device=DEVICE).bfloat16(),
        guidance=torch.tensor([6000.0], device=DEVICE),
    )
    return model, inputs


def test_tiny_hunyuan_video_runs_fp8_over_its_key_padding(registered):
    model, inputs = _tiny_hunyuan()
    fd.disable(model)
    ref = _forward(model, inputs)
    fd.enable(model)
    try:
        with fd.record_calls() as calls:
            final = _forward(model, inputs)
        # the padded text tokens' embeddings changed: nothing the FP8 path computes reads them
        padded = dict(inputs, encoder_hidden_states=inputs["encoder_hidden_states"].clone())
        padded["encoder_hidden_states"][:, 17:] = 1e3
        final_padded = _forward(model, padded)
    finally:
        fd.disable(model)
    masked = [c for c in calls if "key-padding" in c["reason"]]
    # the dual-stream and the single-stream block: 128 video + 24 text keys, 145 of them kept
    assert [(c["backend"], c["k"][1]) for c in masked] == [("fp8", 152), ("fp8", 152)], calls
    stats = error_stats(final, ref)
    assert not stats.nan and stats.cos >= 0.99, str(stats)
    assert torch.equal(final_padded, final)


@pytest.mark.gpu
def test_warp_specialized_kernel_over_kept_keys_on_the_gpu():
    """HunyuanVideo-like lengths on the H200's default kernel: 9,216 video + 256 text tokens,
    two sequences keeping 100 and 31 text tokens; garbage in the dropped keys."""
    from fp8dit.dispatch import choose_kernel
    from fp8dit.testing import attention_ref_rows

    B, S, H, D = 2, 9216 + 256, 8, 128
    q, k, v = _qkv(B, S, S, H, D, seed=11)
    lens = [9216 + 100, 9216 + 31]
    kg, vg = k.clone(), v.clone()
    for b, n in enumerate(lens):
        kg[b, n:] = float("nan")
        vg[b, n:] = float("inf")
    mask = _prefix_mask(lens, S)
    out, lse, reason = kp.key_padding_attention(q, kg, vg, mask, scale=D ** -0.5,
                                                recipe=get_recipe(None), return_lse=True)
    assert reason is None
    if torch.version.hip is None and torch.cuda.get_device_capability() == (9, 0):
        assert choose_kernel(D, max(lens), False, get_recipe(None), q.device)[0] == "gluon-ws"
    rows = torch.arange(0, S, 97, device=DEVICE)
    for b, n in enumerate(lens):
        ref, ref_lse = attention_ref_rows(q, k[:, :n], v[:, :n], rows, batch=b)
        stats = error_stats(out[b, rows], ref)
        assert not stats.nan and stats.cos >= 0.999 and stats.rel_l1 <= 0.04, (b, str(stats))
        assert (lse[b][:, rows].double() - ref_lse).abs().max().item() < 0.03


def test_capture_saves_hunyuan_calls_as_their_kept_keys(registered, tmp_path, capsys):
    """HunyuanVideo's masked calls are captured as the keys its mask keeps (the same attention),
    so `fp8dit check --inputs` and the quality guard's measurements work on that model."""
    import argparse

    from fp8dit.integrations.capture import capture_qkv
    from fp8dit.integrations.guard import measure_captured
    from fp8dit.tools import check

    model, inputs = _tiny_hunyuan()
    fd.enable(model)
    try:
        with capture_qkv(model, tmp_path, max_calls=1) as cap:
            _forward(model, inputs)
        mask = torch.ones(2, 1, 1, 152, dtype=torch.bool, device=DEVICE)
        mask[1, ..., 150:] = False  # two key lengths in one batch: not one file's attention
        q, k, v = _qkv(2, 152, 152, 2, 64, seed=9)
        with capture_qkv(model, tmp_path / "uneven", layers=["transformer_blocks.0.attn"]) as un:
            un._stack.append("transformer_blocks.0.attn")
            un._maybe_save(dict(query=q, key=k, value=v, attn_mask=mask))
    finally:
        fd.disable(model)
    assert not un.files and "differ across the batch" in un.skipped[0], un.skipped
    assert len(cap.files) == 2 and not cap.skipped, (cap.files, cap.skipped)
    for path in cap.files:
        saved = torch.load(path, weights_only=True)
        assert saved["key_padding"] and saved["kv_len"] == 145 and saved["q_len"] == 152
        assert saved["k"].shape == (1, 145, 2, 64) and saved["q"].shape == (1, 152, 2, 64)
    p = argparse.ArgumentParser()
    check.add_arguments(p)
    rc = check.run(p.parse_args(["--inputs", str(cap.files[0]), "--recipes", "int8qk-fp8pv"]))
    assert rc == 0, capsys.readouterr().out
    rows = measure_captured(tmp_path, "int8qk-fp8pv")
    assert len(rows) == 2 and all(0 < r["rel_l1"] < 0.1 and not r["nan"] for r in rows), rows


@pytest.mark.gpu
def test_cuda_graph_replays_follow_the_mask():
    """A captured masked call (the warp-specialized kernel on an H200) replayed after the mask
    changed in place: each replay attends to the keys the mask keeps then."""
    from fp8dit.testing import attention_ref_rows

    S, H, D = 9216 + 256, 8, 128
    q, k, v = _qkv(1, S, S, H, D, seed=12)
    mask = _prefix_mask([9216 + 100], S).clone()  # the graph's static input
    recipe = get_recipe(None)

    def call():
        return kp.key_padding_attention(q, k, v, mask, scale=D ** -0.5, recipe=recipe,
                                        return_lse=False)[0]

    eager = call()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    rows = torch.arange(0, S, 89, device=DEVICE)
    for n in (9216 + 100, 9216 + 3, S, 5000):
        mask.copy_(_prefix_mask([n], S))
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = attention_ref_rows(q, k[:, :n], v[:, :n], rows)
        stats = error_stats(out[0, rows], ref)
        assert not stats.nan and stats.cos >= 0.999 and stats.rel_l1 <= 0.04, (n, str(stats))
        if n == 9216 + 100:  # the eager call's lengths: the same attention
            assert error_stats(out, eager).cos >= 0.9999
    mask[0, ..., 7] = False  # no prefix any more: NaN, not a wrong answer
    graph.replay()
    torch.cuda.synchronize()
    assert out.isnan().all()
