"""The sweep's tests (ctest label `fuzz`): run `flashcheck-testing fuzz` and
check its records. Usage: fuzz_test.py PATH/TO/flashcheck-testing [--gpu]

With --gpu it runs the GPU variants instead (a real illegal address, a
misaligned load, a kernel that never ends); with --gpu-sanitize, memcheck and
racecheck through the sanitizer mode. Both exit 77 (ctest's SKIP) where there
is no usable GPU, and --gpu-sanitize also where compute-sanitizer is missing."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

BINARY = sys.argv.pop(1) if len(sys.argv) > 1 else "flashcheck-testing"
MODE = next((a for a in sys.argv[1:] if a in ("--gpu", "--gpu-sanitize")), "")
if MODE:
    sys.argv.remove(MODE)
HERE = os.path.dirname(os.path.abspath(__file__))
CPU_MUTANTS = ["mutant-cpu-no-max-subtraction", "mutant-cpu-br-as-tl", "mutant-cpu-causal-off-by-one",
               "mutant-cpu-scale-squared", "mutant-cpu-lse-log2", "mutant-cpu-window-off-by-one"]
# Under AddressSanitizer a SIGSEGV is caught by ASan, which reports it and
# exits with status 1: the worker still dies, with a different epitaph.
SEGV_EPITAPH = "exited with status 1" if os.environ.get("FLASHCHECK_SANITIZED") == "1" else "signal 11"


def sweep(out, *args, timeout=300, env=None):
    return subprocess.run([BINARY, "fuzz", "--out", out, *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


def records(out):
    with open(os.path.join(out, "records.jsonl"), encoding="utf-8") as f:
        text = f.read()
    assert text == "" or text.endswith("\n"), "records.jsonl ends with a torn line"
    return [json.loads(line) for line in text.splitlines()]


class Sweep(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def out(self, name):
        return os.path.join(self.dir, name)

    def test_cpu_sweep_passes_and_summarises(self):
        run = sweep(self.out("a"), "--subjects", "smoke-cpu-lowp,cpu-plain", "--cases", "30", "--seed", "11")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        got = records(self.out("a"))
        self.assertEqual(len(got), 30)
        self.assertEqual(len({r["case"] for r in got}), 30)
        # vacuous: a case that compares nothing (none is drawn on purpose; counted apart if one is)
        self.assertTrue(all(r["verdict"] in ("pass", "vacuous", "unsupported") for r in got), got)
        self.assertEqual({r["subject"] for r in got}, {"smoke-cpu-lowp", "cpu-plain"})
        self.assertRegex(run.stdout, r"sweep summary: 30 case\(s\) run in [0-9.]+ min \([0-9]+ cases/min\), 0 failure")
        self.assertRegex(run.stdout, r"oracles \(f64 \+ baseline\) [0-9.]+ s \([0-9]+%\)")

    def test_same_seed_same_cases(self):
        for name in ("a", "b"):
            sweep(self.out(name), "--subjects", "smoke-cpu-lowp,cpu-plain", "--cases", "15", "--seed", "5")
        first = [(r["case"], r["subject"], r["problem"]) for r in records(self.out("a"))]
        second = [(r["case"], r["subject"], r["problem"]) for r in records(self.out("b"))]
        self.assertEqual(first, second)
        sweep(self.out("c"), "--subjects", "smoke-cpu-lowp,cpu-plain", "--cases", "15", "--seed", "6")
        self.assertNotEqual(first, [(r["case"], r["subject"], r["problem"]) for r in records(self.out("c"))])

    def test_shards_are_disjoint_slices_of_one_stream(self):
        whole = {}
        sweep(self.out("whole"), "--subjects", "smoke-cpu-lowp,cpu-plain", "--cases", "12", "--seed", "9")
        for r in records(self.out("whole")):
            whole[r["case"]] = (r["subject"], r["problem"])
        parts = {}
        for i in range(3):
            sweep(self.out(f"s{i}"), "--subjects", "smoke-cpu-lowp,cpu-plain", "--cases", "4", "--seed", "9", "--shard",
                  f"{i}/3")
            for r in records(self.out(f"s{i}")):
                self.assertNotIn(r["case"], parts, "a case ran in two shards")
                parts[r["case"]] = (r["subject"], r["problem"])
        self.assertEqual(parts, whole)

    def test_a_crashing_worker_is_a_recorded_failure_and_the_sweep_goes_on(self):
        run = sweep(self.out("a"), "--subjects", "misbehave-crash,smoke-cpu-lowp", "--cases", "12", "--seed", "3")
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        got = records(self.out("a"))
        self.assertEqual(len(got), 12)
        crashes = [r for r in got if r["subject"] == "misbehave-crash"]
        self.assertTrue(crashes)
        for r in crashes:
            self.assertEqual(r["verdict"], "crash")
            self.assertIn(SEGV_EPITAPH, r["message"])
            self.assertIn("--problem '", r["reproducer"])
        self.assertTrue(all(r["verdict"] in ("pass", "vacuous") for r in got if r["subject"] == "smoke-cpu-lowp"))
        with open(os.path.join(self.out("a"), "corpus", "misbehave-crash.problems"), encoding="utf-8") as f:
            lines = [line for line in f.read().splitlines() if line and not line.startswith("#")]
        expected = [r["problem"] for r in crashes] + [r["shrunk_problem"] for r in crashes if "shrunk_problem" in r]
        self.assertEqual(sorted(lines), sorted(expected))

    def test_a_worker_with_a_sticky_fault_is_replaced(self):
        run = sweep(self.out("a"), "--subjects", "misbehave-fault,smoke-cpu-lowp", "--cases", "16", "--seed", "21",
                    "--shrink-runs", "0")
        self.assertEqual(run.returncode, 1, run.stderr)
        got = records(self.out("a"))
        self.assertEqual(len(got), 16)
        verdicts = {r["subject"]: set() for r in got}
        for r in got:
            verdicts[r["subject"]].add(r["verdict"])
        self.assertEqual(verdicts["misbehave-fault"], {"fault"})
        self.assertLessEqual(verdicts["smoke-cpu-lowp"], {"pass", "vacuous"})

    def test_an_unavailable_subject_is_counted_apart_never_passed(self):
        run = sweep(self.out("a"), "--subjects", "misbehave-unavailable,cpu-plain", "--cases", "12", "--seed", "5")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)  # nothing failed
        got = records(self.out("a"))
        self.assertEqual(len(got), 12)
        verdicts = {r["subject"]: set() for r in got}
        for r in got:
            verdicts[r["subject"]].add(r["verdict"])
        self.assertEqual(verdicts["misbehave-unavailable"], {"unavailable"})
        mine = sum(1 for r in got if r["subject"] == "misbehave-unavailable")
        self.assertRegex(run.stdout, rf"misbehave-unavailable\s+0\s+0\s+0\s+.*\s0\s+{mine}\s")  # no case, no pass
        self.assertIn(f"UNAVAILABLE  misbehave-unavailable: {mine} case(s) not run on this machine: needs a device",
                      run.stdout)
        self.assertFalse(os.path.exists(os.path.join(self.out("a"), "corpus", "misbehave-unavailable.problems")))
        # --require-gpu: a failure, said in one line naming the subject (or, with no GPU at all, before any case).
        strict = sweep(self.out("b"), "--subjects", "misbehave-unavailable,cpu-plain", "--cases", "12", "--seed", "5",
                       "--require-gpu")
        self.assertEqual(strict.returncode, 1, strict.stdout + strict.stderr)
        self.assertEqual(len([l for l in strict.stderr.splitlines() if "--require-gpu" in l]), 1, strict.stderr)

    def test_a_hanging_worker_meets_the_watchdog(self):
        start = time.monotonic()
        run = sweep(self.out("a"), "--subjects", "misbehave-hang", "--cases", "3", "--watchdog", "1")
        self.assertLess(time.monotonic() - start, 30)
        self.assertEqual(run.returncode, 1)
        got = records(self.out("a"))
        self.assertEqual([r["verdict"] for r in got], ["timeout"] * 3)

    def test_run_gives_a_hanging_case_up_records_it_and_exits_1(self):
        # `run` holds its subjects in its own process: its watchdog records the
        # case as a timeout and ends the process, after the cases before it.
        path = self.out("run.jsonl")
        start = time.monotonic()
        run = subprocess.run([BINARY, "run", "-q", "-s", "cpu-plain,misbehave-hang", "-p",
                              "b=1 hq=2 sq=9 skv=13 d=8 dtype=f32", "--watchdog", "1", "--record", path],
                             capture_output=True, text=True, timeout=120)
        self.assertLess(time.monotonic() - start, 30)
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        self.assertEqual(len(run.stderr.strip().splitlines()), 1, run.stderr)
        self.assertIn("flashcheck: hang: misbehave-hang on 'b=1 hq=2", run.stderr)
        self.assertIn("within 1 s (--watchdog)", run.stderr)
        self.assertIn("PASS", run.stdout)
        with open(path, encoding="utf-8") as f:
            got = [json.loads(line) for line in f.read().splitlines()]
        self.assertEqual([(r["subject"], r["verdict"]) for r in got],
                         [("cpu-plain", "pass"), ("misbehave-hang", "timeout")])
        self.assertIn("run --subject misbehave-hang", got[1]["reproducer"])

    def test_a_second_sweep_replays_the_corpus_first(self):
        sweep(self.out("a"), "--subjects", "misbehave-crash", "--cases", "2", "--seed", "4")
        with open(os.path.join(self.out("a"), "corpus", "misbehave-crash.problems"), encoding="utf-8") as f:
            stored = [line for line in f.read().splitlines() if line and not line.startswith("#")]
        run = sweep(self.out("a"), "--subjects", "smoke-cpu-lowp", "--cases", "2", "--seed", "8")
        got = records(self.out("a"))
        replayed = [r for r in got if r["case"].startswith("corpus:")]
        self.assertEqual(sorted(r["problem"] for r in replayed), sorted(stored), run.stdout)
        self.assertEqual(got.index(replayed[0]), 2, "the corpus runs before the new stream")
        self.assertTrue(all(r["case"].startswith("corpus:") for r in got[2:2 + len(stored)]))

    def test_kill_9_of_the_driver_loses_nothing_and_records_nothing_twice(self):
        out = self.out("a")
        args = [BINARY, "fuzz", "--out", out, "--subjects", "smoke-cpu-lowp,cpu-plain", "--cases", "400", "--seed", "2"]
        # A killed driver cannot remove its workers' temporary folders: they go
        # under this test's folder, which tearDown removes.
        killed_tmp = self.out("killed-tmp")
        os.makedirs(killed_tmp)
        killed_env = dict(os.environ, TMPDIR=killed_tmp)
        for _ in range(3):  # kill it three times, at different points
            driver = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=killed_env)
            time.sleep(0.3)
            os.kill(driver.pid, signal.SIGKILL)
            driver.wait()
        final = subprocess.run(args, capture_output=True, text=True, timeout=600)
        self.assertIn(final.returncode, (0, 1), final.stderr)
        got = records(out)
        keys = [r["case"] for r in got]
        self.assertEqual(len(keys), len(set(keys)), "a case was recorded twice")
        self.assertEqual(set(keys), {f"2:{k}" for k in range(400)}, "a case was lost")

    def test_a_failure_is_shrunk_and_both_lines_are_kept(self):
        run = sweep(self.out("a"), "--subjects", "mutant-cpu-br-as-tl", "--cases", "30", "--seed", "1")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)  # a mutants' sweep passes when they are caught
        failures = [r for r in records(self.out("a")) if r["verdict"] == "fail"]
        self.assertTrue(failures)
        shrunk = [r for r in failures if "shrunk_problem" in r]
        self.assertTrue(shrunk, "no failure was shrunk")

        def size(line):
            f = dict(field.split("=", 1) for field in line.split() if "=" in field)
            return int(f["b"]) * int(f["hq"]) * int(f["sq"]) * int(f["skv"]) * (int(f["d"]) + int(f["dv"]))

        for r in shrunk:
            self.assertLess(size(r["shrunk_problem"]), size(r["problem"]))
        with open(os.path.join(self.out("a"), "corpus", "mutant-cpu-br-as-tl.problems"), encoding="utf-8") as f:
            corpus = f.read()
        for r in shrunk:
            self.assertIn(r["problem"], corpus)
            self.assertIn(r["shrunk_problem"], corpus)
        # The shrunk line still fails when replayed.
        replay = subprocess.run([BINARY, "replay", shrunk[0]["shrunk_problem"], "--subject", "mutant-cpu-br-as-tl"],
                                capture_output=True, text=True, timeout=120)
        self.assertEqual(replay.returncode, 1, replay.stdout)

    def test_one_worker_per_gpu_runs_the_same_cases(self):
        common = ["--subjects", "smoke-cpu-lowp,cpu-plain,misbehave-crash", "--cases", "24", "--seed", "12",
                  "--shrink-runs", "0"]
        sweep(self.out("one"), *common)
        run = sweep(self.out("four"), *common, "--gpus", "0,1,2,3")
        self.assertEqual(run.returncode, 1, run.stderr)
        one = {r["case"]: (r["subject"], r["problem"], r["verdict"]) for r in records(self.out("one"))}
        four = {r["case"]: (r["subject"], r["problem"], r["verdict"]) for r in records(self.out("four"))}
        self.assertEqual(one, four)
        self.assertIn("crash", {v for (_, _, v) in four.values()})

    def test_bad_input_is_one_line_and_exit_2(self):
        for args in (["--subjects", "no-such-subject", "--cases", "1"], ["--shard", "3/2", "--cases", "1"],
                     ["--subjects", "smoke-cpu-lowp"]):
            run = sweep(self.out("bad"), *args)
            self.assertEqual(run.returncode, 2, args)
            self.assertEqual(len(run.stderr.strip().splitlines()), 1, run.stderr)

    def test_a_records_file_this_build_cannot_read_is_one_line_and_exit_2(self):
        # A whole line that is not a record of a schema this build reads is never
        # cut off as if torn: the sweep refuses to resume onto it.
        os.makedirs(self.out("a"))
        path = os.path.join(self.out("a"), "records.jsonl")
        text = json.dumps(dict(schema=4, verdict="crash", case="11:0", subject="cpu-plain", problem="b=1")) + "\n"
        text += json.dumps(dict(schema=6, verdict="crash", case="11:1", subject="cpu-plain", problem="b=1")) + "\n"
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        run = sweep(self.out("a"), "--subjects", "cpu-plain", "--cases", "2", "--seed", "11")
        self.assertEqual(run.returncode, 2, run.stdout + run.stderr)
        self.assertEqual(len(run.stderr.strip().splitlines()), 1, run.stderr)
        self.assertIn("records.jsonl line 2: a record of schema 6", run.stderr)
        with open(path, encoding="utf-8") as f:
            self.assertEqual(f.read(), text)

    def test_replay_reruns_a_corpus_file(self):
        sweep(self.out("a"), "--subjects", "misbehave-hang", "--cases", "1", "--watchdog", "1")
        corpus = os.path.join(self.out("a"), "corpus", "misbehave-hang.problems")
        self.assertTrue(os.path.exists(corpus))
        with open(corpus, encoding="utf-8") as f:
            line = [l for l in f.read().splitlines() if not l.startswith("#")][0]
        run = subprocess.run([BINARY, "replay", line, "--subject", "smoke-cpu-lowp"], capture_output=True, text=True,
                             timeout=120)
        self.assertIn(run.returncode, (0, 2), run.stdout + run.stderr)  # 2: outside smoke-cpu-lowp's domain is possible

    def test_mutants_sweep_prints_the_score_and_ends_when_all_are_caught(self):
        start = time.monotonic()
        run = sweep(self.out("a"), "--subjects", ",".join(CPU_MUTANTS), "--minutes", "5", "--seed", "3")
        self.assertLess(time.monotonic() - start, 240, "a caught mutant gets no more cases; all caught ends it")
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
        self.assertIn(f"mutation score: {len(CPU_MUTANTS)}/{len(CPU_MUTANTS)} caught", run.stdout)
        got = records(self.out("a"))
        for mutant in CPU_MUTANTS:
            mine = [r for r in got if r["subject"] == mutant]
            self.assertEqual(sum(r["verdict"] == "fail" for r in mine), 1, f"{mutant}: caught once, then left alone")
            self.assertEqual(mine[-1]["verdict"], "fail")
            self.assertRegex(run.stdout, mutant + r"\s+\d+\s+\d+\.\d s")  # its time to the first catch
            self.assertIn("flashcheck-testing run", mine[-1]["reproducer"])

    def test_mutants_mixed_with_subjects_are_scored_and_the_subjects_judged(self):
        run = sweep(self.out("a"), "--subjects", "mutant-cpu-lse-log2,cpu-plain", "--cases", "20", "--seed", "4")
        self.assertEqual(run.returncode, 0, run.stdout)  # the mutant was caught; the subject passed
        self.assertIn("mutation score: 1/1 caught", run.stdout)

    def test_the_time_budget_carries_over_a_resume(self):
        common = ["--subjects", "smoke-cpu-lowp,cpu-plain", "--minutes", "0.05", "--seed", "8"]
        first = sweep(self.out("a"), *common)
        self.assertEqual(first.returncode, 0, first.stderr)
        second = sweep(self.out("a"), *common)
        self.assertIn("min already spent (resumed)", second.stderr)
        self.assertIn("sweep summary: 0 case(s) run", second.stdout, "the spent budget is not spent again")
        other = sweep(self.out("a"), "--subjects", "smoke-cpu-lowp,cpu-plain", "--minutes", "0.05", "--seed", "9")
        self.assertNotIn("already spent", other.stderr, "another seed is another sweep, with its own budget")

    def test_sanitize_mode_records_the_tools_findings(self):
        env = dict(os.environ, FLASHCHECK_COMPUTE_SANITIZER=os.path.join(HERE, "fake_sanitizer.py"),
                   FAKE_SANITIZER_FINDS="cpu-plain")
        args = ["--sanitize", "memcheck", "--subjects", "smoke-cpu-lowp,cpu-plain", "--sanitize-cases", "2"]
        run = sweep(self.out("a"), *args, env=env)
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        got = records(self.out("a"))
        self.assertEqual(len(got), 4)
        for r in got:
            self.assertEqual(r["sanitizer"]["tool"], "memcheck")
            self.assertTrue(r["reproducer"].startswith("compute-sanitizer --tool memcheck flashcheck run"))
            if r["subject"] == "cpu-plain":
                self.assertEqual((r["verdict"], r["check"]), ("fail", "sanitizer:memcheck"))
                self.assertEqual(r["sanitizer"]["report"][0], "Invalid __global__ write of size 4 bytes (memcheck, fake)")
                self.assertEqual(r["message"], r["sanitizer"]["report"][0])
            else:
                self.assertEqual(r["verdict"], "pass", r)
                self.assertEqual(r["sanitizer"]["exit_code"], 0)
        self.assertIn("cpu-plain", run.stdout)
        self.assertRegex(run.stdout, r"cpu-plain\s+2\s+2\s+0")
        with open(os.path.join(self.out("a"), "corpus", "cpu-plain.problems"), encoding="utf-8") as f:
            self.assertEqual(len([l for l in f.read().splitlines() if l and not l.startswith("#")]), 2)
        again = sweep(self.out("a"), *args, env=env)  # resumed: nothing runs twice, and the findings still count
        self.assertEqual(len(records(self.out("a"))), 4, again.stdout)
        self.assertEqual(again.returncode, 1, again.stdout)
        self.assertIn("2 failed case(s) recorded before", again.stdout)

    def test_sanitize_mode_watchdog_kills_the_tool_and_its_worker(self):
        # A hanging case under the tool: the timeout must take the worker the
        # tool started too (else an orphan holds the GPU and our pipes, and
        # this run would never return).
        env = dict(os.environ, FLASHCHECK_COMPUTE_SANITIZER=os.path.join(HERE, "fake_sanitizer.py"))
        start = time.monotonic()
        run = sweep(self.out("a"), "--sanitize", "memcheck", "--subjects", "misbehave-hang", "--sanitize-cases", "1",
                    "--watchdog", "0.3", env=env, timeout=120)
        self.assertLess(time.monotonic() - start, 60)
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        (record,) = records(self.out("a"))
        self.assertEqual((record["verdict"], record["schema"]), ("timeout", 5))

    def test_sanitize_mode_without_the_tool_is_one_line_and_exit_2(self):
        env = dict(os.environ, FLASHCHECK_COMPUTE_SANITIZER="/nonexistent/compute-sanitizer")
        run = sweep(self.out("a"), "--sanitize", "memcheck", "--subjects", "smoke-cpu-lowp", env=env)
        self.assertEqual(run.returncode, 2)
        self.assertEqual(len(run.stderr.strip().splitlines()), 1, run.stderr)
        self.assertIn("compute-sanitizer", run.stderr)
        bad = sweep(self.out("a"), "--sanitize", "leakcheck", "--subjects", "smoke-cpu-lowp")
        self.assertEqual(bad.returncode, 2)


def gpu_usable():
    """A GPU fixture ran (exit 0 or 1; it writes zeros, so 1). Exit 2 means it
    could not run: no usable GPU, or a build without CUDA, which has no GPU
    fixtures at all."""
    probe = subprocess.run([BINARY, "run", "--subject", "misbehave-gpu-race", "--problem",
                            "b=1 hq=1 sq=4 skv=4 d=8 dtype=f32"], capture_output=True, text=True, timeout=120)
    return probe.returncode in (0, 1)


def sanitizer_found():
    return any(os.access(os.path.join(d, "compute-sanitizer"), os.X_OK)
               for d in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/local/cuda/bin"])


class GpuSweep(unittest.TestCase):
    """The isolation tests with real GPU misbehaviour (run with --gpu)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_sticky_faults_are_recorded_and_the_worker_replaced(self):
        out = os.path.join(self.dir, "a")
        run = sweep(out, "--subjects", "misbehave-gpu-fault,misbehave-gpu-misaligned,fa2-rowthread", "--cases", "18",
                    "--seed", "5", "--shrink-runs", "0")
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        got = records(out)
        self.assertEqual(len(got), 18)
        by = {}
        for r in got:
            by.setdefault(r["subject"], []).append(r)
        self.assertEqual(set(by), {"misbehave-gpu-fault", "misbehave-gpu-misaligned", "fa2-rowthread"})
        for r in by["misbehave-gpu-fault"]:
            self.assertEqual(r["verdict"], "fault", r)
            self.assertIn("illegal", r["message"])
        for r in by["misbehave-gpu-misaligned"]:
            self.assertEqual(r["verdict"], "fault", r)
            self.assertIn("misaligned", r["message"])
        self.assertEqual({r["verdict"] for r in by["fa2-rowthread"]}, {"pass"}, "a fresh worker after every fault")

    def test_run_and_bench_give_a_kernel_that_never_ends_up(self):
        for command in ("run", "bench"):
            start = time.monotonic()
            run = subprocess.run([BINARY, command, "-s", "misbehave-gpu-hang", "-p",
                                  "b=1 hq=2 sq=9 skv=13 d=8 dtype=f32", "--watchdog", "5"],
                                 capture_output=True, text=True, timeout=120)
            self.assertLess(time.monotonic() - start, 60, command)
            self.assertEqual(run.returncode, 1, command + "\n" + run.stdout + run.stderr)
            self.assertIn("flashcheck: hang: misbehave-gpu-hang on 'b=1 hq=2", run.stderr, command)

    def test_a_kernel_that_never_ends_meets_the_watchdog(self):
        out = os.path.join(self.dir, "a")
        start = time.monotonic()
        run = sweep(out, "--subjects", "misbehave-gpu-hang,fa2-rowthread", "--cases", "6", "--seed", "2",
                    "--watchdog", "10", "--shrink-runs", "0")
        self.assertLess(time.monotonic() - start, 200)
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        got = records(out)
        self.assertEqual(len(got), 6)
        self.assertEqual({r["verdict"] for r in got if r["subject"] == "misbehave-gpu-hang"}, {"timeout"})
        self.assertEqual({r["verdict"] for r in got if r["subject"] == "fa2-rowthread"}, {"pass"})



