"""ws13: two-stream overlap: a copy and the FP8 GEMM on two streams (fp8lab.comm.streams.try_overlap), a
double-buffered pipeline of copies and GEMMs ordered by events, and a timer made of CUDA events.

Under the simulator streams and events do nothing (every operation runs at once, in issue order), so a plan with a
race still gives right outputs there. The pipeline check therefore does both: it runs the plan and verifies every
output (poisoned first), and it replays the plan's order (which op on which stream, which event recorded and waited
where) to find every pair of operations that may run in the wrong order on a GPU."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from ... import _validate as V
from ...comm import overlap_common as oc
from ...comm import streams as st
from ...device import runtime
from ...device.runtime import cuda
from ...kernels import fp8_gemm as fg
from ...numerics.spec import ScaleKind
from ._core import NotAttempted, fail, not_attempted_message, question, still_a_placeholder

__all__ = ["PIPELINE_SIZES", "PipelineBatches", "pipeline_batches", "issue_overlap", "pipeline", "time_ms"]

PIPELINE_SIZES = {"sim": dict(gemm=(20, 9, 100), n=5),  # one GEMM tile: seconds on the simulator
                  "check": dict(gemm=(500, 384, 700), n=5),  # a GPU: verified against NumPy
                  "gpu": dict(gemm=(4096, 7168, 16384), n=6)}  # a GPU: 64 MiB copies, about as long as a GEMM


# ------------------------------------------------------------------------------------------- Q1: try_overlap


@question
def issue_overlap(fn, rng=None):
    """Check `fn(copy, gemm)` (fp8lab.comm.streams.try_overlap's `issue`): the copy and the GEMM each issued once,
    on two different streams; try_overlap verifies both outputs."""
    q = "issue_overlap"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    sizes = {} if runtime.IS_SIM else dict(oc.CHECK_SIZES["streams"])
    sizes.pop("d2h_bytes", None)
    try:
        r = st.try_overlap(fn, rng=rng, repeat=1, **sizes)
    except NotImplementedError:
        raise
    except (TypeError, ValueError) as e:
        fail(q, [f"try_overlap refused your plan: {e}"],
             "each op takes one stream; give the copy and the GEMM different ones, and call each once")
    except AssertionError as e:
        fail(q, [f"an output was wrong: {e}"], "call copy and gemm once each; nothing else")
    except Exception as e:
        fail(q, [f"issue_overlap raised {type(e).__name__}: {e}"[:600]],
             "copy(stream) and gemm(stream) take one argument: a stream from cuda.stream()")
    if r.streams != 2:
        fail(q, ["the copy and the GEMM were issued on one stream: the GEMM waits until the copy has finished"],
             "ops on one stream run one after the other: give the GEMM a stream of its own")
    return "the copy and the GEMM on two streams, both outputs right (try_overlap)"


# ------------------------------------------------------------------------------------------- Q2: the pipeline


@dataclasses.dataclass
class _Op:
    kind: str  # "copy" or "gemm"
    i: int
    stream: object
    before: frozenset  # ops (kind, i) that are sure to have finished before this one starts


class _Event:
    """An event the plan makes through `event()`: a real cuda.event(), and the plan's order logged."""

    def __init__(self, batches):
        self._b = batches
        self._real = cuda.event()
        self.snapshot = None  # the ops finished when the last record() completes; None: never recorded

    def record(self, stream=None):
        self._b._need_stream("event.record(stream)", stream)
        self.snapshot = frozenset(self._b._frontier.get(id(stream), frozenset()))
        self._real.record(stream)

    def wait(self, stream=None):
        self._b._need_stream("event.wait(stream)", stream)
        if self.snapshot is None:
            self._b.problems.append("an event was waited on before it was recorded: a wait on an event never "
                                    "recorded waits for nothing (record it after the copy, then wait for it)")
        else:
            self._b._frontier[id(stream)] = self._b._frontier.get(id(stream), frozenset()) | self.snapshot
        self._real.wait(stream)

    def synchronize(self):
        self._b.host_waits += 1
        if self.snapshot is not None:
            self._b._host |= self.snapshot
        self._real.synchronize()


class PipelineBatches:
    """n batches of an FP8 GEMM y[i] = a[i] @ w.T: a[i]'s codes (M, K) in pinned host memory, copied to one of two
    device buffers (batch i to buffer i % 2) by `copy(i, stream)`; `gemm(i, stream)` runs fp8_gemm version 7 on that
    buffer (a's 1 x 128 tile scales, already on the device) into y[i]. `run(plan)` calls plan(n, copy, gemm, event)
    and logs what it issued; `verify()` checks the outputs and `hazards()` the order."""

    def __init__(self, n=None, gemm=None, rng=None):
        size = PIPELINE_SIZES["sim" if runtime.IS_SIM else "check"]
        self.n = V.positive_int("n", size["n"] if n is None else n)
        self.M, self.N, self.K = oc.check_shape("gemm", size["gemm"] if gemm is None else gemm)
        rng = np.random.default_rng() if rng is None else rng
        fg.check_device(7)
        qa = [fg.random_operands(rng, self.M, 1, self.K)[0] for _ in range(self.n)]
        self.qb = fg.random_operands(rng, 1, self.N, self.K)[1]
        self.qa = qa
        self.host = cuda.pinned_array((self.n, self.M, self.K), np.uint8)  # pinned: copied while the host goes on
        for i, q in enumerate(qa):
            self.host[i] = q.data
        self.scales = [cuda.to_device(q.scale) for q in qa]
        self.buffers = [cuda.device_array((self.M, self.K), np.uint8) for _ in range(2)]
        self.b_dev = fg.operand_on_device(self.qb)
        self.y = [cuda.device_array((self.M, self.N), np.float32) for _ in range(self.n)]
        self.sms = min(fg.device_sms(), fg.tiles(self.M, self.N))
        self.flops = 2.0 * self.M * self.N * self.K * self.n
        self.copy_bytes = self.M * self.K * self.n

    # the plan's three tools ----------------------------------------------------------------------------------

    def _need_stream(self, what, stream):
        if stream is None or isinstance(stream, int) or not callable(getattr(stream, "synchronize", None)):
            raise TypeError(f"{what}: stream must be a CUDA stream you made with cuda.stream(), got "
                            f"{V.describe(stream)}")

    def _issue(self, kind, i, stream):
        self._need_stream(f"{kind}(i, stream)", stream)
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.n:
            raise ValueError(f"{kind}(i, stream): i must be a batch number 0..{self.n - 1}, got {V.describe(i)}")
        if (kind, int(i)) in self._done:
            raise ValueError(f"{kind}({i}, stream) was called twice: each batch is copied once and multiplied once")
        frontier = self._frontier.get(id(stream), frozenset())
        op = _Op(kind, int(i), stream, frozenset(frontier | self._host))
        self.ops.append(op)
        self._done.add((kind, int(i)))
        self._frontier[id(stream)] = frontier | {(kind, int(i))}
        if kind == "copy":
            self.buffers[i % 2].copy_to_device(self.host[i], stream=stream)
        else:
            fg.launch(self.buffers[i % 2], self.scales[i], self.b_dev.data, self.b_dev.scale, self.y[i],
                      ScaleKind.TILE, ScaleKind.BLOCK, version=7, sms=self.sms, stream=stream)

    def copy(self, i, stream=None):
        """Copy batch i's codes from pinned host memory into device buffer i % 2, on `stream`."""
        self._issue("copy", i, stream)

    def gemm(self, i, stream=None):
        """y[i] = the FP8 GEMM of device buffer i % 2 (batch i's codes once copied) with the weights, on `stream`."""
        self._issue("gemm", i, stream)

    def event(self):
        """A new CUDA event (`.record(stream)`, `.wait(stream)`, `.synchronize()`), its uses logged."""
        return _Event(self)

    # running and checking ------------------------------------------------------------------------------------

    def run(self, plan, poison=True):
        """Poison the outputs and buffers, call plan(n, copy, gemm, event), wait for the GPU."""
        self.ops, self.problems, self._done, self._frontier, self._host, self.host_waits = [], [], set(), {}, \
            frozenset(), 0
        if poison:
            for arr in self.y:
                arr.copy_to_device(np.full((self.M, self.N), np.nan, np.float32))
            for buf in self.buffers:
                buf.copy_to_device(np.full((self.M, self.K), 0x7F, np.uint8))  # E4M3 NaN codes
        plan(self.n, self.copy, self.gemm, self.event)
        cuda.synchronize()

    def missing(self) -> list[str]:
        return [f"{k}({i})" for i in range(self.n) for k in ("copy", "gemm") if (k, i) not in self._done]

    def verify(self) -> None:
        """AssertionError unless every y[i] is batch i's GEMM (bit for bit with fp8_gemm.reference under the
        simulator, within its tensor-core bound on a GPU; not checked past 2^31 multiply-adds, NaN always)."""
        for i in range(self.n):
            oc.assert_gemm(f"batch {i}", self.y[i].copy_to_host(), self.qa[i], self.qb)

    def hazards(self) -> list[str]:
        """Pairs that may run in the wrong order on a GPU: gemm(i) before copy(i) has landed, copy(i) over the
        buffer gemm(i - 2) still reads."""
        by = {(op.kind, op.i): op for op in self.ops}
        out = []
        for i in range(self.n):
            g, c = by.get(("gemm", i)), by.get(("copy", i))
            if g and c and ("copy", i) not in g.before:
                out.append(f"gemm({i}) may start before copy({i}) has finished: it reads buffer {i % 2} while the "
                           "copy still writes it")
            if c and i >= 2 and ("gemm", i - 2) in by and ("gemm", i - 2) not in c.before:
                out.append(f"copy({i}) may overwrite buffer {i % 2} while gemm({i - 2}) still reads it")
        return out

    def overlaps(self) -> bool:
        """Some copy(i + 1) and gemm(i) are free to run at the same time."""
        by = {(op.kind, op.i): op for op in self.ops}
        return any(("copy", i + 1) in by and ("gemm", i) in by and ("gemm", i) not in by[("copy", i + 1)].before
                   and ("copy", i + 1) not in by[("gemm", i)].before for i in range(self.n - 1))


def pipeline_batches(n=None, gemm=None, rng=None) -> PipelineBatches:
    """The batches ws13's pipeline works on: n batches of an (M, N, K) FP8 GEMM (None: a size that runs in seconds,
    on the simulator or, verified against NumPy, on a GPU; PIPELINE_SIZES["gpu"] is the one to time)."""
    return PipelineBatches(n, gemm, rng)


def _hazard_hint(problems):
    raw = "an event recorded on the copy stream right after copy(i), waited on by the GEMM stream before gemm(i)"
    war = ("buffer i % 2 is reused: an event recorded on the GEMM stream after gemm(i - 2), waited on by the copy "
           "stream before copy(i)")
    text = " ".join(problems)
    if "before it was recorded" in text:
        return "record each event (on the stream of the op it marks) before any stream waits for it"
    return " And ".join(h for h, key in ((raw, "before copy("), (war, "while gemm(")) if key in text) or raw


def _as_plan(fn):
    def plan(n, copy, gemm, event):
        return fn(n, copy, gemm, event)
    return plan


@question
def pipeline(fn, rng=None):
    """Check `fn(n, copy, gemm, event)`: every batch copied and multiplied once, the outputs right (poisoned
    first), no race on a GPU (gemm(i) after copy(i); copy(i) after gemm(i - 2), whose buffer it reuses, through
    events), and copies free to overlap GEMMs."""
    q = "pipeline"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    b = PipelineBatches(rng=rng)
    try:
        b.run(_as_plan(fn))
    except NotImplementedError:
        raise
    except (TypeError, ValueError) as e:
        fail(q, [f"the plan was refused: {e}"], "copy(i, stream) and gemm(i, stream) once each per batch, with "
                                                 "streams from cuda.stream(); events from event()")
    except Exception as e:
        fail(q, [f"pipeline raised {type(e).__name__}: {e}"[:600]],
             "the tools: copy(i, s), gemm(i, s), ev = event(), ev.record(s), ev.wait(s)")
    if b.missing():
        fail(q, [f"never issued: {', '.join(b.missing())}"], f"loop over every batch i = 0 .. n - 1 (n = {b.n})")
    try:
        b.verify()
    except AssertionError as e:
        fail(q, [f"a wrong output: {e}"], "each gemm(i) must follow its own copy(i)")
    problems = b.problems + b.hazards()
    if problems:
        fail(q, ["the outputs are right here (the simulator runs everything in issue order), but on a GPU:"]
             + [f"  {p}" for p in problems[:3]],
             _hazard_hint(problems))
    if not b.overlaps():
        streams = {id(op.stream) for op in b.ops}
        fail(q, ["no copy can run beside a GEMM: " + ("everything is on one stream" if len(streams) == 1 else
                 "every copy waits for the GEMM before it, or the host waits (synchronize)")],
             "put the copies on one stream and the GEMMs on another; copy(i + 1) needs only gemm(i - 1) done, "
             "not gemm(i)")
    return (f"{b.n} batches copied and multiplied, every output right, no race on a GPU (events order "
            "copy(i) -> gemm(i) and gemm(i - 2) -> copy(i)), copies free to overlap GEMMs")


# ------------------------------------------------------------------------------------------- Q3: timing


class _TimingEvent:
    def __init__(self, log, real):
        self.log, self.real, self.stream = log, real, None

    def record(self, stream=0):
        self.log.append(("record", self, stream))
        self.real.record(stream)

    def synchronize(self):
        self.log.append(("sync", self))
        self.real.synchronize()

    def wait(self, stream=0):
        self.real.wait(stream)

    def query(self):
        return self.real.query() if hasattr(self.real, "query") else True

    def elapsed_time(self, other):
        if not isinstance(other, _TimingEvent):
            raise TypeError(f"elapsed_time(event): expected an event from cuda.event(), got {V.describe(other)}")
        if runtime.IS_SIM:  # start.elapsed_time(end) = end - start, in made-up milliseconds
            ms = getattr(other, "_fake", 0.0) - getattr(self, "_fake", 0.0)
        else:  # the end event waited for silently (elapsed_time raises before it completes); the log says whether
            other.real.synchronize()  # the answer waited for it itself
            ms = self.real.elapsed_time(other.real)
        self.log.append(("elapsed", self, other, ms))
        return ms


@contextlib.contextmanager
def _logged_events(log, clock):
    """cuda.event and cuda.synchronize replaced, for the duration, by versions that log their use. Under the
    simulator an event's time is `clock()` when recorded (events there report no times)."""
    saved = cuda.event, cuda.synchronize

    def event(*args, **kwargs):
        ev = _TimingEvent(log, saved[0](*args, **kwargs))
        if runtime.IS_SIM:
            rec = ev.record

            def record(stream=0):
                ev._fake = clock()
                rec(stream)
            ev.record = record
        return ev

    def synchronize():
        log.append(("device sync",))
        saved[1]()

    cuda.event, cuda.synchronize = event, synchronize
    try:
        yield
    finally:
        cuda.event, cuda.synchronize = saved


def _default(stream) -> bool:
    """The default stream: no argument, 0, or numba's default-stream objects (their repr says so)."""
    return stream is None or (isinstance(stream, int) and stream == 0) or "default" in repr(stream).lower()


@question
def time_ms(fn, rng=None):
    """Check `fn(run) -> float`: run() called once between two events recorded on the default stream, the end event
    waited for, and start.elapsed_time(end) returned in milliseconds (under the simulator the events get made-up
    times, so the check can tell what came back)."""
    q = "time_ms"
    if still_a_placeholder(fn):
        raise NotAttempted(not_attempted_message(q, fn))
    rng = np.random.default_rng() if rng is None else rng
    log, calls = [], []
    t = [float(rng.uniform(1, 5))]

    def clock():
        t[0] += float(rng.uniform(0.5, 3))
        return t[0]

    work = cuda.to_device(np.zeros(1 << 16, np.float32))

    def run():
        calls.append(1)
        log.append(("run start",))
        clock()
        work.copy_to_device(np.ones(1 << 16, np.float32))  # something to time on a GPU
        clock()
        log.append(("run end",))

    with _logged_events(log, clock):
        try:
            got = fn(run)
        except NotImplementedError:
            raise
        except Exception as e:
            fail(q, [f"time_ms(run) raised {type(e).__name__}: {e}"[:600]],
                 "two events around run(), recorded on the default stream; wait for the second before reading the "
                 "time between them (check.hint gives the code)")
    if len(calls) != 1:
        fail(q, [f"run() was called {len(calls)} times: expected once"], "call run() once, between the two records")
    i0 = log.index(("run start",))
    i1 = log.index(("run end",))
    before = [e for e in log[:i0] if e[0] == "record"]
    after = [e for e in log[i1:] if e[0] == "record"]
    elapsed = [e for e in log if e[0] == "elapsed"]
    if not before or not after:
        fail(q, ["no event was recorded " + ("before run()" if not before else "after run()")],
             "record one event before calling run() and one after it")
    if any(not _default(e[2]) for e in before + after):
        fail(q, ["an event was recorded on a stream of your own: it times that stream only"],
             "record() with no argument uses the default stream, which waits for the work on every stream")
    if not elapsed:
        fail(q, ["elapsed_time was never called"], "return start.elapsed_time(end): milliseconds from start to end")
    _, first, second, ms = elapsed[-1]
    start_ev, end_ev = before[-1][1], after[-1][1]
    if (first, second) == (end_ev, start_ev):
        fail(q, [f"returned a negative time ({got!r}): end.elapsed_time(start)"], "start.elapsed_time(end)")
    if (first, second) != (start_ev, end_ev):
        fail(q, ["elapsed_time was not taken from the event recorded before run() to the one recorded after it"],
             "start.elapsed_time(end)")
    k_el = log.index(elapsed[-1])
    k_end = log.index(after[-1])
    if not any(e[0] == "device sync" or (e[0] == "sync" and e[1] is end_ev) for e in log[k_end:k_el]):
        fail(q, ["the end event was not waited for before elapsed_time: on a GPU it has not happened yet when the "
                 "host gets there, and elapsed_time raises"], "end.synchronize() before reading the time")
    try:
        value = float(got)
    except (TypeError, ValueError):
        fail(q, [f"time_ms returned {got!r}: expected a number of milliseconds"], "return start.elapsed_time(end)")
    if value != ms:
        unit = (" (that is the time in seconds)" if np.isclose(value, ms / 1000) else
                " (that is in microseconds)" if np.isclose(value, ms * 1000) else "")
        fail(q, [f"returned {value!r}, but the events measured {ms!r} ms{unit}"],
             "elapsed_time already gives milliseconds: return it as it is")
    return "run() timed between two events on the default stream, the end event waited for, milliseconds returned"
