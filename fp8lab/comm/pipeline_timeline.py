"""A simulated pipeline schedule as data: `Event` (one operation on one device) and `Timeline` (every device's
events, the makespan, the idle time per device, the activations held), with `Timeline.check`, which verifies a
timeline from its events alone. `fp8lab.comm.pipeline.simulate` and `time_orders` make them.

Times: F = one forward chunk, B = one full backward chunk (input gradient + weight gradient), W = the weight-gradient
part of B, FB = an overlapped forward + backward pair (DeepSeek-V3's Table 2 writes it F&B).
"""

from __future__ import annotations

import dataclasses
import math

KINDS = ("F", "B", "W", "FB")


@dataclasses.dataclass(frozen=True)
class Event:
    """One operation on one device.

    kind: "F" (forward chunk), "B" (backward chunk: full, or input-gradient only when split), "W" (weight gradient of
    a split B) or "FB" (a forward and a full backward chunk, overlapped). microbatch / direction: the chunk's
    micro-batch and direction (0: enters at stage 0; 1: enters at the last stage, DualPipe only); for "FB", those
    of its forward half, and b_microbatch / b_direction those of its backward half. Micro-batches are numbered
    from 0 within each direction. split: a "B" whose W runs as its own event.
    """

    stage: int
    kind: str
    microbatch: int
    direction: int
    start: int | float
    end: int | float
    b_microbatch: int | None = None
    b_direction: int | None = None
    split: bool = False


