"""Measured tuning of the FP8 path, as frozen data: tiles, warps, stages, programs per SM,
register caps, the quantization's launch shape, and the lengths from which each kernel runs.

Every value changes speed only, never a result bit (one exception, said where it sits: the
statistics pass's sub-tile sets the order of fp32 sums, the channel means' last bits). Each
carries the measurement that chose it (``measured``: GPU, date, what was compared). Readers:
:mod:`fp8dit.attend` (tiles), :mod:`fp8dit.quantize` (the quantization's launches),
:mod:`fp8dit.key_padding` (the mask-reading kernels) and :func:`fp8dit.dispatch.choose`
(which backend and kernel a call runs).

AMD GPUs (``hip_tiles``) and NVIDIA GPUs other than Hopper (``nvidia_tiles``: sm_89, sm_100,
sm_120) have tiles compiled and checked for them, not yet measured: their reasons say so
(docs/amd.md, docs/gpus.md). ``measured_archs`` lists where the crossovers were timed.

Benchmarks and tests vary it for a block of code, in this thread or task only::

    with tuning.override(tiles={128: dict(block_n=64)}):
        fp8dit.attention(q, k, v)

A dict changes the named fields of a table entry (or of :class:`Quantization`), anything else
replaces the value. Plans are cached by their tile sizes, so a tile override gets its own plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

__all__ = [
    "Crossover",
    "GluonTiles",
    "MaskTiles",
    "MeasuredArch",
    "Quantization",
    "Table",
    "TritonTiles",
    "Tuning",
    "VerifiedRelease",
    "DEFAULT",
    "current",
    "override",
]


class Table(Mapping):
    """An immutable mapping (a padded head dim, or a field name, to its entry) that
    torch.compile traces through: :func:`fp8dit.dispatch.choose` reads these tables in
    compiled code, and a ``MappingProxyType`` breaks the graph when any dict changes during
    the trace."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping = ()):
        object.__setattr__(self, "_items", tuple(dict(items).items()))

    def __getitem__(self, key):
        for k, v in self._items:
            if k == key:
                return v
        raise KeyError(key)

    def __contains__(self, key) -> bool:
        return any(k == key for k, _ in self._items)

    def get(self, key, default=None):
        for k, v in self._items:
            if k == key:
                return v
        return default

    def __iter__(self):
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __setattr__(self, name, value):
        raise AttributeError("tuning tables are frozen; use tuning.override")

    def __repr__(self) -> str:
        return f"Table({dict(self._items)!r})"


@dataclass(frozen=True)
class TritonTiles:
    """Launch shape of the Triton attention kernel (``kernels/attention.py``). On AMD GPUs
    (``Tuning.hip_tiles``) ``num_warps`` counts 64-wide wavefronts and ``programs_per_sm``
    programs per CU."""

    block_m: int  # query rows per tile
    block_n: int  # keys per kv step
    num_warps: int
    num_stages: int  # depth of the pipelined K/V loads
    programs_per_sm: int  # persistent programs per SM (per CU on AMD)
    maxnreg: int | None  # registers per thread at most (None: as ptxas likes; NVIDIA only)
    measured: str
    waves_per_eu: int | None = None  # AMD only: the occupancy the HIP compiler aims at
    # Q, K and V tiles through pointers, not tensor descriptors (the kernel's PTR_LOADS): for
    # GPUs without TMA, where Triton lowers descriptors to byte-wide loads
    ptr_loads: bool = False


@dataclass(frozen=True)
class GluonTiles:
    """The warp-specialized Gluon kernel's kv loop (``kernels/attention_sm90_ws.py``). Its work
    items are 128 query rows, 64 per consumer warpgroup, one program of three partitions per
    SM: structure, not tuning."""

    block_n: int  # keys per kv step: 128, or 256 as two dots of 128
    stages: int  # K/V ring slots
    p_regs: bool  # 256-key steps: the PV dots read P from registers, not shared memory
    rowsum_dot: bool  # 256-key steps with p_regs: P's row sums from dots with a tile of ones
    split_kv: bool  # 256-key steps: K and V of a ring slot on their own barriers
    consumer_regs: int  # registers per consumer thread (the producer warp keeps 24)
    measured: str


