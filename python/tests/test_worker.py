"""serve(): the handshake, the request loop, the outputs and the answers, driven through streams."""
import io
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest

import flashcheck_worker as fw
from flashcheck_worker import npy

CAPS = {"dtypes": ["f32", "f16", "bf16"], "masks": ["none"], "lse": True}
HELLO = {"type": "hello", "protocol": 1, "subject": "mine", "flashcheck": "0.1.0", "dir": "/nowhere"}


def shape(**fields):
    base = {"batch": 1, "heads_q": 2, "heads_kv": 1, "seqlen_q": 3, "seqlen_kv": 4, "lens_q": None, "lens_kv": None,
            "head_dim": 2, "head_dim_v": 2, "dtype": "f32", "layout": "bhsd", "mask": "none", "window_left": -1,
            "window_right": -1, "softmax_scale": 0.5}
    base.update(fields)
    return base


def run_request(folder, request_id=1, **fields):
    """A run request with Q, K and V (1, 2, 3, ...) written as flashcheck writes them."""
    s = fw.Shape.from_json(shape(**fields))
    inputs = {}
    for name, dims in (("q", s.q_shape), ("k", s.k_shape), ("v", s.v_shape)):
        inputs[name] = str(folder / f"{name}.npy")
        npy.write(inputs[name], npy.DESCR[s.dtype], dims, npy.encode(range(1, math.prod(dims) + 1), s.dtype))
    return {"type": "run", "id": request_id, "problem": "b=1 hq=2 hkv=1 sq=3 skv=4 d=2", "shape": shape(**fields),
            "inputs": inputs, "outputs": {"o": str(folder / "o.npy"), "lse": str(folder / "lse.npy")}}


def converse(messages, run_fn=None, capabilities=CAPS, **options):
    """Serves the messages (dicts, or raw lines); returns the replies and the exit status."""
    lines = "".join((m if isinstance(m, str) else json.dumps(m)) + "\n" for m in messages)
    out = io.StringIO()
    status = fw.serve(capabilities, run_fn or (lambda request: None), input=io.StringIO(lines), output=out,
                      **options)
    return [json.loads(line) for line in out.getvalue().splitlines()], status


def copy_q(request):
    """O := the first Dv columns of Q (as floats); LSE := the row index."""
    q = request.read("q")
    s = request.shape
    return fw.Result(o=q[:math.prod(s.o_shape)], lse=[float(i) for i in range(math.prod(s.lse_shape))], time_ms=0.25)


def test_the_handshake_declares_the_capabilities():
    replies, status = converse([HELLO])
    assert status == 0
    assert replies == [{"type": "hello", "protocol": 1, "subject": "mine",
                        "description": "external worker (flashcheck_worker)", "version": "", "capabilities": CAPS}]


def test_a_capabilities_function_gets_the_subject_and_its_error_is_the_answer():
    def capabilities(subject):
        if subject == "broken":
            raise RuntimeError("no device here")
        return fw.Hello(CAPS, description=f"kernel {subject}", version="v7")

    replies, _ = converse([dict(HELLO, subject="broken"), HELLO], capabilities=capabilities)
    assert replies[0] == {"type": "error", "message": "RuntimeError: no device here"}
    assert replies[1]["description"] == "kernel mine" and replies[1]["version"] == "v7"


def test_wrong_protocol_unknown_subject_and_early_runs_are_errors(tmp_path):
    replies, status = converse([dict(HELLO, protocol=3), dict(HELLO, subject="theirs"), run_request(tmp_path),
                                "this is not JSON", "[1, 2]", HELLO, {"type": "goodbye", "id": 4}],
                               subjects=["mine"])
    assert status == 0
    assert replies[0] == {"type": "error", "message": "this worker speaks protocol 1/2, not 3"}
    assert replies[1] == {"type": "error", "message": "unknown subject 'theirs'; this worker serves mine"}
    assert replies[2] == {"type": "result", "id": 1, "status": "error", "message": "a run request before the handshake"}
    assert replies[3] == replies[4] == {"type": "error", "message": "malformed request"}
    assert replies[5]["type"] == "hello"
    assert replies[6] == {"type": "result", "id": 4, "status": "error", "message": "unknown request 'goodbye'"}


BACKWARD_CAPS = dict(CAPS, backward=True, backward_deterministic=True)


