"""Checkpoints that cannot be trusted are refused before use, and a run killed at any moment keeps one that can.

The fault suite: a checkpoint truncated, replaced by random bytes, emptied, stripped of its metadata, with bytes
flipped, arrays of the wrong shape or dtype, an array missing or added, an array changed behind its checksum, broken
JSON, a pickled object array, the older format without checksums. Each is one line naming the file (a CheckpointError,
a ValueError, from the API; exit 2 from the command line) and nothing is written. Then SIGKILL at random moments: a
process saving in a loop, and training runs of both engines; each time the previous checkpoint still loads and the
run resumed from it ends bit for bit where an uninterrupted run does.
"""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

import fp8lab as fl
from fp8lab.training import checkpoint
from fp8lab.training.checkpoint import FILE, CheckpointError

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(task="chars", batch=8, context=2, embed=16, hidden=16, blocks=1, eval_every=1)
REF = dict(SMALL, engine="reference", progress=False)
CLI_SMALL = ["--task", "chars", "--recipe", "fp32", "--no-baseline", "--engine", "reference", "--batch", "8",
             "--context", "2", "--embed", "16", "--hidden", "16", "--blocks", "1", "--eval-every", "1", "--no-plot",
             "--no-progress"]


def cli(*args, cwd=None):
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "fp8lab.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=600)


