"""cuDNN's FP8 attention with per-tensor scales: the FP8 peer that ``fp8dit bench`` times.

cuDNN ships an FP8 SDPA forward for Hopper behind its Python frontend (PyPI
``nvidia-cudnn-frontend``, imported as ``cudnn``; the ``peers`` extra). Its scales are one per
tensor (Q, K, V, P and O), the granularity of the system fp8dit replaces, and on Hopper its
output is FP8 as well. This module quantizes with plain torch ops (a max-abs reduction, one
multiply, a cast), runs one cached cuDNN graph per shape and returns bf16, so a bench row
times what a user of cuDNN's FP8 path would run; ``Fp8Inputs`` lets the bench time the cuDNN
kernel alone.

Shapes are those of the bench: q, k, v of one shape, given as [B, H, S, D] views (any
strides; the bench's NHD inputs are transposed views).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
# P = softmax <= 1 is stored as P * 448 (the largest e4m3 value).
P_SCALE = FP8_MAX
# O is a convex combination of V's rows, so |O| <= max |V| up to the rounding of P and V;
# half the range leaves room for that rounding, and costs nothing in a floating-point format.
O_HEADROOM = 2.0


class CudnnFp8Unavailable(RuntimeError):
    """cuDNN's FP8 attention cannot run here (no frontend, no Hopper, or a shape it refuses)."""


def import_cudnn():
    """The ``cudnn`` frontend module, or CudnnFp8Unavailable saying how to get it."""
    try:
        import cudnn
    except Exception as e:  # noqa: BLE001 - ImportError, or a missing libcudnn underneath
        raise CudnnFp8Unavailable(
            f"the cuDNN frontend is not importable ({type(e).__name__}: {e}); "
            "pip install nvidia-cudnn-frontend"
        ) from None
    return cudnn


def round_down_bf16(x: torch.Tensor) -> torch.Tensor:
    """The largest bf16 value <= x (x > 0, float32): bf16 keeps float32's top 16 bits."""
    return (x.view(torch.int32) & -65536).view(torch.float32)


def quantize_per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x -> (x * scale in e4m3, descale = 1 / scale as a [1, 1, 1, 1] float32).

    For bf16 x the scale is rounded down to the bf16 grid before the multiply, so every
    product is at most 448 before and after its rounding: no clamp pass, and no value past
    e4m3's range (torch casts those to NaN). An all-zero tensor gets scale 1.
    """
    amax = torch.linalg.vector_norm(x, float("inf"), dtype=torch.float32)  # no |x| temporary
    scale = torch.where(amax > 0, FP8_MAX / amax, torch.ones_like(amax)).reshape(1)
    if x.dtype == torch.bfloat16:
        scale = round_down_bf16(scale)
        x8 = (x * scale.to(x.dtype)).to(FP8)
    else:  # fp16 / fp32: multiply in fp32 and clamp (one more pass; the bench runs bf16)
        x8 = (x.float() * scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
    return x8, (1.0 / scale).reshape(1, 1, 1, 1)


@dataclass
class Fp8Inputs:
    """Q, K, V quantized per tensor, with the scales the cuDNN graph reads."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    descale_q: torch.Tensor
    descale_k: torch.Tensor
    descale_v: torch.Tensor
    scale_o: torch.Tensor  # O in e4m3 = O * scale_o
    descale_o: torch.Tensor


def dequantize_output(out8: torch.Tensor, x: Fp8Inputs, dtype: torch.dtype) -> torch.Tensor:
    """The kernel's e4m3 O (O * scale_o) back to ``dtype``."""
    return (out8.to(torch.float32) * x.descale_o).to(dtype)


def quantize_inputs(q, k, v) -> Fp8Inputs:
    (q8, dq), (k8, dk), (v8, dv) = (quantize_per_tensor(t) for t in (q, k, v))
    # |O| <= max|V| = 448 * dv: O * scale_o stays within half of e4m3's range
    scale_o = 1.0 / (dv * O_HEADROOM)
    return Fp8Inputs(q8, k8, v8, dq, dk, dv, scale_o, dv * O_HEADROOM)