def test_the_newest_shared_protocol_is_answered_and_protocol_1_has_no_backward(capsys):
    offered = dict(HELLO, protocols=[1, 2])  # what flashcheck 2 sends: "protocol" at its oldest
    replies, _ = converse([offered, dict(offered, protocols=[1, 2, 7]), HELLO], capabilities=BACKWARD_CAPS)
    assert [r["protocol"] for r in replies] == [2, 2, 1]
    assert replies[0]["capabilities"] == BACKWARD_CAPS
    assert replies[2]["capabilities"] == CAPS  # a version-1 flashcheck would refuse the backward keys
    assert "left out of the handshake" in capsys.readouterr().err


def backward_request(folder, request_id=1, **fields):
    """A backward request: the forward's inputs, O (0.5), LSE (1.0) and dO (-1, -2, ...)."""
    request = run_request(folder, request_id, **fields)
    s = fw.Shape.from_json(request["shape"])
    for name, dims, dtype, values in (("o", s.o_shape, s.dtype, lambda n: [0.5] * n),
                                      ("lse", s.lse_shape, "f32", lambda n: [1.0] * n),
                                      ("do", s.do_shape, s.dtype, lambda n: [-float(i) for i in range(1, n + 1)])):
        request["inputs"][name] = str(folder / f"{name}.npy")
        npy.write(request["inputs"][name], npy.DESCR[dtype], dims, npy.encode(values(math.prod(dims)), dtype))
    request["pass"] = "bwd"
    request["outputs"] = {name: str(folder / f"{name}.npy") for name in ("dq", "dk", "dv")}
    return request


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_a_backward_case_reads_o_lse_do_and_writes_dq_dk_dv(tmp_path, layout):
    request = backward_request(tmp_path, 9, dtype="f16", layout=layout)

    def run(req):
        assert req.backward
        assert req.read("o") == [0.5] * 12 and req.read("lse") == [1.0] * 6
        do = req.read("do")
        assert do[:3] == [-1.0, -2.0, -3.0]
        s = req.shape
        return fw.Result(dq=do, dk=[2.0] * math.prod(s.dk_shape), dv=[3.0] * math.prod(s.dv_shape), time_ms=1.5)

    replies, _ = converse([dict(HELLO, protocols=[1, 2]), request], run, capabilities=BACKWARD_CAPS)
    assert replies[1]["status"] == "ok", replies[1]
    dq, dk, dv = (npy.read(request["outputs"][name]) for name in ("dq", "dk", "dv"))
    heads_kv = (1, 4, 1, 2) if layout == "bshd" else (1, 1, 4, 2)  # one K/V head: the GQA sum is the worker's
    assert (dq.descr, dk.shape, dv.shape) == ("<f2", heads_kv, heads_kv)
    assert npy.decode(dq)[:3] == [-1.0, -2.0, -3.0] and npy.decode(dk) == [2.0] * 8


def test_a_backward_case_without_dk_or_with_the_query_heads_is_an_error(tmp_path):
    request = backward_request(tmp_path)
    full = {"dq": [0.0] * 12, "dk": [0.0] * 8, "dv": [0.0] * 8}

    def run(req):
        return fw.Result(**dict(full, dk=None)) if req.id == 1 else fw.Result(**dict(full, dv=[0.0] * 16))

    sideways = dict(request, id=3, **{"pass": "sideways"})
    replies, _ = converse([dict(HELLO, protocols=[1, 2]), request, dict(request, id=2), sideways], run,
                          capabilities=BACKWARD_CAPS)
    assert replies[1]["message"] == "ValueError: run_fn returned no dK and wrote none"
    assert replies[2]["message"] == "ValueError: dV has 16 values, the problem needs [1, 1, 4, 2] = 8"
    assert replies[3]["message"] == "ValueError: unknown pass 'sideways' (fwd or bwd)"


def test_unknown_capability_keys_are_sent_as_declared_for_flashcheck_to_refuse(capsys):
    replies, _ = converse([HELLO], capabilities=dict(CAPS, warp_speed=True))
    assert replies[0]["capabilities"]["warp_speed"] is True
    assert "unknown capability key(s) warp_speed" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_a_case_writes_o_and_lse_in_the_problems_dtype_and_shape(tmp_path, dtype, layout):
    request = run_request(tmp_path, 7, dtype=dtype, layout=layout)
    replies, _ = converse([HELLO, request], copy_q)
    reply = replies[1]
    assert reply["status"] == "ok" and reply["id"] == 7 and reply["time_ms"] == 0.25 and reply["worker_ms"] >= 0
    o, lse = npy.read(request["outputs"]["o"]), npy.read(request["outputs"]["lse"])
    want_o = (1, 3, 2, 2) if layout == "bshd" else (1, 2, 3, 2)
    assert (o.descr, o.shape) == (npy.DESCR[dtype], want_o)
    assert npy.decode(o) == [float(x) for x in range(1, 13)]  # small integers: exact in every dtype
    assert (lse.descr, lse.shape) == ("<f4", (1, 2, 3))
    assert npy.decode(lse) == [float(i) for i in range(6)]


