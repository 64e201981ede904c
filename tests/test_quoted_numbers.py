"""Figures the lectures and worksheets quote in their prose, checked against the data they come from.

A measurement quoted in a markdown cell either is printed by a code cell or is listed here: QUOTED formats each
phrase from the recorded GPU runs (fp8lab/data/*.json) with the rounding the prose uses, so a re-recorded run whose
figures move fails here until the prose follows; CITED names the figures of runs not recorded there, which the
prose attributes to BENCHMARKS.md, and the strings BENCHMARKS.md must hold for them. Every TFLOP/s, GB/s, TB/s and
ms in a markdown cell must lie inside one of those phrases or in SPECS (datasheet and report figures, no run of
ours). Also: each lecture's title and each link label "NN · title" carry the number of the file they name.
"""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from fp8lab.device import hardware

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")) + sorted((ROOT / "solutions").glob("ws*.ipynb"))
UNIT = re.compile(r"(?<![\w.])\d[\d,.]*(?:-\d[\d,.]*)?\s*(?:TFLOP/s|GB/s|TB/s|ms\b)")
SUP = str.maketrans("0123456789.-", "⁰¹²³⁴⁵⁶⁷⁸⁹·⁻")


def _norm(text: str) -> str:
    return " ".join(text.replace("–", "-").split())


def _path(name: str) -> Path:
    found = [p for p in NOTEBOOKS if p.stem.startswith(name)]
    assert len(found) == 1, (name, found)
    return found[0]


def markdown(name: str) -> str:
    """The markdown cells of a lecture ("08") or worksheet ("ws11_"), whitespace collapsed, dashes as hyphens."""
    cells = json.loads(_path(name).read_text(encoding="utf-8"))["cells"]
    return _norm("\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown"))


def sup(x: str) -> str:
    """'13.3' -> '¹³·³', as the prose writes exponents."""
    return x.translate(SUP)


# ----------------------------------------------------------------------------------------------- recorded data

def lectures(key):
    return hardware.recorded("h200_lectures")["entries"][key]


def row(key, start):
    """The cells of the row of recorded table `key` whose first cell starts with `start`."""
    rows = [r for r in lectures(key)["value"]["rows"] if r[0].startswith(start)]
    assert len(rows) == 1, (key, start)
    return rows[0]


def tensor_cores(shape, kernel):
    rows = [r for r in hardware.recorded("h200_tensor_cores")["bench"] if r["shape"] == shape and r["kernel"] == kernel]
    assert len(rows) == 1, (shape, kernel)
    return rows[0]["tflops"]


def error_vs_k(dist, K):
    return next(r for r in hardware.recorded("h200_tensor_cores")["error_vs_k"] if r["dist"] == dist and r["K"] == K)


def accum_added(version, product, s):
    t = next(r for r in hardware.recorded("h200_tensor_cores")["accum"]["shift"][version] if r["product"] == product)
    return t["added_by_shift"][str(s)]


BIG, SMALL = [4096, 7168, 16384], [4096, 4096, 4096]


def q00():
    copy, tc = lectures("00.bias_add"), lectures("00.tensor_cores_8192")
    assert copy["date"] == tc["date"]
    return dict(copy=copy["value"]["copy_gbs"] / 1000, bf16=tc["value"]["BF16 tensor cores"],
                fp8=tc["value"]["FP8 tensor cores"], date=tc["date"])


def q01():
    v1 = float(row("01.reduce", "v1")[3].rstrip("%"))
    assert round(100 / v1) == 8  # "about an eighth of the copy"
    return dict(v2=row("01.reduce", "v2")[3], v3=row("01.reduce", "v3")[3])


def q04_copy():
    bench = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    copy = re.search(r"x \(40960, 7168\) float32 = 1\.09 GiB;[^*]*ceiling: copy ([\d,]+) GB/s", bench).group(1)
    return dict(copy=copy, share=int(copy.replace(",", "")) / 4800)


def q05():
    v = lectures("05.sgemm_ladder")["value"]
    t, cub, peak = v["tflops"], v["cublas"], hardware.H100_FP32_TFLOPS
    return dict(v7=t["7"], pct=t["7"] / cub, cub=cub, peak=t["7"] / peak, v6=t["6"] / cub, cub_peak=cub / peak,
                about=round(t["7"] / cub, 1))