@dataclasses.dataclass(frozen=True)
class Timeline:
    """A simulated schedule.

    events: per device (stage), its Events in time order. makespan: the end of the last event. busy: per device,
    the sum of its events' durations. stage_bubbles: per device, makespan - busy (idle time). bubble: the largest
    of them; equal on every device for 1f1b and zb1p, and for dualpipe when FB = F + B (with FB < F + B, the
    devices near the ends run a few more un-overlapped F, B pairs, so they are busier and idle less; Table 2's
    value is the idle time of the middle devices, which overlap the most).

    peak_activations: per device, the most micro-batches' activations held at once, in units of "the activations
    of one micro-batch on one stage (one chunk)": held from the start of its forward chunk to the end of its
    backward (of its W, where the backward is split: W still reads the layer inputs); in an overlapped FB pair
    the forward's are counted before the backward's are freed. A DualPipe device holds chunks of both directions
    (its stages i and PP-1-i) and counts both. activations: the largest (Table 2's column: PP, PP, PP+1).
    parameters: copies of the model's parameters per device (1, or 2 for DualPipe).
    """

    schedule: str
    stages: int
    microbatches: int
    F: int | float
    B: int | float
    W: int | float
    FB: int | float
    events: tuple
    makespan: int | float
    busy: tuple
    stage_bubbles: tuple
    bubble: int | float
    peak_activations: tuple
    activations: int
    parameters: int

    def check(self) -> Timeline:
        """Verify the timeline from its events alone; raise AssertionError naming the first problems.

        Checks: events on each device in order without overlap, each lasting its kind's time; every (micro-batch,
        direction, stage) has exactly one F and one B (as "B" or inside an "FB") on the right device, and one W
        exactly when its B is split; every dependency (forward after the previous stage's forward, backward after
        the next stage's backward and its own forward, W after its B); the summary fields. Returns self.
        """
        bad: list[str] = []
        P, N = self.stages, self.microbatches
        dual = self.schedule == "dualpipe"
        ndir, per_dir = (2, N // 2) if dual else (1, N)
        span = max(abs(float(self.makespan)), 1.0)

        def close(a, b):
            return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9 * span)

        def device(k, d):  # the device that runs pipeline stage k of direction d
            return k if d == 0 else P - 1 - k

        def pstage(s, d):  # the pipeline stage that device s runs for direction d
            return s if d == 0 else P - 1 - s

        dur = {"F": self.F, "W": self.W, "FB": self.FB}
        fwd, bwd, wgt = {}, {}, {}  # (d, m, k) -> list of (start, end); bwd values carry split
        if len(self.events) != P:
            bad.append(f"events has {len(self.events)} devices, expected {P}")
        for s, evs in enumerate(self.events):
            prev_end = 0
            for e in evs:
                if e.stage != s:
                    bad.append(f"{e} listed under device {s}")
                if e.kind not in KINDS:
                    bad.append(f"{e}: unknown kind")
                    continue
                if e.start < prev_end:
                    bad.append(f"{e} starts before the previous event on device {s} ends ({prev_end})")
                prev_end = e.end
                want = (self.B - self.W if e.split else self.B) if e.kind == "B" else dur[e.kind]
                if not close(e.end - e.start, want):
                    bad.append(f"{e} lasts {e.end - e.start}, expected {want}")
                if e.direction not in range(ndir) or e.microbatch not in range(per_dir):
                    bad.append(f"{e}: micro-batch or direction out of range")
                    continue
                key = (e.direction, e.microbatch, pstage(s, e.direction))
                if e.kind in ("F", "FB"):
                    fwd.setdefault(key, []).append((e.start, e.end))
                if e.kind == "B":
                    bwd.setdefault(key, []).append((e.start, e.end, e.split))
                if e.kind == "W":
                    wgt.setdefault(key, []).append((e.start, e.end))
                if e.kind == "FB":
                    if e.b_direction not in range(ndir) or e.b_microbatch not in range(per_dir):
                        bad.append(f"{e}: backward micro-batch or direction out of range")
                        continue
                    bkey = (e.b_direction, e.b_microbatch, pstage(s, e.b_direction))
                    bwd.setdefault(bkey, []).append((e.start, e.end, False))
        for d in range(ndir):
            for m in range(per_dir):
                for k in range(P):
                    key, where = (d, m, k), f"micro-batch {m} direction {d} stage {k} (device {device(k, d)})"
                    f, b, w = fwd.get(key, []), bwd.get(key, []), wgt.get(key, [])
                    if len(f) != 1 or len(b) != 1:
                        bad.append(f"{where}: {len(f)} forward and {len(b)} backward chunks, expected one each")
                        continue
                    split = b[0][2]
                    if len(w) != int(split):
                        bad.append(f"{where}: {len(w)} W events for a {'split' if split else 'full'} backward")
                    if k > 0 and len(fwd.get((d, m, k - 1), [])) == 1 and f[0][0] < fwd[(d, m, k - 1)][0][1]:
                        bad.append(f"{where}: forward starts before stage {k - 1}'s forward ends")
                    if b[0][0] < f[0][1]:
                        bad.append(f"{where}: backward starts before its forward ends")
                    if k < P - 1 and len(bwd.get((d, m, k + 1), [])) == 1 and b[0][0] < bwd[(d, m, k + 1)][0][1]:
                        bad.append(f"{where}: backward starts before stage {k + 1}'s backward ends")
                    if split and len(w) == 1 and w[0][0] < b[0][1]:
                        bad.append(f"{where}: W starts before its backward ends")
        extra = (set(fwd) | set(bwd) | set(wgt)) - {(d, m, k) for d in range(ndir) for m in range(per_dir)
                                                   for k in range(P)}
        if extra:
            bad.append(f"events for unknown chunks {sorted(extra)[:3]}")

        ends = [e.end for evs in self.events for e in evs]
        if not ends or self.makespan != max(ends):
            bad.append(f"makespan {self.makespan} is not the last event's end")
        peaks = []
        for s, evs in enumerate(self.events):
            busy = sum(e.end - e.start for e in evs)
            if not close(busy, self.busy[s]) or not close(self.makespan - self.busy[s], self.stage_bubbles[s]):
                bad.append(f"device {s}: busy {self.busy[s]} / bubble {self.stage_bubbles[s]} do not add up")
            held = peak = 0
            for e in sorted(evs, key=lambda e: e.start):
                held += e.kind in ("F", "FB")
                peak = max(peak, held)
                held -= e.kind == "FB" or e.kind == "W" or (e.kind == "B" and not e.split)
            peaks.append(peak)
        if self.stage_bubbles and self.bubble != max(self.stage_bubbles):
            bad.append(f"bubble {self.bubble} is not the largest stage bubble {max(self.stage_bubbles)}")
        if tuple(peaks) != tuple(self.peak_activations) or self.activations != max(peaks, default=0):
            bad.append(f"peak activations {self.peak_activations} / {self.activations}, recounted {peaks}")
        if self.parameters != (2 if dual else 1):
            bad.append(f"parameters {self.parameters}, expected {2 if dual else 1}")
        if bad:
            raise AssertionError(f"{self.schedule} timeline ({P} stages, {N} micro-batches) is invalid: "
                                 + "; ".join(bad[:5]) + (f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""))
        return self

