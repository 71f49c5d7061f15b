"""Public API: validation messages, backend selection, environment, torch.compile."""

import logging

import pytest
import torch

import fp8dit
from fp8dit import dispatch
from fp8dit.testing import attention_ref, error_stats, make_qkv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _qkv(B=1, S=40, H=2, D=64, **kw):
    return make_qkv(B, H, S, D, device=DEVICE, **kw)


@pytest.mark.parametrize("mutate,exc,pattern", [
    (lambda q, k, v: (q[0], k, v), ValueError, r"q: expected a 4-D tensor \[B, S, H, D\]"),
    (lambda q, k, v: (q, k[..., :32], v[..., :32]), ValueError,
     r"k: expected head_dim 64 like q, got 32"),
    (lambda q, k, v: (q, k, v[..., :32]), ValueError, r"v: expected head_dim 64"),
    (lambda q, k, v: (q, torch.cat([k, k]), torch.cat([v, v])), ValueError,
     r"k: expected batch size 1 like q, got 2"),
    (lambda q, k, v: (q, k, v[:, :20]), ValueError, r"v: expected the batch, sequence and head"),
    (lambda q, k, v: (torch.cat([q, q[:, :, :1]], 2), k, v), ValueError,
     r"k: expected a number of kv heads that divides q's 3 heads \(GQA\), got 2"),
    (lambda q, k, v: (q.int(), k, v), TypeError,
     r"q: expected a floating-point dtype .* got torch.int32"),
    (lambda q, k, v: (q, k.bool(), v), TypeError, r"k: expected a floating-point dtype"),
    (lambda q, k, v: (q, k.half(), v), TypeError, r"k: expected dtype torch.bfloat16 like q"),
    (lambda q, k, v: (q, k, "v"), TypeError, r"v: expected a torch.Tensor, got str"),
    (lambda q, k, v: (q, k, v.to("meta")), ValueError, rf"v: expected device {DEVICE}.* like q"),
])
def test_bad_input_names_argument_expected_and_got(mutate, exc, pattern):
    q, k, v = _qkv()
    with pytest.raises(exc, match=pattern):
        fp8dit.attention(*mutate(q, k, v))


def test_bad_layout_and_scale():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"layout: expected 'NHD' or 'HND', got 'BSHD'"):
        fp8dit.attention(q, k, v, layout="BSHD")
    with pytest.raises(ValueError, match=r"scale: expected a finite positive float, got nan"):
        fp8dit.attention(q, k, v, scale=float("nan"))
    with pytest.raises(TypeError, match=r"scale: expected a float or None, got str"):
        fp8dit.attention(q, k, v, scale="0.1")
    with pytest.raises(ValueError, match=r"backend: expected one of auto, fp8, sdpa, got 'cuda'"):
        fp8dit.attention(q, k, v, backend="cuda")
    with pytest.raises(ValueError, match=r"recipe: expected one of"):
        fp8dit.attention(q, k, v, recipe="per-tensor-please")


def test_varlen_bad_cu_seqlens():
    q = torch.randn(10, 2, 64, device=DEVICE).bfloat16()
    ok = torch.tensor([0, 4, 10], dtype=torch.int32)
    cases = [
        (torch.tensor([0, 6, 4, 10], dtype=torch.int32), ok,
         "cu_seqlens_q: expected non-decreasing"),
        (torch.tensor([0, 4, 9], dtype=torch.int32), ok, "cu_seqlens_q: expected the last offset"),
        (torch.tensor([1, 4, 10], dtype=torch.int32), ok, "cu_seqlens_q: expected the first"),
        (ok.float(), ok, "cu_seqlens_q: expected dtype int32 or int64"),
        (ok, torch.tensor([0, 10], dtype=torch.int32), "cu_seqlens_k: expected 3 offsets"),
    ]
    for cq, ck, msg in cases:
        with pytest.raises((ValueError, TypeError), match=msg):
            fp8dit.attention_varlen(q, q, q, cq, ck, 10, 10)
    with pytest.raises(ValueError, match=r"max_seqlen_q: expected at least the longest"):
        fp8dit.attention_varlen(q, q, q, ok, ok, 3, 10)
    with pytest.raises(ValueError, match=r"q: expected a 3-D tensor \[T, H, D\]"):
        fp8dit.attention_varlen(q[None], q, q, ok, ok, 10, 10)