def q06():
    tc, v2, v3 = (row("06.cuda_vs_tensor_cores", k) for k in ("torch", "fp8_gemm v2", "fp8_gemm v3"))
    assert v3[3] == f"1/{float(tc[2]) / float(v3[2]):.0f}"  # the ratio of the times is that of the rates
    return dict(tc=tc[2], v2=v2[2], v2r=v2[3], v3=v3[2], v3r=v3[3], v3n=v3[3][2:], v3int=f"{float(v3[2]):.0f}",
                sgemm=lectures("05.sgemm_ladder")["value"]["tflops"]["7"],
                fp8=lectures("00.tensor_cores_8192")["value"]["FP8 tensor cores"])


def q08_speed():
    v4, v5, v6 = (tensor_cores(BIG, k) for k in ("v4", "v5", "v6"))
    cub = tensor_cores(BIG, "scaled_mm blockwise bf16")
    assert v6 > v5 > v4  # the recap's ladder
    return dict(v5=v5, v6=v6, cub=cub, v5p=v5 / cub, v6p=v6 / cub)


def q07_accum():
    m = hardware.recorded("h200_tensor_cores")["accum"]
    lost = [r["first_shift_lost"] for r in m["shift"]["v1"]]
    assert accum_added("v2", 1.0, 14) == 0.0 and accum_added("v2", 1.0, 13) == 1.0  # 1 vanishes next to 2^14
    return dict(model=m["matches"]["random"]["v2"]["model13"], lo=min(lost), hi=max(lost),
                exact=m["matches"]["random"]["v1"]["round-exact"], fp32=m["matches"]["random"]["v1"]["fp32"],
                a=f"{accum_added('v2', 1.875, 11):g}", b=f"{accum_added('v2', -1.5, 13):g}")


def q07_error():
    ks = sorted({r["K"] for r in hardware.recorded("h200_tensor_cores")["error_vs_k"]})
    u = {k: error_vs_k("uniform", k) for k in ks}
    means = [u[k]["v5"][1] * 1e4 for k in ks]
    assert {round(math.log10(u[k]["v4"][0])) for k in ks} <= {-7, -6}  # "sits at 10^-7-10^-6"
    return dict(k4=u[4096]["v5-nopromote"][0], k16=u[16384]["v5-nopromote"][0],
                n4=error_vs_k("normal", 4096)["v5-nopromote"][0], lo=f"{min(means):.1f}", hi=f"{max(means):.1f}",
                m128=f"{u[128]['v5'][0] * 1e3:.1f}", m16=f"{u[16384]['v5'][0] * 1e4:.0f}",
                f8=u[8192]["scaled_mm-fast"][0], o8=u[8192]["v5-nopromote"][0])


def q09_losses():
    rec = hardware.recorded("h200_capstone")
    v = rec["val_loss"]
    gap = max(abs(x - y) / y for r in ("fp8-tensor", "fp8-deepseek") for base in ("fp32", "bf16")
              for x, y in zip(v[r], v[base]))
    ends = [c[-1] for c in v.values()]
    from fp8lab.training import corpus, loop

    return dict(gap=math.ceil(gap * 1000) / 10, lo=min(ends), hi=max(ends), blo=min(ends) / math.log(2),
                bhi=max(ends) / math.log(2), steps=rec["model"]["steps"],
                default=loop.SIZES["chars"]["gpu"]["steps"], per_pass=corpus.load().train.size / rec["model"]["batch"])


def q09_timing():
    from fp8lab.course import recorded

    t = recorded.lookup("09.step_breakdown")["value"]
    b = t["breakdown"]["fp8-deepseek"]
    gemms = sum(ms for op, ms in b.items() if op.startswith("GEMM"))
    assert round(4 * gemms / sum(b.values())) == 1  # "about a quarter of the GPU time of a step launched from Python"
    g = recorded.lookup("09.graph_step")["value"]
    assert round(g["launched from Python"] / g["one CUDA graph"]) == 2  # "about twice as fast"
    return {}


def _overlap():
    return hardware.recorded("h200_overlap")


def q10_streams():
    rec = _overlap()
    runs = rec["streams"]["runs"]
    alone = {op["name"]: op["end_ms"] - op["start_ms"] for op in runs["serialized"]}
    together = {op["name"]: op["end_ms"] - op["start_ms"] for op in runs["overlapped"]}
    assert all(together[k] > alone[k] for k in alone)  # "each op ran a little slower than alone"
    copies = {f"{alone[k]:.1f}" for k in ("H2D", "D2H")}
    assert len(copies) == 1
    gbs = {f"{rec['streams'][f'{k.lower()}_bytes'] / alone[k] / 1e6:.0f}" for k in ("H2D", "D2H")}
    assert len(gbs) == 1
    gain = max(op["end_ms"] for op in runs["serialized"]) / max(op["end_ms"] for op in runs["overlapped"])
    return dict(date=rec["date"], copy=copies.pop(), gbs=gbs.pop(), gemm=alone["GEMM"], gain=gain)


