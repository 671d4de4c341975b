#!/usr/bin/env python3
"""A fake external worker for flashcheck's protocol tests: the standard library
only (no NumPy, no GPU), a small exact attention in float64, and modes that
misbehave on purpose.

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
Case numbers count this process's cases from 1: after a restart, again from 1.
"""
import argparse
import ast
import json
import math
import os
import signal
import struct
import sys
import time

CAPS = {
    "dtypes": ["f32", "f16", "bf16"],
    "head_dims": [8, 16],
    "masks": ["none", "causal_tl", "causal_br", "window"],
    "layouts": ["bhsd", "bshd"],
    "gqa": True,
    "varlen": False,
    "lse": True,
    "max_seqlen_q": 24,
    "max_seqlen_kv": 24,
    "tile_q": 8,
    "tile_kv": 8,
}
DESCR = {"f32": "<f4", "f16": "<f2", "bf16": "<u2"}


def read_npy(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:6] == b"\x93NUMPY", path
    length = struct.unpack("<H", data[8:10])[0]
    header = ast.literal_eval(data[10:10 + length].decode("latin1"))
    body = data[10 + length:]
    count = math.prod(header["shape"])
    descr = header["descr"]
    if descr == "<f4":
        values = struct.unpack(f"<{count}f", body)
    elif descr == "<f2":
        values = struct.unpack(f"<{count}e", body)
    elif descr == "<u2":  # bf16 bit patterns
        values = [struct.unpack("<f", struct.pack("<I", bits << 16))[0] for bits in struct.unpack(f"<{count}H", body)]
    else:
        raise ValueError(f"unexpected dtype {descr}")
    return list(header["shape"]), list(values)


def to_bits(value, dtype):
    """One value rounded to nearest even in dtype, as packed bytes."""
    if dtype == "f32":
        try:
            return struct.pack("<f", value)
        except OverflowError:
            return struct.pack("<f", math.copysign(math.inf, value))
    if dtype == "f16":
        try:
            return struct.pack("<e", value)
        except OverflowError:
            return struct.pack("<e", math.copysign(math.inf, value))
    # bf16 from the exact float64: its float32 rounding first would round twice.
    if math.isnan(value):
        return struct.pack("<H", 0x7FC0)
    bits = struct.unpack("<Q", struct.pack("<d", value))[0]
    sign, exponent, mantissa = bits >> 63, (bits >> 52) & 0x7FF, bits & ((1 << 52) - 1)
    if value == 0 or exponent == 0:  # zero and float64 subnormals (far below bf16's)
        return struct.pack("<H", sign << 15)
    e = exponent - 1023
    if e < -126:  # bf16 subnormal: scale to an integer count of 2^-133
        scaled = abs(value) * 2.0 ** 133
        integer = round(scaled)  # Python rounds half to even
        return struct.pack("<H", (sign << 15) | integer)
    full = (1 << 52) | mantissa  # 53 bits
    kept, rest = full >> 45, full & ((1 << 45) - 1)  # 8 bits kept (1 hidden + 7)
    half = 1 << 44
    if rest > half or (rest == half and kept & 1):
        kept += 1
        if kept == 1 << 8:
            kept >>= 1
            e += 1
    if e > 127:
        return struct.pack("<H", (sign << 15) | 0x7F80)
    return struct.pack("<H", (sign << 15) | ((e + 127) << 7) | (kept & 0x7F))


def write_npy(path, descr, shape, payload):
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + payload)


def visible(shape, i, j):
    lq, lk = shape["seqlen_q"], shape["seqlen_kv"]
    mask = shape["mask"]
    if mask == "none":
        return True
    if mask == "causal_tl":
        return j <= i
    if mask == "causal_br":
        return j <= i + lk - lq
    left, right = shape["window_left"], shape["window_right"]
    centre = i + lk - lq
    return (left < 0 or j >= centre - left) and (right < 0 or j <= centre + right)


