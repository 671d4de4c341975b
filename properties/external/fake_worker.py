#!/usr/bin/env python3
"""A fake external worker for flashcheck's protocol tests, on the
flashcheck_worker package (python/, standard library only: no NumPy, no GPU):
a small exact attention and its backward in float64, and modes that misbehave
on purpose. The package is imported from this repository's python/src without
installing it.

    fake_worker.py [--mode MODE] [--at N]

MODE (default good):
  good          answers every case correctly
  wrong-scale   computes with the softmax scale 2% too large (numbers the oracle must reject)
  unsupported   answers every case `unsupported`
  error         answers every case with status `error`
  crash         dies of SIGSEGV on case N (default 1), correct before it
  hang          stops answering on case N (sleeps forever)
  garbage       answers case N with a line that is not JSON
  wrong-shape   writes O with one row too few on case N
  wrong-dtype   writes O as float32 whatever the problem's dtype, on case N
  wrong-id      answers case N with another request's id
  no-lse        omits lse.npy on case N
  fatal         answers case N with an error marked fatal, and exits (as after a sticky CUDA error)
  null-reason   answers case N `unsupported` with a null reason (untrusted types must not throw)
  bad-status    answers case N with the status 5
  bad-protocol  answers the handshake with protocol 99
  bad-caps      declares a capability key that does not exist
  refuse        answers the handshake with an error
  exit          exits at start-up, before the handshake
  noisy         prints a line of chatter to stdout before the handshake
  fifo-output   makes o.npy a FIFO that nobody writes, on case N (a blocking open would never return)
  huge-output   writes o.npy as a sparse 4 GiB array with a header that matches its size, on case N
  setsid-child  starts a grandchild that calls setsid and sleeps for an hour, on case N, then answers
  protocol1     answers the handshake as a version-1 worker would (no backward: the forward only)
  page-table-ignored  reads a paged K/V pool as if its pages were in sequence order (FlashInfer #3219's class)
Backward cases (protocol 2) go through the same modes, and through these:
  wrong-dk      dK and dV not summed over the query heads of a GQA group: only each group's first
                head counts (a backward bug class of issue 22)
  dk-per-head   returns dK with one head per query head, the GQA sum not done (a shape flashcheck refuses)
  no-dq         answers case N ok, with dK and dV written but no dQ
Case numbers count this process's cases from 1: after a restart, again from 1.
"""
import argparse
import math
import os
import signal
import sys
import time

# The repository's own package, whether or not one is installed.
sys.dont_write_bytecode = True  # no __pycache__ in the repository's python/src
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python", "src"))
from flashcheck_worker import Failed, Fatal, Hello, Result, Unsupported, Worker, npy, serve  # noqa: E402

CAPS = {
    "dtypes": ["f32", "f16", "bf16"],
    "head_dims": [8, 16],
    "masks": ["none", "causal_tl", "causal_br", "window"],
    "layouts": ["bhsd", "bshd"],
    "gqa": True,
    "varlen": False,
    "softcap": True,
    "alibi": True,
    "min_page_size": 1,
    "lse": True,
    "max_seqlen_q": 24,
    "max_seqlen_kv": 24,
    "tile_q": 8,
    "tile_kv": 8,
    "nonfinite_inputs": False,
    "backward": True,
    "backward_deterministic": True,  # the same float64 loops in the same order every time
}


def visible(shape, i, j):
    lq, lk = shape.seqlen_q, shape.seqlen_kv
    mask = shape.mask
    if mask == "none":
        return True
    if mask == "causal_tl":
        return j <= i
    if mask == "causal_br":
        return j <= i + lk - lq
    left, right = shape.window_left, shape.window_right
    centre = i + lk - lq
    return (left < 0 or j >= centre - left) and (right < 0 or j <= centre + right)


