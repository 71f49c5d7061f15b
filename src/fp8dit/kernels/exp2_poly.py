"""exp2 on the FMA pipe for part of a tile (FlashAttention-4's trick), as sm_90 PTX.

Why: at head dim 128 an fp8 attention step needs one exponential per 512 tensor-core FLOPs,
which is what the H200's exp unit (MUFU, 16 per clock per SM) delivers at the tensor cores'
peak: the two are balanced, so MUFU sits on the softmax's critical path (ablations in
benchmarks/NOTES.md: the loop without exponentials runs 14-18% faster). Computing some of the
exponentials with a polynomial on the FMA pipe trades issue slots (seven instructions for one)
for MUFU time.

The recipe for one x (x <= ~8 in the kernels; -inf and very negative x give ~0):
    x  = max(x, -127)                    the exponent field must not wrap
    t  = x + 1.5 * 2**23                 round(x) lands in t's low mantissa bits
    f  = x - (t - 1.5 * 2**23)           in [-0.5, 0.5]
    p  = c0 + f * (c1 + f * (c2 + ...))  2**f, minimax in relative error
    2**x = bits(p) + bits(t) * 2**23     (integer add: round(x) into p's exponent field)
bits(1.5 * 2**23) has its low 23 bits zero, so bits(t) * 2**23 (mod 2**32) is round(x) << 23.
Relative error: 1.7e-3 (degree 2), 7.5e-5 (degree 3), against fp8 P's 2**-4 spacing.

NaN is not propagated (``max`` returns -126 for NaN): the kernels keep MUFU for at least one
element of every four, and a non-finite input reaches them through the per-row or per-block
scales, so each row still gets a NaN exponential and a NaN row sum.
"""

from __future__ import annotations

import numpy as np

# minimax (relative error) polynomials for 2**f on [-0.5, 0.5], lowest order first, as fp32
POLY = {
    2: (1.0004432201385498, 0.7034481167793274, 0.23842868208885193),
    3: (0.9999280571937561, 0.6932609677314758, 0.24261116981506348, 0.0551716648042202),
}
MAGIC = 12582912.0  # 1.5 * 2**23
X_MIN = -126.0  # 2**f >= 0.707 has exponent field 126: round(x) >= -126 keeps it >= 0


def _f32_hex(v: float) -> str:
    return "0f%08X" % np.array(v, dtype=np.float32).view(np.uint32)


def _poly_ptx(out: str, inp: str, degree: int) -> str:
    c = POLY[degree]
    lines = [
        "{ .reg .b32 x, t, r, f, p;",
        f"max.f32 x, {inp}, {_f32_hex(X_MIN)};",
        f"add.rn.f32 t, x, {_f32_hex(MAGIC)};",
        f"sub.rn.f32 r, t, {_f32_hex(MAGIC)};",
        "sub.rn.f32 f, x, r;",
        f"fma.rn.f32 p, f, {_f32_hex(c[degree])}, {_f32_hex(c[degree - 1])};",
    ]
    for k in range(degree - 2, -1, -1):
        lines.append(f"fma.rn.f32 p, p, f, {_f32_hex(c[k])};")
    lines.append(f"mad.lo.s32 {out}, t, 8388608, p; }}")
    return "\n".join(lines)


def exp2_ptx(n_poly: int, degree: int, pack: int = 4) -> str:
    """PTX for ``inline_asm_elementwise(pack=pack)``: of every ``pack`` consecutive elements
    of a thread, the first ``n_poly`` by the polynomial, the rest by ``ex2.approx.ftz``
    (what ``gl.exp2`` emits for fp32)."""
    assert 0 <= n_poly <= pack and degree in POLY
    body = []
    for i in range(pack):
        out, inp = f"${i}", f"${i + pack}"
        body.append(_poly_ptx(out, inp, degree) if i < n_poly
                    else f"ex2.approx.ftz.f32 {out}, {inp};")
    return "\n".join(body)


def exp2_poly_reference(x: np.ndarray, degree: int) -> np.ndarray:
    """The PTX recipe step by step in numpy fp32 (``.rn`` keeps ptxas from reassociating;
    the fp64 fma can differ from the fp32 one by a double rounding, rarely): for tests and for the error budget."""
    x = np.fmax(np.asarray(x, np.float32), np.float32(X_MIN))  # PTX max: NaN -> X_MIN
    t = (x + np.float32(MAGIC)).astype(np.float32)
    f = (x - (t - np.float32(MAGIC))).astype(np.float32)
    c = [np.float32(v) for v in POLY[degree]]
    p = np.full_like(f, c[degree])
    for k in range(degree - 1, -1, -1):
        # an fp32 fma: the fp64 product of two fp32 is exact, one rounding after the add
        p = (p.astype(np.float64) * f + np.float64(c[k])).astype(np.float32)
    bits = (p.view(np.uint32).astype(np.uint64) + t.view(np.uint32).astype(np.uint64)
            * (1 << 23)) & 0xFFFFFFFF
    return bits.astype(np.uint32).view(np.float32)
