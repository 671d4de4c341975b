"""The PyTorch worker on the GPU (ctest `external_torch`, labels gpu and
external): every backend on external/torch_smoke.problems, judged against
the f64 oracle. Usage: torch_sdpa_test.py PATH/TO/flashcheck

Exits 77 (ctest's SKIP) where torch or a CUDA device is missing. Expected
outcomes that are not a pass are listed with their reason: outside a
backend's domain (flashcheck or the worker refuses), and torch's own bugs
that flashcheck found (a known failure; the test fails when torch fixes it,
so that this table is kept true)."""
import json
import os
import subprocess
import sys
import tempfile

BINARY = sys.argv[1] if len(sys.argv) > 1 else "flashcheck"
HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = os.path.join(HERE, "torch_sdpa.json")
PROBLEMS = os.path.join(HERE, "torch_smoke.problems")
SUBJECTS = ["torch-flash", "torch-efficient", "torch-cudnn", "torch-math"]

# (subject, dseed of the smoke problem) -> expected verdict, and why.
EXPECTED = {
    ("torch-flash", 5): ("unsupported", "per-sequence lengths: not in this worker's flash domain"),
    ("torch-flash", 7): ("unsupported", "f32: FlashAttention is f16/bf16"),
    ("torch-flash", 9): ("unsupported", "causal_tl with seqlen_q != seqlen_kv: FlashAttention's causal is bottom-right"),
    ("torch-efficient", 1): ("unsupported", "GQA: torch 2.11's efficient kernel needs equal heads"),
    ("torch-efficient", 3): ("fail", "torch bug found by flashcheck: custom_mask_type=2 (bottom-right) with "
                                     "seqlen_q > seqlen_kv gives wrong rows (docs/external-subjects.md)"),
    ("torch-flash", 8): ("fail", "FlashAttention-2 writes LSE +inf, not NaN, for a row whose scores hold a NaN "
                                 "(its `sum != sum ? INFINITY` branch); O is NaN there, as it should be"),
    ("torch-cudnn", 7): ("unsupported", "f32: cuDNN SDPA is f16/bf16"),
}


def main():
    probe = subprocess.run([sys.executable, "-c", "import torch, numpy; assert torch.cuda.is_available()"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        print("SKIPPED: torch with CUDA (and numpy) is not importable here:", probe.stderr.strip()[-200:])
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        records = os.path.join(tmp, "records.jsonl")
        args = [BINARY, "external", "--config", CONFIG, "run", "--no-peer", "-q", "--problems", PROBLEMS,
                "--record", records]
        for subject in SUBJECTS:
            args += ["-s", subject]
        run = subprocess.run(args, capture_output=True, text=True, timeout=1200)
        print(run.stdout[-4000:], run.stderr[-2000:])
        if run.returncode not in (0, 1):
            print(f"FAIL: flashcheck exited {run.returncode}")
            return 1
        with open(records, encoding="utf-8") as f:
            got = [json.loads(line) for line in f]
    problems = [line for line in open(PROBLEMS, encoding="utf-8").read().splitlines()
                if line.strip() and not line.startswith("#")]
    failures = []
    seen = set()
    for r in got:
        seed = int(r["problem"].split("dseed=")[1].split()[0])
        verdict = r["verdict"]
        verdict = "fail" if verdict not in ("pass", "unsupported") else verdict
        want, why = EXPECTED.get((r["subject"], seed), ("pass", "inside the domain"))
        seen.add((r["subject"], seed))
        line = f"{r['subject']:16} dseed={seed}: {verdict:11} (expected {want}: {why})"
        print(line)
        if verdict != want:
            failures.append(line + (f" -- {r.get('message', '')[:300]}" if r.get("message") else ""))
    missing = [(s, i + 1) for s in SUBJECTS for i in range(len(problems)) if (s, i + 1) not in seen]
    if missing:
        failures.append(f"no record for {missing}")
    for line in failures:
        print("FAIL:", line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