def modified(shape, h, i, j, s):
    """The score s of (query head h, row i, key j) with the problem's softcap
    and ALiBi, and the softcap's chain factor d s' / d s (1 without)."""
    chain = 1.0
    if shape.softcap > 0:
        t = math.tanh(s / shape.softcap)
        s, chain = shape.softcap * t, 1.0 - t * t
    if shape.alibi:
        s -= shape.alibi_slope(h) * abs(i + shape.seqlen_kv - shape.seqlen_q - j)
    return s, chain


def attention(shape, scale, q, k, v, table=None, ignore_table=False):
    """O [flat, storage order] and LSE [b][h][i], exactly in float64; K and V
    read through the page table when the problem is paged."""
    b_n, hq, hkv = shape.batch, shape.heads_q, shape.heads_kv
    sq, skv, d, dv = shape.seqlen_q, shape.seqlen_kv, shape.head_dim, shape.head_dim_v
    bshd = shape.layout == "bshd"

    def offset(b, h, s, heads, seq, dim):
        return (((b * seq + s) * heads + h) if bshd else ((b * heads + h) * seq + s)) * dim

    def key_offset(b, h, j, dim):
        if shape.page_size:
            page, slot = shape.key_slot(table, b, j)
            if ignore_table:  # the pool read as if its pages were in sequence order
                page = (b * shape.pages_per_sequence + j // shape.page_size) % shape.pages
            return offset(page, h, slot, hkv, shape.page_size, dim)
        return offset(b, h, j, hkv, skv, dim)

    o = [0.0] * (b_n * hq * sq * dv)
    lse = [0.0] * (b_n * hq * sq)
    for b in range(b_n):
        for h in range(hq):
            hk = h // (hq // hkv)
            for i in range(sq):
                qi = offset(b, h, i, hq, sq, d)
                qrow = q[qi:qi + d]
                scores = []
                for j in range(skv):
                    if not visible(shape, i, j):
                        continue
                    kj = key_offset(b, hk, j, d)
                    score, _ = modified(shape, h, i, j, scale * sum(a * c for a, c in zip(qrow, k[kj:kj + d])))
                    scores.append((j, score))
                oi = offset(b, h, i, hq, sq, dv)
                if not scores:
                    lse[(b * hq + h) * sq + i] = -math.inf
                    continue
                top = max(s for _, s in scores)
                if math.isinf(top) or math.isnan(top):  # the fake's domain has finite inputs only
                    top = 0.0
                weights = [(j, math.exp(s - top)) for j, s in scores]
                total = sum(w for _, w in weights)
                lse[(b * hq + h) * sq + i] = top + math.log(total)
                for c in range(dv):
                    o[oi + c] = sum(w * v[key_offset(b, hk, j, dv) + c] for j, w in weights) / total
    return o, lse


def attention_backward(shape, scale, q, k, v, do, reduce_gqa=True):
    """dQ, dK, dV [flat, storage order] of the exact attention in float64,
    from Q, K, V and dO: P recomputed from the scores (as a framework's
    autograd does), D_i = sum_j P_ij dP_ij (= dO_i . O_i for the exact O).
    dK and dV are per K/V head, summed over the query heads of each group;
    with reduce_gqa False only the group's first head counts (the mutant)."""
    b_n, hq, hkv = shape.batch, shape.heads_q, shape.heads_kv
    sq, skv, d, dv = shape.seqlen_q, shape.seqlen_kv, shape.head_dim, shape.head_dim_v
    bshd = shape.layout == "bshd"
    group = hq // hkv

    def offset(b, h, s, heads, seq, dim):
        return (((b * seq + s) * heads + h) if bshd else ((b * heads + h) * seq + s)) * dim

    dq = [0.0] * (b_n * hq * sq * d)
    dk = [0.0] * (b_n * hkv * skv * d)
    dvs = [0.0] * (b_n * hkv * skv * dv)
    for b in range(b_n):
        for h in range(hq):
            hk = h // group
            counts = reduce_gqa or h % group == 0
            for i in range(sq):
                qi = offset(b, h, i, hq, sq, d)
                qrow = q[qi:qi + d]
                scores, chains = [], {}
                for j in range(skv):
                    if visible(shape, i, j):
                        kj = offset(b, hk, j, hkv, skv, d)
                        score, chains[j] = modified(shape, h, i, j, scale * sum(a * c for a, c in zip(qrow, k[kj:kj + d])))
                        scores.append((j, score))
                if not scores:  # a row that sees no key: zero gradients, nothing into dK and dV
                    continue
                top = max(s for _, s in scores)
                total = sum(math.exp(s - top) for _, s in scores)
                oi = offset(b, h, i, hq, sq, dv)
                dorow = do[oi:oi + dv]
                probs = [(j, math.exp(s - top) / total) for j, s in scores]
                dprobs = {}
                for j, _ in probs:
                    vj = offset(b, hk, j, hkv, skv, dv)
                    dprobs[j] = sum(g * x for g, x in zip(dorow, v[vj:vj + dv]))
                delta = sum(p * dprobs[j] for j, p in probs)
                for j, p in probs:
                    dscore = p * (dprobs[j] - delta) * chains[j]  # through the softcap's tanh
                    kj = offset(b, hk, j, hkv, skv, d)
                    for c in range(d):
                        dq[qi + c] += scale * dscore * k[kj + c]
                        if counts:
                            dk[kj + c] += scale * dscore * qrow[c]
                    if counts:
                        vj = offset(b, hk, j, hkv, skv, dv)
                        for c in range(dv):
                            dvs[vj + c] += p * dorow[c]
    return dq, dk, dvs


#: One unit in the last place, relative, of each dtype's rounding.
ULP = {"f32": 2.0 ** -23, "f16": 2.0 ** -10, "bf16": 2.0 ** -7}


def check_handed(shape, scale, q, k, v, handed_o, handed_lse):
    """The O and LSE flashcheck hands a backward are the exact forward's,
    rounded once (O to the dtype, LSE to f32), in the problem's layout: a
    layout or row mix-up on flashcheck's side is a failure of the case."""
    o, lse = attention(shape, scale, q, k, v)
    for what, got, want, ulp in (("O", handed_o, o, ULP[shape.dtype]), ("LSE", handed_lse, lse, ULP["f32"])):
        for n, (g, w) in enumerate(zip(got, want)):
            close = g == w or abs(g - w) <= ulp * abs(w) + 1e-30
            if not close:
                raise Failed(f"the handed {what} differs from the exact forward at element {n}: {g!r} against {w!r}")


class FakeWorker(Worker):
    """The protocol-level misbehaviours: they bend the package's own answers."""

    mode = "good"
    at = 1
    cases = 0

    def hello(self, message):
        if self.mode == "protocol1":  # a worker that predates protocol 2 sees only "protocol": 1
            message = {key: value for key, value in message.items() if key != "protocols"}
        reply = super().hello(message)
        if self.mode == "bad-protocol" and reply["type"] == "hello":
            reply["protocol"] = 99
        return reply

    def answer(self, message):
        FakeWorker.cases += 1
        here = FakeWorker.cases == self.at
        if here and self.mode == "garbage":
            self.write_line("Traceback (most recent call last): this is not JSON")
            return None
        if here and self.mode == "null-reason":
            return {"type": "result", "id": message["id"], "status": "unsupported", "reason": None}
        if here and self.mode == "bad-status":
            return {"type": "result", "id": message["id"], "status": 5}
        reply = super().answer(message)
        if here and self.mode == "no-dq" and reply.get("status") == "ok":  # answered ok, dQ gone
            os.remove(message["outputs"]["dq"])
        if here and self.mode == "wrong-id":
            reply["id"] += 1
        return reply


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="good")
    parser.add_argument("--at", type=int, default=1)
    parser.add_argument("--tag", default="")  # ignored: lets a test find its workers
    args = parser.parse_args()
    mode = args.mode
    FakeWorker.mode, FakeWorker.at = mode, args.at
    if mode == "exit":
        print("fake_worker: exiting before the handshake, as asked", file=sys.stderr)
        sys.exit(3)
    if mode == "noisy":
        print("loading the fake backend...", flush=True)

    def capabilities(subject):
        if mode == "refuse":
            raise Failed("no device here (the fake refuses, as asked)")
        caps = dict(CAPS, warp_speed=True) if mode == "bad-caps" else CAPS
        return Hello(caps, description=f"fake worker ({mode})", version="fake 1.0")

    def run(request):
        here = FakeWorker.cases == args.at
        shape = request.shape
        if mode == "unsupported":
            raise Unsupported("the fake supports nothing")
        if mode == "error":
            raise Failed("the fake failed, as asked")
        if mode == "crash" and here:
            print("fake_worker: crashing on purpose", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode == "hang" and here:
            time.sleep(3600)
        if mode == "fatal" and here:
            raise Fatal("CUDA error (fake)")
        if mode == "setsid-child" and here:
            if os.fork() == 0:  # the grandchild: leaves the worker's process group and session
                os.setsid()
                os.closerange(0, 3)
                time.sleep(3600)
                os._exit(0)
        start = time.perf_counter()
        scale = shape.softmax_scale * (1.02 if mode == "wrong-scale" else 1.0)
        if request.backward:
            return backward(request, scale, start)
        o, lse = attention(shape, scale, request.read("q"), request.read("k"), request.read("v"),
                           request.read("page_table") if shape.page_size else None, mode == "page-table-ignored")
        elapsed = (time.perf_counter() - start) * 1e3
        if request.timing:
            return Result(times_ms=[elapsed] * request.timing.repeats)
        rows = list(shape.o_shape)
        if mode == "wrong-shape" and here:  # one query row too few
            rows[1 if shape.layout == "bshd" else 2] -= 1
            npy.write(request.outputs["o"], npy.DESCR[shape.dtype], rows,
                      npy.encode(o[:math.prod(rows)], shape.dtype))
            return Result(lse=lse, time_ms=elapsed)
        if mode == "fifo-output" and here:
            os.mkfifo(request.outputs["o"])
            return Result(lse=lse, time_ms=elapsed)
        if mode == "huge-output" and here:  # 2**30 float32: 4 GiB of holes, its header true to its size
            with open(request.outputs["o"], "wb") as stream:
                stream.write(npy.header("<f4", [1 << 30]))
                stream.truncate(stream.tell() + (4 << 30))
            return Result(lse=lse, time_ms=elapsed)
        if mode == "wrong-dtype" and here:
            npy.write(request.outputs["o"], "<f4", rows, npy.encode(o, "f32"))
            return Result(lse=lse, time_ms=elapsed)
        return Result(o=o, lse=None if mode == "no-lse" and here else lse, time_ms=elapsed)

    def backward(request, scale, start):
        shape = request.shape
        dq, dk, dv = attention_backward(shape, scale, request.read("q"), request.read("k"), request.read("v"),
                                        request.read("do"), reduce_gqa=mode != "wrong-dk")
        if mode != "wrong-scale":  # recomputed as torch does, and checked: flashcheck hands the right forward
            check_handed(shape, scale, request.read("q"), request.read("k"), request.read("v"), request.read("o"),
                         request.read("lse"))
        elapsed = (time.perf_counter() - start) * 1e3
        if mode == "dk-per-head":  # one head per query head: the GQA sum not done
            heads = list(shape.dk_shape)
            heads[2 if shape.layout == "bshd" else 1] = shape.heads_q
            npy.write(request.outputs["dk"], npy.DESCR[shape.dtype], heads,
                      npy.encode([0.0] * math.prod(heads), shape.dtype))
            return Result(dq=dq, dv=dv, time_ms=elapsed)
        return Result(dq=dq, dk=dk, dv=dv, time_ms=elapsed)

    sys.exit(serve(capabilities, run, worker=FakeWorker))


if __name__ == "__main__":
    main()
