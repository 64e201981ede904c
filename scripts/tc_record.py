"""The tensor-core measurements of fp8lab on one GPU (run on the H200 for fp8lab/data/h200_tensor_cores.json):

    FP8LAB_BACKEND=gpu python scripts/tc_record.py [correct] [accum] [errk] [bench] [sass]   # files in $OUT
    python scripts/tc_record.py assemble DIR                  # DIR holds those files: writes the data file

correct: versions 4-6 against float64 on odd shapes (printed); accum: tc_accum.json (the probes, raw);
errk: error_vs_k.json (v4/v5 with and without promotion, torch._scaled_mm with and without fast accumulation);
bench: bench.json (speed and normwise error at 4096^3 and 4096x7168x16384 next to cuBLAS); sass: sass_vN.txt.
"""
import json
import os
import re
import sys
import time
import traceback
import numpy as np

if sys.argv[1:2] == ["assemble"]:
    src = sys.argv[2]
    data = {"device": "NVIDIA H200 (sm_90, 132 SMs)", "date": time.strftime("%Y-%m-%d"),
            "software": "numba-cuda 0.30.4, torch 2.11.0+cu130",
            "how": "scripts/tc_record.py on the H200 (fp8_gemm versions 3-6 checked and timed next to "
                   "torch._scaled_mm, error vs K, tc_accum probes, SASS through numba's inspect_sass); the SASS "
                   "lines are excerpts of those listings"}
    data["bench"] = [{"shape": r[:3], "kernel": r[3], "ms": r[4], "tflops": r[5], "normwise_error": r[6]}
                     for r in json.load(open(f"{src}/bench.json"))]
    data["error_vs_k"] = json.load(open(f"{src}/error_vs_k.json"))
    acc = json.load(open(f"{src}/tc_accum.json"))
    data["accum"] = {"matches": {f: {v: acc["families"][f][v]["matches"] for v in ("v1", "v2")} for f in acc["families"]},
                     "shift": {v: acc["families"]["shift"][v]["table"] for v in ("v1", "v2")}}
    # (patterns, lines per pattern): the excerpts lecture 07 (a) prints, in the order of the patterns
    pats = {"v3": ([r"F2FP", r"HADD2\.F32", r"LDS\.128", r"FFMA"], 2),
            "v4": ([r"LDGSTS", r"LDGDEPBAR|DEPBAR", r"LDSM", r"F2FP", r"HMMA"], 2),
            "v5": ([r"LDGSTS", r"DEPBAR", r"FENCE\.VIEW\.ASYNC", r"WARPGROUP", r"QGMMA", r"WARPSYNC|WARPGROUP\.DEPBAR"], 3),
            "v6": ([r"QGMMA", r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1", r"WARPGROUP\.DEPBAR"], 4)}
    counted = {"v3": ("FFMA", "F2FP", "LDS", "HMMA", "QGMMA")}
    data["sass"], data["sass_counts"] = {}, {}
    for v, (ps, n) in pats.items():
        lines = open(f"{src}/sass_{v}.txt").read().splitlines()
        data["sass"][v] = [re.sub(r"\s+", " ", ln.strip()) for p in ps for ln in [x for x in lines if re.search(p, x)][:n]]
        if v == "v6":
            data["sass"][v] = data["sass"][v][:8]  # the four QGMMA of one K-group and four waits
        text = "\n".join(lines)
        names = counted.get(v, ("FFMA", "F2FP", "LDSM", "HMMA", "QGMMA", "LDGSTS"))
        data["sass_counts"][v] = {nm: len(re.findall(r"\b" + re.escape(nm) + r"\b", text)) for nm in names}
    data["registers"] = json.load(open(f"{src}/registers.json")) if os.path.exists(f"{src}/registers.json") else {}
    json.dump(data, open("fp8lab/data/h200_tensor_cores.json", "w"), indent=1)
    sys.exit(0)

OUT = os.environ.get("OUT", "/tmp/out")
os.makedirs(OUT, exist_ok=True)
sys.path.insert(0, "tests")
from fp8lab.device import runtime
from fp8lab.numerics import formats, spec
from fp8lab.bench import timing
from fp8lab import bench
from fp8lab.kernels import fp8_gemm as fg, tc_accum as T
from fp8lab.device.runtime import cuda
from test_fp8_gemm import operands, run, Q
torch = bench.torch_cuda()
print(runtime.device_info(), "torch", torch.__version__ if torch else None, flush=True)
rng = np.random.default_rng(7)
steps = sys.argv[1:] or ["correct", "accum", "errk", "bench", "sass"]
res = {}


def step(name):
    def deco(fn):
        if name in steps:
            t = time.time()
            try:
                fn()
            except Exception:
                traceback.print_exc()
            print(f"== {name}: {time.time() - t:.1f} s", flush=True)
        return fn
    return deco


@step("correct")
def _():
    out = res["correct"] = []
    for (M, N, K) in [(1000, 777, 1111), (1000, 777, 1024), (300, 260, 16384)]:
        for grans in [("tile", "block"), ("tensor", "tensor"), ("block", "tile"), ("tile", "tensor")]:
            qa, qb = operands(rng, M, N, K, *grans)
            ref = fg.reference64(qa, qb)
            absp = fg.abs_product(qa, qb)
            bound = fg.error_bound(qa, qb)
            for v in (4, 5, 6):
                try:
                    got = run(qa, qb, v)
                    rel = np.abs(got - ref) / absp
                    line = (M, N, K, grans, v, float(rel.max()), float(rel.mean()), bool((np.abs(got - ref) <= bound).all()))
                except Exception as e:
                    line = (M, N, K, grans, v, repr(e)[:300])
                out.append(line)
                print(line, flush=True)
    # e5m2 b operand
    a = rng.standard_normal((200, 300), dtype=np.float32)
    codes, sc = spec.quantize(a, "tile")[:2]
    qa = Q(codes, sc, "tile")
    b = rng.standard_normal((150, 300), dtype=np.float32)
    amax = np.abs(b).max(axis=1, keepdims=True).astype(np.float32)
    cb = formats.encode((b * (np.float32(57344) / amax)).astype(np.float32), formats.E5M2)
    qb = Q(cb, np.repeat(amax / np.float32(57344), 3, axis=1).astype(np.float32), "tile", fmt="e5m2")
    ref = fg.reference64(qa, qb)
    for v in (4, 5, 6):
        try:
            got = run(qa, qb, v)
            print("e5m2 b", v, float((np.abs(got - ref) / fg.abs_product(qa, qb)).max()), flush=True)
        except Exception as e:
            print("e5m2 b", v, repr(e)[:300])


@step("accum")
def _():
    for r in T.checks(rng):
        print(r, flush=True)
    data = T.record(rng)
    with open(f"{OUT}/tc_accum.json", "w") as f:
        json.dump(data, f)
    for name, fam in data["families"].items():
        for v in (1, 2):
            m = fam[f"v{v}"]["matches"]
            print(name, v, {k: round(x, 3) for k, x in m.items()}, flush=True)
    for v in (1, 2):
        for r in data["families"]["shift"][f"v{v}"]["table"]:
            print("shift", v, r["product"], r["first_shift_lost"], {k: r["added_by_shift"][k] for k in list(r["added_by_shift"])[10:20]})


@step("errk")
def _():
    rows = []
    M = N = 256
    for dist in ("uniform", "normal"):
        for K in (128, 256, 512, 1024, 2048, 4096, 8192, 16384):
            if dist == "uniform":
                a, b = rng.random((M, K)) * 448, rng.random((N, K)) * 448
            else:
                a, b = rng.standard_normal((M, K)) * 112, rng.standard_normal((N, K)) * 112
            ca, cb = formats.encode(a.astype(np.float32)), formats.encode(b.astype(np.float32))
            A, B = formats.decode(ca).astype(np.float64), formats.decode(cb).astype(np.float64)
            ex = A @ B.T
            absp = np.abs(A) @ np.abs(B).T
            one = np.ones(1, np.float32)
            da, db = cuda.to_device(ca), cuda.to_device(cb)
            s1 = cuda.to_device(one.reshape(1, 1))
            r = {"dist": dist, "K": K}
            for v in (4, 5):
                for prom in (True, False):
                    out = bench.poisoned((M, N), np.float32)
                    fg.launch(da, s1, db, s1, out, 0, 0, version=v, tc_promote=prom)
                    y = out.copy_to_host().astype(np.float64)
                    e = np.abs(y - ex) / absp
                    r[f"v{v}{'' if prom else '-nopromote'}"] = [float(e.max()), float(e.mean())]
            if torch is not None:
                ta = torch.from_numpy(ca).cuda().view(torch.float8_e4m3fn)
                tb = torch.from_numpy(cb).cuda().view(torch.float8_e4m3fn)
                o = torch.ones((), device="cuda")
                for fast in (True, False):
                    y = torch._scaled_mm(ta, tb.t(), o, o, out_dtype=torch.float32, use_fast_accum=fast).cpu().numpy()
                    e = np.abs(y.astype(np.float64) - ex) / absp
                    r[f"scaled_mm{'-fast' if fast else ''}"] = [float(e.max()), float(e.mean())]
            rows.append(r)
            print(r, flush=True)
    with open(f"{OUT}/error_vs_k.json", "w") as f:
        json.dump(rows, f)


@step("bench")
def _():
    rows = []
    for (M, N, K) in [(4096, 4096, 4096), (4096, 7168, 16384)]:
        flops = 2.0 * M * N * K
        qa, qb = fg.random_operands(rng, M, N, K, on_device=True)
        out = cuda.device_array((M, N), np.float32)
        big = M * N * K > 4096**3
        # float64 reference on the GPU through torch
        ref = None
        if torch is not None:
            A = torch.from_numpy(formats.decode(qa.data.copy_to_host()).astype(np.float64)).cuda()
            B = torch.from_numpy(formats.decode(qb.data.copy_to_host()).astype(np.float64)).cuda()
            sa = torch.from_numpy(qa.scale.copy_to_host()).cuda().double()
            sb = torch.from_numpy(qb.scale.copy_to_host()).cuda().double()
            A = A * sa.repeat_interleave(128, dim=1)[:, :K]
            B = B * sb.repeat_interleave(128, dim=0)[:N].repeat_interleave(128, dim=1)[:, :K]
            ref = A @ B.T
            del A, B
            refn = torch.linalg.norm(ref).item()

        def nerr(y):
            if ref is None:
                return None
            yt = torch.as_tensor(y, device="cuda").double() if not isinstance(y, torch.Tensor) else y.double()
            return torch.linalg.norm(yt - ref).item() / refn

        for v in ([4, 5, 6] if big else [3, 4, 5, 6]):
            try:
                ms = timing.time_ms(lambda v=v: fg.fp8_gemm(qa, qb, out=out, version=v), warmup=1, repeat=3 if big else 10)
                rows.append((M, N, K, f"v{v}", ms, flops / ms / 1e9, nerr(out)))
            except Exception as e:
                rows.append((M, N, K, f"v{v}", repr(e)[:200]))
            print(rows[-1], flush=True)
        if torch is not None:
            ta = torch.from_numpy(qa.data.copy_to_host()).cuda().view(torch.float8_e4m3fn)
            tb = torch.from_numpy(qb.data.copy_to_host()).cuda().view(torch.float8_e4m3fn)
            sa = torch.from_numpy(qa.scale.copy_to_host()).cuda()
            sb = torch.from_numpy(qb.scale.copy_to_host()).cuda()
            o = torch.ones((), device="cuda")
            try:
                f = lambda: torch._scaled_mm(ta, tb.t(), sa.t().contiguous().t(), sb.t(), out_dtype=torch.bfloat16)
                ms = timing.torch_time_ms(torch, f)
                rows.append((M, N, K, "scaled_mm blockwise bf16", ms, flops / ms / 1e9, nerr(f())))
            except Exception as e:
                rows.append((M, N, K, "blockwise", repr(e)[:300]))
            print(rows[-1], flush=True)
            for od in (torch.bfloat16, torch.float32):
                f = lambda od=od: torch._scaled_mm(ta, tb.t(), o, o, out_dtype=od)
                ms = timing.torch_time_ms(torch, f)
                rows.append((M, N, K, f"scaled_mm tensorwise {od}", ms, flops / ms / 1e9, None))
                print(rows[-1], flush=True)
            del ref
            torch.cuda.empty_cache()
    with open(f"{OUT}/bench.json", "w") as f:
        json.dump(rows, f)


@step("sass")
def _():
    keys = {3: ("fp8_gemm.v3", 1, 2, "e4m3", "e4m3"), 4: ("fp8_gemm.v4", 1, 2, "e4m3", "e4m3", True),
            5: ("fp8_gemm.v5", 1, 2, "e4m3", "e4m3", True), 6: ("fp8_gemm.v6", 1, 2, "e4m3", "e4m3", 1)}
    regs = {}
    for v in (3, 4, 5, 6):
        k = runtime.cached(keys[v], lambda: None)  # compiled by the "bench" step
        if k is None:
            print("no kernel", v)
            continue
        kern = next(iter(k.overloads.values()))
        attrs = kern._codelibrary.get_cufunc().attrs
        regs[f"v{v}"] = {"regs": attrs.regs, "local_bytes": attrs.local}
        print("v", v, "attrs", attrs, flush=True)
        try:
            s = kern.inspect_sass()
            open(f"{OUT}/sass_v{v}.txt", "w").write(s)
            print("inspect_sass ok", len(s))
        except Exception as e:
            print("inspect_sass", repr(e)[:200])
    json.dump(regs, open(f"{OUT}/registers.json", "w"))
