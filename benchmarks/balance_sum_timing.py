"""The balance recipes' rank-one update before the rotation with its products rounded on their
own (``mul_rn``) and its x . u by ``tl.sum`` or as integers on a per-row grid (``quantize.BAL_MODE``)
against the plain expression, in one process, interleaved:
end-to-end ``fp8dit.attention`` and the quantization alone, beside the default recipe; then
both against fp64 on inputs with a K bias and outlier channels.

    python benchmarks/balance_sum_timing.py [cog,wan720] [rounds]
"""
import json, math, os, sys, time
import torch, triton, triton.testing
import fp8dit
from fp8dit import attend, quantize
from fp8dit.recipes import get_recipe

SHAPES = {"cog": (1, 48, 17776, 64), "wan720": (1, 40, 75600, 128)}
# name -> (recipe, quantize.BAL_MODE)
VARIANTS = {
    "default": ("int8qk-fp8pv", 1),
    "bal-tlsum": ("int8qk-fp8pv-bal", 1),
    "bal-int": ("int8qk-fp8pv-bal", 6),
}


def setting(name):
    rec, mode = VARIANTS[name]
    quantize.BAL_MODE = mode
    return rec


def timings(shape, names, rounds):
    B, H, S, D = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    scale = 1.0 / math.sqrt(D)
    res, fns = {}, {}
    for name in names:
        rec = setting(name)
        recipe = get_recipe(rec)
        plan, launch = attend.plan_for([S] * B, [S] * B, varlen=False, num_heads=H,
                                       num_kv_heads=H, head_dim=D, is_causal=False,
                                       device=q.device, recipe=recipe)
        st = attend._bthd_strides(q, "NHD")
        kv16 = launch.kernel == "gluon-ws"

        def e2e(rec=rec):
            return fp8dit.attention(q, k, v, backend="fp8", recipe=rec)

        def quant(plan=plan, recipe=recipe):
            return quantize.quantize_stage(plan, recipe, scale, q, st, k, st, v, st,
                                           kv_perm16=kv16)
        fns[name] = (e2e, quant)
        t0 = time.time()
        e2e(); quant(); torch.cuda.synchronize()
        print(f"{shape} {name}: kernel {launch.kernel}, warm-up {time.time() - t0:.1f} s",
              flush=True)
    for r in range(rounds):
        for name in names:
            setting(name)
            for what, fn in zip(("e2e", "quant"), fns[name]):
                ms = triton.testing.do_bench(fn, warmup=50, rep=600, return_mode="median")
                res.setdefault(what, {}).setdefault(name, []).append(ms)
                print(f"{shape} {what} {name} round {r}: {ms:.4f} ms", flush=True)
    for what in ("e2e", "quant"):
        base = sorted(res[what]["default"])[rounds // 2]
        for name in names:
            med = sorted(res[what][name])[rounds // 2]
            print(f"SUMMARY {shape} {what:5s} {name:10s} {med:9.4f} ms  "
                  f"{med / base * 100 - 100:+6.2f}% vs default", flush=True)
    return res


def accuracy():
    out = {}
    g = torch.Generator(device="cuda").manual_seed(1)
    for D in (64, 128, 256):
        B, H, S = 1, 8, 4096
        q, k, v = (torch.randn(B, S, H, D, device="cuda", generator=g) for _ in range(3))
        k[..., 3] += 6.0  # a K bias channel
        q[..., 5] *= 8.0  # a Q outlier channel
        k[..., 7] *= 8.0
        q += 2.0  # a Q bias on every channel: the rank-one update's case
        q, k, v = (t.bfloat16() for t in (q, k, v))
        qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
        s = qd @ kd.transpose(-1, -2) / math.sqrt(D)
        lse_ref = torch.logsumexp(s, -1)
        ref = (torch.softmax(s, -1) @ vd).transpose(1, 2)
        for name in VARIANTS:
            rec = setting(name)
            o, lse = fp8dit.attention(q, k, v, backend="fp8", recipe=rec, return_lse=True)
            rl1 = ((o.double() - ref).abs().mean() / ref.abs().mean()).item()
            le = (lse.double() - lse_ref).abs().mean().item()
            out[f"d{D}-{name}"] = dict(rel_l1=rl1, lse=le)
            print(f"ACC D={D} {name:10s} rel-L1 {rl1:.5f} LSE {le:.5f}", flush=True)
    return out


if __name__ == "__main__":
    shapes = (sys.argv[1] if len(sys.argv) > 1 else "cog,wan720").split(",")
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    meta = dict(gpu=torch.cuda.get_device_name(),
                uuid=str(torch.cuda.get_device_properties(0).uuid),
                torch=torch.__version__, triton=triton.__version__,
                date=time.strftime("%Y-%m-%d %H:%M"))
    print(json.dumps(meta), flush=True)
    res = {s: timings(s, list(VARIANTS), rounds) for s in shapes}
    acc = accuracy()
    with open(os.path.join(os.environ.get("OUT", "."), "balance-sum-timing.json"), "w") as fh:
        json.dump(dict(meta=meta, accuracy=acc, ms=res), fh, indent=1)
