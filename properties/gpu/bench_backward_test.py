#!/usr/bin/env python3
"""`flashcheck bench` on a backward problem (issue 22 item 6): the GPU backward
subject and cuDNN's backward are both timed beside each other, their records
count 2.5 times the forward's FLOPs (flash-attention's and cuDNN's
convention) and every tensor and its gradient moved once, and the forward of
the same problem is timed apart (its FLOPs the forward's).

Usage: bench_backward_test.py PATH/TO/flashcheck

Exits 77 (ctest's SKIP) where nothing can be timed: no GPU, or a build without
CUDA (bench's exit code 2 with its reason on stderr)."""
import json
import os
import subprocess
import sys
import tempfile

SKIP = 77
SUBJECT = "fa2-rowthread-bwd"
# b, hq, hkv, sq, skv, d: unmasked, so the FLOPs are 4 b hq sq skv d.
B, HQ, HKV, SQ, SKV, D = 2, 8, 2, 512, 512, 64
LINE = f"b={B} hq={HQ} hkv={HKV} sq={SQ} skv={SKV} d={D} dtype=bf16"


def main():
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as folder:
        records = os.path.join(folder, "bench.jsonl")
        run = subprocess.run([binary, "bench", "-s", SUBJECT, "-p", LINE + " pass=bwd", "-p", LINE, "--warmup", "2",
                              "--repeats", "5", "--record", records], capture_output=True, text=True, timeout=600)
        print(run.stdout)
        print(run.stderr, file=sys.stderr)
        if run.returncode == 2 and not os.path.exists(records):
            print("SKIP: nothing can be timed here")
            return SKIP
        if run.returncode != 0:
            print(f"FAIL: bench exited {run.returncode}")
            return 1
        with open(records, encoding="utf-8") as f:
            timings = [r for r in map(json.loads, f) if r.get("kind") == "bench"]
    forward_flops = 4.0 * B * HQ * SQ * SKV * D
    tensors = 2 * (B * HQ * SQ * D * 2 + B * HKV * SKV * D * 2)  # Q, O and K, V, bf16
    lse = B * HQ * SQ * 4
    want = {
        (SUBJECT, "bwd"): (2.5 * forward_flops, 2 * tensors + lse),
        ("cudnn", "bwd"): (2.5 * forward_flops, 2 * tensors + lse),
        (SUBJECT, "fwd"): (forward_flops, tensors + lse),
        ("cudnn", "fwd"): (forward_flops, tensors + lse),
    }
    failures = []
    seen = set()
    for r in timings:
        which = (r["subject"], "bwd" if "pass=bwd" in r["problem"] else "fwd")
        seen.add(which)
        if which not in want:
            failures.append(f"an unexpected timing: {which}")
            continue
        flops, moved = want[which]
        if r.get("flops") != flops:
            failures.append(f"{which}: flops {r.get('flops')}, want {flops}")
        if r.get("bytes") != moved:
            failures.append(f"{which}: bytes {r.get('bytes')}, want {moved}")
        if not r["median_ms"] > 0 or len(r["samples_ms"]) != 5:
            failures.append(f"{which}: median {r['median_ms']} ms over {len(r['samples_ms'])} samples")
        if which[0] == SUBJECT and not r.get("speed_vs_peer", 0) > 0:
            failures.append(f"{which}: no speed against the peer")
    for which in want:
        if which not in seen:
            failures.append(f"not timed: {which}")
    # Each problem ends with its summary line: the fastest, and the subject over cuDNN.
    summaries = [l for l in run.stdout.splitlines() if l.startswith("  best: ")]
    if len(summaries) != 2 or not all(f"vs cudnn: {SUBJECT} " in l for l in summaries):
        failures.append(f"want two summary lines naming {SUBJECT} against cudnn, got {summaries}")
    for failure in failures:
        print("FAIL:", failure)
    if not failures:
        print(f"PASS: {len(timings)} timings, the backward's FLOPs 2.5 times the forward's")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
