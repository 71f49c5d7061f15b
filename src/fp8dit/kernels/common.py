"""Small jit helpers shared by the quantization and attention kernels."""

import triton
import triton.language as tl

# Largest finite float8 e4m3fn value.
FP8_E4M3_MAX = 448.0


@triton.jit
def round_to_e4m3_grid(x):
    """Round fp32 ``x`` to the nearest e4m3 value (ties to even), still in fp32.

    Only used when ``SOFT_FP8_CAST`` is set, i.e. under Triton's CPU interpreter, whose fp32->fp8
    conversion drops the carry when rounding up overflows the mantissa (1.94 -> 1.0). After this
    rounding the low mantissa bits are zero, so the interpreter's cast is exact. The GPU's
    ``cvt.rn.satfinite`` rounds the same way on its own, so compiled kernels skip this.
    """
    bits = x.to(tl.int32, bitcast=True)
    exp = (bits >> 23) & 0xFF
    # e4m3 keeps 3 mantissa bits; below 2^-6 it is subnormal with a fixed step of 2^-9.
    e_eff = tl.maximum(exp - 127, -6)
    # Adding 1.5 * 2^(e_eff + 20) moves the value into a binade whose fp32 ulp is 2^(e_eff - 3),
    # the e4m3 step at x's exponent, so fp32 round-to-nearest-even does the rounding.
    magic = (((e_eff + 20 + 127) << 23) | 0x400000).to(tl.float32, bitcast=True)
    ax = tl.abs(x)
    r = (ax + magic) - magic
    return tl.where(bits < 0, -r, r)  # the sign bit: -0 stays -0


@triton.jit
def round_to_e4m3fnuz_grid(x):
    """fp32 ``x`` (|x| <= 224) rounded to the nearest float8e4b8 (e4m3fnuz) value, still in
    fp32, zeros as +0: what the interpreter's fp32 -> fnuz cast then keeps exactly (alone, it
    loses rounding carries, truncates subnormals and turns -0 and small negatives into 0x80,
    fnuz's NaN). fnuz's values are e4m3fn's halved (``fp8dit.device``), so x rounds on
    e4m3fn's grid at 2x."""
    r = round_to_e4m3_grid(x * 2.0) * 0.5
    return tl.where(r == 0.0, 0.0, r)


@triton.jit
def fp8_cast(x, SOFT_FP8_CAST: tl.constexpr, FP8_FNUZ: tl.constexpr = False):
    """fp32 already within the format's range to float8e4nv (e4m3fn), or float8e4b8 (e4m3fnuz)
    with ``FP8_FNUZ``; NaN stays NaN.

    ``SOFT_FP8_CAST`` (the interpreter): rounded first, and NaN given its byte (0x7F or 0xFF,
    0x80 in fnuz) explicitly, the interpreter's cast turning it into a finite one (384 in
    e4m3fn), and so is e4m3fn's -0. So the cast matches torch's on all 65,536 bfloat16 values
    within range and NaN, in both formats (tests/test_fnuz.py). Compiled, one conversion
    instruction per one or two values (``cvt.rn.satfinite.e4m3x2.f32`` on sm_90,
    ``v_cvt_pk_fp8_f32`` on gfx942, ``v_cvt_scalef32_pk_fp8_f32`` on gfx950).
    """
    # (if/else and one return: compiled Triton builds the code after a constexpr branch's return)
    if FP8_FNUZ:
        if SOFT_FP8_CAST:
            y = round_to_e4m3fnuz_grid(x).to(tl.float8e4b8)
            y = tl.where(x == x, y, tl.full(x.shape, 0x80, tl.uint8).to(y.dtype, bitcast=True))
        else:
            y = x.to(tl.float8e4b8)
    else:
        if SOFT_FP8_CAST:
            r = round_to_e4m3_grid(x)
            y = r.to(tl.float8e4nv)
            # NaN with x's sign, as torch keeps it, and -0 (triton 3.6's interpreter drops its
            # sign)
            neg = x.to(tl.int32, bitcast=True) < 0
            byte = tl.where(x == x, 0x80, tl.where(neg, 0xFF, 0x7F)).to(tl.uint8)
            y = tl.where((x == x) & ((r != 0.0) | ~neg), y, byte.to(y.dtype, bitcast=True))
        else:
            y = x.to(tl.float8e4nv)
    return y


@triton.jit
def to_fp8_e4m3(x, SOFT_FP8_CAST: tl.constexpr, FP8_MAX: tl.constexpr = 448.0,
                FP8_FNUZ: tl.constexpr = False):
    """Saturating cast of fp32 to float8e4nv (float8e4b8 with ``FP8_FNUZ``): values beyond
    +-``FP8_MAX`` (the format's scale limit, ``fp8dit.device.Fp8Format.scale_max``: 448, or
    224 in fnuz, whose largest value 240 is not a scale limit) become +-``FP8_MAX``; NaN stays
    NaN."""
    # where() rather than min/max: comparisons with NaN are false, so NaN passes through
    # (hardware max/min would return the other operand and turn NaN into +-448).
    x = tl.where(x > FP8_MAX, FP8_MAX, tl.where(x < -FP8_MAX, -FP8_MAX, x))
    if SOFT_FP8_CAST or FP8_FNUZ:
        y = fp8_cast(x, SOFT_FP8_CAST, FP8_FNUZ)
    else:  # the cast written here, not through fp8_cast: the sm_90 SASS stays the measured one
        y = x.to(tl.float8e4nv)
    return y


