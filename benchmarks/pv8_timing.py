"""The warp-specialized kernel's 8-bit integer P·V step (``attend.PV_INT8_FOLD``: 0 u8 P with
the preset and I2FP, 1 the magic-number FADD, 3 the 7-bit P, no offset or preset) timed against
the shipped fp8 step in one process, interleaved; V's fp8 bytes are read as int8 (timing only).

    python benchmarks/pv8_timing.py time cog none,0,1,3
    python benchmarks/pv8_timing.py one cog 3          # one launch, for ncu
    python benchmarks/pv8_timing.py bal cog            # torch.profiler of the three recipes
"""
import json, math, os, sys, time
os.environ.setdefault("FP8DIT_KERNEL", "gluon-ws")
import torch, triton, triton.testing
from fp8dit import attend, quantize
from fp8dit.recipes import get_recipe

SHAPES = {"cog": (1, 48, 17776, 64), "wan720": (1, 40, 75600, 128), "wan480": (1, 40, 32760, 128)}


def stage(name, recipe=None, seed=0):
    B, H, S, D = SHAPES[name]
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(seed)
    q, k, v = (torch.randn(B, S, H, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
    rec, scale = get_recipe(recipe), 1.0 / math.sqrt(D)
    plan, launch = attend.plan_for([S] * B, [S] * B, varlen=False, num_heads=H, num_kv_heads=H,
                                   head_dim=D, is_causal=False, device=dev, recipe=rec)
    assert launch.kernel == "gluon-ws", launch.kernel
    out = torch.empty_like(q)
    lse = torch.empty(B, H, S, device=dev, dtype=torch.float32)
    st = tuple(attend._bthd_strides(t, "NHD") for t in (q, k, v, out))
    ws = quantize.quantize_stage(plan, rec, scale, q, st[0], k, st[1], v, st[2], kv_perm16=True)
    ls = (lse.stride(0), lse.stride(1), lse.stride(2))
    return lambda: attend.attention_stage(plan, launch, ws, out, st[3], lse, ls)


def timing(names, folds, rounds=3):
    res = {}
    for name in names:
        fn = stage(name)
        for f in folds:  # compile
            attend.PV_INT8_FOLD = f
            t0 = time.time(); fn(); torch.cuda.synchronize()
            print(f"compile {name} fold={f} {time.time()-t0:.1f}s", flush=True)
        for r in range(rounds):
            for f in folds:
                attend.PV_INT8_FOLD = f
                ms = triton.testing.do_bench(fn, warmup=200, rep=1500, return_mode="median")
                res.setdefault(name, {}).setdefault(str(f), []).append(ms)
                print(f"{name} fold={f} round={r} {ms:.4f} ms", flush=True)
        attend.PV_INT8_FOLD = None
        for f in folds:
            ts = res[name][str(f)]
            base = sorted(res[name]["None"])[len(ts) // 2]
            med = sorted(ts)[len(ts) // 2]
            print(f"SUMMARY {name} fold={f} median {med:.4f} ms  vs shipped {med / base * 100 - 100:+.2f}%", flush=True)
    return res


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "time":
        names = sys.argv[2].split(",")
        folds = [None if x == "none" else int(x) for x in sys.argv[3].split(",")]
        res = timing(names, folds)
        meta = dict(gpu=torch.cuda.get_device_name(), uuid=str(torch.cuda.get_device_properties(0).uuid),
                    torch=torch.__version__, triton=triton.__version__, date=time.strftime("%Y-%m-%d %H:%M"))
        out = os.environ.get("OUT", ".")
        with open(os.path.join(out, f"pv8-{sys.argv[2].replace(',', '_')}.json"), "w") as fh:
            json.dump(dict(meta=meta, ms=res), fh, indent=1)
        print(json.dumps(meta))
    elif mode == "one":  # one launch after warm-up, for ncu
        name, f = sys.argv[2], sys.argv[3]
        fn = stage(name)
        attend.PV_INT8_FOLD = None if f == "none" else int(f)
        fn(); torch.cuda.synchronize()
        fn(); torch.cuda.synchronize()
    elif mode == "bal":  # where -bal's time goes at a shape
        import fp8dit
        from torch.profiler import profile, ProfilerActivity
        B, H, S, D = SHAPES[sys.argv[2]]
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for rec in ("int8qk-fp8pv", "int8qk-fp8pv-rot", "int8qk-fp8pv-bal"):
            for _ in range(3):
                fp8dit.attention(q, k, v, backend="fp8", recipe=rec)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    fp8dit.attention(q, k, v, backend="fp8", recipe=rec)
                torch.cuda.synchronize()
            print(f"==== {rec} (5 calls)")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))
            e = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
            e[0].record()
            for _ in range(20):
                fp8dit.attention(q, k, v, backend="fp8", recipe=rec)
            e[1].record(); torch.cuda.synchronize()
            print(f"E2E {rec} {e[0].elapsed_time(e[1]) / 20:.3f} ms per call", flush=True)