@dataclass(frozen=True)
class Crossover:
    """Lengths from which a kernel measured faster, at one padded head dim. Against SDPA
    cuDNN the length is the call's effective one (:func:`fp8dit.dispatch.effective_tokens`);
    against the Triton kernel it is the longest key sequence. None: at no length measured."""

    gluon_ws: int | None  # the warp-specialized kernel beats the Triton kernel and SDPA
    triton: int | None  # the Triton kernel beats SDPA (where the other cannot run)
    measured: str


@dataclass(frozen=True)
class Quantization:
    """Launch shape of the quantization kernels (``kernels/quantize.py``). The workspace is
    bitwise the same whatever the values, except that ``stats_sub_elems`` sets the order of
    the statistics' fp32 sums (the channel means' last bits)."""

    # Rows per quantize_kv program by padded head dim, where one K scale spans a longer kv
    # block (the block's amax then comes from the statistics pass); absent or 0: the block.
    kv_rows: Mapping[int, int]
    # Rows per quantize_q program by padded head dim; absent: the plan's query tile.
    q_rows: Mapping[int, int]
    # Elements per sub-tile of the channel-statistics pass (its rows: this / padded head dim),
    # on the GPU and under Triton's CPU interpreter.
    stats_sub_elems: int
    stats_sub_elems_interpret: int
    stats_warps: int
    measured: Mapping[str, str]  # field name -> GPU, date: what was compared


@dataclass(frozen=True)
class MaskTiles:
    """The mask-reading kernels' launch (``kernels/mask_stats.py``)."""

    rows: int  # mask rows per program (word kernel: rows of one phase class)
    cols: int  # bytes (byte kernel) or int32 words (word kernel) per step
    num_warps: int
    measured: str


@dataclass(frozen=True)
class VerifiedRelease:
    """A Triton release on which the warp-specialized kernel ran and measured correct and
    faster; ``FP8DIT_KERNEL=auto`` runs that kernel only on these (Gluon's API changes between
    releases)."""

    triton: str  # major.minor
    gpu: str
    date: str
    measured: str


@dataclass(frozen=True)
class MeasuredArch:
    """An NVIDIA architecture where the FP8 path was run and timed against SDPA: ``auto``
    takes FP8 there from ``Tuning.crossovers``. On any other architecture ``auto`` runs SDPA
    and says why (:func:`fp8dit.dispatch.fp8_not_preferred_reason`)."""

    gpus: str
    date: str
    measured: str


@dataclass(frozen=True)
class Tuning:
    tiles: Mapping[int, TritonTiles]  # one-term recipes, by padded head dim
    # AMD GPUs (fp8dit.device): by architecture, then padded head dim, every recipe
    hip_tiles: Mapping[str, Mapping[int, TritonTiles]]
    two_term_tiles: Mapping[int, TritonTiles]  # recipes with qk_terms=2, where they differ
    gluon_tiles: Mapping[int, GluonTiles]  # non-causal calls, by padded head dim
    gluon_causal_tiles: Mapping[int, GluonTiles]  # causal calls (FP8DIT_KERNEL=gluon-ws)
    crossovers: Mapping[int, Crossover]  # by padded head dim
    gluon_releases: tuple[VerifiedRelease, ...]
    # where the warp-specialized kernel is built from triton 3.6's PTX (fp8dit.prebuilt)
    prebuilt_releases: tuple[VerifiedRelease, ...]
    quantization: Quantization
    mask_bytes: MaskTiles  # masks read byte by byte (any strides)
    mask_words: MaskTiles  # masks whose rows are contiguous, read as int32 words
    # NVIDIA architectures other than sm_90 (fp8dit.device.NVIDIA_CHECKED_ARCHS): by
    # architecture ("sm_89"), then padded head dim, every recipe; compiled, not measured
    nvidia_tiles: Mapping[str, Mapping[int, TritonTiles]]
    # where the crossovers were measured ("sm_90"); auto runs SDPA on the others
    measured_archs: Mapping[str, MeasuredArch]


