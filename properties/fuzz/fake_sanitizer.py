#!/usr/bin/env python3
"""A stand-in for compute-sanitizer, for the sanitizer mode's tests on machines
without a GPU (FLASHCHECK_COMPUTE_SANITIZER points here). It accepts the
options the sweep passes, runs the program with its stdin and stdout, and
reports a finding (a report in --log-file and the --error-exitcode) when the
case's subject is named in FAKE_SANITIZER_FINDS. The real tool runs in the GPU
tests (fuzz_gpu)."""
import os
import subprocess
import sys

args = sys.argv[1:]
options = {}
while args and args[0].startswith("--"):
    options[args[0]] = args[1]
    args = args[2:]
request = sys.stdin.read()
child = subprocess.run(args, input=request, stdout=sys.stdout, text=True)
subject = request.split("\t")[1] if request.count("\t") >= 2 else ""
finds = subject and subject in os.environ.get("FAKE_SANITIZER_FINDS", "").split(",")
with open(options["--log-file"], "w", encoding="utf-8") as log:
    log.write("========= COMPUTE-SANITIZER\n")
    if finds:
        log.write(f"========= Invalid __global__ write of size 4 bytes ({options['--tool']}, fake)\n")
        log.write("=========     at fake_kernel()+0x10\n")
    log.write(f"========= ERROR SUMMARY: {1 if finds else 0} error(s)\n")
sys.exit(int(options["--error-exitcode"]) if finds else child.returncode)
