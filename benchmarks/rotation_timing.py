"""The rotating recipes' Hadamard rotation by a fast Walsh-Hadamard transform (fp32 adds in
registers, ``quantize.ROTATE_FWHT``) against the tf32 dot with the matrix, in one process,
interleaved: end-to-end ``fp8dit.attention`` and the quantization alone; then the accuracy of
both against fp64 on inputs with outlier channels.

    python benchmarks/rotation_timing.py [cog,wan720] [rounds]
"""
import json, math, os, sys, time
import torch, triton, triton.testing
import fp8dit
from fp8dit import attend, quantize, tuning
from fp8dit.recipes import get_recipe

SHAPES = {"cog": (1, 48, 17776, 64), "wan720": (1, 40, 75600, 128)}
# name -> (recipe, fwht, kv warps, q rows override, rotated K amax from the statistics)
VARIANTS = {
    "default": ("int8qk-fp8pv", False, None, None, False),
    "rot-dot": ("int8qk-fp8pv-rot", False, None, None, False),
    "rot-fwht": ("int8qk-fp8pv-rot", True, None, None, False),
    "rot-fwht-kam": ("int8qk-fp8pv-rot", True, None, None, True),
    "bal-dot": ("int8qk-fp8pv-bal", False, None, None, False),
    "bal-fwht": ("int8qk-fp8pv-bal", True, None, None, False),
    "bal-fwht-kam": ("int8qk-fp8pv-bal", True, None, None, True),
}


def setting(name, D):
    rec, fwht, kvw, qrows, kam = VARIANTS[name]
    quantize.ROTATE_FWHT = fwht
    quantize.KAMAX_ROTATED = kam
    rows = 256
    quantize.KV_ROT_WARPS = (quantize.tile_warps(rows, D) // 2) if kvw == "half" else None
    over = dict(quantization=dict(q_rows={D: qrows})) if qrows else {}
    return rec, over


def timings(shape, names, rounds):
    B, H, S, D = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    scale = 1.0 / math.sqrt(D)
    res = {}
    fns = {}
    for name in names:
        rec, over = setting(name, D)
        recipe = get_recipe(rec)
        with tuning.override(**over):
            plan, launch = attend.plan_for([S] * B, [S] * B, varlen=False, num_heads=H,
                                           num_kv_heads=H, head_dim=D, is_causal=False,
                                           device=q.device, recipe=recipe)
        st = attend._bthd_strides(q, "NHD")
        kv16 = launch.kernel == "gluon-ws"

        def e2e(rec=rec, over=over):
            with tuning.override(**over):
                return fp8dit.attention(q, k, v, backend="fp8", recipe=rec)

        def quant(plan=plan, recipe=recipe, over=over):
            with tuning.override(**over):
                return quantize.quantize_stage(plan, recipe, scale, q, st, k, st, v, st,
                                               kv_perm16=kv16)
        fns[name] = (e2e, quant)
        t0 = time.time()
        e2e(); quant(); torch.cuda.synchronize()
        print(f"{shape} {name}: kernel {launch.kernel}, warm-up {time.time() - t0:.1f} s",
              flush=True)
    for r in range(rounds):
        for name in names:
            setting(name, D)
            for what, fn in zip(("e2e", "quant"), fns[name]):
                ms = triton.testing.do_bench(fn, warmup=50, rep=600, return_mode="median")
                res.setdefault(what, {}).setdefault(name, []).append(ms)
                print(f"{shape} {what} {name} round {r}: {ms:.4f} ms", flush=True)
    for what in ("e2e", "quant"):
        base = sorted(res[what]["default"])[rounds // 2]
        for name in names:
            med = sorted(res[what][name])[rounds // 2]
            print(f"SUMMARY {shape} {what:5s} {name:14s} {med:9.4f} ms  {med / base * 100 - 100:+6.2f}%"
                  " vs default", flush=True)
    return res


def accuracy():
    out = {}
    g = torch.Generator(device="cuda").manual_seed(1)
    from fp8dit import device
    for key in list(device.ROTATION_SHARED_BYTES):  # D=256 tried with the transform only
        if key[0] == 256:
            device.ROTATION_SHARED_BYTES[key] = 0
    for D in (64, 128, 256):
        B, H, S = 1, 8, 4096
        q, k, v = (torch.randn(B, S, H, D, device="cuda", generator=g) for _ in range(3))
        k[..., 3] += 6.0  # a K bias channel
        q[..., 5] *= 8.0  # a Q outlier channel
        k[..., 7] *= 8.0
        q, k, v = (t.bfloat16() for t in (q, k, v))
        qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
        s = qd @ kd.transpose(-1, -2) / math.sqrt(D)
        lse_ref = torch.logsumexp(s, -1)
        ref = (torch.softmax(s, -1) @ vd).transpose(1, 2)
        for name in ("rot-dot", "rot-fwht", "rot-fwht-kam", "bal-dot", "bal-fwht", "bal-fwht-kam"):
            if D == 256 and name.endswith("dot"):
                continue
            rec, _ = setting(name, D)
            o, lse = fp8dit.attention(q, k, v, backend="fp8", recipe=rec, return_lse=True)
            rl1 = ((o.double() - ref).abs().mean() / ref.abs().mean()).item()
            le = (lse.double() - lse_ref).abs().mean().item()
            out[f"d{D}-{name}"] = dict(rel_l1=rl1, lse=le)
            print(f"ACC D={D} {name:9s} rel-L1 {rl1:.5f} LSE {le:.5f}", flush=True)
        o, lse = fp8dit.attention(q, k, v, backend="fp8", recipe="int8qk-fp8pv", return_lse=True)
        rl1 = ((o.double() - ref).abs().mean() / ref.abs().mean()).item()
        le = (lse.double() - lse_ref).abs().mean().item()
        out[f"d{D}-default"] = dict(rel_l1=rl1, lse=le)
        print(f"ACC D={D} default   rel-L1 {rl1:.5f} LSE {le:.5f}", flush=True)
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
    with open(os.path.join(os.environ.get("OUT", "."), "rotation-timing.json"), "w") as fh:
        json.dump(dict(meta=meta, accuracy=acc, ms=res), fh, indent=1)
