"""`flashcheck external` end to end (ctest label `external`), with the fake
worker: run, list, a fuzz sweep over good and misbehaving workers, and the
one-line errors. Usage: external_cli_test.py PATH/TO/flashcheck"""
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest

BINARY = sys.argv.pop(1) if len(sys.argv) > 1 else "flashcheck"
HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "fake_worker.py")
TAG = f"flashcheck-cli-test-{os.getpid()}"  # marks this test's workers, to find leftovers
PYTHON = sys.executable


def fake(mode="good", at=1):
    return f"{PYTHON} {FAKE} --mode {mode} --at {at} --tag {TAG}"


def flashcheck(*args, timeout=300):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=timeout)


def leftover_workers():
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if TAG in line and "ps -eo" not in line]


class External(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()
        deadline = time.monotonic() + 5
        while leftover_workers() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(leftover_workers(), [], "a worker outlived flashcheck")

    def config(self, workers):
        path = os.path.join(self.dir, "workers.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"workers": [{"name": name, "cmd": cmd} for name, cmd in workers]}, f)
        return path

    def test_run_judges_a_worker_against_the_oracle(self):
        run = flashcheck("external", "--cmd", fake(), "--name", "fake", "run", "-s", "fake", "-p",
                         "b=2 hq=4 hkv=2 sq=11 skv=19 d=16 dtype=bf16 layout=bshd mask=causal_br dseed=2")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn("verdict: PASS", run.stdout)
        self.assertNotIn("FAIL", run.stdout)  # one verdict per case, and it passed
        self.assertIn("subject: fake 1.0", run.stdout)

    BACKWARD = "b=2 hq=4 hkv=2 sq=11 skv=19 d=16 dtype=bf16 layout=bshd mask=causal_br pass=bwd dseed=2"

    def run_backward(self, mode):
        run = flashcheck("external", "--cmd", fake(mode), "--name", "fake", "run", "-s", "fake", "-p", self.BACKWARD)
        if run.returncode == 2 and "pass" in run.stderr and "bwd" in run.stderr:
            self.skipTest(f"this flashcheck's judge does not take pass=bwd yet: {run.stderr.strip()[-200:]}")
        return run

    def test_run_judges_a_workers_backward(self):  # protocol 2, end to end through the judge
        run = self.run_backward("good")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertNotIn("FAIL", run.stdout)

    def test_run_catches_a_workers_backward_without_the_gqa_sum(self):
        run = self.run_backward("wrong-dk")
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        self.assertIn("dk.", run.stdout + run.stderr)

    def test_run_kokkos_triangulates_each_case(self):  # not external, but the same binary and harness
        # A padded batch: rows past a sequence's length are padding, skipped as the judge skips them.
        run = flashcheck("run", "-s", "smoke-cpu-lowp", "--kokkos", "-p",
                         "b=2 hq=2 sq=7 skv=9 lens_q=3,7 lens_kv=9,2 d=8 dtype=f32 mask=causal_br dseed=4")
        if run.returncode == 2 and "no Kokkos reference" in run.stderr:
            self.skipTest("this build has no Kokkos reference")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        lines = dict((line.strip()[:22].strip(), line.strip()[22:]) for line in run.stdout.splitlines()
                     if line.strip().startswith(("cpu_f64 vs", "subject vs")))
        self.assertEqual(set(lines), {"cpu_f64 vs kokkos_f64", "subject vs cpu_f64", "subject vs kokkos_f64"})
        for name, text in lines.items():  # "1.2e-07 (3.4e-07)": O, then LSE
            o, lse = (float(x.strip("()")) for x in text.split())
            self.assertLess(o, 1e-5 if name.startswith("subject") else 1e-12, name)  # smoke-cpu-lowp rounds to f32

    def test_list_shows_the_declared_domain(self):
        run = flashcheck("external", "--config", self.config([("fake-a", fake()), ("fake-b", fake())]), "list")
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertRegex(run.stdout, r"fake-a .*fake worker \(good\) \[external: ")
        self.assertIn("dtypes=f32,f16,bf16 d=8,16", run.stdout)
        self.assertIn("fake-b", run.stdout)

    def test_fuzz_records_each_misbehaviour_and_goes_on(self):
        config = self.config([("fake-good", fake()), ("fake-crash", fake("crash", 2)), ("fake-hang", fake("hang", 2)),
                              ("fake-garbage", fake("garbage", 2))])
        out = os.path.join(self.dir, "sweep")
        run = flashcheck("external", "--config", config, "--watchdog", "3", "fuzz", "--subjects",
                         "fake-good,fake-crash,fake-hang,fake-garbage,smoke-cpu-lowp", "--cases", "40", "--seed", "7",
                         "--shrink-runs", "0", "--out", out, timeout=600)
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)  # failures were found
        self.assertRegex(run.stdout, r"sweep summary: 40 case\(s\)")
        with open(os.path.join(out, "records.jsonl"), encoding="utf-8") as f:
            got = [json.loads(line) for line in f]
        self.assertEqual(len(got), 40)
        by = {}
        for r in got:
            by.setdefault(r["subject"], []).append(r)
        self.assertEqual(set(by), {"fake-good", "fake-crash", "fake-hang", "fake-garbage", "smoke-cpu-lowp"})
        for name in ("fake-good", "smoke-cpu-lowp"):
            self.assertTrue(all(r["verdict"] in ("pass", "unsupported") for r in by[name]), by[name])
        # Every worker answers its first case and misbehaves on its second;
        # the sweep's worker process lives on, and so each misbehaviour
        # shows once per sweep worker.
        expected = {"fake-crash": "killed by signal 11", "fake-hang": "within 3 s (watchdog)",
                    "fake-garbage": "malformed reply"}
        for name, text in expected.items():
            failed = [r for r in by[name] if r["verdict"] not in ("pass", "unsupported")]
            self.assertTrue(failed, f"{name}: no failure recorded")
            for r in failed:
                self.assertIn(text, r.get("message", ""), r)
                self.assertIn("--problem '", r["reproducer"])
            self.assertTrue(any(r["verdict"] == "pass" for r in by[name]), f"{name}: never recovered")
        self.assertTrue(os.path.exists(os.path.join(out, "corpus", "fake-crash.problems")))

    def test_bad_workers_are_one_line_and_exit_2(self):
        cases = [
            (["--cmd", "flashcheck-no-such-worker", "--name", "x", "list"], "cannot run 'flashcheck-no-such-worker'"),
            (["--cmd", fake("refuse"), "--name", "x", "list"], "refused the handshake"),
            (["--cmd", fake("bad-caps"), "--name", "x", "list"], "unknown key 'warp_speed'"),
            (["--cmd", fake(), "--name", "smoke-cpu-lowp", "list"], "the name is taken"),
            (["--cmd", fake(), "--name", "two words", "list"], "without spaces"),
            (["list"], "needs --cmd and --name, or --config"),
            (["fuzz", "--cases", "3", "--out", os.path.join(self.dir, "never")], "needs --cmd and --name, or --config"),
            (["--cmd", fake(), "list"], "--name"),
        ]
        for args, text in cases:
            with self.subTest(args=args):
                run = flashcheck("external", *args)
                self.assertEqual(run.returncode, 2, run.stdout + run.stderr)
                self.assertIn(text, run.stderr)
                self.assertEqual(len(run.stderr.strip().splitlines()), 1, run.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "never")), "the sweep ran before the check")

    # Issue 21's worker findings, through `run`.
    SMALL = "b=1 hq=2 hkv=1 sq=9 skv=13 d=8 dtype=f16 layout=bhsd mask=none dseed=5"

    def test_run_with_a_fifo_for_output_returns_within_the_watchdog(self):
        start = time.monotonic()
        run = flashcheck("external", "--cmd", fake("fifo-output"), "--name", "fake", "--watchdog", "10", "run",
                         "-s", "fake", "-p", self.SMALL, timeout=60)
        self.assertLess(time.monotonic() - start, 10, "run waited on the FIFO")
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        said = [line for line in (run.stdout + run.stderr).splitlines() if "is a FIFO, not a regular file" in line]
        self.assertEqual(len(said), 1, run.stdout + run.stderr)

    def test_run_refuses_a_huge_sparse_output_by_its_size(self):
        run = flashcheck("external", "--cmd", fake("huge-output"), "--name", "fake", "run", "-s", "fake", "-p",
                         self.SMALL, timeout=60)
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        said = [line for line in (run.stdout + run.stderr).splitlines() if "refused unread" in line]
        self.assertEqual(len(said), 1, run.stdout + run.stderr)

    def test_a_setsid_grandchild_does_not_outlive_run(self):
        run = flashcheck("external", "--cmd", fake("setsid-child"), "--name", "fake", "run", "-s", "fake", "-p",
                         self.SMALL, timeout=60)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertEqual(leftover_workers(), [], "a process the worker started outlived run")

    def test_environment_config_registers_for_any_command(self):
        env = dict(os.environ, FLASHCHECK_EXTERNAL=self.config([("fake-env", fake())]))
        run = subprocess.run([BINARY, "run", "-s", "fake-env", "-q", "-p", "b=1 hq=2 sq=5 skv=6 d=8 dtype=f16"],
                             capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertRegex(run.stdout, r"PASS\s+fake-env")


if __name__ == "__main__":
    unittest.main()