def test_select_backend_and_fallback_reasons(monkeypatch, caplog):
    q, k, v = _qkv()
    name, why = fp8dit.select_backend(q, k, v)
    if DEVICE == "cuda":  # 40 tokens are under the length where FP8 pays on a GPU
        assert name == "sdpa" and "too short for FP8 to pay" in why
    else:  # the interpreter has no such floor
        assert name == "fp8" and "fp8dit" in why
    # float32 inputs: auto falls back to SDPA and says why, once.
    qf, kf, vf = (t.float() for t in (q, k, v))
    dispatch._logged.clear()
    with caplog.at_level(logging.WARNING, logger="fp8dit"):
        name, why = fp8dit.select_backend(qf, kf, vf)
        fp8dit.attention(qf, kf, vf)
        fp8dit.attention(qf, kf, vf)
    assert name == "sdpa" and "torch.float32 is not supported" in why
    assert sum("float32 is not supported" in r.message for r in caplog.records) == 1
    # Asked for by name, the FP8 path raises with the reason instead.
    with pytest.raises(fp8dit.BackendUnavailableError, match="float32 is not supported"):
        fp8dit.attention(qf, kf, vf, backend="fp8")


def test_head_dim_over_256_falls_back():
    q, k, v = _qkv(D=288, S=8)
    name, why = fp8dit.select_backend(q, k, v)
    assert name == "sdpa" and "head_dim 288 is over 256" in why
    out = fp8dit.attention(q, k, v)
    assert error_stats(out, attention_ref(q, k, v)).rel_l1 < 0.01


def test_environment_switches(monkeypatch):
    q, k, v = _qkv()
    monkeypatch.setenv("FP8DIT_DISABLE", "1")
    name, why = fp8dit.select_backend(q, k, v)
    assert name == "sdpa" and "FP8DIT_DISABLE=1" in why
    with pytest.raises(fp8dit.BackendUnavailableError, match="FP8DIT_DISABLE=1"):
        fp8dit.attention(q, k, v, backend="fp8")
    monkeypatch.delenv("FP8DIT_DISABLE")
    monkeypatch.setenv("FP8DIT_BACKEND", "sdpa")
    assert fp8dit.select_backend(q, k, v)[0] == "sdpa"
    monkeypatch.setenv("FP8DIT_BACKEND", "nope")
    with pytest.raises(ValueError, match="FP8DIT_BACKEND: expected one of"):
        fp8dit.select_backend(q, k, v)


def test_cpu_without_interpreter_falls_back(monkeypatch):
    q, k, v = _qkv()
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    if q.device.type == "cpu":
        name, why = fp8dit.select_backend(q, k, v)
        assert name == "sdpa" and "TRITON_INTERPRET=1" in why


def test_sdpa_backend_lse_matches_fp64():
    q, k, v = _qkv(H=4, S=70)
    k, v = k[:, :, :2].contiguous(), v[:, :, :2].contiguous()  # GQA 2:1
    out, lse = fp8dit.attention(q, k, v, backend="sdpa", return_lse=True, is_causal=True)
    ref, ref_lse = attention_ref(q, k, v, return_lse=True, is_causal=True)
    assert error_stats(out, ref).rel_l1 < 0.01
    assert (lse.double() - ref_lse).abs().max() < 1e-3


def test_requires_grad_falls_back():
    q, k, v = _qkv()
    q.requires_grad_(True)
    assert fp8dit.select_backend(q, k, v)[0] == "sdpa"


def test_compile_fullgraph_no_graph_break():
    q, k, v = _qkv(S=130)

    def f(q, k, v):
        out, lse = fp8dit.attention(q, k, v, return_lse=True)
        return out * 2, lse

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    out_c, lse_c = compiled(q, k, v)
    out_e, lse_e = f(q, k, v)
    assert torch.equal(out_c, out_e) and torch.equal(lse_c, lse_e)
    explanation = torch._dynamo.explain(f)(q, k, v)
    assert explanation.graph_break_count == 0