def attention(shape, inputs):
    """O [rows in storage order] and LSE [b][h][i], exactly in float64."""
    b_n, hq, hkv = shape["batch"], shape["heads_q"], shape["heads_kv"]
    sq, skv, d, dv = shape["seqlen_q"], shape["seqlen_kv"], shape["head_dim"], shape["head_dim_v"]
    bshd = shape["layout"] == "bshd"
    tensors = {}
    for key in "qkv":
        _, values = read_npy(inputs[key])
        tensors[key] = values
    q, k, v = tensors["q"], tensors["k"], tensors["v"]

    def offset(b, h, s, heads, seq, dim):
        return (((b * seq + s) * heads + h) if bshd else ((b * heads + h) * seq + s)) * dim

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
                    kj = offset(b, hk, j, hkv, skv, d)
                    scores.append((j, shape["softmax_scale"] * sum(a * c for a, c in zip(qrow, k[kj:kj + d]))))
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
                    o[oi + c] = sum(w * v[offset(b, hk, j, hkv, skv, dv) + c] for j, w in weights) / total
    return o, lse


def reply(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="good")
    parser.add_argument("--at", type=int, default=1)
    parser.add_argument("--tag", default="")  # ignored: lets a test find its workers
    args = parser.parse_args()
    mode = args.mode
    if mode == "exit":
        print("fake_worker: exiting before the handshake, as asked", file=sys.stderr)
        sys.exit(3)
    if mode == "noisy":
        print("loading the fake backend...", flush=True)
    cases = 0
    for line in sys.stdin:
        request = json.loads(line)
        if request["type"] == "hello":
            if mode == "refuse":
                reply({"type": "error", "message": "no device here (the fake refuses, as asked)"})
                continue
            caps = dict(CAPS, nonfinite_inputs=False)
            if mode == "bad-caps":
                caps["warp_speed"] = True
            reply({"type": "hello", "protocol": 99 if mode == "bad-protocol" else 1, "subject": request["subject"],
                   "description": f"fake worker ({mode})", "version": "fake 1.0", "capabilities": caps})
            continue
        if request["type"] != "run":
            reply({"type": "result", "id": request.get("id"), "status": "error", "message": "unknown request"})
            continue
        cases += 1
        here = cases == args.at
        shape = request["shape"]
        if mode == "unsupported":
            reply({"type": "result", "id": request["id"], "status": "unsupported", "reason": "the fake supports nothing"})
            continue
        if mode == "error":
            reply({"type": "result", "id": request["id"], "status": "error", "message": "the fake failed, as asked"})
            continue
        if mode == "crash" and here:
            print("fake_worker: crashing on purpose", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode == "hang" and here:
            time.sleep(3600)
        if mode == "fatal" and here:
            reply({"type": "result", "id": request["id"], "status": "error", "message": "CUDA error (fake)",
                   "fatal": True})
            sys.exit(1)
        if mode == "null-reason" and here:
            reply({"type": "result", "id": request["id"], "status": "unsupported", "reason": None})
            continue
        if mode == "bad-status" and here:
            reply({"type": "result", "id": request["id"], "status": 5})
            continue
        if mode == "garbage" and here:
            sys.stdout.write("Traceback (most recent call last): this is not JSON\n")
            sys.stdout.flush()
            continue
        start = time.perf_counter()
        if mode == "wrong-scale":
            shape = dict(shape, softmax_scale=shape["softmax_scale"] * 1.02)
        o, lse = attention(shape, request["inputs"])
        elapsed = (time.perf_counter() - start) * 1e3
        dtype = shape["dtype"]
        rows = [shape["batch"], shape["heads_q"], shape["seqlen_q"], shape["head_dim_v"]]
        if shape["layout"] == "bshd":
            rows[1], rows[2] = rows[2], rows[1]
        if mode == "wrong-shape" and here:  # one query row too few
            rows[1 if shape["layout"] == "bshd" else 2] -= 1
            o = o[:math.prod(rows)]
        if mode == "wrong-dtype" and here:
            write_npy(request["outputs"]["o"], "<f4", rows, b"".join(to_bits(x, "f32") for x in o))
        else:
            write_npy(request["outputs"]["o"], DESCR[dtype], rows, b"".join(to_bits(x, dtype) for x in o))
        if not (mode == "no-lse" and here):
            write_npy(request["outputs"]["lse"], "<f4", [shape["batch"], shape["heads_q"], shape["seqlen_q"]],
                      b"".join(to_bits(x, "f32") for x in lse))
        answer = {"type": "result", "id": request["id"] + (1 if mode == "wrong-id" and here else 0), "status": "ok",
                  "time_ms": elapsed}
        if request.get("timing"):
            answer["times_ms"] = [elapsed] * request["timing"]["repeats"]
        reply(answer)


if __name__ == "__main__":
    main()