_TWO_TERM = ("sm_90 SASS (triton 3.9), 2026-12-02: the one-term tiles spilled in the kv loop "
             "(89 at D=64, 4 at D=128) and took 161 KB at D=128; H200, 2026-12-02: fastest of "
             "64/128 keys x 2/3 stages at Wan 720p and CogVideoX")
_CAUSAL = ("sm_90 SASS (triton 3.6), 2026-12-03: the 256-key step's masked loop spills ~40 "
           "registers at D=128, the 128-key loop none; three slots are 96 KB of K/V at D=128")

# AMD Instinct: compiled, not run (docs/amd.md). The starting point is AMD's own int8-QK / fp8-PV
# Triton attention (ROCm/aiter, aiter/ops/triton/attention/fav3_sage.py, get_sage_fwd_configs):
# 256 x 128 tiles, 8 wavefronts, waves_per_eu=2, 3 stages on gfx950 and 2 on gfx942; one
# persistent program per CU. Changed where this kernel's kv loop spilled registers with triton
# 3.8 or 3.9 (Triton gives it at most 256 VGPRs there). Instructions are per wavefront and kv
# step, spills are spill instructions per step.
_HIP = ("compiled for %s with triton 3.8.0 and 3.9.0 on 2026-12-05 (tests/test_hip_compile.py): "
        "native MFMA for both dots; not yet executed on the hardware; ")
_HIP_TILES = {
    ("gfx942", 64): "aiter's 256 x 128 tiles with 3 stages: no spills in the kv loops (1,167 "
                    "instructions with triton 3.8), where 2 stages spilled 3 per step with 3.9",
    ("gfx942", 128): "256 x 32: no spills in the kv loops (639 instructions), where 64-key "
                     "blocks spilled 1 per step with triton 3.9 and 128-key blocks 19 with 3.8",
    ("gfx942", 256): "128 x 64 with 8 wavefronts: no spills in the kv loops (1,885 "
                     "instructions with triton 3.8), where 4 wavefronts spilled 153 and 64 x 64 "
                     "with 4 took 3,062 instructions for half the rows",
    ("gfx950", 64): "aiter's 256 x 128 tiles: no spills in the unmasked kv loop (881 "
                    "instructions with triton 3.8)",
    ("gfx950", 128): "256 x 64: no spills in the unmasked kv loop (788 instructions with triton "
                     "3.8; 16 in the masked one), where 128-key blocks spilled 9 (69 masked)",
    ("gfx950", 256): "128 x 64 with 8 wavefronts: 11 spills per step in the kv loop with triton "
                     "3.8, against 73 for 64 x 64 with 4 and 212 for 128 x 64 with 4",
}


def _hip(arch: str, dp: int, block_m: int, block_n: int, stages: int) -> TritonTiles:
    return TritonTiles(block_m, block_n, 8, stages, 1, None,
                       _HIP % arch + _HIP_TILES[arch, dp], waves_per_eu=2)


# NVIDIA GPUs other than Hopper: compiled, not run (docs/gpus.md). The starting point is
# sm_90's tiles without its register cap (tuned for three H200 programs per SM). Changed where
# the compiled kv loops spilled, loaded K and V one byte at a time, or laid the four warps side
# by side across columns (a barrier-bound row reduction through shared memory); instructions
# and spills are per thread and kv step.
_NV = ("compiled and checked for %s with triton 3.9.0 on 2026-12-06 "
       "(tests/test_nvidia_compile.py); not yet executed on the hardware; ")
