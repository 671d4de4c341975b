"""The report's tests (ctest label `report`): `flashcheck report` on the H200
records in reports/testdata, on doctored copies with planted regressions, and
on empty, torn and foreign input. Usage: report_test.py PATH/TO/flashcheck

Exits 77 (ctest's SKIP) where no Python with matplotlib and Jinja2 can be
found: the report cannot be drawn there."""
import copy
import json
import os
import subprocess
import sys
import tempfile
import unittest

BINARY = sys.argv.pop(1) if len(sys.argv) > 1 else "flashcheck"
HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "testdata", "h200-2026-11-21")
ACCURACY = os.path.join(DATA, "accuracy.jsonl")
BENCH = os.path.join(DATA, "bench.jsonl")
PYTHON = None  # the Python that runs report.py (set in __main__)


def report(*args):
    return subprocess.run([BINARY, "report", *args], capture_output=True, text=True, timeout=300)


def load(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def save(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


class Report(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_gpu_records_make_all_three_files(self):
        run = report(ACCURACY, BENCH, "-o", self.path("out"))
        self.assertEqual(run.returncode, 0, run.stderr)
        for name in ("report.html", "summary.md", "summary.json"):
            self.assertGreater(os.path.getsize(os.path.join(self.path("out"), name)), 0, name)
        with open(os.path.join(self.path("out"), "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
        gpu_subjects = {r["subject"] for r in load(BENCH) if r.get("kind") == "bench"}
        self.assertEqual({b["subject"] for b in summary["bench"]}, gpu_subjects)
        self.assertIn("cudnn", gpu_subjects)
        for b in summary["bench"]:
            self.assertGreater(b["fraction_of_gemm"], 0)
            self.assertGreater(b["fraction_of_copy"], 0)
        self.assertGreater(summary["ceilings"]["gemm_bf16_tflops"], 100)
        subjects = {s["subject"] for s in summary["subjects"]}
        self.assertTrue({"mma-kv-pipelined", "cudnn", "cpu-lowp", "fa2-rowthread"} <= subjects, subjects)
        with open(os.path.join(self.path("out"), "report.html"), encoding="utf-8") as f:
            page = f.read()
        self.assertEqual(page.count("<img"), page.count("data:image/png;base64,"), "every plot is inlined")
        self.assertGreaterEqual(page.count("<img"), 4)
        self.assertNotIn("src='http", page)

    def test_a_planted_regression_is_flagged_and_nothing_else(self):
        bench, accuracy = load(BENCH), load(ACCURACY)
        self.assertEqual(report(ACCURACY, BENCH, "-o", self.path("same"), "--baseline", ACCURACY, BENCH).returncode, 0,
                         "a run compared with itself has no regression")
        slower = copy.deepcopy(bench)
        victim = next(r for r in slower if r.get("subject") == "mma-kv-pipelined")
        victim["median_ms"] *= 1.5
        victim["samples_ms"] = [t * 1.5 for t in victim["samples_ms"]]
        worse = copy.deepcopy(accuracy)
        passed = [r for r in worse if r["verdict"] == "pass" and r["metrics"]["o"]["errors"]["rmse"] > 0]
        passed[0]["metrics"]["o"]["errors"]["rmse"] *= 4
        passed[1]["verdict"] = "fail"
        passed[1]["check"] = "o.max_abs"
        save(self.path("bench.jsonl"), slower)
        save(self.path("accuracy.jsonl"), worse)
        run = report(self.path("accuracy.jsonl"), self.path("bench.jsonl"), "-o", self.path("out"), "--baseline",
                     ACCURACY, BENCH)
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        with open(os.path.join(self.path("out"), "summary.json"), encoding="utf-8") as f:
            flagged = {(r["kind"], r["subject"], r["problem"]) for r in json.load(f)["regressions"]}
        self.assertEqual(flagged, {("speed", "mma-kv-pipelined", victim["problem"]),
                                   ("error", passed[0]["subject"], passed[0]["problem"]),
                                   ("verdict", passed[1]["subject"], passed[1]["problem"])})
        with open(os.path.join(self.path("out"), "summary.md"), encoding="utf-8") as f:
            self.assertIn("**3 regression(s)", f.read())
        with open(os.path.join(self.path("out"), "report.html"), encoding="utf-8") as f:
            page = f.read()
        self.assertLess(page.index("3 regression(s)"), page.index("Accuracy per subject"), "flagged at the top")

    def test_a_slowdown_within_the_noise_is_not_flagged(self):
        bench = copy.deepcopy(load(BENCH))
        for r in bench:
            if r.get("kind") == "bench":
                r["median_ms"] *= 1.03  # 3%: below the 5% floor
        save(self.path("bench.jsonl"), bench)
        run = report(self.path("bench.jsonl"), "-o", self.path("out"), "--baseline", BENCH)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)

    def test_a_pair_missing_from_the_bench_is_flagged(self):
        bench = load(BENCH)
        gone = next(r for r in bench if r.get("subject") == "decode")
        save(self.path("bench.jsonl"), [r for r in bench if r is not gone])
        run = report(self.path("bench.jsonl"), "-o", self.path("out"), "--baseline", BENCH)
        self.assertEqual(run.returncode, 1, run.stdout + run.stderr)
        with open(os.path.join(self.path("out"), "summary.json"), encoding="utf-8") as f:
            flagged = [(r["kind"], r["subject"]) for r in json.load(f)["regressions"]]
        self.assertEqual(flagged, [("missing", "decode")])

    def test_odd_records_are_warnings_or_one_line_never_a_traceback(self):
        bench = load(BENCH)
        old_style = {k: v for k, v in bench[1].items() if k not in ("fraction_of_gemm", "fraction_of_copy")}
        zero = dict(bench[2], median_ms=0)
        save(self.path("bench.jsonl"), [bench[0], old_style, zero] + bench[3:])
        run = report(self.path("bench.jsonl"), "-o", self.path("out"), "--baseline", self.path("bench.jsonl"))
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("2 bench record(s) lack the fields", run.stderr)
        self.assertNotIn("Traceback", run.stderr)
        open(self.path("a-file"), "w").close()
        run = report(ACCURACY, "-o", self.path("a-file"))
        self.assertEqual(run.returncode, 2)
        self.assertEqual(len(run.stderr.strip().splitlines()), 1, run.stderr)

    def test_unavailable_cases_are_counted_apart_never_passed(self):
        records = load(ACCURACY)
        subject = records[0]["subject"]
        unavailable = [dict(schema=1, subject=subject, problem=r["problem"], dtype=r["dtype"], status="unavailable",
                            verdict="unavailable", message="needs a GPU; none is usable here (no CUDA device)")
                       for r in records if r["subject"] == subject]
        mine = [dict(r, subject="gpu-less") for r in unavailable]  # a subject with no case judged at all
        save(self.path("records.jsonl"), records + unavailable + mine)
        run = report(self.path("records.jsonl"), "-o", self.path("out"))
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(os.path.join(self.path("out"), "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
        judged = {(s["subject"], s["dtype"]): s for s in summary["subjects"]}
        before = {(r["subject"], r["dtype"]) for r in records}
        for key, s in judged.items():
            self.assertEqual(s["cases"], sum(1 for r in records if (r["subject"], r["dtype"]) == key and
                                             r.get("verdict") != "unsupported"), key)
            expected = sum(1 for r in unavailable if (r["subject"], r["dtype"]) == key)
            self.assertEqual(s["unavailable"], expected, key)
        self.assertFalse(any(k[0] == "gpu-less" for k in judged), "nothing judged: not a row with a pass rate")
        self.assertEqual(set(judged) - before, set())
        warning = next((w for w in summary["warnings"] if "unavailable on the machine" in w), "")
        self.assertIn("gpu-less", warning)
        self.assertIn(subject, warning)

    def test_a_subject_named_like_math_text_is_drawn_as_it_is(self):
        # "$\\frac{" in a name made matplotlib raise (it read the name as math text).
        records = [dict(r, subject="evil$\\frac{x$<b>") for r in load(ACCURACY)[:20]]
        save(self.path("records.jsonl"), records)
        run = report(self.path("records.jsonl"), "-o", self.path("out"))
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(os.path.join(self.path("out"), "report.html"), encoding="utf-8") as f:
            page = f.read()
        self.assertNotIn("x$<b>", page, "the name is escaped")
        self.assertIn("evil$\\frac{x$&lt;b&gt;", page)

    def test_every_name_and_message_is_escaped_in_the_html(self):
        # A tag that no template writes, planted in every string the page shows.
        tag = "<x-hostile a='1'>"
        records = copy.deepcopy(load(ACCURACY))
        passes = [r for r in records if r.get("verdict") == "pass"]
        for r in records:
            r["subject"] += tag
            r["reproducer"] = r.get("reproducer", "") + tag
        passes[0].update(verdict="fail", check="o.max_abs" + tag, message="too far" + tag)
        passes[1].update(schema=2, verdict="deviation", deviation="declared limit" + tag)
        passes[2].update(schema=3, rows_basis="sampled", every_row_unavailable="no Kokkos" + tag)
        passes[3]["problem"] += " values=ties" + tag
        passes[4]["subject_version"], passes[5]["subject_version"] = "v1" + tag, "v2"
        passes[5]["subject"], passes[5]["dtype"] = passes[4]["subject"], passes[4]["dtype"]
        bench = copy.deepcopy(load(BENCH))
        for r in bench:
            r["device"] = r.get("device", "") + tag
            if r.get("kind") == "bench":
                r["subject"] += tag
        save(self.path("accuracy.jsonl"), records)
        save(self.path("bench.jsonl"), bench)
        run = report(self.path("accuracy.jsonl"), self.path("bench.jsonl"), "-o", self.path("out"),
                     "--title", "title" + tag, "--baseline", self.path("accuracy.jsonl"))
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(os.path.join(self.path("out"), "report.html"), encoding="utf-8") as f:
            page = f.read()
        self.assertNotIn("<x-hostile", page)
        shown = page.count("&lt;x-hostile a=&#39;1&#39;&gt;")
        for planted in ("title", "o.max_abs", "declared limit", "no Kokkos", "ties", "v1"):
            self.assertIn(planted + "&lt;x-hostile", page, planted)
        self.assertGreater(shown, len({r["subject"] for r in records}) + len(bench), "the names are shown, escaped")

    def test_every_kind_of_record_follows_the_schema(self):
        # Written here: run (a pass, an unsupported case) and a fuzz sweep;
        # from the H200 testdata: bench timings and ceilings; as the sweep
        # writes them (fuzz/sweep.cpp record_of): a crash, a timeout, an error.
        out = self.path("records")
        os.makedirs(out)
        for line in ("b=1 hq=2 sq=8 skv=8 d=8 dtype=f16", "b=1 hq=2 sq=8 skv=8 d=800 dtype=f16"):
            subprocess.run([BINARY, "run", "-s", "cpu-plain", "-p", line, "--record", os.path.join(out, "run.jsonl")],
                           capture_output=True, timeout=120)
        sweep = subprocess.run([BINARY, "fuzz", "-s", "cpu-plain", "--cases", "5", "--seed", "3", "--out",
                                os.path.join(out, "sweep")], capture_output=True, text=True, timeout=300)
        self.assertEqual(sweep.returncode, 0, sweep.stderr)
        problem = "b=1 hq=2 hkv=2 sq=8 skv=8 d=8 dv=8 dtype=f16"
        planted = [dict(schema=4, verdict=v, check=v, message=m, case=f"3:{n}", subject="cpu-plain", problem=problem,
                        reproducer=f"flashcheck run --subject cpu-plain --problem '{problem}'")
                   for n, (v, m) in enumerate((("crash", "worker killed by signal 11 (Segmentation fault)"),
                                               ("timeout", "no answer within the 60 s watchdog"),
                                               ("error", "the worker wrote a line that is not JSON")))]
        save(os.path.join(out, "planted.jsonl"), planted)
        run = report(out, ACCURACY, BENCH, "-o", self.path("out"))
        self.assertEqual(run.returncode, 0, run.stderr)
        if "has no jsonschema" in run.stderr:
            self.skipTest("the report's Python has no jsonschema: records are not validated there")
        self.assertNotIn("does not follow", run.stderr)
        with open(os.path.join(self.path("out"), "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
        self.assertGreaterEqual(sum(s["cases"] for s in summary["subjects"] if s["subject"] == "cpu-plain"), 6)
        # And a record that breaks the contract is named and left out.
        broken = dict(planted[0], verdict="maybe")
        save(os.path.join(out, "planted.jsonl"), planted + [broken])
        run = report(out, "-o", self.path("out2"))
        self.assertIn("planted.jsonl:4: does not follow docs/record.schema.json (verdict:", run.stderr)

    def test_no_records_is_one_line_and_exit_2(self):
        os.makedirs(self.path("empty"))
        for args in ([self.path("empty")], [self.path("missing")]):
            run = report(*args, "-o", self.path("out"))
            self.assertEqual(run.returncode, 2, args)
            self.assertEqual(len(run.stderr.strip().splitlines()), 1, run.stderr)
        open(self.path("empty/records.jsonl"), "w").close()
        run = report(self.path("empty"), "-o", self.path("out"))
        self.assertEqual(run.returncode, 2)
        self.assertIn("no records", run.stderr)

    def test_a_torn_last_line_is_a_warning_not_a_traceback(self):
        with open(ACCURACY, encoding="utf-8") as f:
            text = f.read()
        with open(self.path("records.jsonl"), "w", encoding="utf-8") as f:
            f.write(text + text.splitlines()[0][:200])  # a killed run's half-written line
        run = report(self.path("records.jsonl"), "-o", self.path("out"))
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("last line is truncated", run.stderr)
        self.assertNotIn("Traceback", run.stderr)
        with open(os.path.join(self.path("out"), "summary.md"), encoding="utf-8") as f:
            self.assertIn("last line is truncated", f.read())

    def test_vacuous_cases_and_deviations_are_counted_apart_from_passes(self):
        passes = [r for r in load(ACCURACY) if r.get("verdict") == "pass" and r.get("subject") == "cublas-unfused"
                  and r["metrics"]["rows_compared"] > 0]
        self.assertGreater(len(passes), 0)
        records = [copy.deepcopy(r) for r in (passes * 5)[:5]]
        records[0].update(schema=2, verdict="vacuous", rows_visible=0)
        records[1].update(schema=2, verdict="deviation", deviation="declared limit: accumulator")
        records[2]["metrics"]["rows_compared"] = 0  # schema 1: a pass that compared no row was vacuous
        records[3:] = [dict(r, schema=2) for r in records[3:]]
        save(self.path("records.jsonl"), records)
        run = report(self.path("records.jsonl"), "-o", self.path("out"))
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(os.path.join(self.path("out"), "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
        (subject,) = summary["subjects"]
        self.assertEqual(subject["cases"], len(records))
        self.assertEqual(subject["vacuous"], 2)
        self.assertEqual(subject["deviations"], 1)
        self.assertEqual(subject["passes"], len(records) - 3)
        self.assertEqual(subject["pass_rate"], 1.0)
        self.assertEqual(subject["failures_by_check"], {})
        with open(os.path.join(self.path("out"), "summary.md"), encoding="utf-8") as f:
            self.assertIn("| vacuous | deviations |", f.read())
        with open(os.path.join(self.path("out"), "report.html"), encoding="utf-8") as f:
            self.assertIn("declared limit: accumulator", f.read())

    def test_verdicts_on_sampled_rows_are_counted_and_a_missing_every_row_check_is_a_warning(self):
        passes = [r for r in load(ACCURACY) if r.get("verdict") == "pass" and r.get("subject") == "cublas-unfused"]
        records = [dict(copy.deepcopy(r), schema=3, rows_basis="every") for r in (passes * 4)[:4]]
        records[0].update(rows_basis="sampled",
                          every_row_unavailable="the Kokkos reference cannot run on a GPU here: X")
        records[1].update(rows_basis="sampled")  # --every-row off: sampled, nothing to warn about
        save(self.path("records.jsonl"), records)
        run = report(self.path("records.jsonl"), "-o", self.path("out"))
        self.assertEqual(run.returncode, 0, run.stderr)
        with open(os.path.join(self.path("out"), "summary.json"), encoding="utf-8") as f:
            (subject,) = json.load(f)["subjects"]
        self.assertEqual(subject["on_sampled_rows"], 2)
        with open(os.path.join(self.path("out"), "summary.md"), encoding="utf-8") as f:
            self.assertIn("1 verdict(s) rest on sampled rows: the every-row check was asked for and could not run "
                          "(the Kokkos reference cannot run on a GPU here: X)", f.read())

    def test_without_jinja2_the_report_says_so_in_one_line(self):
        # report.py run as the CLI runs it, in a Python where `import jinja2` fails.
        hide = ("import runpy, sys; sys.modules['jinja2'] = None; sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
        run = subprocess.run([PYTHON, "-c", hide, os.path.join(HERE, "report.py"), ACCURACY, "-o", self.path("out")],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(run.returncode, 2, run.stderr)
        self.assertEqual(len(run.stderr.strip().splitlines()), 1, run.stderr)
        self.assertIn("Jinja2 is not installed", run.stderr)
        self.assertFalse(os.path.exists(self.path("out")), "nothing written")

    def test_records_of_another_version_are_refused_in_one_line(self):
        records = load(ACCURACY)[:3]
        records[1]["schema"] = 6
        save(self.path("records.jsonl"), records)
        run = report(self.path("records.jsonl"), "-o", self.path("out"))
        self.assertEqual(run.returncode, 2)
        self.assertEqual(len(run.stderr.strip().splitlines()), 1, run.stderr)
        self.assertIn("schema 6", run.stderr)


def python_with_matplotlib():
    """The Python that `flashcheck report` picks (cli/report.cpp), or None."""
    for python in filter(None, [os.environ.get("FLASHCHECK_PYTHON"), "python3", "/usr/bin/python3"]):
        try:
            if subprocess.run([python, "-c", "import matplotlib"], capture_output=True).returncode == 0:
                return python
        except OSError:
            pass
    return None


if __name__ == "__main__":
    PYTHON = python_with_matplotlib()
    if not PYTHON:
        print("SKIP: no Python with matplotlib (apt install python3-matplotlib)")
        sys.exit(77)
    if subprocess.run([PYTHON, "-c", "import jinja2"], capture_output=True).returncode != 0:
        print(f"SKIP: {PYTHON} has matplotlib but no Jinja2, the report's templates (apt install python3-jinja2)")
        sys.exit(77)
    unittest.main(verbosity=2)