def test_inputs_are_checked_against_the_problem(tmp_path):
    request = run_request(tmp_path)
    npy.write(request["inputs"]["k"], "<f4", (1, 1, 4, 3), npy.encode(range(12), "f32"))
    replies, _ = converse([HELLO, request], lambda r: [r.read(name) for name in "qkv"] and None)
    assert replies[1]["status"] == "error"
    assert replies[1]["message"] == "ValueError: input k is <f4 [1, 1, 4, 3], the problem says <f4 [1, 1, 4, 2]"


def test_raised_answers(tmp_path):
    def run(request):
        kind = request.id
        if kind == 1:
            raise fw.Unsupported("odd head dims")
        if kind == 2:
            raise fw.Failed("the kernel returned 7")
        if kind == 3:
            raise KeyError("oops")
        return fw.Result(o=[0.0] * 11)  # one value short

    replies, status = converse([HELLO] + [run_request(tmp_path, i) for i in (1, 2, 3, 4)], run)
    assert status == 0
    assert [r["status"] for r in replies[1:]] == ["unsupported", "error", "error", "error"]
    assert replies[1]["reason"] == "odd head dims"
    assert replies[2]["message"] == "the kernel returned 7"
    assert replies[3]["message"] == "KeyError: 'oops'"
    assert replies[4]["message"] == "ValueError: O has 11 values, the problem needs [1, 2, 3, 2] = 12"
    assert not any("fatal" in r for r in replies)


def test_a_result_of_another_type_is_an_error(tmp_path):
    replies, _ = converse([HELLO, run_request(tmp_path)], lambda request: {"o": [0.0] * 12})
    assert replies[1]["message"] == "TypeError: run_fn returned a dict, not a flashcheck_worker.Result"


def test_no_o_at_all_is_an_error_not_a_silent_ok(tmp_path):
    replies, _ = converse([HELLO, run_request(tmp_path)], lambda request: None)
    assert replies[1]["status"] == "error" and "returned no O and wrote none" in replies[1]["message"]


def test_a_fatal_error_is_the_last_answer(tmp_path):
    def run(request):
        raise fw.Fatal("CUDA error: an illegal memory access")

    replies, status = converse([HELLO, run_request(tmp_path, 1), run_request(tmp_path, 2)], run)
    assert status == 1
    assert len(replies) == 2  # the second case was never read
    assert replies[1]["fatal"] is True and replies[1]["message"] == "CUDA error: an illegal memory access"


def test_is_fatal_picks_other_exceptions(tmp_path):
    def run(request):
        raise RuntimeError("CUDA error: misaligned address")

    replies, status = converse([HELLO, run_request(tmp_path)], run, is_fatal=lambda e: "CUDA error" in str(e))
    assert status == 1 and replies[1]["fatal"] is True
    assert replies[1]["message"] == "RuntimeError: CUDA error: misaligned address"


def test_timing_requests_answer_one_time_per_repeat(tmp_path):
    timed = dict(run_request(tmp_path, 3), timing={"warmup": 2, "repeats": 3, "input_sets": 2})
    seen = []

    def run(request):
        seen.append(request.timing)
        return fw.Result(times_ms=[1.0, 2.0, 3.0][:len(seen) + 1])

    replies, _ = converse([HELLO, timed, dict(timed, id=4)], run)
    assert seen[0] == fw.Timing(warmup=2, repeats=3, input_sets=2)
    assert replies[1] == {"type": "result", "id": 3, "status": "error",
                          "message": "ValueError: a timing request needs 3 times_ms, run_fn returned 2",
                          "worker_ms": replies[1]["worker_ms"]}
    assert replies[2]["status"] == "ok" and replies[2]["times_ms"] == [1.0, 2.0, 3.0]
    assert not os.path.exists(timed["outputs"]["o"])


