"""The persistent schedule: coverage, causal clipping, balance, split bookkeeping, cache."""

import threading

import numpy as np
import pytest

from fp8dit import plan as plan_mod
from fp8dit.plan import PlanKey, build_plan, get_plan


def _key(q_lens, k_lens=None, *, H=2, Hkv=None, D=128, causal=False, P=8, splits=None,
         bm=128, bn=128, varlen=False):
    return PlanKey(
        q_lens=tuple(q_lens), k_lens=tuple(k_lens if k_lens is not None else q_lens),
        varlen=varlen, num_heads=H, num_kv_heads=Hkv or H, head_dim=D, is_causal=causal,
        block_m=bm, block_n=bn, num_programs=P, num_splits=splits, device="cpu",
    )


def _needed(key):
    """Every (b, h, q_tile, kv_block) that attention needs."""
    need = set()
    for b, (lq, lk) in enumerate(zip(key.q_lens, key.k_lens)):
        if lq == 0 or lk == 0:
            continue
        for h in range(key.num_heads):
            for qt in range(-(-lq // key.block_m)):
                last_row = min((qt + 1) * key.block_m, lq) - 1
                max_col = min(last_row, lk - 1) if key.is_causal else lk - 1
                for kb in range(max_col // key.block_n + 1):
                    need.add((b, h, qt, kb))
    return need


def _check_plan(key):
    p = build_plan(key)
    covered = {}
    for (b, h, qt, lo, hi, _slot) in p.work.tolist():
        assert lo < hi, "empty work item"
        for kb in range(lo, hi):
            covered[(b, h, qt, kb)] = covered.get((b, h, qt, kb), 0) + 1
    assert set(covered) == _needed(key)
    assert all(c == 1 for c in covered.values()), "a block is computed twice"
    # Split bookkeeping: the reduce map names exactly the slots the pieces write, once each.
    slots = [s for *_, s in p.work.tolist() if s >= 0]
    assert sorted(slots) == list(range(p.n_partials))
    for b, h, qt, s0, n in p.reduce.tolist():
        assert n >= 2
        pieces = sorted(
            (lo, hi, s) for (bb, hh, tt, lo, hi, s) in p.work.tolist()
            if (bb, hh, tt) == (b, h, qt) and s >= 0
        )
        assert [s for *_, s in pieces] == list(range(s0, s0 + n)), "slots not in kv order"
        assert pieces[0][0] == 0 and all(pieces[i][1] == pieces[i + 1][0] for i in range(n - 1))
    assert p.work_indptr[0] == 0 and p.work_indptr[-1] == p.n_work
    assert np.all(np.diff(p.work_indptr) >= 0)
    return p


@pytest.mark.parametrize("q_lens,causal,splits", [
    ([1000], False, None), ([1000], True, None), ([239, 17], False, 3), ([113, 1], True, 3),
    ([128, 128], False, 1), ([5000], True, None), ([0, 300, 7], False, None),
])
def test_plan_covers_every_block_once(q_lens, causal, splits):
    _check_plan(_key(q_lens, causal=causal, splits=splits))


def test_plan_varlen_mixed_lengths_and_cross_lengths():
    _check_plan(_key([300, 0, 1000, 5], [77, 10, 2000, 0], varlen=True, causal=False))
    _check_plan(_key([300, 64, 1000], [500, 10, 129], varlen=True, causal=True))


def test_causal_clipping_is_top_left():
    p = build_plan(_key([512], causal=True, P=1, H=1))
    # Tile t covers rows [128t, 128t+127]: it needs kv blocks 0..t (cols <= row).
    for (_, _, qt, lo, hi, _) in p.work.tolist():
        assert (lo, hi) == (0, qt + 1)
    # Sq > Sk: rows past the keys still stop at the last key block.
    p = build_plan(_key([512], [200], causal=True, P=1, H=1))
    assert sorted(hi for *_, hi, _ in p.work.tolist()) == [1, 2, 2, 2]


@pytest.mark.parametrize("q_lens,H,P,causal", [
    ([75600], 40, 132, False),  # Wan2.2 720p on an H200
    ([4608], 24, 132, False),  # Flux 1024: 6.5 waves
    ([17776], 48, 264, False),  # CogVideoX, two programs per SM
    ([8192], 3, 16, True),
    ([3000, 12000, 700], 5, 32, False),
    ([32760], 5, 132, False),  # Wan 480p under Ulysses degree 8: 5 heads
])
def test_balance_within_5_percent_with_two_or_more_waves(q_lens, H, P, causal):
    key = _key(q_lens, H=H, P=P, causal=causal, varlen=len(q_lens) > 1)
    p = build_plan(key)
    loads = p.program_loads
    assert loads.sum() / P >= 2 * max(p.work[:, 4] - p.work[:, 3]) or len(p.work) >= 2 * P
    assert loads.max() <= 1.05 * loads.mean(), (loads.max(), loads.mean())


def test_single_wave_is_split_to_fill_the_machine():
    p = build_plan(_key([1000], H=1, P=8))  # 8 tiles of 8 blocks on 8 programs: balanced
    assert p.n_partials == 0
    p = build_plan(_key([512], H=1, P=16))  # 4 tiles of 4 blocks on 16 programs: split
    assert p.n_partials > 0
    assert p.program_loads.max() <= 1


def test_partials_sized_from_real_pieces():
    p = build_plan(_key([1000], H=3, P=4, splits=3))
    assert p.n_partials == 3 * p.n_reduce == int(p.reduce[:, 4].sum())


def test_plan_is_deterministic():
    a = build_plan(_key([3000, 1200], H=5, P=7, causal=True, varlen=True))
    b = build_plan(_key([3000, 1200], H=5, P=7, causal=True, varlen=True))
    for name in ("work", "work_indptr", "reduce", "seq"):
        assert np.array_equal(getattr(a, name), getattr(b, name))


def test_cache_hits_and_is_bounded(monkeypatch):
    plan_mod.clear_plan_cache()
    monkeypatch.setenv("FP8DIT_PLAN_CACHE", "3")
    k1 = _key([100])
    assert get_plan(k1) is get_plan(k1)
    for n in range(2, 8):
        get_plan(_key([100 * n]))
    assert plan_mod.plan_cache_info()["size"] == 3
    assert get_plan(k1) is not None  # rebuilt after eviction


def test_bad_cache_size_raises_on_hits_too(monkeypatch):
    plan_mod.clear_plan_cache()
    k1 = _key([100])
    get_plan(k1)
    monkeypatch.setenv("FP8DIT_PLAN_CACHE", "many")
    with pytest.raises(ValueError, match="FP8DIT_PLAN_CACHE: expected an integer, got 'many'"):
        get_plan(k1)


def test_cache_is_thread_safe():
    plan_mod.clear_plan_cache()
    keys = [_key([64 * (i % 5 + 1)], H=i % 3 + 1) for i in range(40)]
    results, errors = {}, []

    def worker(i):
        try:
            results[i] = get_plan(keys[i])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i in range(40):
        assert results[i].key == keys[i]


def test_bad_head_dim():
    with pytest.raises(ValueError, match="head_dim"):
        plan_mod.padded_head_dim(300)