# 1 / golden ratio: block b's V grid factor is 2^frac(b * PHI), an equidistributed sequence.
V_GRID_PHI = tl.constexpr(0.6180339887498949)

# Two-term int8 (recipes with qk_terms=2): x = s * (hi + lo / LO_SCALE), lo = the rounding
# residual x/s - hi in [-1/2, 1/2] scaled to int8's range.
LO_SCALE = tl.constexpr(254.0)
LO_SCALE_INT = tl.constexpr(254)


@triton.jit
def v_block_log2_scale(blk):
    """log2 of kv block ``blk``'s extra V scale, in [0, 1) (shared by quantization and attention).

    bf16 V on one per-channel fp8 grid errs the same way on every token of a channel (the bf16
    grid, shifted by the channel mean, lands on the fp8 grid in a fixed pattern), and PV sums
    that bias over the whole sequence: rel-L1 on i.i.d. normal inputs went 0.040 (8k tokens) ->
    0.082 (200k) on the H200, in emulation too. Stretching each block's grid by its own factor
    makes the pattern, and so the bias, vary from block to block: it averages out. fp8's
    relative precision does not depend on the scale, so nothing else changes.
    """
    r = tl.cast(blk, tl.float32) * V_GRID_PHI
    return r - tl.floor(r)


@triton.jit
def p_to_fp8(p, SOFT_FP8_CAST: tl.constexpr, FP8_FNUZ: tl.constexpr = False):
    """Cast of probabilities already within the format's range (P <= 2^P_SHIFT, the attention
    kernel's; no clamp: one instruction fewer per element in the attention loop)."""
    if SOFT_FP8_CAST or FP8_FNUZ:
        y = fp8_cast(p, SOFT_FP8_CAST, FP8_FNUZ)
    else:  # the cast written here, not through fp8_cast: the sm_90 SASS stays the measured one
        y = p.to(tl.float8e4nv)
    return y