_NV_TILES = {
    ("sm_89", 64): "pointer loads (16 bytes wide, cp.async), 64 x 64: no spills in the kv loops "
                   "(350 instructions per 64-key step with triton 3.9)",
    ("sm_89", 128): "pointer loads, 128 x 64 with 8 warps: no spills (453 instructions per "
                    "step, 2 barriers), where 64 x 64 with 4 warps laid them side by side (98 "
                    "barriers, 949 instructions) and the descriptors' byte loads spilled ~400",
    ("sm_89", 256): "pointer loads, 64 x 32: no spills in the kv loops (772 instructions), 34 "
                    "barriers per step as the warps split the 256 columns; 64 x 64 spilled 20",
    ("sm_100", 64): "TMA and tcgen05, 64 x 128 without sm_90's register cap: no spills in the "
                    "kv loops (539 instructions), where the cap of 168 spilled 62 in the "
                    "masked loop",
    ("sm_100", 128): "sm_90's 64 x 128 with 3 stages: no spills (608 instructions, 105 KB of "
                     "shared memory, 256 TMEM columns)",
    ("sm_100", 256): "128 x 64 with 8 warps: no spills in the kv loops (594 instructions), "
                     "where 64 x 64 spilled 32 in the masked loop; all 512 TMEM columns",
    ("sm_120", 64): "TMA, 64 x 64: no spills (381 instructions)",
    ("sm_120", 128): "TMA, 128 x 64 with 8 warps: no spills (474 instructions, 6 barriers), "
                     "where 64 x 128 laid the four warps side by side (~134 barriers, 83-125 "
                     "spills per step)",
    ("sm_120", 256): "pointer loads, 64 x 32: no spills in the kv loops (756 instructions, 34 "
                     "barriers), where TMA spilled 78 per step",
}


def _nv(arch: str, dp: int, block_m: int, block_n: int, warps: int, stages: int,
        ptr_loads: bool) -> TritonTiles:
    # as many programs per SM as its 65,536 registers hold at the 255 a thread these take:
    # two of 4 warps, one of 8
    return TritonTiles(block_m, block_n, warps, stages, 8 // warps, None,
                       _NV % arch + _NV_TILES[arch, dp], ptr_loads=ptr_loads)