def test_compile_fullgraph_through_a_logged_fallback(monkeypatch, caplog):
    # auto's fallback to SDPA warns once; dynamo cannot trace a logger call, and a first call
    # under torch.compile(fullgraph=True) raised (found on the GPU, where short rows fall back).
    q, k, v = (t.float() for t in _qkv(S=130))  # float32: auto falls back to SDPA everywhere
    monkeypatch.setattr(dispatch, "_logged", set())

    def f(q, k, v):
        return fp8dit.attention(q, k, v) * 2

    with caplog.at_level(logging.WARNING, logger="fp8dit"):
        out_c = torch.compile(f, fullgraph=True, backend="eager")(q, k, v)
        assert "falling back to sdpa" not in caplog.text  # not logged while tracing
        out_e = f(q, k, v)
    assert torch.equal(out_c, out_e)
    assert caplog.text.count("falling back to sdpa") == 1  # the first eager call logs it


def test_opcheck_custom_ops():
    q, k, v = _qkv(S=70)
    torch.library.opcheck(
        torch.ops.fp8dit.attention_fp8.default, (q, k, v, "NHD", 0.125, False, "int8qk-fp8pv", 0)
    )
    qp = torch.randn(50, 2, 64, device=DEVICE).bfloat16()
    cu = torch.tensor([0, 20, 50], dtype=torch.int32)
    torch.library.opcheck(
        torch.ops.fp8dit.attention_varlen_fp8.default,
        (qp, qp, qp, cu, cu, 0.125, True, "int8qk-fp8pv", 0),
    )