def one_line(r, *words):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A whole checkpoint of the reference engine after 3 steps: base/fp32/checkpoint.npz."""
    d = tmp_path_factory.mktemp("base")
    fl.train("fp32", steps=3, save=d / "fp32", **REF)
    return d / "fp32" / FILE


def members(path: Path) -> dict:
    with zipfile.ZipFile(path) as z:
        return {n[:-4]: np.lib.format.read_array(z.open(n)) for n in z.namelist()}


def npz(arrays: dict) -> bytes:
    f = io.BytesIO()
    np.savez(f, **arrays)
    return f.getvalue()


def edit(fn):
    """A fault made by changing the archive's arrays (and its metadata, a dict) and writing it again."""
    def fault(data: bytes, path: Path) -> bytes:
        a = members(path)
        meta = json.loads(a["__meta__"].tobytes())
        a, meta = fn(a, meta)
        if meta is not None:
            a["__meta__"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        return npz(a)
    return fault


def _cut(a, meta):
    a["params/emb"] = a["params/emb"][:1]  # the probe: one row of the embedding
    return a, meta


def _reshaped(a, meta):
    a["params/head"] = a["params/head"].T.copy()
    return a, meta


def _dtype(a, meta):
    a["m/head"] = a["m/head"].astype(np.float64)
    return a, meta


def _missing(a, meta):
    del a["v/gf"]
    return a, meta


def _extra(a, meta):
    a["params/extra"] = np.zeros(3, np.float32)
    return a, meta


def _changed(a, meta):  # a weight changed, the checksum written beside it not
    a["params/emb"] = a["params/emb"] + np.float32(1)
    return a, meta


def _nometa(a, meta):
    del a["__meta__"]
    return a, None


def _json(a, meta):
    a["__meta__"] = a["__meta__"][:-7]
    return a, None


def _pickled(a, meta):
    a["params/emb"] = np.array([{"x": 1}, None], dtype=object)
    return a, meta


def _old_format(a, meta):  # what fp8lab wrote before checksums
    meta.pop("sha256")
    meta.pop("format")
    return a, meta


def _flip(data: bytes, path: Path) -> bytes:
    """One byte of an array's data flipped (the archive's CRC of that member no longer matches)."""
    with zipfile.ZipFile(path) as z:
        offset = z.getinfo("params/head.npy").header_offset
    name_len, extra_len = struct.unpack("<HH", data[offset + 26:offset + 30])  # the member's local header
    start = offset + 30 + name_len + extra_len + 128  # past the .npy header
    b = bytearray(data)
    b[start + 17] ^= 0x40
    return bytes(b)


FAULTS = {
    "truncated": (lambda d, p: d[: len(d) // 2], "truncated"),
    "truncated by a few bytes": (lambda d, p: d[:-5], "truncated"),
    "random bytes": (lambda d, p: np.random.default_rng(27).bytes(len(d)), "not a checkpoint (not an .npz archive)"),
    "empty": (lambda d, p: b"", "empty (0 bytes)"),
    "no metadata": (edit(_nometa), "no metadata"),
    "flipped byte": (_flip, "the bytes of params/head changed"),
    "cut embedding": (edit(_cut), "params/emb has shape (1, 16), not (65, 16)"),
    "transposed head": (edit(_reshaped), "params/head has shape (32, 65), not (65, 32)"),
    "wrong dtype": (edit(_dtype), "m/head has dtype float64, not float32"),
    "missing array": (edit(_missing), "the array 'v/gf' is missing"),
    "extra array": (edit(_extra), "params/extra"),
    "changed behind its checksum": (edit(_changed), "checksum mismatch in params/emb"),
    "broken JSON": (edit(_json), "its metadata is not valid JSON"),
    "pickled object array": (edit(_pickled), "'params/emb' is an object array"),
    "no checksums (older format)": (edit(_old_format), "no checksums"),
}


def damaged(base: Path, tmp_path: Path, kind: str) -> Path:
    """tmp_path/run/fp32/checkpoint.npz: base with the fault `kind`."""
    make, _ = FAULTS[kind]
    d = tmp_path / "run" / "fp32"
    d.mkdir(parents=True)
    (d / FILE).write_bytes(make(base.read_bytes(), base))
    return d / FILE


@pytest.mark.parametrize("kind", FAULTS)
def test_a_damaged_checkpoint_is_refused_in_one_line_naming_the_file(base, tmp_path, kind):
    path = damaged(base, tmp_path, kind)
    words = FAULTS[kind][1]
    before = sorted((p.name, p.read_bytes()) for p in path.parent.iterdir())
    with pytest.raises(CheckpointError, match="^" + str(path).replace("\\", "\\\\") + ": ") as e:
        checkpoint.read(path)
    assert words in str(e.value) and "\n" not in str(e.value)
    # the API: a ValueError before the first step; nothing written
    with pytest.raises(ValueError, match="^" + str(path)):
        fl.train("fp32", steps=5, resume=path.parent, save=path.parent, **REF)
    with pytest.raises(ValueError, match="^" + str(path)):
        checkpoint.model_of(path.parent)
    assert sorted((p.name, p.read_bytes()) for p in path.parent.iterdir()) == before


@pytest.mark.parametrize("kind", ["truncated", "random bytes", "cut embedding", "changed behind its checksum",
                                  "pickled object array"])
def test_the_command_line_refuses_a_damaged_checkpoint_with_exit_2(base, tmp_path, kind):
    path = damaged(base, tmp_path, kind)
    before = path.read_bytes()
    run = path.parent.parent
    r = cli("train", *CLI_SMALL, "--steps", "5", "--resume", str(run), "--save", str(run), cwd=tmp_path)
    one_line(r, str(path), FAULTS[kind][1])
    r = cli("generate", "--from", str(path.parent), cwd=tmp_path)  # was an IndexError or a reshape error
    one_line(r, str(path), FAULTS[kind][1])
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == [FILE]


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.9, 0.999])
def test_a_checkpoint_cut_anywhere_is_refused(base, tmp_path, cut):
    path = tmp_path / FILE
    data = base.read_bytes()
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(CheckpointError, match="truncated|damaged"):
        checkpoint.read(path)


def test_flipped_bytes_anywhere_are_refused(base, tmp_path):
    """A byte flipped at random places: the archive's structure, an array's header or data, or the metadata; each
    time a CheckpointError naming the file (or, in a zip header field that nothing reads, a checkpoint whose arrays
    are all unchanged)."""
    data, want = base.read_bytes(), checkpoint.read(base)
    rng = np.random.default_rng(2027)
    path = tmp_path / FILE
    for pos in rng.integers(0, len(data), 40):
        b = bytearray(data)
        b[pos] ^= 1 << int(rng.integers(8))
        path.write_bytes(bytes(b))
        try:
            arrays, meta = checkpoint.read(path)
        except CheckpointError as e:
            assert str(e).startswith(f"{path}: ") and "\n" not in str(e)
            continue
        assert meta == want[1] and all(np.array_equal(arrays[k], want[0][k]) for k in want[0]), pos


def test_a_checkpoint_of_another_configuration_names_each_difference(base):
    with pytest.raises(ValueError, match=r"resume='.*' holds a checkpoint of another configuration \(context: "
                                         r"checkpoint 2, this run 4; hidden: checkpoint 16, this run 8\)"):
        fl.train("fp32", steps=5, resume=base.parent, **{**REF, "context": 4, "hidden": 8})


# ------------------------------------------------------------------------------------------ killed by SIGKILL

SAVER = r"""
import sys
import numpy as np
from fp8lab.training import checkpoint
model = dict(vocab=65, context=2, embed=16, hidden=2048, blocks=4, outliers=1.0, moments="fp32")
shapes = checkpoint.layout(dict(engine="reference", model=model))
for i in range(1, 10**6):  # every array of save i holds i
    arrays = {k: np.full(s, i, d) for k, (s, d) in shapes.items()}
    meta = dict(recipe="fp32", engine="reference", model=model, step=i, rng={}, loss=[0.0] * i, val_loss=[],
                step_seconds=[0.0] * i)
    checkpoint.save(sys.argv[1], arrays, meta)
    print(i, flush=True)
"""


def test_a_process_killed_while_saving_leaves_the_previous_checkpoint(tmp_path):
    """SIGKILL at random moments of a process writing 13 MB checkpoints in a loop: the file left is always a whole
    checkpoint, the last one finished or the one after it."""
    rng = np.random.default_rng(2412)
    for attempt in range(4):
        proc = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        done = [int(proc.stdout.readline())]  # the first checkpoint is whole
        time.sleep(rng.uniform(0.0, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        done += [int(line) for line in proc.stdout.read().split()]
        arrays, meta = checkpoint.read(tmp_path / FILE)
        assert meta["step"] in (done[-1], done[-1] + 1), (meta["step"], done[-1])
        assert all((a == meta["step"]).all() for a in arrays.values())
    assert sorted(p.name for p in tmp_path.iterdir()) in ([FILE], [FILE, FILE + ".tmp"])


def _state(folder: Path) -> tuple:
    arrays, meta = checkpoint.read(folder / FILE)
    return arrays, {k: meta[k] for k in ("step", "rng", "loss", "val_loss", "ema_loss")}


def _same(a: tuple, b: tuple) -> None:
    assert a[1] == b[1]
    assert a[0].keys() == b[0].keys() and all(np.array_equal(a[0][k], b[0][k]) for k in a[0]), "state differs"


def _kill_after_checkpoint(args, folder: Path, wait: float):
    """Start `fp8lab train args`, wait for a checkpoint in folder newer than any there now, then `wait` seconds,
    then SIGKILL."""
    before = (folder / FILE).stat().st_mtime_ns if (folder / FILE).exists() else None
    proc = subprocess.Popen([sys.executable, "-m", "fp8lab.cli", "train", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if (folder / FILE).exists() and (folder / FILE).stat().st_mtime_ns != before:
            break
        time.sleep(0.02)
    time.sleep(wait)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate()
    assert proc.returncode in (-signal.SIGKILL, 0), err


def test_reference_runs_killed_at_random_moments_resume_bit_for_bit(tmp_path):
    """Three SIGKILLs of the reference engine (a checkpoint every step), each run resuming the last: after each the
    checkpoint loads, and the run resumed from it to two steps further ends where an uninterrupted run does."""
    rng = np.random.default_rng(27)
    run = tmp_path / "run"
    args = [*CLI_SMALL, "--steps", "100000", "--save", str(run)]
    step = 0
    for k in range(3):
        _kill_after_checkpoint(args + (["--resume", str(run)] if k else []), run / "fp32", rng.uniform(0, 0.5))
        _, meta = checkpoint.read(run / "fp32" / FILE)
        assert meta["step"] >= step
        step = meta["step"]
    end = step + 2
    resumed = fl.train("fp32", steps=end, resume=run / "fp32", save=run / "fp32", **REF)
    whole = fl.train("fp32", steps=end, save=tmp_path / "whole", **REF)
    assert resumed.loss == whole.loss and resumed.val_loss == whole.val_loss and resumed.ema_loss == whole.ema_loss
    _same(_state(run / "fp32"), _state(tmp_path / "whole"))


def test_a_kernel_engine_run_killed_resumes_bit_for_bit(tmp_path):
    """The kernel engine (flat buffers, bfloat16 moments as uint16) under SIGKILL at a random moment after its first
    checkpoint: the checkpoint loads, and resuming it to step 2 ends bit for bit where an uninterrupted run does."""
    rng = np.random.default_rng(3)
    run = tmp_path / "run"
    args = ["--task", "chars", "--recipe", "fp8-deepseek", "--no-baseline", "--engine", "kernels", "--batch", "8",
            "--context", "2", "--embed", "16", "--hidden", "16", "--blocks", "1", "--eval-every", "1", "--no-plot",
            "--no-progress", "--steps", "2", "--save", str(run)]
    _kill_after_checkpoint(args, run / "fp8-deepseek", rng.uniform(0, 2))
    arrays, meta = checkpoint.read(run / "fp8-deepseek" / FILE)
    assert arrays["m"].dtype == np.uint16 and meta["step"] in (1, 2)
    kw = dict(SMALL, engine="kernels", progress=False)
    if meta["step"] == 1:
        fl.train("fp8-deepseek", steps=2, resume=run / "fp8-deepseek", save=run / "fp8-deepseek", **kw)
    fl.train("fp8-deepseek", steps=2, save=tmp_path / "whole", **kw)
    _same(_state(run / "fp8-deepseek"), _state(tmp_path / "whole"))