def q10_budget():
    sb = _overlap()["sm_budget"]
    split = {s["sms"]: s for s in sb["splits"]}
    full, part = split[132]["gemm_alone_ms"], split[112]
    M, N, _ = sb["gemm"]
    tiles = math.ceil(M / 128) * math.ceil(N / 128)
    return dict(alone=1 - full / part["gemm_alone_ms"], beside=1 - full / part["gemm_beside_ms"],
                pred=1 - math.ceil(tiles / 132) / math.ceil(tiles / 112))


def q_ws6():
    return dict(h200=2.0**11 + accum_added("v2", 1.875, 11))


def q_massive():
    return dict(lo=sup(f"{math.log2(1e4):.1f}"), hi=sup(f"{math.log2(1e5):.1f}"))


# (notebook, phrase with {fields} formatted as the prose rounds them, fields from the recorded data)
QUOTED = [
    ("00", "({copy:.1f} TB/s, {bf16:.0f} and {fp8:.0f} TFLOP/s on {date};", q00),
    ("01", "({v3} of the copy against {v2} in the course's,", q01),
    ("01", "hold it to about an eighth of the copy", q01),
    ("04", "{copy} GB/s read + write in that run: {share:.0%} of the 4.8 TB/s of the H200 datasheet", q04_copy),
    ("05", "v7 ran at {v7:.1f} TFLOP/s at 4096³, **{pct:.0%} of cuBLAS SGEMM** measured in the same run "
           "({cub:.1f} TFLOP/s) and {peak:.0%} of the FP32 peak; v6 was at {v6:.0%} of cuBLAS", q05),
    ("05", "cuBLAS itself is at {cub_peak:.0%} of peak.", q05),
    ("05", "take the SGEMM to about {about:.0%} of cuBLAS on the CUDA cores", q05),
    ("06", "reached **{fp8:.0f} TFLOP/s** at 8192³ (lecture 00 measures it)", q06),
    ("06", "ran at {v2} TFLOP/s, {v2r} of `torch._scaled_mm`'s {tc} TFLOP/s.", q06),
    ("06", "ran at {v3} TFLOP/s ({v3r}),", q06),
    ("06", "(SGEMM v7 reached {sgemm:.0f} of their ~67, lecture 05), and still {v3n} times short of the tensor cores",
     q06),
    ("06", "({v3int} against {tc} TFLOP/s at 4096³ in the course's H200 run)", q06),
    ("08", "Version 6 reaches {v6p:.0%} of cuBLAS's blockwise FP8 GEMM at DeepSeek-V3's shape (recorded: {v6:.0f} "
           "against {cub:.0f} TFLOP/s), version 5 {v5p:.0%};", q08_speed),
    ("08", "from {v5:.0f} to {v6:.0f} TFLOP/s ({v6p:.0%} of cuBLAS)", q08_speed),
    ("07", "On random inputs {model:.0%} of outputs match the model", q07_accum),
    ("07", "(a product is lost only from s = {lo}..{hi} on; on random inputs {exact:.1%} of outputs are the exactly "
           "rounded sum, {fp32:.1%} the k-order FP32 sum)", q07_accum),
    ("07", "A product of 1 next to C = 2¹⁴ vanishes (the last kept bit of 2¹⁴ is 2¹), 1.875 next to 2¹¹ adds {a}, "
           "-1.5 next to 2¹³ adds {b}", q07_accum),
    ("07", "it reaches {k4:.0%} at K = 4096 and {k16:.0%} at 16384", q07_error),
    ("07", "between this worst case and normal inputs ({n4:.2%})", q07_error),
    ("07", "mean error stays between {lo}·10⁻⁴ and {hi}·10⁻⁴ whatever K (its maximum falls from {m128}·10⁻³ at "
           "K = 128 to {m16}·10⁻⁴", q07_error),
    ("07", "({f8:.1%} at 8192 against {o8:.0%} for one accumulator)", q07_error),
    ("07", "sits at 10⁻⁷-10⁻⁶", q07_error),
    ("09", "All FP8 recipes stay within {gap}% of FP32 and BF16 at every validation point", q09_losses),
    ("09", "every recipe ends at {lo:.3f}-{hi:.3f} nats, {blo:.2f}-{bhi:.2f} bits per character", q09_losses),
    ("09", "(one pass is about {per_pass:.0f} steps at this batch)", q09_losses),
    ("09", "run for {steps} steps (the default is {default})", q09_losses),
    ("09", "the FP8 GEMMs take about a quarter of the GPU time of an `fp8-deepseek` step launched from Python. "
           "Replaying the whole step as one CUDA graph made it about twice as fast", q09_timing),
    ("10", "On the recorded H200 run ({date}) each 64 MiB copy took about {copy} ms alone ({gbs} GB/s over PCIe) and "
           "the GEMM {gemm:.1f} ms. Overlapped, each op ran a little slower than alone", q10_streams),
    ("10", "({gain:.2f}x on the recorded H200 run)", q10_streams),
    ("10", "on the recorded run {alone:.1%} alone against {pred:.1%} predicted, and {beside:.1%} beside", q10_budget),
    ("ws6_", "the H200 gives {h200:g}", q_ws6),
    ("09", "reach 10⁴-10⁵ times the median", q_massive),
    ("ws11_", "reach 10⁴-10⁵ times the median (\"e.g., 100,000 times larger\", in their abstract), about 2{lo}-2{hi}",
     q_massive),
]

