#!/usr/bin/env python3
"""Replays the GPU regression cases: every problem line of a regressions file
must pass `flashcheck run` on each subject named by the `# subjects: a,b,...`
line above it. A line runs once on all its subjects (one process: the f64
oracle and the references are computed once, not once a subject), and each
subject's verdict is read from the run's records: a subject passes only with
a record whose verdict is `pass`. Each line is judged as it was when it
failed, on the rows the judge samples (`--every-row off`): with every key row
compared, a dominant key's own terms set the gradients' floor, and a flushed
subnormal dK, the failure the backward lines record, hides under it
(docs/perf.md, 2026-11-28).

Usage: regressions_test.py PATH/TO/flashcheck PATH/TO/regressions.problems

Exits 77 (ctest's SKIP) where no GPU can run any of them: no device, or a build
without CUDA. A subject whose minimum compute capability is above every
device's is skipped alone, and said so. A subject the binary does not know, in
a build that has a GPU, is a failure (a renamed kernel must not silence its
regression case). Under a ctest resource allocation (CTEST_RESOURCE_GROUP_0_GPUS
"id:N,slots:1") the runs see that device only."""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

SKIP = 77


def read_blocks(path):
    """[(subjects, [problem lines])] in file order."""
    blocks, subjects = [], None
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            directive = re.match(r"#\s*subjects:\s*(.+)$", line)
            if directive:
                subjects = [s.strip() for s in directive.group(1).split(",") if s.strip()]
                blocks.append((subjects, []))
            elif line and not line.startswith("#"):
                if subjects is None:
                    sys.exit(f"{path}:{number}: a problem line before any '# subjects:' line")
                blocks[-1][1].append(line)
    return blocks


def inventory(binary, env):
    """(largest compute capability of a visible GPU or None, why none,
    {subject: minimum compute capability} of the binary's GPU subjects)."""
    listing = subprocess.run([binary, "list"], capture_output=True, text=True, timeout=120, env=env)
    if listing.returncode != 0:
        sys.exit(f"`flashcheck list` failed ({listing.returncode}): {listing.stderr.strip()}")
    text = listing.stdout
    capabilities = [int(cc) for cc in re.findall(r"^GPU \d+: .*\(sm_(\d+),", text, re.M)]
    none = re.search(r"^GPU: none \((.*)\)", text, re.M)
    gpu_subjects = {}
    name = None
    for line in text.splitlines():
        # A subject's line starts with its name two spaces in (a name of 20
        # characters or more is followed by one space); its capabilities line
        # follows, indented further.
        entry = re.match(r"^  (\S+)\s", line)
        if entry:
            name = entry.group(1)
            continue
        device = re.search(r"device=gpu\(sm_(\d+)\+\)", line)
        if device and name:
            gpu_subjects[name] = int(device.group(1))
    return (max(capabilities) if capabilities else None), (none.group(1) if none else "no GPU listed"), gpu_subjects


def replay(binary, subjects, line, env):
    """Runs `line` on `subjects` in one `flashcheck run`: ({subject: verdict}
    from its records, the finished process)."""
    with tempfile.TemporaryDirectory() as scratch:
        records = os.path.join(scratch, "records.jsonl")
        command = [binary, "run", "--no-peer", "--every-row", "off", "-q", "-s", ",".join(subjects), "-p", line, "--record", records]
        run = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
        verdicts = {}
        if os.path.exists(records):
            with open(records, encoding="utf-8") as f:
                for text in f:
                    record = json.loads(text)
                    verdicts[record["subject"]] = record["verdict"]
    return verdicts, run


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: regressions_test.py PATH/TO/flashcheck PATH/TO/regressions.problems")
    binary, path = sys.argv[1], sys.argv[2]
    env = dict(os.environ)
    allocation = re.search(r"id:([^,]+)", env.get("CTEST_RESOURCE_GROUP_0_GPUS", ""))
    if allocation:
        env["CUDA_VISIBLE_DEVICES"] = allocation.group(1)
    blocks = read_blocks(path)
    if not any(lines for _, lines in blocks):
        sys.exit(f"{path}: no problem line")
    best, why_none, gpu_subjects = inventory(binary, env)
    if best is None:
        print(f"SKIP: no GPU to replay {path} on: {why_none}")
        return SKIP

    failed, ran, skipped = [], 0, []
    for subjects, lines in blocks:
        runnable = []
        for subject in subjects:
            if subject not in gpu_subjects:
                failed.append(f"{subject}: not a GPU subject of this build ({binary})")
            elif gpu_subjects[subject] > best:
                skipped.append(f"{subject} (needs sm_{gpu_subjects[subject]}, the best device here is sm_{best})")
            else:
                runnable.append(subject)
        for line in lines:
            if not runnable:
                continue
            started = time.monotonic()
            verdicts, run = replay(binary, runnable, line, env)
            seconds = time.monotonic() - started
            for subject in runnable:
                ran += 1
                verdict = verdicts.get(subject, f"no record (exit {run.returncode})")
                print(f"{'PASS' if verdict == 'pass' else 'FAIL (' + verdict + ')'}  {subject:<18} {line}")
                if verdict != "pass":
                    failed.append(f"{subject}: {line}   replay: flashcheck run -s {subject} -p '{line}'")
            print(f"  ({len(runnable)} subject(s) in one run, {seconds:.1f} s)")
            if run.returncode != 0 or any(verdicts.get(s) != "pass" for s in runnable):
                print(run.stdout + run.stderr)
                if run.returncode != 0 and all(verdicts.get(s) == "pass" for s in runnable):
                    failed.append(f"{','.join(runnable)}: {line}   exit {run.returncode} with every verdict pass")
    for s in sorted(set(skipped)):
        print(f"skipped: {s}")
    if failed:
        print(f"\n{len(failed)} regression case(s) failed:")
        for f in failed:
            print(f"  {f}")
        return 1
    if ran == 0:
        print("SKIP: no subject of the regressions file can run on this machine's GPU")
        return SKIP
    print(f"\n{ran} regression case(s) passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