DEFAULT = Tuning(
    tiles=Table({
        64: TritonTiles(64, 128, 4, 2, 3, 168,
                        "H200, 2026-12-02: 3 programs/SM (168 registers, 65,536 / 384 = 170 at "
                        "most), 2 stages: 460 against 438 TFLOPS at CogVideoX"),
        128: TritonTiles(64, 128, 4, 3, 2, None,
                         "H200, 2026-12-02: 64-row tiles, 4 warps, 2 programs/SM: 741 against "
                         "583 TFLOPS (128-row tiles, 8 warps) at Wan 720p; 3 programs/SM 738"),
        256: TritonTiles(64, 64, 4, 2, 2, None,
                         "H200, 2026-12-02: 64x64 tiles, 4 warps: 412 TFLOPS against 299-405 "
                         "for 8 warps or 128-wide tiles"),
    }),
    hip_tiles=Table({
        "gfx942": Table({64: _hip("gfx942", 64, 256, 128, 3),
                         128: _hip("gfx942", 128, 256, 32, 2),
                         256: _hip("gfx942", 256, 128, 64, 2)}),
        "gfx950": Table({64: _hip("gfx950", 64, 256, 128, 3),
                         128: _hip("gfx950", 128, 256, 64, 3),
                         256: _hip("gfx950", 256, 128, 64, 3)}),
    }),
    two_term_tiles=Table({
        64: TritonTiles(64, 64, 4, 3, 2, None, _TWO_TERM),
        128: TritonTiles(64, 64, 4, 3, 2, None, _TWO_TERM),
    }),
    gluon_tiles=Table({
        64: GluonTiles(256, 2, True, True, True, 240,
                       "H200, 2026-12-04: K and V on their own barriers, CogVideoX 13.29 against "
                       "14.19 ms; 2026-12-03: the row-sum dot (P in registers) 527 against 475 "
                       "TFLOPS"),
        128: GluonTiles(256, 2, True, True, False, 240,
                        "H200, 2026-12-03: 256-key steps +8-10% over 128; P from registers 912 "
                        "against 852 TFLOPS, the row-sum dot 960 against 898 at Wan 720p; 3 "
                        "stages 1-2% slower; 2026-12-04: split K/V barriers spill, 28.5 against "
                        "22.9 ms at Wan 480p"),
    }),
    gluon_causal_tiles=Table({
        64: GluonTiles(128, 3, False, False, False, 240, _CAUSAL),
        128: GluonTiles(128, 3, False, False, False, 240, _CAUSAL),
    }),
    crossovers=Table({
        64: Crossover(8192, 17000,
                      "H200, 2026-12-03, end to end against SDPA cuDNN, 48 heads: "
                      "warp-specialized 1.14x at 8,192 and 12,288 tokens (1.67 against 1.91 ms "
                      "on the Triton kernel at 8,192); Triton kernel 1.00x at 8,192, 0.98x at "
                      "12,288, 1.12x at 17,776"),
        128: Crossover(8192, 8192,
                       "H200, 2026-12-03, end to end against SDPA cuDNN, 24 heads: "
                       "warp-specialized 1.36x at 8,192 tokens, 0.44x at 4,608 (where the Triton "
                       "kernel is faster, 0.86 against 0.99 ms); Triton kernel 1.08x at 8,192"),
        256: Crossover(None, None,
                       "H200, 2026-12-02: 0.62x the speed of SDPA cuDNN with the best tiles"),
    }),
    gluon_releases=(
        VerifiedRelease("3.6", "NVIDIA H200", "2026-12-04",
                        "matched the Triton kernel against fp64 (13 cases, the GPU test "
                        "suite) and ran faster end to end from 8,192 tokens"),
        # Slower than on 3.6 (docs/triton_releases.md says where) but faster than the Triton
        # kernel on the same release: auto takes it there too.
        VerifiedRelease("3.8", "NVIDIA H100 80GB HBM3", "2026-12-06",
                        "commit 187a40f: both kernels against fp64 at 6 shapes (rel-L1 "
                        "0.037-0.040, cos >= 0.99922), the GPU tests of the FP8 path with the "
                        "kernel forced; Wan2.2 720p 1.45x SDPA cuDNN end to end, the Triton "
                        "kernel 1.21x"),
        VerifiedRelease("3.9", "NVIDIA H100 80GB HBM3", "2026-12-06",
                        "commit 187a40f: both kernels against fp64 at 6 shapes (rel-L1 "
                        "0.037-0.040, cos >= 0.99922), the GPU tests of the FP8 path with the "
                        "kernel forced; Wan2.2 720p 1.63x SDPA cuDNN end to end, the Triton "
                        "kernel 1.28x"),
    ),
    prebuilt_releases=(
        VerifiedRelease("3.8", "NVIDIA H100 80GB HBM3", "2026-12-06",
                        "commit 38037dd: built from triton 3.6's PTX the kernel took 119.8, "
                        "174.3, 22.74 and 6.40 ms at Wan2.2 720p, HunyuanVideo 720p, Wan 480p "
                        "and CogVideoX-5B, 3.6's build 117.0, 171.8, 22.36 and 6.22, 3.8's own "
                        "136.7, 211.3, 26.53 and 6.36; both kernels against fp64 at 4 shapes "
                        "and the FP8 path's GPU tests passed with it"),
        VerifiedRelease("3.9", "NVIDIA H100 80GB HBM3", "2026-12-06",
                        "commit 0812edb: built from triton 3.6's PTX (the cubin 3.8 builds, "
                        "byte for byte) the kernel took 124.5, 181.2, 23.14 and 6.45 ms at "
                        "Wan2.2 720p, HunyuanVideo 720p, Wan 480p and CogVideoX-5B, 3.6's build "
                        "120.9, 174.9, 23.26 and 6.29, 3.9's own 131.9, 193.3, 24.39 and 6.32; "
                        "interleaved on another H100 98.0-98.6% of 3.6's kernel; both kernels "
                        "against fp64 at 4 shapes and the FP8 path's GPU tests passed with it"),
    ),
    quantization=Quantization(
        kv_rows=Table({128: 32, 64: 64}),
        q_rows=Table({128: 32, 256: 64}),
        stats_sub_elems=512,
        stats_sub_elems_interpret=2048,
        stats_warps=4,
        measured=Table({
            "kv_rows": "H200, 2026-12-03: quantize_kv at Wan 720p 0.71 ms with 32 rows against "
                       "0.79 (64) and 1.23 (256); CogVideoX (D=64) 0.103 with 64 against 0.169",
            "q_rows": "H200, 2026-12-03: 32 rows at D=128, Wan 720p 0.49 ms against 0.58 for 64; "
                      "D=64 no faster; D=256 (a no-op on NVIDIA's 64-row tiles): compiled for "
                      "gfx942 and gfx950 with triton 3.8.0 on 2026-12-05, AMD's 128-row tiles "
                      "in one program spilled 24-35 registers, 64 rows none",
            "stats_sub_elems": "H200, 2026-12-03: 4-row sub-tiles at D=128, Wan 720p 0.61 ms "
                               "against 0.68 for 8 rows and 0.86 for 16",
            "stats_sub_elems_interpret": "CPU interpreter, 2026-12-03: every loop step costs "
                                         "Python time; 4-row sub-tiles took a 65k-token test "
                                         "66 s instead of 28",
            "stats_warps": "H200, 2026-12-03: 8 warps slower than 4",
        }),
    ),
    mask_bytes=MaskTiles(32, 512, 4,
                         "H200, 2026-12-04: 2.1 ms at HunyuanVideo 1.5 480p against 3.3 for "
                         "64 x 256 bytes with 8 warps"),
    mask_words=MaskTiles(32, 128, 1,
                         "H200, 2026-12-04: 0.92 ms at HunyuanVideo 1.5 480p, 16 x 256 words "
                         "with 4 warps the same"),
    nvidia_tiles=Table({
        "sm_89": Table({64: _nv("sm_89", 64, 64, 64, 4, 2, True),
                        128: _nv("sm_89", 128, 128, 64, 8, 2, True),
                        256: _nv("sm_89", 256, 64, 32, 4, 2, True)}),
        "sm_100": Table({64: _nv("sm_100", 64, 64, 128, 4, 2, False),
                         128: _nv("sm_100", 128, 64, 128, 4, 3, False),
                         256: _nv("sm_100", 256, 128, 64, 8, 2, False)}),
        "sm_120": Table({64: _nv("sm_120", 64, 64, 64, 4, 2, False),
                         128: _nv("sm_120", 128, 128, 64, 8, 2, False),
                         256: _nv("sm_120", 256, 64, 32, 4, 2, True)}),
    }),
    measured_archs=Table({
        "sm_90": MeasuredArch("NVIDIA H100, H200", "2026-12-04",
                              "H200, 2026-12-02 to 2026-12-04: the tiles and crossovers of "
                              "this module timed against SDPA cuDNN"),
    }),
)