class CudnnFp8Attention:
    """One cuDNN FP8 SDPA graph for q, k, v of one [B, H, S, D] shape and stride pattern.

    Example (Hopper, ``pip install nvidia-cudnn-frontend``)::

        att = CudnnFp8Attention(q, k, v)   # q, k, v: bf16 [B, H, S, D] views
        out = att(q, k, v)                 # bf16, q's shape and strides
    """

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 softmax_scale: float | None = None):
        if q.device.type != "cuda" or torch.version.hip is not None:  # ROCm GPUs are "cuda"
            raise CudnnFp8Unavailable("cuDNN's FP8 attention needs an NVIDIA CUDA GPU")
        if torch.cuda.get_device_capability(q.device) < (9, 0):
            raise CudnnFp8Unavailable("cuDNN's FP8 attention needs Hopper (sm_90) or newer")
        if not (q.shape == k.shape == v.shape and q.dim() == 4):
            raise CudnnFp8Unavailable(
                f"q, k, v: expected one [B, H, S, D] shape, got {tuple(q.shape)}, "
                f"{tuple(k.shape)}, {tuple(v.shape)}"
            )
        cudnn = import_cudnn()
        self._cudnn = cudnn
        self.device = q.device
        D = q.shape[-1]
        scale = softmax_scale if softmax_scale is not None else D ** -0.5
        self.handle = cudnn.create_handle()
        e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        g = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=f32,
                          compute_data_type=f32, handle=self.handle)
        dims = list(q.shape)
        self._t = {n: g.tensor(name=n, dim=dims, stride=list(t.stride()), data_type=e4m3)
                   for n, t in (("q", q), ("k", k), ("v", v))}
        for n in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
            self._t[n] = g.tensor(name=n, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32)
        kw = dict(q=self._t["q"], k=self._t["k"], v=self._t["v"],
                  descale_q=self._t["descale_q"], descale_k=self._t["descale_k"],
                  descale_v=self._t["descale_v"], descale_s=self._t["descale_s"],
                  scale_s=self._t["scale_s"], scale_o=self._t["scale_o"],
                  attn_scale=scale, use_causal_mask=False, name="fp8dit_peer_sdpa_fp8")
        try:
            o, _stats, amax_s, amax_o = g.sdpa_fp8(generate_stats=False, **kw)
        except TypeError:  # frontends before generate_stats took is_inference
            o, _stats, amax_s, amax_o = g.sdpa_fp8(is_inference=True, **kw)
        self.out_stride = list(q.stride())
        o.set_output(True).set_dim(dims).set_stride(self.out_stride).set_data_type(e4m3)
        for a in (amax_s, amax_o):
            a.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
        self._t.update(o=o, amax_s=amax_s, amax_o=amax_o)
        try:
            g.validate()
            g.build_operation_graph()
            g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
            g.check_support()
            g.build_plans()
        except Exception as e:  # noqa: BLE001 - cuDNN's refusal is an answer, not a bug
            raise CudnnFp8Unavailable(
                f"cuDNN refuses FP8 SDPA for shape {dims} ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:200] if str(e) else ''})"
            ) from None
        self.graph = g
        dev = self.device
        self.workspace = torch.empty(g.get_workspace_size(), device=dev, dtype=torch.uint8)
        self.p_scale = torch.full((1, 1, 1, 1), P_SCALE, device=dev, dtype=torch.float32)
        self.p_descale = torch.full((1, 1, 1, 1), 1.0 / P_SCALE, device=dev, dtype=torch.float32)
        self.amax_s = torch.empty(1, 1, 1, 1, device=dev, dtype=torch.float32)
        self.amax_o = torch.empty(1, 1, 1, 1, device=dev, dtype=torch.float32)

    def run_fp8(self, x: Fp8Inputs, out8: torch.Tensor | None = None) -> torch.Tensor:
        """The cuDNN kernel alone: e4m3 O (O * scale_o) with q's shape and strides."""
        if out8 is None:
            out8 = torch.empty_strided(x.q.shape, self.out_stride, device=self.device,
                                       dtype=FP8)
        t = self._t
        pack = {t["q"]: x.q, t["k"]: x.k, t["v"]: x.v, t["descale_q"]: x.descale_q,
                t["descale_k"]: x.descale_k, t["descale_v"]: x.descale_v,
                t["descale_s"]: self.p_descale, t["scale_s"]: self.p_scale,
                t["scale_o"]: x.scale_o, t["o"]: out8, t["amax_s"]: self.amax_s,
                t["amax_o"]: self.amax_o}
        self._cudnn.set_stream(handle=self.handle,
                               stream=torch.cuda.current_stream(self.device).cuda_stream)
        self.graph.execute(pack, self.workspace, handle=self.handle)
        return out8

    def __call__(self, q, k, v) -> torch.Tensor:
        """bf16 in, bf16 out: per-tensor quantization, the cuDNN kernel, O dequantized."""
        x = quantize_inputs(q, k, v)
        return dequantize_output(self.run_fp8(x), x, q.dtype)