# (notebook, phrase, what BENCHMARKS.md must hold for it): figures of runs not recorded in fp8lab/data
CITED = [
    ("00", "cuBLAS's blockwise FP8 GEMM ranged 1096-1184 TFLOP/s across the sessions of BENCHMARKS.md",
     ["cuBLAS blockwise 1096-1184 TFLOP/s"]),
    ("01", "84.0% against 94.2% in BENCHMARKS.md's", ["| 84.0% |", "| 94.2% |"]),
    ("04", "at 101.7% of the copy bandwidth measured in the same run (102-104% in earlier runs), version 2 at 23.8%, "
           "and PyTorch's five-kernel equivalent at 10.7%", ["| 101.7% |", "102-104% of copy", "| 23.8% |",
                                                              "| 10.7% |"]),
    ("04", "about 70 µs of Python to launch version 3, a fifth of the kernel's 0.34 ms",
     ["~70 us launch path", "0.339 ms"]),
    ("04", "version 3 looked like 77-78% of the copy (BENCHMARKS.md's changelog, 2026-12-02)", ["77-78% of copy"]),
    ("05", "(BENCHMARKS.md's runs of `python -m fp8lab.kernels.gemm`: v7 at 68-72% of cuBLAS)",
     ["SGEMM v7 (68-72% of cuBLAS)"]),
    ("06", "and at 31 TFLOP/s at DeepSeek-V3's M = 4096, N = 7168, K = 16384 in an earlier run (BENCHMARKS.md)",
     ["version 3 ran 31 TFLOP/s there"]),
    ("07", "(one point at 5.7%, from a small model sample; the table is in BENCHMARKS.md, section tc_accum)",
     ["| -5.7% |"]),
    ("08", "BENCHMARKS.md's current table has 729 against 1126 TFLOP/s, and cuBLAS's blockwise GEMM ranged "
           "1096-1184 TFLOP/s across its sessions", ["| 729.1 |", "cuBLAS FP8 blockwise 1,126.2 TFLOP/s",
                                                     "cuBLAS blockwise 1096-1184 TFLOP/s"]),
    ("08", "(729 against 695 TFLOP/s in BENCHMARKS.md's table, 716 against 701 in an earlier run) and behind it at "
           "4096³ (589 against 681)", ["| 694.8 |", "716 against 701 TFLOP/s", "| 589.4 |", "| 680.8 |"]),
    ("08", "(720 against 714)", ["720 against 714"]),
    ("08", "(slower: 664-699 TFLOP/s)", ["664-699"]),
]

# figures of datasheets and of the DeepSeek-V3 report, no run of the course's
SPECS = [
    ("00", "~1979 TFLOP/s"), ("00", "~989 TFLOP/s"), ("00", "~67 TFLOP/s"), ("00", "141 GB HBM3e at 4.8 TB/s"),
    ("00", "cut to 400 GB/s"), ("00", "InfiniBand at about 50 GB/s against about 160 GB/s over NVLink"),
    ("01", "80-141 GB of HBM, 3.35-4.8 TB/s"),
    ("05", "at ~1979 TFLOP/s dense FP8 peak"),
    ("06", "about 67 TFLOP/s of FP32 on its CUDA cores and about 1979 TFLOP/s of dense FP8"),
    ("07", "about 67 TFLOP/s of that, and about 1979 TFLOP/s of dense FP8"),
    ("10", "NVLink (about 160 GB/s per GPU)"), ("10", "(IB, 50 GB/s per GPU)"),
    ("10", "4 rows at 50 GB/s take longer than 8 rows at 160 GB/s"),
]


