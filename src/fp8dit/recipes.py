"""Named accuracy recipes: how Q, K, V are quantized and how PV is accumulated.

A recipe is data: the launcher turns its fields into kernel constexprs. ``DEFAULT_RECIPE`` is
what ``fp8dit.attention`` uses unless ``recipe=`` or ``FP8DIT_RECIPE`` names another.

Kernel rel-L1 against fp64, normal / dit family (CPU interpreter, B=1 H=2 S=512 D=64, seed 0;
``tests/test_recipes.py``): ``int8qk-bf16pv`` 0.011 / 0.008, ``int8qk-fp8pv`` (default) 0.036 /
0.012, ``int8qk-fp8pv-rot`` 0.036 / 0.009, ``fp8`` 0.052 / 0.034, ``per-tensor-fp8`` 0.053 /
0.050, ``int8x2qk-fp8pv`` 0.034 / 0.009 (its LSE: < 1e-4 / 0.001 off at D=128). On the H200
at 8k tokens and Wan 720p speed: README's quality table. Over the stress suite
(:data:`fp8dit.testing.STRESS_SUITE`, docs/accuracy.md): worst rel-L1 / worst mean LSE
error, S=1024 D=128, emulation: ``int8qk-fp8pv`` 0.077 / 0.060, ``int8qk-fp8pv-rot`` 0.046 /
0.031, ``int8qk-fp8pv-bal`` 0.038 / 0.030 (fp8 P and V alone leave up to 0.036),
``int8qk-bf16pv-bal`` 0.024 / 0.030, ``int8x2qk-fp8pv`` 0.036 / 0.0001.
:func:`fp8dit.testing.attention_emulated` rounds each recipe the same way in torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import env


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    qk: str = "int8"  # "int8" (IGMMA, 7-bit mantissa-equivalent) or "fp8" (QGMMA, 3 bits)
    smooth_k: bool = True  # subtract K's per-channel mean over tokens before quantizing
    center_v: bool = True  # subtract V's per-channel mean, add it back after PV
    # "fine": Q per token, K per kv block, V per channel. "tensor": one scale for all of Q, one
    # for K, one for V (an extra two-launch amax reduction; a baseline, not a hot path).
    scales: str = "fine"
    # "fp8": P scaled to [0, 256] and V (per-channel scale) in fp8 e4m3. "bf16": P and V in
    # bfloat16, no V scale (bf16 keeps V's range); twice the V bytes in shared memory.
    pv: str = "fp8"
    # Rotate Q and K (K after smoothing) by an orthonormal Hadamard matrix along the head dim
    # before quantizing (FlashAttention-3's incoherent processing): outlier channels spread out.
    rotate: bool = False
    # With ``rotate``: before the rotation, balance Q against K exactly (q @ Mq, k @ Mk with
    # Mq Mk^T = I, per sequence and kv head, from channel sums of Q and K: fp8dit.balance):
    # shrink Q along its mean (a Q bias) and move magnitude between Q's and K's channels. The
    # scores are unchanged; Q's and K's int8 steps get finer together.
    balance: bool = False
    # 2: Q and K each stored as two int8 terms, x = s * (hi + lo / LO_SCALE) (lo: hi's rounding
    # residual), and the scores summed from three int8 dots (hi.hi, hi.lo, lo.hi). For the LSE:
    # 8-bit Q and K misplace DiT scores of ~100 by up to ~0.5. The dropped lo.lo term is still
    # ~1 unit of the hi grid (the product of two rounding residuals); with ``rotate`` the grid
    # is ~3x finer (no outlier channel sets the scale): LSE 0.011 -> 0.001 (S=2048, DiT-like).
    qk_terms: int = 1

    def __post_init__(self):
        if self.qk not in ("int8", "fp8") or self.scales not in ("fine", "tensor") \
                or self.pv not in ("fp8", "bf16") or self.qk_terms not in (1, 2):
            raise ValueError(f"recipe {self.name!r}: unknown qk/scales/pv/qk_terms in {self}")
        if self.qk_terms == 2 and (self.qk != "int8" or self.scales != "fine"):
            raise ValueError(f"recipe {self.name!r}: two-term QK needs int8 QK and fine scales")
        if self.balance and not (self.rotate and self.smooth_k and self.scales == "fine"):
            raise ValueError(f"recipe {self.name!r}: balance needs rotate, smooth_k and fine "
                             "scales")
        if self.scales == "tensor" and (self.smooth_k or self.center_v):
            # The tensor-wide amax is taken of the raw inputs, before any shift.
            raise ValueError(f"recipe {self.name!r}: per-tensor scales exclude smooth_k and "
                             "center_v")


RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "int8qk-fp8pv",
            "Q int8 per token, K smoothed + int8 per kv block, V centered + fp8 per channel, "
            "P fp8 scaled to [0, 256], PV accumulated per block into fp32",
        ),
        Recipe(
            "int8qk-fp8pv-rot",
            "as int8qk-fp8pv with Q and K rotated by a Hadamard matrix along the head dim before "
            "quantizing (outlier channels spread over all channels)",
            rotate=True,
        ),
        Recipe(
            "int8qk-fp8pv-bal",
            "as int8qk-fp8pv-rot with Q and K first balanced against each other by an exact "
            "transform per sequence and kv head (Q's mean direction shrunk, K's stretched; "
            "channel magnitudes moved between Q and K): Q biases and one-sided outlier "
            "channels stop setting the int8 steps",
            rotate=True,
            balance=True,
        ),
        Recipe(
            "int8x2qk-fp8pv",
            "precise LSE: as int8qk-fp8pv-rot (Hadamard-rotated Q and K) with Q and K each "
            "stored as two int8 terms (value and rounding residual); three int8 dots per kv "
            "block instead of one",
            qk_terms=2,
            rotate=True,
        ),
        Recipe(
            "fp8",
            "as int8qk-fp8pv with Q and K in fp8 e4m3 (QGMMA for both matmuls)",
            qk="fp8",
        ),
        Recipe(
            "fp8-plain",
            "fp8 QK and PV without K smoothing or V centering (to measure what they buy)",
            qk="fp8",
            smooth_k=False,
            center_v=False,
        ),
        # V stays uncentered: the input is already on the bf16 grid, and (v - mean) rounded back
        # to bf16 errs by the same amount on every token of a channel (the grid offset is the
        # mean), a coherent bias that PV sums up instead of averaging out: rel-L1 0.011 -> 0.013
        # on the normal family in emulation.
        Recipe(
            "int8qk-bf16pv",
            "high accuracy: QK as int8qk-fp8pv (Q int8 per token, K smoothed + int8 per kv "
            "block), P and V in bf16 with fp32 accumulation; V not centered (bf16 V is then a "
            "copy of the input, no rounding)",
            pv="bf16",
            center_v=False,
        ),
        Recipe(
            "int8qk-bf16pv-bal",
            "high accuracy on outliers: QK as int8qk-fp8pv-bal (balanced, Hadamard-rotated, "
            "int8), P and V in bf16 as int8qk-bf16pv",
            pv="bf16",
            center_v=False,
            rotate=True,
            balance=True,
        ),
        Recipe(
            "per-tensor-fp8",
            "baseline: Q, K, V in fp8 e4m3 with one scale per tensor each (over all batches and "
            "heads), no K smoothing, no V centering; P as in the other fp8 recipes",
            qk="fp8",
            smooth_k=False,
            center_v=False,
            scales="tensor",
        ),
    )
}

DEFAULT_RECIPE = "int8qk-fp8pv"


def get_recipe(name: str | None) -> Recipe:
    """Recipe by name; ``None`` means ``FP8DIT_RECIPE`` or the default."""
    if name is None:
        name = env.default_recipe() or DEFAULT_RECIPE
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(
            f"recipe: expected one of {', '.join(sorted(RECIPES))}, got {name!r}"
        ) from None
