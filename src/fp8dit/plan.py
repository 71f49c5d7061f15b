"""Host-side persistent schedule: who computes what, and where partial results merge.

``build_plan`` turns sequence lengths, head counts and the number of persistent programs into:

- ``seq``: one int32 row per sequence (lengths, offsets into the user's tensors and into the
  padded internal buffers; columns named in ``kernels.quantize``);
- ``work`` / ``work_indptr``: each program's list of work items (sequence, head, query tile,
  kv block range, partial slot), CSR by program (columns named in ``kernels.attention``);
- ``reduce``: for every item split over the kv axis, which consecutive partial slots merge into
  which output rows (columns named in ``kernels.merge``).

Whole items go out round-robin, least-loaded first, in (sequence, head, tile) order, so at any
moment the programs work on neighbouring tiles of the same heads and share K/V in L2. Only the
last, partial wave is split over the kv axis, and only when that evens the programs out: the
pieces fill the least-loaded programs up to a common level (water filling). Partial buffers are
sized from the real number of pieces.

Plans are pure functions of their key, cached in a bounded LRU (thread-safe) with their int32
tables already on the device, so a diffusion loop plans once and ``run`` never builds one inside
CUDA-graph capture.
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch

from . import env
from .kernels.attention import W_FIELDS
from .kernels.merge import R_FIELDS
from .kernels.quantize import SEQ_FIELDS

# Padded head dims the kernels are compiled for; any D up to 256 is zero-padded to the next one.
SUPPORTED_HEAD_DIMS = (64, 128, 256)
MAX_HEAD_DIM = SUPPORTED_HEAD_DIMS[-1]
# Tokens per chunk of the K/V channel-statistics pass: the longest chunk that still gives at
# least STATS_MIN_PROGRAMS programs. Each program walks its chunk serially, so at Flux's 4,608
# tokens 512-token chunks left 216 latency-bound programs on 132 SMs.
STATS_CHUNKS = (512, 256, 128, 64)
STATS_MIN_PROGRAMS = 1024
# Splitting the tail pays only when it removes more imbalance than this (fraction of the mean).
SPLIT_THRESHOLD = 0.02
# Smallest kv range (in blocks) worth a partial output and a merge.
MIN_PIECE_BLOCKS = 1


def stats_chunk(max_k_len: int, n_seq_heads: int, block_n: int = 1) -> int:
    """Tokens per chunk of the channel-statistics pass (see ``STATS_CHUNKS``). With kv blocks
    of 256 keys (``block_n``), whole blocks per chunk, so that pass can take each block's K
    channel max and min where ``tuning.Quantization.kv_rows`` asks for them."""
    chunks = [c for c in STATS_CHUNKS if block_n <= 128 or c % block_n == 0] or [block_n]
    for chunk in chunks:
        if n_seq_heads * _cdiv(max_k_len, chunk) >= STATS_MIN_PROGRAMS:
            return chunk
    return chunks[-1]


def padded_head_dim(d: int) -> int:
    for dp in SUPPORTED_HEAD_DIMS:
        if d <= dp:
            return dp
    raise ValueError(f"head_dim: expected at most {MAX_HEAD_DIM}, got {d}")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class PlanKey:
    q_lens: tuple[int, ...]
    k_lens: tuple[int, ...]
    varlen: bool
    num_heads: int
    num_kv_heads: int
    head_dim: int
    is_causal: bool
    block_m: int
    block_n: int
    num_programs: int
    num_splits: int | None  # None: automatic; n forces every item into n kv pieces (tests)
    device: str


@dataclass
class Plan:
    key: PlanKey
    head_dim_padded: int
    q_total_padded: int  # rows of the padded internal q buffer
    k_total_padded: int
    n_kblocks: int  # kv blocks over all sequences (per-block K scales)
    max_q_blocks: int
    max_k_blocks: int
    n_chunks: int  # channel-statistics chunks per sequence (max over sequences)
    stats_chunk: int  # tokens per channel-statistics chunk
    n_partials: int
    seq: np.ndarray  # [B, SEQ_FIELDS] int32
    work: np.ndarray  # [n_work, W_FIELDS] int32, grouped by program
    work_indptr: np.ndarray  # [num_programs + 1] int32
    reduce: np.ndarray  # [n_reduce, R_FIELDS] int32
    program_loads: np.ndarray  # kv blocks per program (balance diagnostics)
    needs_zero_fill: bool  # some sequence has q rows but no keys: its output is 0, lse -inf
    device_tables: dict = field(default_factory=dict, repr=False)

    @property
    def num_programs(self) -> int:
        return self.key.num_programs

    @property
    def n_work(self) -> int:
        return int(self.work.shape[0])

    @property
    def n_reduce(self) -> int:
        return int(self.reduce.shape[0])

    def tables(self, device: torch.device) -> dict:
        """The int32 tables on ``device`` (uploaded once per plan, in one copy)."""
        t = self.device_tables.get("seq")
        if t is not None and t.device == device:
            return self.device_tables
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "fp8dit: the attention plan for these shapes was not built before CUDA-graph "
                "capture; run the model once outside capture (warm-up) so the plan is cached"
            )
        parts = [self.seq.ravel(), self.work.ravel(), self.work_indptr, self.reduce.ravel()]
        flat = torch.from_numpy(np.concatenate(parts).astype(np.int32)).to(device)
        out, o = {}, 0
        for name, arr in zip(("seq", "work", "work_indptr", "reduce"), parts):
            out[name] = flat[o:o + arr.size]
            o += arr.size
        self.device_tables = out
        return out


def _item_blocks(q_rows_end: int, k_len: int, block_n: int, is_causal: bool) -> int:
    """kv blocks a query tile needs; causal is top-left aligned like SDPA (col <= row)."""
    if k_len == 0:
        return 0
    if not is_causal:
        return _cdiv(k_len, block_n)
    return _cdiv(min(q_rows_end, k_len), block_n)


def _split_even(lo: int, hi: int, n: int) -> list[tuple[int, int]]:
    n = max(1, min(n, hi - lo))
    bounds = [lo + (hi - lo) * i // n for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(n)]


def build_plan(key: PlanKey) -> Plan:
    B = len(key.q_lens)
    H = key.num_heads
    BM, BN, P = key.block_m, key.block_n, key.num_programs
    Dp = padded_head_dim(key.head_dim)

    seq = np.zeros((B, SEQ_FIELDS), dtype=np.int64)
    q_src = k_src = q_pad = k_pad = 0
    for b, (lq, lk) in enumerate(zip(key.q_lens, key.k_lens)):
        seq[b, :8] = (lq, lk, q_src if key.varlen else 0, k_src if key.varlen else 0,
                      q_pad, k_pad, k_pad // BN, lk)
        q_src += lq
        k_src += lk
        q_pad += _cdiv(lq, BM) * BM
        k_pad += _cdiv(lk, BN) * BN

    # Items in (sequence, head, tile) order: neighbours share K/V.
    items = []  # (b, h, qt, n_blocks)
    for b, (lq, lk) in enumerate(zip(key.q_lens, key.k_lens)):
        if lq == 0 or lk == 0:
            continue
        for h in range(H):
            for qt in range(_cdiv(lq, BM)):
                nb = _item_blocks(min((qt + 1) * BM, lq), lk, BN, key.is_causal)
                items.append((b, h, qt, nb))
    if key.is_causal:
        # Longest first (LPT), stable so equal-cost tiles stay in locality order.
        items.sort(key=lambda it: -it[3])

    per_prog: list[list[tuple]] = [[] for _ in range(P)]  # (b, h, qt, lo, hi, item_id)
    loads = np.zeros(P, dtype=np.int64)
    heap = [(0, p) for p in range(P)]

    def put_whole(it_id):
        b, h, qt, nb = items[it_id]
        load, p = heapq.heappop(heap)
        per_prog[p].append((b, h, qt, 0, nb, it_id))
        loads[p] = load + nb
        heapq.heappush(heap, (load + nb, p))

    pieces_of: dict[int, list[tuple[int, int, int]]] = {}  # item -> [(lo, hi, program)]

    if key.num_splits is not None:
        for i, (b, h, qt, nb) in enumerate(items):
            chunks = _split_even(0, nb, key.num_splits)
            for lo, hi in chunks:
                load, p = heapq.heappop(heap)
                if len(chunks) == 1:
                    per_prog[p].append((b, h, qt, lo, hi, i))
                else:
                    pieces_of.setdefault(i, []).append((lo, hi, p))
                loads[p] = load + hi - lo
                heapq.heappush(heap, (load + hi - lo, p))
    else:
        n_full = (len(items) // P) * P
        for i in range(n_full):
            put_whole(i)
        tail = list(range(n_full, len(items)))
        if tail:
            # Would handing the tail out whole leave the programs uneven?
            trial = loads.copy()
            for i in sorted(tail, key=lambda i: -items[i][3]):
                trial[int(np.argmin(trial))] += items[i][3]
            mean = trial.sum() / P
            if trial.max() <= mean * (1 + SPLIT_THRESHOLD) + 1e-9:
                for i in tail:
                    put_whole(i)
            else:
                _water_fill(items, tail, loads, per_prog, pieces_of, P)

    # Slots: the pieces of one item take consecutive slots, in kv order.
    slot_of: dict[tuple[int, int], int] = {}
    reduce_rows = []
    n_slots = 0
    for i in sorted(pieces_of):
        pcs = sorted(pieces_of[i])
        b, h, qt, _ = items[i]
        reduce_rows.append((b, h, qt, n_slots, len(pcs)))
        for lo, hi, p in pcs:
            slot_of[(i, lo)] = n_slots
            per_prog[p].append((b, h, qt, lo, hi, i))
            n_slots += 1

    work_rows, indptr = [], [0]
    for p in range(P):
        for b, h, qt, lo, hi, i in per_prog[p]:
            slot = slot_of.get((i, lo), -1) if i in pieces_of else -1
            work_rows.append((b, h, qt, lo, hi, slot))
        indptr.append(len(work_rows))
    loads = np.zeros(P, dtype=np.int64)
    for p in range(P):
        loads[p] = sum(hi - lo for _, _, _, lo, hi, _ in per_prog[p])

    work = np.asarray(work_rows, dtype=np.int32).reshape(-1, W_FIELDS)
    reduce = np.asarray(reduce_rows, dtype=np.int32).reshape(-1, R_FIELDS)
    max_k = max(key.k_lens) if key.k_lens else 0
    chunk = stats_chunk(max_k, len(key.k_lens) * key.num_kv_heads, BN)
    return Plan(
        key=key,
        head_dim_padded=Dp,
        q_total_padded=q_pad,
        k_total_padded=k_pad,
        n_kblocks=k_pad // BN,
        max_q_blocks=max((_cdiv(x, BM) for x in key.q_lens), default=0),
        max_k_blocks=max((_cdiv(x, BN) for x in key.k_lens), default=0),
        n_chunks=_cdiv(max_k, chunk),
        stats_chunk=chunk,
        n_partials=n_slots,
        seq=seq.astype(np.int32),
        work=work,
        work_indptr=np.asarray(indptr, dtype=np.int32),
        reduce=reduce,
        program_loads=loads,
        needs_zero_fill=any(lq > 0 and lk == 0 for lq, lk in zip(key.q_lens, key.k_lens)),
    )


def _water_fill(items, tail, loads, per_prog, pieces_of, P):
    """Split the tail items into kv pieces that lift the least-loaded programs to one level."""
    total = sum(items[i][3] for i in tail)
    order = np.argsort(loads, kind="stable")
    sorted_loads = loads[order]
    # Smallest level L with sum(max(0, L - load)) >= total.
    level = float(sorted_loads[0])
    for j in range(P):
        nxt = float(sorted_loads[j + 1]) if j + 1 < P else float("inf")
        room = (j + 1) * nxt - sorted_loads[: j + 1].sum()
        if room >= total or j + 1 == P:
            level = (total + sorted_loads[: j + 1].sum()) / (j + 1)
            break
    caps = [(int(order[j]), max(0, int(np.ceil(level - loads[order[j]])))) for j in range(P)]
    caps = [(p, c) for p, c in caps if c > 0]
    ci = 0
    for i in tail:
        b, h, qt, nb = items[i]
        lo = 0
        pieces = []
        while lo < nb:
            if ci >= len(caps):  # rounding left a few blocks: give them to the least loaded
                p = int(np.argmin(loads))
                take = nb - lo
            else:
                p, cap = caps[ci]
                take = min(cap, nb - lo)
                rest = nb - lo - take
                if 0 < rest < MIN_PIECE_BLOCKS:
                    take = nb - lo
                caps[ci] = (p, cap - take)
                if caps[ci][1] <= 0:
                    ci += 1
            pieces.append((lo, lo + take, p))
            loads[p] += take
            lo += take
        if len(pieces) == 1:
            lo_, hi_, p = pieces[0]
            per_prog[p].append((b, h, qt, lo_, hi_, i))
        else:
            pieces_of[i] = pieces


# ---------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------

_cache: OrderedDict[PlanKey, Plan] = OrderedDict()
_lock = threading.Lock()


def get_plan(key: PlanKey) -> Plan:
    """Cached :func:`build_plan` (LRU of ``FP8DIT_PLAN_CACHE`` entries, thread-safe)."""
    limit = env.plan_cache_size()  # a bad value raises on every call, not only on a miss
    with _lock:
        plan = _cache.get(key)
        if plan is not None:
            _cache.move_to_end(key)
            return plan
    plan = build_plan(key)
    with _lock:
        _cache[key] = plan
        _cache.move_to_end(key)
        while len(_cache) > limit:
            _cache.popitem(last=False)
        return _cache[key]


def clear_plan_cache() -> None:
    with _lock:
        _cache.clear()


def plan_cache_info() -> dict:
    with _lock:
        return {"size": len(_cache), "limit": env.plan_cache_size()}
