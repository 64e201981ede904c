"""The `fp8lab` command line: info, train, generate, bench, alltoall, pipeline, worksheets, grade.

Nothing here imports fp8lab's kernels before the arguments are read: `--backend` must be applied before
fp8lab.device.runtime picks the backend (numba's simulator mode is fixed when numba.cuda is first imported).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from .device import select as _backend
from .kernels import MODULES as BENCHES  # the registry only; kernel modules are imported on use

SIZES = ("default", "large")  # training.loop.PRESETS' names (a test checks), written out: importing loop picks a backend

TORCH_HOW = ".venv/bin/pip install -e '.[torch]' (PyTorch is optional: the course's first rung and peer)"


def _name_width() -> int:
    """The recipe column of the result tables: wide enough for every registered recipe's name."""
    from .numerics import recipes as R

    return max(13, *(len(name) for name in R.RECIPES))


def _output_path(flag: str, path: str) -> str:
    """Make the folder of an output file now, so a bad path fails before minutes of training, not after."""
    d = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot create its folder ({e.strerror})") from None
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as e:
        raise ValueError(f"{flag} {path}: cannot write it ({e.strerror})") from None
    if not existed:
        os.remove(path)
    return path


def _train(args) -> int:
    import dataclasses

    from .training import corpus, loop, preflight

    replaced = {}  # an output file that exists is replaced, and the output says so
    if args.json:
        replaced[args.json] = os.path.exists(args.json)
        _output_path("--json", args.json)
    if not args.no_plot:
        replaced[args.plot] = os.path.exists(args.plot)
        _output_path("--plot", args.plot)

    from .numerics import recipes as R

    if args.torch and args.task != "chars":
        raise ValueError("--torch (the PyTorch rung) is only for --task chars")
    folders = [f"--{k}" for k in ("save", "resume") if getattr(args, k) is not None]
    if folders and args.task != "chars":
        raise ValueError(f"{', '.join(folders)}: only for --task chars, got --task {args.task}")
    if folders and args.engine == "torch":
        raise ValueError(f"{', '.join(folders)}: checkpoints are for --engine kernels or reference, got --engine torch")
    baselines = R.BASELINES[:1] if args.task == "teacher" else R.BASELINES
    recipes = [args.recipe] if args.no_baseline else [r for r in baselines if r != args.recipe] + [args.recipe]
    # every option goes through: fl.train names any that does not apply to the task
    common = dict(steps=args.steps, seed=args.seed, batch=args.batch, lr=args.lr, optimizer=args.optimizer,
                  engine=args.engine, progress=not args.no_progress, task=args.task, d_in=args.d_in,
                  d_out=args.d_out, noise=args.noise, context=args.context, embed=args.embed, hidden=args.hidden,
                  blocks=args.blocks, moments=args.moments, eval_every=args.eval_every, outliers=args.outliers,
                  eval_batches=args.eval_batches, size=args.size, graph=False if args.no_graph else None)
    # everything is checked before the first recipe trains: the options, every recipe's folders, the memory
    prepared = {r: loop.prepare(r, **common) for r in recipes}
    plan = (preflight.comparison(prepared, args.save, args.resume) if folders else
            [preflight.Part(r, "train") for r in recipes])
    for part in plan:
        if part.action != "done":
            preflight.check_memory(prepared[part.recipe], cli=True)
    hists, part = [], None
    try:
        for part in plan:
            s = prepared[part.recipe]
            if part.action == "done":
                hists.append(loop.finished(s, part.meta))
                print(f"{part.recipe}: already trained to step {s.steps} in {part.resume} (its row is read from there)")
            else:
                hists.append(dataclasses.replace(s, save=part.save, resume=part.resume).run())
    except loop.TrainingDiverged as e:
        print(f"fp8lab train: error: {e.command_line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(_interrupted(args, part, prepared), file=sys.stderr)
        return 130
    h0 = hists[0]
    if args.task == "teacher":
        print(f"\nbackend {h0.backend}, engine {h0.engine}: batch {h0.batch}, {h0.d_in} -> {h0.d_out}, "
              f"{h0.steps} steps, {h0.optimizer} lr {h0.lr:g}, seed {h0.seed}; noise floor {h0.floor:.4f}")
        print(f"{'recipe':<{_name_width()}} {'final loss':>11} {'vs ' + baselines[0]:>8} {'eval':>8} {'EMA eval':>9} "
              f"{'time':>8}")
        base = hists[0].final_loss if hists[0].recipe == baselines[0] else None
        for h in hists:
            rel = "-" if base is None else f"{(h.final_loss - base) / base:+.2%}"
            print(f"{h.recipe:<{_name_width()}} {h.final_loss:>11.5f} {rel:>8} {h.eval_loss:>8.5f} {h.ema_loss:>9.5f} "
                  f"{h.seconds:>7.1f}s")
    else:
        m = h0.model
        print(f"\nTiny Shakespeare, backend {h0.backend}, engine {h0.engine}: {h0.batch} windows of {m['context']} "
              f"characters per step, width {m['context'] * m['embed']}, SwiGLU {m['hidden']}, {m['blocks']} blocks; "
              f"{h0.steps} steps, AdamW lr {h0.lr:g}, seed {h0.seed}"
              + (f"; {_outlier_note(m)}" if m.get("outliers", 1) != 1 else ""))
        print(f"{'recipe':<{_name_width()}} {'moments':>7} {'train':>7} {'val (nats)':>10} {'val bpc':>8} "
              + " ".join(f"{'vs ' + b:>8}" for b in baselines) + f" {'EMA bpc':>8} {'step':>9}")
        ref = {h.recipe: h.eval_loss for h in hists}
        for h in hists:
            rel = [f"{(h.eval_loss - ref[b]) / ref[b]:+.2%}" if b in ref else "-" for b in baselines]
            print(f"{h.recipe:<{_name_width()}} {h.model['moments']:>7} {h.final_loss:>7.4f} {h.eval_loss:>10.4f} "
                  f"{h.eval_bpc:>8.4f} " + " ".join(f"{r:>8}" for r in rel)
                  + f" {corpus.bits_per_char(h.ema_loss):>8.4f} {h.step_ms:>7.1f}ms")
        if args.torch:
            _torch_row(args, common, baselines, ref)
        timed = [h for h in hists if h.breakdown]
        if timed:  # kernels on a GPU: where each recipe's step goes
            print("\nGPU time per step by op (ms; after the first steps, which compile kernels"
                  + ("; profiled on steps that launch every kernel from Python, before the step became one CUDA "
                     "graph" if any(h.graph for h in timed) else "") + "):")
            for h in timed:
                print(f"  {h.recipe:<{_name_width()}} " + ", ".join(f"{k} {v:.2f}" for k, v in h.breakdown.items()))
            replayed = [h for h in timed if h.graph_breakdown]
            if replayed:  # the same ops without Python between the launches
                print("The forward and backward alone, replayed as one CUDA graph (no launch gaps; AdamW, the copies "
                      "and the loss's read are not in it):")
                for h in replayed:
                    print(f"  {h.recipe:<{_name_width()}} {sum(h.graph_breakdown.values()):.2f} in all: "
                          + ", ".join(f"{k} {v:.2f}" for k, v in h.graph_breakdown.items()))
            busy = [h for h in timed if h.gpu_busy is not None]
            if busy:  # the replayed steps: GPU time over wall time
                print("GPU busy during the CUDA graph's steps: "
                      + ", ".join(f"{h.recipe} {h.gpu_busy:.0%}" for h in busy))
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump([h.to_dict() for h in hists], f, indent=1)
        print(_wrote(args.json, replaced[args.json]))
    if not args.no_plot:
        os.environ.setdefault("MPLBACKEND", "Agg")
        from .course.plotting import plot_losses

        plot_losses(hists, path=args.plot)
        print(_wrote(args.plot, replaced[args.plot]))
        if any(h.breakdown for h in hists):
            from .course.plotting import plot_breakdown

            where = os.path.splitext(args.plot)[0] + "_breakdown.png"
            existed = os.path.exists(where)
            plot_breakdown(hists, path=where)
            print(_wrote(where, existed))
    return 0


def _wrote(path: str, existed: bool) -> str:
    return f"wrote {path}" + (" (replacing the file that was there)" if existed else "")


def _resume_command(args) -> str:
    """The command line typed, with --resume DIR (DIR: its --save folder) in place of any --resume."""
    import shlex

    argv, out, skip = list(args.argv), [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--resume":
            skip = True
        elif not a.startswith("--resume="):
            out.append(a)
    return "fp8lab " + shlex.join(out + ["--resume", args.save])


def _interrupted(args, part, prepared) -> str:
    """One line for Ctrl-C during training: where the last checkpoint is and the command that continues."""
    from .training import checkpoint

    head = "fp8lab train: interrupted" + (f" during {part.recipe}" if part is not None else "")
    if args.task != "chars":
        return f"{head}; nothing was saved (the teacher task keeps no checkpoints)"
    if args.save is None:
        kept = None if part is None or part.resume is None else checkpoint.peek(part.resume)
        if kept is not None:
            return (f"{head}; nothing new was saved (no --save): {part.resume / checkpoint.FILE} still holds step "
                    f"{kept['step']}")
        return f"{head}; nothing was saved (with --save DIR, --resume DIR continues a run)"
    meta = None if part is None or part.save is None else checkpoint.peek(part.save)
    cmd = _resume_command(args)
    if meta is None:
        every = prepared[part.recipe].eval_every if part is not None else None
        return (f"{head}, before its first checkpoint (one every {every} steps); the recipes finished are kept: "
                f"{cmd}")
    return (f"{head}; its last checkpoint is {part.save / checkpoint.FILE} (step {meta['step']} of "
            f"{prepared[part.recipe].steps}): {cmd}")


def _outlier_note(m) -> str:
    from .training import model as lm

    return (f"{lm.OUTLIER_CHANNELS} outlier channels x{m['outliers']:g} in W1's input (W1's columns /"
            f"{m['outliers']:g}: fp32 and bf16 unchanged)")


def _torch_row(args, common, baselines, ref) -> None:
    """The PyTorch rung (engine="torch", fp8lab.training.engine_torch): the same model, weights and batches, BF16
    autocast, when PyTorch is installed."""
    import importlib.util

    import fp8lab as fl

    from .training import corpus

    if importlib.util.find_spec("torch") is None:
        print(f"PyTorch is not installed: no PyTorch row ({TORCH_HOW})")
        return
    h = fl.train(baselines[-1], **dict(common, engine="torch", moments=None))
    rel = [f"{(h.eval_loss - ref[b]) / ref[b]:+.2%}" if b in ref else "-" for b in baselines]
    print(f"{'PyTorch ' + h.recipe:<{_name_width()}} {h.model['moments']:>7} {h.final_loss:>7.4f} {h.eval_loss:>10.4f} "
          f"{h.eval_bpc:>8.4f} " + " ".join(f"{r:>8}" for r in rel) + f" {'-':>8} {h.step_ms:>7.1f}ms  (autocast, "
          f"{h.device}; no EMA)")


def _generate(args) -> int:
    from .training import checkpoint, corpus, engine_reference

    if args.seed < 0:
        raise ValueError(f"--seed must be a non-negative int, got {args.seed}")
    if args.chars <= 0:
        raise ValueError(f"--chars must be a positive int, got {args.chars}")
    if not args.temperature > 0:
        raise ValueError(f"--temperature must be a positive number, got {args.temperature}")
    c = corpus.load()
    bad = sorted(set(args.prompt) - set(c.vocab))
    if bad:
        raise ValueError(f"--prompt holds characters outside the corpus vocabulary: {''.join(bad)!r}")
    if not args.prompt:
        raise ValueError("--prompt must hold at least one character")
    folder = checkpoint.check_resume_dir("from", args.source, cli=True)
    arrays, meta = checkpoint.read(folder / checkpoint.FILE)
    cfg, recipe, weights = checkpoint.weights(arrays, meta)
    val, floor = meta["val_loss"][-1][1], corpus.unigram_entropy()
    if val >= floor:  # it has not learned more than how often each letter occurs
        print(f"fp8lab generate: warning: {folder} is barely trained ({meta['step']} steps; validation "
              f"{corpus.bits_per_char(val):.2f} bits/char, no better than letter frequencies alone, "
              f"{corpus.bits_per_char(floor):.2f}): expect noise; train longer (--steps)", file=sys.stderr)
    ids = engine_reference.generate(engine_reference.Model(cfg, recipe), weights, c.encode(args.prompt), args.chars,
                                    np.random.default_rng(args.seed), args.temperature)
    print(args.prompt + c.decode(ids))
    return 0


def _alltoall(args) -> int:
    from . import bench
    from .comm import moe

    try:
        r = moe.run_alltoall(args.world_size, args.tokens, args.hidden, args.experts, args.top_k, args.dist_backend,
                             args.seed)
    except ImportError as e:  # PyTorch is optional
        print(f"fp8lab alltoall: error: {e}", file=sys.stderr)
        return 2
    bench.print_table("MoE all-to-all: FP8 dispatch, BF16 combine (measured here)", ["what", "result"], r.rows())
    c = moe.comm_cost(args.tokens)
    bench.print_table(f"{args.tokens} tokens per GPU at DeepSeek-V3's size (hidden 7168, 8 experts per token, at most "
                      "4 nodes; a model, not measured)", ["phase", "link", "bytes per token", "time"], c.rows())
    print(f"FP8 dispatch sends {c.fp8_dispatch_saving:.1%} fewer bytes than BF16 and saves "
          f"{c.fp8_total_saving:.1%} of dispatch + combine time")
    return 0 if r.mismatches == 0 and r.bound_ratio <= 1 else 1


def _pipeline(args) -> int:
    from .comm import pipeline

    if args.plot:
        _output_path("--plot", args.plot)
    schedules = pipeline.SCHEDULES if args.schedule == "all" else (args.schedule,)
    rows = pipeline.compare(args.stages, args.microbatches, args.F, args.B, args.W, args.FB, schedules)
    if args.plot:
        os.environ.setdefault("MPLBACKEND", "Agg")
        pipeline.plot_gantt([r["timeline"] for r in rows], path=args.plot)
        print(f"wrote {args.plot}")
    return 0


def _bench(args) -> int:
    from .kernels import load

    names = BENCHES + ("overhead", "overlap") if args.op == "all" else (args.op,)
    status = 0
    for name in names:
        if name == "overhead":  # the public API against its kernels (not a kernel module)
            from .bench import overhead

            status |= overhead.main(args.rest)
        elif name == "overlap":  # streams and the SM budget of a persistent GEMM (not a kernel module)
            from .comm import overlap

            status |= overlap.main(args.rest)
        elif name == "train":  # the capstone's step against PyTorch peers (minutes on a GPU: not part of all)
            from .training import speed

            status |= speed.main(args.rest)
        else:  # each kernel module's own options (--markdown, --check-only, ...)
            status |= load(name).main(args.rest)
    return status


def _apply_backend(choice: str | None) -> None:
    """Set FP8LAB_BACKEND for this process (and the notebooks it runs), before the backend is chosen."""
    if choice is None:
        return
    if "fp8lab.device.runtime" in sys.modules:  # called from Python after the backend was chosen
        chosen = sys.modules["fp8lab.device.runtime"].backend
        if chosen != choice:
            raise _backend.BackendError(f"--backend {choice}: this Python process already uses the {chosen!r} backend")
    os.environ[_backend.ENV_VAR] = choice


def _leading_backend(argv: list[str]) -> tuple[str | None, list[str]]:
    """(--backend value, the other arguments) for a `--backend X` given before the command."""
    if argv and argv[0].startswith("--backend="):
        return argv[0].split("=", 1)[1], argv[1:]
    if len(argv) >= 2 and argv[0] == "--backend":
        return argv[1], argv[2:]
    return None, argv


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except _backend.BackendError as e:  # no GPU for --backend gpu, a bad FP8LAB_BACKEND, ...
        print(f"fp8lab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside a training run (train says more): one line, no traceback
        print("fp8lab: interrupted", file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    choice, rest = _leading_backend(argv)
    if not any(a in ("-h", "--help") for a in rest[:2]):
        _backend.preflight(choice)  # a bad or unusable backend: one line now, not a traceback later
    if rest and rest[0] in ("worksheets", "grade"):  # they parse their own options (--help included)
        from .course import worksheets

        _apply_backend(choice)  # the notebooks' kernels inherit it
        if rest[0] == "worksheets":
            return worksheets.main(rest[1:])
        return worksheets.main(rest[1:], prog="fp8lab grade")
    if len(rest) >= 2 and rest[0] == "bench" and rest[1].startswith("-") and rest[1] not in ("-h", "--help"):
        rest = ["bench", "all", *rest[1:]]  # `fp8lab bench --check-only` means every module
    from .numerics import recipes as R  # NumPy only: the backend is still unchosen

    p = argparse.ArgumentParser(prog="fp8lab", description="FP8 training course: kernels, checks, benchmarks. "
                                "Put --backend before the command: fp8lab --backend sim info.")
    p.add_argument("--backend", choices=("gpu", "sim"), help="force a backend (same as FP8LAB_BACKEND)")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    i = sub.add_parser("info", help="backend, device and library versions")
    sub.add_parser("recipes", help="the training recipes: each GEMM operand's format and scaling, and the rest")

    t = sub.add_parser("train", help="train with an FP8 recipe (and baselines) and plot the loss")
    for sp in (i, t):
        sp.add_argument("--backend", choices=("gpu", "sim"), default=argparse.SUPPRESS,
                        help="force a backend (also accepted before the command)")
    t.add_argument("--task", default="teacher", choices=("teacher", "chars"),
                   help="teacher: one Linear + RMSNorm layer fitted to a teacher; chars: a character-level language "
                        "model of Tiny Shakespeare (default: %(default)s)")
    t.add_argument("--recipe", default="fp8-tensor", choices=tuple(R.RECIPES),
                   help=f"the recipe to train, beside a {R.BASELINES[0]} baseline (chars: and a {R.BASELINES[1]} "
                        "one); `fp8lab recipes` describes each (default: %(default)s)")
    t.add_argument("--steps", type=int, help="default: 600 (teacher) or 250 (chars) on a GPU; 20 or 3 on the "
                                             "simulator")
    t.add_argument("--seed", type=int, default=0, help="default: %(default)s")
    t.add_argument("--batch", type=int, help="teacher: rows, default 64 on a GPU, 8 on the simulator; chars: "
                                             "windows per step, default 4096 on a GPU, 8 on the simulator")
    t.add_argument("--d-in", type=int, help="teacher: input features; default: 512 on a GPU, 32 on the simulator")
    t.add_argument("--d-out", type=int, help="teacher: output features; default: 256 on a GPU, 16 on the simulator")
    t.add_argument("--lr", type=float, help="default: 1e-3 on a GPU; teacher 5e-2, chars 3e-3 on the simulator")
    t.add_argument("--optimizer", choices=("adam", "sgd", "adamw"), help="teacher: adam (default) or sgd; chars: adamw")
    t.add_argument("--noise", type=float, default=0.5, help="teacher: target noise std; the loss floor is its square")
    t.add_argument("--context", type=int, help="chars: characters the model sees (default 16 on a GPU, 2 simulated)")
    t.add_argument("--embed", type=int, help="chars: embedding width per character (default 32; 16 simulated)")
    t.add_argument("--hidden", type=int, help="chars: SwiGLU width (default 1024; 16 simulated)")
    t.add_argument("--blocks", type=int, help="chars: residual blocks (default 4; 1 simulated)")
    t.add_argument("--size", default="default", choices=SIZES,
                   help="chars: a named model size, its sizes, steps and lr as defaults (the options above still "
                        "override them): default (the backend's), large (width 2048, SwiGLU 5632, 16384 windows a "
                        "step, 300 steps: sized for the GEMMs to take most of a step; a GPU size)")
    t.add_argument("--moments", choices=R.MOMENTS,
                   help="chars: AdamW moments' storage (default: the recipe's: bf16 in fp8-deepseek, else fp32)")
    t.add_argument("--eval-batches", type=int, help="chars: batches of validation windows (default 8 on a GPU, 1 "
                                                    "simulated)")
    t.add_argument("--outliers", type=float, metavar="S",
                   help="chars: a power of two; W1's input gets a few channels S times larger and W1 those columns S "
                        "times smaller (the same product: a controlled test of per-tensor against fine-grained "
                        "scaling)")
    t.add_argument("--save", metavar="DIR", help="chars: write a checkpoint of each recipe's run to DIR/RECIPE/ at "
                                                 "every validation (atomically, with checksums)")
    t.add_argument("--resume", metavar="DIR", help="chars: finish the comparison saved in DIR: recipes whose "
                   "checkpoint has reached --steps are not trained again (their rows are read from it), an "
                   "interrupted one continues, the others start. Give the same folder to both, --save DIR --resume "
                   "DIR: from the first run on, the same command picks up where it stopped")
    t.add_argument("--torch", action="store_true", help="chars: add the PyTorch rung (the same model in PyTorch, "
                                                        "BF16 autocast) as a loss and speed peer, if installed")
    t.add_argument("--eval-every", type=int, help="chars: steps between validation losses (default 50; 3 simulated)")
    t.add_argument("--engine", default="kernels", choices=("kernels", "reference", "torch"),
                   help="Numba-CUDA kernels, the same arithmetic in NumPy, or (chars, float32 and bfloat16 recipes) "
                        "the same model in PyTorch (default: %(default)s)")
    t.add_argument("--no-baseline", action="store_true", help="skip the baseline runs")
    t.add_argument("--plot", default=os.path.join("runs", "train_loss.png"),
                   help="where to write the plot (a file there is replaced, and the output says so; default: "
                        "%(default)s)")
    t.add_argument("--no-plot", action="store_true")
    t.add_argument("--json", help="also write the histories as JSON (a file there is replaced, and the output "
                                  "says so)")
    t.add_argument("--no-progress", action="store_true")
    t.add_argument("--no-graph", action="store_true", help="chars, kernels on a GPU: launch every kernel from Python "
                   "instead of replaying the step as one CUDA graph (the same losses, bit for bit; to compare)")

    gen = sub.add_parser("generate", help="sample text from a language model saved by train --task chars --save DIR")
    gen.add_argument("--from", dest="source", required=True, metavar="DIR",
                     help="a folder holding checkpoint.npz (train --save DIR writes DIR/RECIPE/)")
    gen.add_argument("--prompt", default="ROMEO:\n", help="the text to continue (default: %(default)r)")
    gen.add_argument("--chars", type=int, default=300, help="characters to sample (default: %(default)s)")
    gen.add_argument("--temperature", type=float, default=0.8, help="softmax temperature (default: %(default)s)")
    gen.add_argument("--seed", type=int, default=0, help="fixes the sample (default: %(default)s)")

    b = sub.add_parser("bench", help="check every kernel version against its reference, then time it",
                       description="Check every version of a kernel module against its reference, then time it "
                                   "(on a GPU). OP defaults to all; options go after it: fp8lab bench gemm --markdown.")
    b.add_argument("op", nargs="?", default="all", choices=BENCHES + ("overhead", "overlap", "train", "all"),
                   metavar="OP",
                   help=f"a kernel module ({', '.join(BENCHES)}), overhead (the public API against its "
                        "preallocated kernels), overlap (copies on streams beside a GEMM; the GEMM on part of the SMs "
                        "beside a copy), train (the capstone's step time, the course's recipes against PyTorch "
                        "peers, at each size, and the crossover width; not part of all), or all (default)")
    b.add_argument("rest", nargs=argparse.REMAINDER,
                   help="passed to each kernel module: --markdown (a BENCHMARKS.md section), --check-only, and "
                        "module options (gemm: --plot PATH; fp8_gemm: --deepseek; overlap: --plot DIR; train: --sizes, "
                        "--widths, --steps, --plot PATH)")

    a = sub.add_parser("alltoall", help="MoE dispatch in FP8 and combine in BF16 as an all-to-all among processes "
                                        "(needs PyTorch)")
    a.add_argument("--world-size", type=int, default=2, help="processes, one per rank (default: %(default)s)")
    a.add_argument("--tokens", type=int, default=256, help="tokens per rank (default: %(default)s)")
    a.add_argument("--hidden", type=int, default=512, help="hidden size (default: %(default)s)")
    a.add_argument("--experts", type=int, default=16, help="routed experts, a multiple of --world-size "
                                                         "(default: %(default)s)")
    a.add_argument("--top-k", type=int, default=4, help="experts per token (default: %(default)s)")
    a.add_argument("--dist-backend", choices=("gloo", "nccl"),
                   help="torch.distributed backend (default: nccl with a GPU per rank, else gloo)")
    a.add_argument("--seed", type=int, default=0)

    pp = sub.add_parser("pipeline", help="simulate 1F1B, ZB1P and DualPipe and compare their bubbles with "
                                         "DeepSeek-V3's Table 2")

    def number(s: str):  # ints stay ints: the simulator's times are then exact
        return int(s) if s.lstrip("+-").isdigit() else float(s)

    pp.add_argument("--schedule", default="all", choices=("all", "1f1b", "zb1p", "dualpipe"),
                    help="default: %(default)s")
    pp.add_argument("--stages", type=int, default=8, help="pipeline stages PP (default: %(default)s)")
    pp.add_argument("--microbatches", type=int, default=20, help="micro-batches, both directions together for "
                                                                "dualpipe (default: %(default)s, as in Figure 5)")
    for flag, default, what in (("--F", 1, "a forward chunk"), ("--B", 2, "a full backward chunk"),
                                ("--W", 1, "the weight-gradient part of B"),
                                ("--FB", None, "an overlapped forward + backward pair (default: F + B)")):
        pp.add_argument(flag, type=number, default=default, help=f"time of {what}" +
                        ("" if default is None else " (default: %(default)s)"))
    pp.add_argument("--plot", metavar="PATH", help="also write the Gantt chart(s) there (PNG)")

    w = sub.add_parser("worksheets", help="start a worksheet in work/, grade it; instructors: build exercises/",
                       add_help=False)
    w.add_argument("rest", nargs=argparse.REMAINDER)
    g = sub.add_parser("grade", help="run a worksheet headless and print a score table per question")
    g.add_argument("rest", nargs=argparse.REMAINDER)

    args = p.parse_args(rest if choice is None else ["--backend", choice, *rest])
    if choice is None and args.backend is not None:
        _backend.preflight(args.backend)
    _apply_backend(args.backend)
    args.argv = argv  # train: the command that resumes an interrupted run
    import fp8lab

    if args.cmd in ("train", "generate"):  # a warning is one line, in the command's words
        import warnings

        def show(message, category, *_, **__):
            print(f"fp8lab {args.cmd}: warning: {message}", file=sys.stderr)

        warnings.showwarning = show
    try:
        if args.cmd == "info":
            fp8lab.info(show=True)
            return 0
        if args.cmd == "recipes":
            print("\n".join(r.describe() for r in R.RECIPES.values()))
            return 0
        if args.cmd == "train":
            return _train(args)
        if args.cmd == "generate":
            return _generate(args)
        if args.cmd == "alltoall":
            return _alltoall(args)
        if args.cmd == "pipeline":
            return _pipeline(args)
        return _bench(args)
    except (ValueError, TypeError) as e:  # bad arguments: say what was wrong, without a traceback
        print(f"fp8lab {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