class GpuSanitize(unittest.TestCase):
    """The sanitizer mode with the real compute-sanitizer (run with --gpu-sanitize)."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_memcheck_and_racecheck_find_what_they_should_and_only_that(self):
        for tool, bad, words in (("memcheck", "misbehave-gpu-fault", "Invalid __global__ write"),
                                 ("racecheck", "misbehave-gpu-race", "hazard")):
            out = os.path.join(self.dir, tool)
            run = sweep(out, "--sanitize", tool, "--subjects", f"{bad},fa2-rowthread", "--sanitize-cases", "1",
                        timeout=600)
            self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
            got = {r["subject"]: r for r in records(out)}
            self.assertEqual(got[bad]["check"], f"sanitizer:{tool}", got[bad])
            self.assertIn(words, " ".join(got[bad]["sanitizer"]["report"]), got[bad])
            self.assertEqual(got["fa2-rowthread"]["verdict"], "pass", got["fa2-rowthread"])
            self.assertEqual(got["fa2-rowthread"]["sanitizer"]["exit_code"], 0)


if __name__ == "__main__":
    if MODE:
        if not gpu_usable():
            print("SKIP: no usable GPU")
            sys.exit(77)
        if MODE == "--gpu-sanitize" and not sanitizer_found():
            print("SKIP: compute-sanitizer is not on PATH or in /usr/local/cuda/bin")
            sys.exit(77)
        unittest.main(verbosity=2, defaultTest="GpuSweep" if MODE == "--gpu" else "GpuSanitize")
    else:
        unittest.main(verbosity=2, defaultTest="Sweep")