def test_auto_preferences_follow_the_measured_crossovers(monkeypatch):
    """On CUDA, auto skips FP8 where it measured slower than SDPA cuDNN (short sequences,
    head dims padded to 256), at the crossover of the kernel that would run; CPU (interpreter)
    runs are never redirected."""
    from types import SimpleNamespace

    from fp8dit import dispatch, tuning
    from fp8dit.recipes import get_recipe

    cap = {"value": (9, 0)}
    monkeypatch.setattr(dispatch, "_capability", lambda index: cap["value"])
    monkeypatch.delenv("FP8DIT_KERNEL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the pretended GPU runs Gluon
    def verified():  # this Triton release taken as one the Gluon kernel was verified on
        return tuning.override(gluon_releases=(
            tuning.VerifiedRelease(dispatch.triton_release(), "(this test)", "", ""),))
    crossovers = tuning.current().crossovers

    def fake(d, device="cuda"):
        return SimpleNamespace(device=torch.device(device, 0) if device == "cuda"
                               else torch.device(device), shape=(1, 8, 2, d))

    def preferred(q, tokens, is_causal=False, recipe=None):
        kernel, _ = dispatch.choose_kernel(q.shape[-1], int(tokens), is_causal, recipe,
                                           q.device)
        return dispatch.fp8_not_preferred_reason(q, kernel, tokens) is None

    # D=64 pays from 8,192 tokens on the warp-specialized kernel (Hopper, non-causal, a verified
    # Triton) and only from 17,000 where the Triton kernel runs (causal, another GPU, another
    # Triton, a recipe the Gluon kernel does not run)
    q64, n64 = fake(64), crossovers[64].gluon_ws
    assert n64 < crossovers[64].triton
    with verified():
        assert preferred(q64, n64) and not preferred(q64, n64 - 1)
        assert not preferred(q64, n64, is_causal=True)
        assert not preferred(q64, n64, recipe=get_recipe("int8qk-bf16pv"))
        monkeypatch.setenv("FP8DIT_KERNEL", "triton")
        assert not preferred(q64, n64) and preferred(q64, crossovers[64].triton)
        monkeypatch.delenv("FP8DIT_KERNEL")
        # nothing was timed on sm_89 (tests/test_nvidia_archs.py): SDPA at any length
        cap["value"] = (8, 9)
        assert not preferred(q64, n64) and not preferred(q64, 10**6)
        cap["value"] = (9, 0)
    with tuning.override(gluon_releases=()):  # a Triton release not verified on a GPU
        assert not preferred(q64, n64)

    floor = crossovers[128].gluon_ws
    assert dispatch.effective_tokens([4096], [4096]) == 4096
    # Wan cross-attention: 75,600 queries against 512 text keys is ~1,000 effective tokens.
    assert 1000 < dispatch.effective_tokens([75600], [512]) < 1030
    q = fake(128)
    with verified():
        assert preferred(q, floor)
        why = dispatch.fp8_not_preferred_reason(q, "gluon-ws", floor - 1)
        assert why and "too short" in why and str(floor) in why
    assert "256" in dispatch.fp8_not_preferred_reason(fake(200), "triton", 10**6)
    assert dispatch.fp8_not_preferred_reason(fake(128, "cpu"), "triton", 1) is None
    # A backend named explicitly ignores these preferences; on CPU auto still picks FP8 (in the
    # interpreter; on a GPU machine CPU tensors cannot reach the compiled kernels).
    monkeypatch.undo()
    qq, kk, vv = (torch.randn(1, 64, 2, 64).bfloat16() for _ in range(3))
    name, why = fp8dit.select_backend(qq, kk, vv)
    if fp8dit.env.triton_interpret():
        assert name == "fp8" and "triton kernel" in why, why
    else:
        assert name == "sdpa" and "CPU tensors need TRITON_INTERPRET=1" in why


def test_choice_names_the_kernel_and_traces_without_a_graph_break(monkeypatch):
    """auto's choice runs inside compiled forwards (dispatch is traced): deciding which kernel
    will run must not break the graph, also on its first call (release not read yet)."""
    from fp8dit import dispatch, tuning

    monkeypatch.setattr(dispatch, "_capability", lambda index: (9, 0))
    monkeypatch.setattr(dispatch, "_TRITON_RELEASE", {})
    monkeypatch.delenv("FP8DIT_KERNEL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gpu = torch.device("cuda", 0)

    def f(x):
        kernel, why = dispatch.choose_kernel(128, 75600, False, None, gpu)
        return x + 1 if kernel == "gluon-ws" else x - len(why)

    here = tuning.VerifiedRelease(dispatch.triton_release(), "(this test)", "", "")
    for releases, expected in (((here,), 1.0), ((), None)):  # verified here, or not
        with tuning.override(gluon_releases=releases):
            monkeypatch.setattr(dispatch, "_TRITON_RELEASE", {})
            torch._dynamo.reset()
            out = torch.compile(f, fullgraph=True, backend="eager")(torch.zeros(2))
            assert torch.equal(out, f(torch.zeros(2)))
            assert (out[0] == expected) if expected else (out[0] < 0)


def test_sampled_rows_reference_matches_the_full_one():
    from fp8dit.testing import attention_ref, attention_ref_rows, make_qkv

    q, k, v = make_qkv(2, 3, 100, 32, seed=1)
    rows = torch.tensor([0, 5, 99])
    out, lse = attention_ref_rows(q, k, v, rows, batch=1)
    ref, ref_lse = attention_ref(q, k, v, return_lse=True)
    torch.testing.assert_close(out, ref[1, rows].double(), rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse[1][:, rows].double(), rtol=0, atol=1e-12)


def test_numpy_scalar_scale_is_a_float():
    np = pytest.importorskip("numpy")
    q, k, v = (torch.randn(1, 16, 2, 64).bfloat16() for _ in range(3))
    a = fp8dit.attention(q, k, v, scale=np.float32(0.125), backend="sdpa")
    b = fp8dit.attention(q, k, v, scale=0.125, backend="sdpa")
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_zero_heads_is_named():
    q = torch.randn(1, 8, 0, 64).bfloat16()
    with pytest.raises(ValueError, match="q: expected at least 1 head, got 0"):
        fp8dit.attention(q, q, q)
