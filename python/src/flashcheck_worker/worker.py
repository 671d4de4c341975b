"""flashcheck's worker protocol (version 2, docs/external-subjects.md), served.

`serve(capabilities, run_fn)` is a whole worker: it answers the handshake with
the capabilities, then reads one request per line on stdin, calls `run_fn`
for each case, writes O and LSE (or, for a backward case, dQ, dK and dV) as
.npy files and answers on stdout. What
`run_fn` raises becomes the case's answer: `Unsupported` an `unsupported`
answer, `Failed` an `error` with its message, `Fatal` an `error` after which
the worker exits (a sticky CUDA error), and any other exception an `error`
that names its type (its traceback goes to stderr, which flashcheck keeps in
the worker's log).

Only the standard library is needed. With NumPy installed, `Request.load`
returns arrays and `Result` takes arrays as well as flat lists of floats.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import npy
from .shape import Shape

#: The newest protocol version this package speaks, and every version it
#: speaks. 2 added the backward pass (`Request.backward`, `Result.dq/dk/dv`,
#: the capability keys `backward` and `backward_deterministic`); the
#: handshake answers the newest version that flashcheck offers too.
PROTOCOL = 2
PROTOCOLS = (1, 2)

#: The capability keys that need protocol 2; under 1 they are left out of
#: the handshake (with a note in the log), and no backward case comes.
BACKWARD_KEYS = frozenset({"backward", "backward_deterministic"})

#: The capability keys flashcheck knows (core/subject.hpp's Capabilities).
CAPABILITY_KEYS = frozenset({
    "dtypes", "masks", "layouts", "head_dims", "min_head_dim", "max_head_dim", "max_head_dim_v",
    "head_dim_v_equal", "gqa", "varlen", "softcap", "alibi", "min_page_size", "page_size_multiple",
    "page_size_power_of_two", "lse", "product_accumulation_unit", "fp8_output", "fp8_accumulator_keys",
    "seqlen_q_multiple", "seqlen_kv_multiple", "max_seqlen_q", "min_seqlen_q",
    "max_seqlen_kv", "empty_sequences", "nonfinite_inputs", "may_flush_subnormals", "tile_q", "tile_kv",
    "needs_gpu", "min_compute_capability", "compute_dtype", "known_deviations",
}) | BACKWARD_KEYS


class Unsupported(Exception):
    """The problem is outside what the worker can run: answered `unsupported` with this reason."""


class Failed(Exception):
    """The call failed: answered `error` with this message as it is."""


class Fatal(Failed):
    """The call failed and the worker cannot run another case: answered `error`
    with `"fatal": true`, after which `serve` returns exit status 1."""


# ---- requests ----------------------------------------------------------------

@dataclass(frozen=True)
class Timing:
    """A timing request (`flashcheck bench`): time `repeats` calls after
    `warmup` calls, cycling through `input_sets` copies of the inputs."""

    warmup: int
    repeats: int
    input_sets: int = 1


@dataclass(frozen=True)
class Request:
    """One case. A forward case (`backward` False) maps q, k, v to the input
    .npy paths and o, lse to the outputs'. A backward case (protocol 2,
    `backward` True) adds the inputs o and lse (the forward flashcheck hands
    over: the f64 oracle's, O rounded to the dtype and LSE to f32) and do
    (dO, O's shape and dtype), and its outputs are dq, dk and dv."""

    id: int
    subject: str
    problem: str
    shape: Shape
    inputs: Mapping[str, str]
    outputs: Mapping[str, str]
    timing: Optional[Timing]
    message: Mapping[str, Any] = field(repr=False)
    backward: bool = False

    def read(self, name: str) -> List[float]:
        """Input q, k, v (o, lse, do) as Python floats, flat in storage order (standard library only)."""
        return npy.decode(self._checked(name))

    def load(self, name: str, *, bf16_as_float32: bool = False) -> Any:
        """Input q, k, v (o, lse, do) as a NumPy array in storage order. bf16 comes as its
        bit pattern (uint16; in PyTorch: `torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)`),
        or as float32 with `bf16_as_float32`. Needs NumPy."""
        import numpy as np

        array = self._checked(name)
        values = np.frombuffer(array.data, dtype=np.dtype(array.descr)).reshape(array.shape)
        if bf16_as_float32 and array.descr == "<u2":
            return (values.astype(np.uint32) << 16).view(np.float32)
        return values.copy()

    def _checked(self, name: str) -> npy.Array:
        if name not in self.inputs:
            raise KeyError(f"no input {name!r} (inputs: {', '.join(self.inputs)})")
        array = npy.read(self.inputs[name])
        s = self.shape
        dtype = npy.DESCR[s.dtype]
        want = {"q": (dtype, s.q_shape), "k": (dtype, s.k_shape), "v": (dtype, s.v_shape), "o": (dtype, s.o_shape),
                "lse": ("<f4", s.lse_shape), "do": (dtype, s.do_shape),
                "page_table": ("<i4", (s.batch, s.pages_per_sequence))}.get(name)
        if want is not None and (array.descr, array.shape) != want:
            raise ValueError(f"input {name} is {array.descr} {list(array.shape)}, the problem says "
                             f"{want[0]} {list(want[1])}")
        return array


# ---- results -----------------------------------------------------------------

@dataclass
class Result:
    """What `run_fn` returns for a case.

    `o` (and `lse`, if the capabilities declare it) in storage order: a NumPy
    array of any float dtype (rounded to the problem's dtype; for bf16 a uint16
    or int16 array is taken as bit patterns), or a flat sequence of floats.
    A backward case returns `dq`, `dk` and `dv` the same way (dK and dV per
    K/V head) instead of O and LSE.
    None means that `run_fn` wrote the file at `request.outputs[...]` itself.
    `time_ms` is the worker's own time of the call; a timing request answers
    with `times_ms`, one per repeat, instead of outputs.
    """

    o: Any = None
    lse: Any = None
    time_ms: Optional[float] = None
    times_ms: Optional[Sequence[float]] = None
    dq: Any = None
    dk: Any = None
    dv: Any = None


def _is_numpy(value: Any) -> bool:
    return type(value).__module__ == "numpy" and hasattr(value, "dtype")


def _numpy_bytes(array: Any, dtype: str, shape: Tuple[int, ...], what: str) -> bytes:
    import numpy as np

    if tuple(array.shape) != tuple(shape):
        raise ValueError(f"{what} has shape {list(array.shape)}, the problem needs {list(shape)}")
    if dtype == "bf16":
        if array.dtype in (np.uint16, np.int16):
            return bytes(np.ascontiguousarray(array).view(np.uint16).astype("<u2", copy=False).tobytes())
        if array.dtype == np.float32 or array.dtype == np.float16:
            bits = np.ascontiguousarray(array, dtype="<f4").view("<u4").astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")  # nearest, ties to even
            nan = np.isnan(np.asarray(array, dtype=np.float32))
            rounded[nan] = 0x7FC0
            return bytes(rounded.tobytes())
        # float64 and wider: exactly, without rounding through float32 first.
        return npy.encode(np.asarray(array, dtype=np.float64).ravel().tolist(), dtype)
    with np.errstate(over="ignore"):
        return bytes(np.ascontiguousarray(array).astype(npy.DESCR[dtype]).tobytes())


def _to_bytes(values: Any, dtype: str, shape: Tuple[int, ...], what: str) -> bytes:
    if _is_numpy(values):
        return _numpy_bytes(values, dtype, shape, what)
    values = list(values)
    if len(values) != math.prod(shape):
        raise ValueError(f"{what} has {len(values)} values, the problem needs {list(shape)} = {math.prod(shape)}")
    return npy.encode(values, dtype)


def write_outputs(request: Request, result: Result) -> None:
    """Writes the result's O and LSE (dQ, dK and dV for a backward case) where
    the request asks, in the problem's dtype and shape."""
    shape = request.shape
    if request.backward:
        for name, values, dims in (("dq", result.dq, shape.dq_shape), ("dk", result.dk, shape.dk_shape),
                                   ("dv", result.dv, shape.dv_shape)):
            what = "d" + name[1].upper()
            if values is not None:
                npy.write(request.outputs[name], npy.DESCR[shape.dtype], dims,
                          _to_bytes(values, shape.dtype, dims, what))
            elif not os.path.exists(request.outputs[name]):
                raise ValueError(f"run_fn returned no {what} and wrote none")
        return
    if result.o is not None:
        npy.write(request.outputs["o"], npy.DESCR[shape.dtype], shape.o_shape,
                  _to_bytes(result.o, shape.dtype, shape.o_shape, "O"))
    elif not os.path.exists(request.outputs["o"]):
        raise ValueError("run_fn returned no O and wrote none")
    if result.lse is not None:
        npy.write(request.outputs["lse"], "<f4", shape.lse_shape,
                  _to_bytes(result.lse, "f32", shape.lse_shape, "LSE"))


# ---- the worker --------------------------------------------------------------

@dataclass
class Hello:
    """The handshake's answer: the capabilities (docs/external-subjects.md), a
    description and a version string (copied into every record)."""

    capabilities: Mapping[str, Any]
    description: str = "external worker (flashcheck_worker)"
    version: str = ""


CapabilitiesArg = Union[Mapping[str, Any], Hello, Callable[[str], Union[Mapping[str, Any], Hello]]]
RunFn = Callable[[Request], Optional[Result]]


def _describe(error: BaseException) -> str:
    text = str(error).strip()
    if isinstance(error, (Failed, Unsupported)):
        return text or type(error).__name__
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def log(*args: Any) -> None:
    """A line on stderr (the worker's log in flashcheck's folder for it)."""
    print(*args, file=sys.stderr, flush=True)


class Worker:
    """The request loop of `serve`. Test workers subclass it to misbehave on
    purpose (`answer` may return None after writing its own line)."""

    def __init__(self, capabilities: CapabilitiesArg, run_fn: RunFn, *, subjects: Optional[Sequence[str]] = None,
                 is_fatal: Optional[Callable[[BaseException], bool]] = None, output: Optional[IO[str]] = None):
        self.capabilities = capabilities
        self.run_fn = run_fn
        self.subjects = tuple(subjects) if subjects is not None else None
        self.is_fatal = is_fatal or (lambda error: False)
        self.output: IO[str] = output if output is not None else sys.stdout
        self.subject: Optional[str] = None
        self.protocol: int = PROTOCOL  # the version the handshake agreed on
        self.exit_status: Optional[int] = None

    # ---- transport -----------------------------------------------------------
    def write_line(self, text: str) -> None:
        self.output.write(text + "\n")
        self.output.flush()

    def send(self, message: Mapping[str, Any]) -> None:
        self.write_line(json.dumps(message, allow_nan=False, default=float))

    # ---- the handshake -------------------------------------------------------
    def hello(self, message: Mapping[str, Any]) -> Dict[str, Any]:
        """The answer to a hello: the worker's hello, or an error."""
        subject = message.get("subject")
        # flashcheck lists every version it speaks in "protocols" and keeps
        # "protocol" at its oldest (which a version-1 worker checks); the
        # answer is the newest version both speak.
        offered = message.get("protocols")
        if not isinstance(offered, list):
            offered = [message.get("protocol")]
        shared = [version for version in PROTOCOLS if version in offered]
        if not shared:
            spoken = "/".join(str(version) for version in PROTOCOLS)
            return {"type": "error", "message": f"this worker speaks protocol {spoken}, not "
                                                f"{'/'.join(repr(v) for v in offered)}"}
        if not isinstance(subject, str) or (self.subjects is not None and subject not in self.subjects):
            served = ", ".join(self.subjects or ())
            return {"type": "error", "message": f"unknown subject {subject!r}; this worker serves {served}"}
        try:
            declared = self.capabilities(subject) if callable(self.capabilities) else self.capabilities
        except Exception as error:  # no GPU, a missing import: the handshake says so
            if not isinstance(error, Failed):
                log(traceback.format_exc())
            return {"type": "error", "message": _describe(error)}
        hello = declared if isinstance(declared, Hello) else Hello(dict(declared))
        capabilities = dict(hello.capabilities)
        unknown = sorted(set(capabilities) - CAPABILITY_KEYS)
        if unknown:  # flashcheck refuses them and names them; a note in the log says where they came from
            log(f"flashcheck_worker: unknown capability key(s) {', '.join(unknown)}: flashcheck will refuse them")
        self.protocol = max(shared)
        if self.protocol < 2 and BACKWARD_KEYS & set(capabilities):
            log("flashcheck_worker: this flashcheck speaks protocol 1, which has no backward pass: "
                f"{', '.join(sorted(BACKWARD_KEYS & set(capabilities)))} left out of the handshake")
            capabilities = {key: value for key, value in capabilities.items() if key not in BACKWARD_KEYS}
        self.subject = subject
        return {"type": "hello", "protocol": self.protocol, "subject": subject, "description": hello.description,
                "version": hello.version, "capabilities": capabilities}

    # ---- a case --------------------------------------------------------------
    def parse(self, message: Mapping[str, Any]) -> Request:
        timing = message.get("timing")
        kind = message.get("pass", "fwd")
        if kind not in ("fwd", "bwd"):
            raise ValueError(f"unknown pass {kind!r} (fwd or bwd)")
        return Request(
            id=message["id"], subject=self.subject or "", problem=str(message.get("problem", "")),
            shape=Shape.from_json(message["shape"]), inputs=dict(message.get("inputs") or {}),
            outputs=dict(message.get("outputs") or {}),
            timing=Timing(int(timing["warmup"]), int(timing["repeats"]), int(timing.get("input_sets", 1)))
            if timing else None,
            message=message, backward=kind == "bwd")

    def answer(self, message: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
        """The result for a run request (None: nothing to send)."""
        started = time.perf_counter()
        reply: Dict[str, Any] = {"type": "result", "id": message.get("id")}
        try:
            request = self.parse(message)
            result = self.run_fn(request)
            if result is None:
                result = Result()
            if not isinstance(result, Result):
                raise TypeError(f"run_fn returned a {type(result).__name__}, not a flashcheck_worker.Result")
            if request.timing is not None:
                times = list(result.times_ms or ())
                if len(times) != request.timing.repeats:
                    raise ValueError(f"a timing request needs {request.timing.repeats} times_ms, "
                                     f"run_fn returned {len(times)}")
                if not all(math.isfinite(float(t)) for t in times):
                    raise ValueError(f"run_fn returned times_ms {times}: every time must be finite")
                reply.update(status="ok", times_ms=[float(t) for t in times])
            else:
                write_outputs(request, result)
                reply["status"] = "ok"
                if result.time_ms is not None and math.isfinite(float(result.time_ms)):
                    reply["time_ms"] = float(result.time_ms)
        except Unsupported as why:
            reply.update(status="unsupported", reason=_describe(why))
        except Exception as error:  # the worker's own bugs included: a recorded failure, never hidden
            reply.update(status="error", message=_describe(error))
            if not isinstance(error, Failed) or isinstance(error, Fatal):
                log(traceback.format_exc())
            if isinstance(error, Fatal) or self.is_fatal(error):
                reply["fatal"] = True
        reply["worker_ms"] = (time.perf_counter() - started) * 1e3
        return reply

    # ---- the loop ------------------------------------------------------------
    def handle(self, line: str) -> None:
        try:
            message = json.loads(line)
            if not isinstance(message, dict):
                raise ValueError("not an object")
        except ValueError:
            self.send({"type": "error", "message": "malformed request"})
            return
        kind = message.get("type")
        if kind == "hello":
            self.send(self.hello(message))
            return
        if kind != "run" or self.subject is None:
            why = "a run request before the handshake" if self.subject is None else f"unknown request {kind!r}"
            self.send({"type": "result", "id": message.get("id"), "status": "error", "message": why})
            return
        reply = self.answer(message)
        if reply is not None:
            self.send(reply)
            if reply.get("fatal"):
                self.exit_status = 1

    def serve(self, lines: Iterator[str]) -> int:
        """Answers every line until the input ends (0) or a fatal error (1)."""
        for line in lines:
            if not line.strip():
                continue
            self.handle(line)
            if self.exit_status is not None:
                return self.exit_status
        return 0


@contextlib.contextmanager
def _replies_on_stdout_only() -> Iterator[IO[str]]:
    """Yields a stream on the real stdout and points fd 1 and sys.stdout at
    stderr meanwhile: a print in the kernel's code or a library's banner
    would otherwise be read as the reply to the next request."""
    sys.stdout.flush()
    replies_fd = os.dup(1)
    os.dup2(2, 1)
    saved = sys.stdout
    sys.stdout = sys.stderr
    replies = os.fdopen(replies_fd, "w", encoding="utf-8")
    try:
        yield replies
    finally:
        sys.stdout = saved
        replies.close()


def serve(capabilities: CapabilitiesArg, run_fn: RunFn, *, subjects: Optional[Sequence[str]] = None,
          is_fatal: Optional[Callable[[BaseException], bool]] = None, input: Optional[IO[str]] = None,
          output: Optional[IO[str]] = None, worker: Optional[Callable[..., Worker]] = None) -> int:
    """Serves flashcheck's worker protocol until stdin closes; returns the exit
    status (0, or 1 after a fatal error) for `sys.exit`.

    capabilities: the domain (a mapping of docs/external-subjects.md's keys),
        a `Hello`, or a function of the subject name that returns either; it
        is called at the handshake, and what it raises is the handshake's error.
    run_fn: called with each `Request`; returns a `Result` (or None when it
        wrote the outputs itself), or raises `Unsupported`, `Failed` or `Fatal`.
    subjects: the names this worker serves (default: any name).
    is_fatal: which other exceptions leave the worker unable to go on.
    input, output: the streams (default: stdin, and stdout, with fd 1 and
        sys.stdout sent to stderr while serving so that stray prints cannot
        break the protocol).
    worker: a `Worker` subclass to use (test workers that misbehave).
    """
    make = worker or Worker
    lines = input if input is not None else sys.stdin
    if output is not None:
        return make(capabilities, run_fn, subjects=subjects, is_fatal=is_fatal, output=output).serve(iter(lines))
    with _replies_on_stdout_only() as replies:
        return make(capabilities, run_fn, subjects=subjects, is_fatal=is_fatal, output=replies).serve(iter(lines))
