"""The cuDNN FP8 peer (fp8dit.tools.cudnn_fp8): its per-tensor quantization on CPU, the kernel on
a Hopper GPU with the cuDNN frontend installed."""

from __future__ import annotations

import pytest
import torch

from fp8dit.testing import attention_ref, error_stats, make_qkv
from fp8dit.tools import cudnn_fp8


def test_round_down_bf16_is_the_largest_bf16_not_above():
    x = torch.tensor([1.0, 448.0 / 3.0, 1e-30, 3.4e38, 0.1], dtype=torch.float32)
    r = cudnn_fp8.round_down_bf16(x.clone())
    assert torch.all(r <= x)
    assert torch.equal(r.to(torch.bfloat16).to(torch.float32), r)  # on the bf16 grid
    up = (r.view(torch.int32) + 65536).view(torch.float32)  # the next bf16 value
    assert torch.all(up > x)


@pytest.mark.parametrize("amax", [448.0, 1.0, 3.0e-3, 6.0e4, 123.456])
def test_per_tensor_quantization_stays_in_range_and_round_trips(amax):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 257, 64, generator=g)
    x = (x / x.abs().max() * amax).to(torch.bfloat16)
    x8, descale = cudnn_fp8.quantize_per_tensor(x)
    assert x8.dtype == torch.float8_e4m3fn and x8.shape == x.shape
    assert descale.shape == (1, 1, 1, 1) and descale.dtype == torch.float32
    back = x8.to(torch.float32) * descale
    assert torch.isfinite(back).all()
    assert back.abs().max() <= float(x.abs().max()) * (1 + 1 / 16)
    assert x8.to(torch.float32).abs().max() > 448.0 * 0.99  # the range is used
    big = x.float().abs() > float(x.abs().max()) / 64  # normal e4m3 numbers: 3-bit mantissa
    rel = ((back - x.float()).abs() / x.float().abs())[big]
    assert rel.max() <= 2.0 ** -4 + 1e-6


def test_per_tensor_quantization_of_zeros_and_fp16():
    x8, descale = cudnn_fp8.quantize_per_tensor(torch.zeros(1, 1, 4, 8, dtype=torch.bfloat16))
    assert float(descale) == 1.0 and not x8.to(torch.float32).any()
    x = torch.tensor([[[[6.0e4, -6.0e4, 1.0, 0.0]]]], dtype=torch.float16)
    x8, descale = cudnn_fp8.quantize_per_tensor(x)
    back = x8.to(torch.float32) * descale
    assert torch.isfinite(back).all() and float(back.abs().max()) == pytest.approx(6.0e4, rel=0.07)


def test_inputs_leave_headroom_for_the_fp8_output():
    q, k, v = (torch.randn(1, 2, 64, 64).to(torch.bfloat16) for _ in range(3))
    x = cudnn_fp8.quantize_inputs(q, k, v)
    # the largest possible |O| (max |V|) lands at half of e4m3's range
    assert float(v.float().abs().max() * x.scale_o) <= cudnn_fp8.FP8_MAX / 2 * 1.001
    assert float(x.scale_o * x.descale_o) == pytest.approx(1.0, rel=1e-6)
    # an O the kernel stored as O * scale_o in e4m3 comes back within e4m3's rounding
    o = v.float() * 0.5
    back = cudnn_fp8.dequantize_output((o * x.scale_o).to(cudnn_fp8.FP8), x, torch.bfloat16)
    assert back.dtype == torch.bfloat16
    big = o.abs() > o.abs().max() / 32
    assert ((back.float() - o).abs() / o.abs())[big].max() <= 2.0 ** -4 + 2.0 ** -8


def test_cpu_tensors_are_refused_with_the_reason():
    q = torch.zeros(1, 1, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(cudnn_fp8.CudnnFp8Unavailable, match="CUDA GPU"):
        cudnn_fp8.CudnnFp8Attention(q, q, q)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_cudnn_fp8_matches_fp64_on_hopper(layout):
    if torch.version.hip is not None or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("cuDNN's FP8 attention needs an NVIDIA sm_90 or newer")
    try:
        cudnn_fp8.import_cudnn()
    except cudnn_fp8.CudnnFp8Unavailable as e:
        pytest.skip(str(e))
    q, k, v = make_qkv(1, 4, 1000, 128, layout=layout, dtype=torch.bfloat16, device="cuda",
                       seed=3)
    hn = (lambda t: t) if layout == "HND" else (lambda t: t.transpose(1, 2))
    att = cudnn_fp8.CudnnFp8Attention(hn(q), hn(k), hn(v))
    out = hn(att(hn(q), hn(k), hn(v)))
    assert out.shape == q.shape and out.dtype == torch.bfloat16
    ref = attention_ref(hn(q), hn(k), hn(v), layout="HND")
    st = error_stats(hn(out), ref)
    assert not st.nan and st.cos > 0.99 and st.rel_l1 < 0.1, st