def test_numpy_arrays_in_and_out(tmp_path):
    np = pytest.importorskip("numpy")
    request = run_request(tmp_path, dtype="bf16", layout="bshd")

    def run(req):
        q = req.load("q")
        assert q.dtype == np.uint16 and q.shape == (1, 3, 2, 2)  # bf16 as its bit pattern
        q32 = req.load("q", bf16_as_float32=True)
        assert q32.dtype == np.float32 and q32.ravel().tolist() == list(range(1, 13))
        o = (q32 + np.float32(2 ** -8)).astype(np.float32)  # ties: each rounds to even
        o[0, 0, 0, 0] = np.nan
        return fw.Result(o=o, lse=np.zeros((1, 2, 3), dtype=np.float64))

    replies, _ = converse([HELLO, request], run)
    assert replies[1]["status"] == "ok", replies[1]
    o = npy.read(request["outputs"]["o"])
    exact = [float(v) + 2 ** -8 for v in range(1, 13)]
    want = [npy.float_to_bf16(v) for v in exact]
    got = list(np.frombuffer(o.data, dtype="<u2"))
    assert got[0] == 0x7FC0 and got[1:] == want[1:]
    assert npy.decode(npy.read(request["outputs"]["lse"])) == [0.0] * 6


def test_bf16_bit_patterns_pass_as_they_are_from_int16_too(tmp_path):
    np = pytest.importorskip("numpy")
    request = run_request(tmp_path, dtype="bf16")
    bits = [npy.float_to_bf16(x) for x in (-1.5, 2.0, -0.0, -3e38, 1e-40, 7.0)] * 2  # sign bits set: negative int16
    as_int16 = np.array(bits, dtype=np.uint16).view(np.int16).reshape(1, 2, 3, 2)
    replies, _ = converse([HELLO, request], lambda r: fw.Result(o=as_int16))
    assert replies[1]["status"] == "ok", replies[1]
    assert list(np.frombuffer(npy.read(request["outputs"]["o"]).data, dtype="<u2")) == bits


def test_numpy_output_of_the_wrong_shape_is_an_error(tmp_path):
    np = pytest.importorskip("numpy")
    replies, _ = converse([HELLO, run_request(tmp_path)], lambda r: fw.Result(o=np.zeros((1, 3, 2, 2))))
    assert replies[1]["message"] == "ValueError: O has shape [1, 3, 2, 2], the problem needs [1, 2, 3, 2]"


WORKER = textwrap.dedent("""
    import sys
    {block_numpy}
    import flashcheck_worker as fw

    def run(request):
        print("a stray print from the kernel's code")
        sys.stdout.flush()
        import os
        os.write(1, b"a stray write to fd 1\\n")
        return fw.Result(o=request.read("v")[:12], lse=[0.0] * 6)

    sys.exit(fw.serve({{"dtypes": ["f32"], "masks": ["none"]}}, run))
""")


@pytest.mark.parametrize("without_numpy", [False, True])
def test_a_worker_process_keeps_stdout_for_replies(tmp_path, without_numpy):
    """Over real pipes: stray prints go to stderr, and the standard library suffices."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(block_numpy="sys.modules['numpy'] = None" if without_numpy else ""))
    request = run_request(tmp_path, 5, seqlen_kv=6)
    lines = json.dumps(HELLO) + "\n" + json.dumps(request) + "\n"
    done = subprocess.run([sys.executable, str(script)], input=lines, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    replies = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["type"] for r in replies] == ["hello", "result"]
    assert replies[1]["status"] == "ok", replies[1]
    assert "a stray print from the kernel's code" in done.stderr and "a stray write to fd 1" in done.stderr
    assert npy.decode(npy.read(request["outputs"]["o"])) == [float(x) for x in range(1, 13)]


def test_the_score_modifications_arrive_in_the_shape_and_default_to_none():
    # A sender without the fields (before softcap and ALiBi): none of either.
    plain = fw.Shape.from_json(shape())
    assert plain.softcap == 0.0 and plain.alibi is False
    modified = fw.Shape.from_json(shape(softcap=30.0, alibi=True))
    assert modified.softcap == 30.0 and modified.alibi is True
    with pytest.raises(ValueError, match="lacks softmax_scale"):
        fw.Shape.from_json({k: v for k, v in shape().items() if k != "softmax_scale"})


def test_alibi_slopes_are_the_standard_ones():
    # Press et al.: 8 heads give 2^-1 ... 2^-8; 12 heads interleave 2^-0.5, 2^-1.5, ... after the first 8.
    eight = fw.Shape.from_json(shape(heads_q=8, heads_kv=8))
    assert [eight.alibi_slope(h) for h in range(8)] == [2.0 ** -(h + 1) for h in range(8)]
    twelve = fw.Shape.from_json(shape(heads_q=12, heads_kv=12))
    assert [twelve.alibi_slope(h) for h in range(8, 12)] == [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5, 2.0 ** -3.5]