def _quoted(entry) -> str:
    nb, template, fields = entry
    return template.format(**fields())


@pytest.mark.parametrize("entry", QUOTED, ids=[f"{e[0]}-{i}" for i, e in enumerate(QUOTED)])
def test_quoted_figures_match_the_recorded_runs(entry):
    nb, template, _ = entry
    phrase = _quoted(entry)
    assert _norm(phrase) in markdown(nb), (f"{_path(nb).name} should say {phrase!r} (from the recorded data; "
                                           f"template {template!r})")


@pytest.mark.parametrize("entry", CITED, ids=[f"{e[0]}-{i}" for i, e in enumerate(CITED)])
def test_figures_of_other_runs_are_in_benchmarks(entry):
    nb, phrase, holds = entry
    assert _norm(phrase) in markdown(nb), f"{_path(nb).name} no longer says {phrase!r}: update CITED"
    bench = _norm((ROOT / "BENCHMARKS.md").read_text(encoding="utf-8"))
    missing = [s for s in holds if _norm(s) not in bench]
    assert not missing, f"{_path(nb).name} cites BENCHMARKS.md for {phrase!r}, which lacks {missing}"


def test_every_measurement_in_the_prose_is_checked():
    covered = {}
    for entry in QUOTED:
        covered.setdefault(entry[0], []).append(_quoted(entry))
    for nb, phrase, _ in CITED:
        covered.setdefault(nb, []).append(phrase)
    for nb, phrase in SPECS:
        covered.setdefault(nb, []).append(phrase)
    unchecked = []
    for path in NOTEBOOKS:
        name = path.stem[:2] if path.parent.name == "notebooks" else path.stem.split("_")[0] + "_"
        text = markdown(name)
        spans = [(m.start(), m.start() + len(_norm(p))) for p in covered.get(name, [])
                 for m in re.finditer(re.escape(_norm(p)), text)]
        for m in UNIT.finditer(text):
            if not any(a <= m.start() and m.end() <= b for a, b in spans):
                unchecked.append(f"{path.name}: ...{text[max(0, m.start() - 60):m.end() + 20]}...")
    assert not unchecked, ("figures in markdown that no code cell prints and no test checks (add them to QUOTED, "
                           "CITED or SPECS in tests/test_quoted_numbers.py, or print them from a code cell):\n"
                           + "\n".join(unchecked))


def test_titles_and_link_labels_carry_their_file_numbers():
    for path in NOTEBOOKS:
        first = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"])
        lecture = path.parent.name == "notebooks"
        want = f"# {path.stem[:2]} ·" if lecture else f"# Worksheet {path.stem[2:].split('_')[0]} ·"
        assert first.startswith(want), (path.name, first[:60])
        text = markdown(path.stem[:2] if lecture else path.stem.split("_")[0] + "_")
        for label, target in re.findall(r"\[(\d\d) ·[^\]]*\]\((?:[^)]*/)?(\d\d)_[^)]*\.ipynb\)", text):
            assert label == target, (path.name, label, target)
        for label, target in re.findall(r"\[[Ll]ecture (\d\d)\]\((?:[^)]*/)?(\d\d)_[^)]*\.ipynb\)", text):
            assert label == target, (path.name, label, target)


def test_the_worksheet_sweep_breaks_among_massive_activations():
    """ws11's own sweep (seed 0) breaks inside 10^4-10^5, where its prose puts it."""
    from fp8lab.course.check import ws11
    from fp8lab.training import engine_reference
    from fp8lab.training import model as lm

    rng = np.random.default_rng(0)  # the worksheet's cell, as it runs
    K = 512
    z = rng.standard_normal((16, K)).astype(np.float32)
    w = (rng.standard_normal((48, K)) / np.sqrt(K)).astype(np.float32)
    exact = z.astype(np.float64) @ w.T.astype(np.float64)
    errors = {}
    for e in range(21):
        d = lm.outlier_scales(lm.Config(65, 16, 32, 64, 1, outliers=2.0**e))
        d = np.ones(K, np.float32) if d is None else d
        errors[e] = {r: float(np.linalg.norm(engine_reference.Linear(r).forward(z * d, w / d) - exact)
                              / np.linalg.norm(exact)) for r in ("fp8-tensor", "fp8-deepseek")}
    e_break = ws11._breaks(errors)
    assert e_break is not None and math.log2(1e4) <= e_break <= math.log2(1e5), e_break
    assert "this break lies inside that range" in markdown("ws11_")
