"""A sequence of kernel launches captured once as a CUDA graph and replayed: one launch from Python for what was
hundreds (numba spends tens of microseconds of CPU per kernel launch, so a training step of small tensors is bound
by Python, not by the GPU).

    g = graphs.Graph()            # a stream of its own, ordered with the legacy default stream (blocking)
    g.capture(step)               # step() runs nothing: its launches are recorded on g.stream
    g.replay()                    # the recorded launches, in order, on g.stream

While `capture` runs `step`, every kernel launched on the default stream (`kernel[grid, block](...)`, as all of
fp8lab's launchers do) goes to the capturing stream instead: CUDA cannot capture the legacy default stream, and this
keeps the launchers unchanged. What a captured step may do (CUDA Programming Guide, "CUDA Graphs", stream capture):
launch kernels and asynchronous copies on the stream; not allocate, not copy synchronously, not synchronize, not
read results on the host. The arguments are frozen at capture: a replay reads and writes the same buffers, with
the same scalars, so whatever changes per step (the batch, AdamW's step count) must live in device memory that the
host fills before the replay (fp8lab.training.engine_kernels.GraphedStep).

Under the simulator (no graphs) the twin records `step` and runs it on each replay: the same order of work, so a
training loop written for graphs runs and is tested there too.
"""

from __future__ import annotations

import contextlib

from . import runtime
from .runtime import cuda


def _check(result, what: str):
    """The values of a cuda.bindings.driver call (a tuple whose first item is the error code) after checking it."""
    from cuda.bindings import driver

    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise RuntimeError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    return values[0] if len(values) == 1 else values


@contextlib.contextmanager
def _default_launches_on(stream):
    """Kernels launched on the default stream go to `stream` (a numba Stream) inside the block. numba-cuda launches
    through the name `launch` in its dispatcher module (cuda.core's launcher); that one name is replaced here."""
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv import driver

    target = driver._to_core_stream(stream)
    original = dispatcher.launch

    def launch(core_stream, config, kernel, *args):
        if int(core_stream.handle) == 0:  # the default stream: what every fp8lab launcher uses
            core_stream = target
        return original(core_stream, config, kernel, *args)

    dispatcher.launch = launch
    try:
        yield
    finally:
        dispatcher.launch = original


def record_event(event, stream=None) -> None:
    """Record `event` (a numba Event) on `stream` (None: the default stream). While `stream` is capturing a graph,
    the record becomes a node of the graph (cudaEventRecordExternal in the CUDA Programming Guide's "CUDA Graphs"):
    each replay records the event again, so events between a graph's launches time its parts, with no gaps of
    launches from Python between them."""
    if stream is None or runtime.IS_SIM:
        event.record(0 if stream is None else stream)
        return
    from cuda.bindings import driver

    handle = driver.CUstream(int(stream.handle))
    status = _check(driver.cuStreamIsCapturing(handle), "cuStreamIsCapturing")
    if status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:  # the flag is invalid outside a capture
        event.record(stream)
        return
    _check(driver.cuEventRecordWithFlags(driver.CUevent(int(event.handle)), handle,
                                         driver.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL),
           "cuEventRecordWithFlags (an event node in a captured graph)")


class Graph:
    """Launches captured once (`capture(fn)`) and replayed (`replay()`) on `stream`, a numba Stream that
    synchronizes with the legacy default stream, so eager work on the default stream (an evaluation, a checkpoint's
    copies) is ordered with the replays without an explicit synchronization."""

    def __init__(self):
        self.stream = cuda.stream()
        self._graph = self._exec = None
        self._fn = None

    @property
    def captured(self) -> bool:
        return self._fn is not None

    def capture(self, fn) -> None:
        """Record what fn() launches (it runs no work on the GPU now); a second capture replaces the first. A
        capture that fails raises RuntimeError (whatever CUDA or numba raised is its __cause__)."""
        self.close()
        if runtime.IS_SIM:  # the twin: replay runs fn
            self._fn = fn
            return
        from cuda.bindings import driver

        handle = driver.CUstream(int(self.stream.handle))
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL  # this thread's unsafe calls fail
        _check(driver.cuStreamBeginCapture(handle, mode), "cuStreamBeginCapture")
        try:
            with _default_launches_on(self.stream):
                fn()
        except BaseException as e:
            err, graph = driver.cuStreamEndCapture(handle)  # leave the stream usable; the capture is dropped
            if err == driver.CUresult.CUDA_SUCCESS:
                driver.cuGraphDestroy(graph)
            if isinstance(e, Exception):  # numba's CudaAPIError, cuda.core's CUDAError...: not RuntimeErrors
                raise RuntimeError(f"capturing the step failed: {type(e).__name__}: {e}") from e
            raise
        graph = _check(driver.cuStreamEndCapture(handle), "cuStreamEndCapture (a call in the step was not "
                       "allowed while capturing: a synchronous copy, an allocation or a synchronization)")
        try:
            exe = _check(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        except RuntimeError:
            driver.cuGraphDestroy(graph)
            raise
        self._graph, self._exec = graph, exe
        _check(driver.cuGraphUpload(self._exec, handle), "cuGraphUpload")
        self._handle, self._fn = handle, fn

    def replay(self) -> None:
        """The captured launches once more, in order, on `stream` (asynchronous: returns at once)."""
        if not self.captured:
            raise RuntimeError("Graph.replay: nothing was captured; call capture(fn) first")
        if runtime.IS_SIM:
            self._fn()
            return
        from cuda.bindings import driver

        _check(driver.cuGraphLaunch(self._exec, self._handle), "cuGraphLaunch")

    def close(self) -> None:
        """Free the graph (the buffers its launches use are the caller's); replay() then raises until the next
        capture."""
        if self._exec is not None:
            from cuda.bindings import driver

            driver.cuGraphExecDestroy(self._exec)
            driver.cuGraphDestroy(self._graph)
        self._graph = self._exec = self._fn = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the driver may be gone already
            pass