@triton.jit
def round_to_bf16_grid(x):
    """fp32 ``x`` rounded to the nearest bfloat16 value (ties to even), still in fp32: add half
    an ulp of bf16 in the fp32 bits, clear the low 16 bits; NaN is kept as is (the add could
    carry a NaN payload into inf). Integer work, which no compiler pass contracts or folds:
    the fused rotary's bf16 path written with casts (``.to(bf16).to(fp32)`` after each product)
    differed from torch on the H200, this one matches it bitwise (2026-12-04)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & -65536
    return tl.where(x == x, bits.to(tl.float32, bitcast=True), x)


@triton.jit
def rotate_pair_bf16(xe, xo, c, s, SOFT_CAST: tl.constexpr, HIP: tl.constexpr = False):
    """``(xe * c - xo * s, xe * s + xo * c)`` as torch computes it on bfloat16 tensors (each
    product and each sum rounded to bf16, to nearest even), in fp32 holding bf16 values. ``xe``,
    ``xo``, ``c``, ``s``: fp32 holding bf16 values, so every product is exact in fp32.

    On the GPU one PTX block per pair: the products, ``cvt.rn.bf16x2.f32`` (two roundings in one
    instruction), the halves moved back into fp32 bits by a mask and a shift. Inline assembly,
    so no compiler pass contracts or drops a rounding (the casts written in Triton differed from
    torch on the H200, 2026-12-04); 15 instructions per pair against ~38 for six
    :func:`round_to_bf16_grid` (sm_90 SASS). At Wan 720p the rotation then adds 0.37 ms to the
    1.91 ms of quantization kernels instead of 1.09 ms, bitwise the same (H200, 2026-12-04). The
    interpreter and AMD GPUs (``HIP``) take the integer rounding (they run no PTX; the products
    are exact and feed integer operations, so no FMA contraction can drop a rounding)."""
    # (if/else and one return: compiled Triton builds the code after a constexpr branch's return)
    if SOFT_CAST or HIP:
        oe = round_to_bf16_grid(round_to_bf16_grid(xe * c) - round_to_bf16_grid(xo * s))
        oo = round_to_bf16_grid(round_to_bf16_grid(xe * s) + round_to_bf16_grid(xo * c))
    else:
        oe, oo = tl.inline_asm_elementwise(
            """
            {
            .reg .b32 a, b, e, o, p;
            mul.rn.f32 a, $2, $4;
            mul.rn.f32 b, $3, $5;
            cvt.rn.bf16x2.f32 p, a, b;
            and.b32 a, p, 0xFFFF0000;
            shl.b32 b, p, 16;
            sub.rn.f32 e, a, b;
            mul.rn.f32 a, $2, $5;
            mul.rn.f32 b, $3, $4;
            cvt.rn.bf16x2.f32 p, a, b;
            and.b32 a, p, 0xFFFF0000;
            shl.b32 b, p, 16;
            add.rn.f32 o, a, b;
            cvt.rn.bf16x2.f32 p, e, o;
            and.b32 $0, p, 0xFFFF0000;
            shl.b32 $1, p, 16;
            }
            """,
            "=r,=r,r,r,r,r", [xe, xo, c, s], dtype=(tl.float32, tl.float32), is_pure=True,
            pack=1)
    return oe, oo


@triton.jit
def mul_rn(a, b, SOFT_CAST: tl.constexpr, HIP: tl.constexpr = False):
    """fp32 ``a * b`` rounded on its own, as torch rounds each product of an element-wise
    expression: PTX ``mul.rn`` is never contracted into an FMA with a following add (a
    contracted ``a * b - c * d`` rounds once less). The interpreter rounds every op anyway.
    ``HIP``: AMD GPUs' ``v_mul_f32`` (round to nearest even), in inline assembly for the same
    reason: Triton's HIP backend contracts a product and a following add into ``v_fma_f32``
    (gfx942 ISA, triton 3.8)."""
    # (if/else and one return: compiled Triton builds the code after a constexpr branch's return)
    if SOFT_CAST:
        p = a * b
    elif HIP:
        p = tl.inline_asm_elementwise("v_mul_f32 $0, $1, $2", "=v,v,v", [a, b],
                                      dtype=tl.float32, is_pure=True, pack=1)
    else:
        p = tl.inline_asm_elementwise("mul.rn.f32 $0, $1, $2;", "=r,r,r", [a, b],
                                      dtype=tl.float32, is_pure=True, pack=1)
    return p


@triton.jit
def to_bf16(x, SOFT_CAST: tl.constexpr):
    """Round-to-nearest-even cast of fp32 to bfloat16.

    ``SOFT_CAST`` (the interpreter only): its fp32->bf16 conversion truncates, so round in the
    fp32 bits first (:func:`round_to_bf16_grid`). The GPU's cvt.rn.bf16.f32 needs none.
    """
    if SOFT_CAST:
        x = round_to_bf16_grid(x)
    return x.to(tl.bfloat16)


@triton.jit
def cast_for_store(x, dst_ptr, SOFT_CAST: tl.constexpr):
    """``x`` converted to ``dst_ptr``'s element type, rounding to nearest under the interpreter
    too (its fp32->bf16 conversion truncates, which biased every bf16 output of the CPU tests)."""
    if SOFT_CAST:
        if dst_ptr.dtype.element_ty == tl.bfloat16:
            return to_bf16(x, SOFT_CAST)
    return x.to(dst_ptr.dtype.element_ty)


@triton.jit
def is_finite(x):
    """Elementwise: neither NaN nor infinite."""
    return (x == x) & (tl.abs(x) < float("inf"))


@triton.jit
def finite_or(x, fill):
    """``x`` where finite, else ``fill``: keeps one bad element from poisoning a shared scale."""
    return tl.where(is_finite(x), x, fill)


@triton.jit
def to_int8_rn(x):
    """Round-to-nearest (half away from zero) saturating cast of fp32 to int8; NaN gives 0.

    Callers flag non-finite data through a NaN scale instead (int8 has no NaN).
    """
    x = tl.where(x == x, x, 0.0)
    return _int8_rn_in_range(tl.minimum(tl.maximum(x, -127.0), 127.0))


@triton.jit
def _int8_rn_in_range(x):
    """Round half away from zero of ``x`` in [-127, 127] to int8. A function of its own: the
    inlined call is part of the code timed on the H200 (written inline, the debug scope it
    leaves behind moves a PTX label and ptxas schedules the quantization differently)."""
    return tl.where(x >= 0, x + 0.5, x - 0.5).to(tl.int8)


@triton.jit
def residual_int8(x, inv_scale, hi):
    """The second int8 term of ``x * inv_scale`` after ``hi = to_int8_rn(x * inv_scale)``."""
    return to_int8_rn((x * inv_scale - hi.to(tl.float32)) * LO_SCALE)


@triton.jit
def quantize_tile(x, inv_scale, QK_INT8: tl.constexpr, SOFT_FP8_CAST: tl.constexpr,
                  FP8_MAX: tl.constexpr = 448.0, FP8_FNUZ: tl.constexpr = False):
    """``x * inv_scale`` to int8 or fp8 (float8e4nv, or float8e4b8 with ``FP8_FNUZ``)."""
    if QK_INT8:
        return to_int8_rn(x * inv_scale)
    else:
        return to_fp8_e4m3(x * inv_scale, SOFT_FP8_CAST, FP8_MAX, FP8_FNUZ)