# A plain dict, not a ContextVar: torch.compile traces current() (through the dispatcher), and
# dynamo before torch 2.14 cannot trace ContextVar.get (a graph break; an error under
# fullgraph=True). Overrides are process-wide, for benchmarks and tests.
_ACTIVE: dict[str, Tuning] = {"tuning": DEFAULT}


def current() -> Tuning:
    """The tuning in force: :data:`DEFAULT` unless an :func:`override` is active."""
    return _ACTIVE["tuning"]


def _changed(value, change):
    if isinstance(change, Mapping) and dataclasses.is_dataclass(value):
        unknown = sorted(set(change) - {f.name for f in dataclasses.fields(value)})
        if unknown:
            raise TypeError(f"tuning.override: {type(value).__name__} has no field "
                            f"{unknown[0]!r}")
        return dataclasses.replace(value, **{name: _changed(getattr(value, name), c)
                                             for name, c in change.items()})
    if isinstance(change, Mapping) and isinstance(value, Mapping):
        missing = [k for k, c in change.items() if k not in value and isinstance(c, Mapping)]
        if missing:
            raise KeyError(f"tuning.override: no entry {missing[0]!r} to change; give a whole one")
        return Table({**value, **{k: _changed(value[k], c) if k in value else c
                                    for k, c in change.items()}})
    return change


@contextlib.contextmanager
def override(**changes) -> Iterator[Tuning]:
    """Run a block of code under changed tuning (benchmarks, tests); yields it.

    Example
    -------
    >>> with tuning.override(tiles={128: dict(block_n=64)}, quantization=dict(q_rows={128: 64})):
    ...     out = fp8dit.attention(q, k, v)
    """
    previous = current()
    _ACTIVE["tuning"] = _changed(previous, changes)
    try:
        yield current()
    finally:
        _ACTIVE["tuning"] = previous
