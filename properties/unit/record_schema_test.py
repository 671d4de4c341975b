"""Every kind of record that the C++ writer produces follows
docs/record.schema.json, and the report reads them all.

    record_schema_test.py PATH/TO/record_samples

record_samples (record_samples.hpp) writes one record of each kind and shape:
judged cases (pass, fail, vacuous, deviation, with a peer), cases that did
not run (unsupported, unavailable, fault, error), a sweep's lost cases (crash,
timeout, a worker error), a fuzz case, the sanitizer mode's, bench timings
and ceilings. Exits 77 (ctest's SKIP) where this Python has no jsonschema
(Debian: python3-jsonschema)."""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

SAMPLES = sys.argv.pop(1) if len(sys.argv) > 1 else "record_samples"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCHEMA = os.path.join(ROOT, "docs", "record.schema.json")
sys.dont_write_bytecode = True  # no __pycache__ left in the source tree
sys.path.insert(0, os.path.join(ROOT, "reports"))


class RecordSchema(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import jsonschema
        cls.tmp = tempfile.TemporaryDirectory()
        cls.path = os.path.join(cls.tmp.name, "samples.jsonl")
        run = subprocess.run([SAMPLES, cls.path], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        with open(cls.path, encoding="utf-8") as f:
            cls.lines = [line for line in f.read().split("\n") if line]
        cls.records = [json.loads(line) for line in cls.lines]
        with open(SCHEMA, encoding="utf-8") as f:
            cls.validator = jsonschema.Draft202012Validator(json.load(f))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_kind_is_there(self):
        kinds = {r.get("kind") or r["verdict"] for r in self.records}
        self.assertEqual(kinds, {"pass", "fail", "vacuous", "deviation", "unsupported", "unavailable", "fault", "error",
                                 "crash", "timeout", "bench", "ceiling"})
        self.assertTrue(any("sanitizer" in r for r in self.records))
        self.assertTrue(any("shrunk_problem" in r for r in self.records))
        self.assertTrue(any("peer" in r and isinstance(r["peer"], dict) for r in self.records))

    def test_every_record_follows_the_schema(self):
        for line, record in zip(self.lines, self.records):
            errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
                      for e in self.validator.iter_errors(record)]
            self.assertEqual(errors, [], line[:300])

    def test_the_schema_is_not_vacuous(self):
        # The same records, broken as a careless writer would: each is refused.
        judged = next(r for r in self.records if r.get("verdict") == "pass")
        for broken in (dict(judged, verdict="maybe"),
                       {k: v for k, v in judged.items() if k != "histogram_edges"},
                       {k: v for k, v in judged.items() if k != "metrics"},
                       dict(judged, schema=6),
                       dict(judged, histogram_edges=dict(judged["histogram_edges"], log10=["many"]))):
            self.assertFalse(self.validator.is_valid(broken), json.dumps(broken)[:300])
        bench = next(r for r in self.records if r.get("kind") == "bench")
        self.assertFalse(self.validator.is_valid({k: v for k, v in bench.items() if k != "median_ms"}))

    def test_the_report_reads_every_record_and_its_edges(self):
        from flashcheck_report import aggregate, load
        warnings = []
        records = load.read_records([self.path], warnings)
        self.assertEqual(len(records), len(self.records), warnings)
        self.assertEqual([w for w in warnings if "does not follow" in w], [])
        groups = aggregate.accuracy(records)
        judged = [g for g in groups.values() if g["hist"]]
        self.assertTrue(judged)
        for g in judged:
            edges = g["edges"]
            self.assertEqual(len(edges["log10"]), len(g["hist"]) + 1)
            self.assertEqual(len(edges["ulp_log2"]), len(g["ulp"]) + 1)
            self.assertTrue(math.isinf(edges["log10"][-1]))
            # This build's bins are those older records were written with.
            self.assertEqual(edges, load.LEGACY_HISTOGRAM_EDGES)
            self.assertEqual(load.bin_labels(edges["log10"], "abs")[:3], ["0", "<1e-16", "1e-16"])
            self.assertEqual(load.bin_labels(edges["ulp_log2"], "ulp")[-1], ">=2^20")

    def test_a_backward_case_is_reported_per_gradient(self):
        from flashcheck_report import aggregate, load
        records = load.read_records([self.path], [])
        backward = [r for r in records if "pass=bwd" in r.get("problem", "") and r.get("verdict") in ("pass", "fail")]
        self.assertTrue(backward)
        groups = aggregate.accuracy(records)
        for r in backward:
            for tensor in ("dQ", "dK", "dV"):
                g = groups[(r["subject"], r["dtype"], tensor)]
                self.assertEqual(g["label"], f"{r['dtype']}, {tensor}")
                self.assertTrue(g["hist"] and sum(g["hist"]) > 0, tensor)  # the gradient's own errors, binned
                self.assertTrue(g["base_hist"] and sum(g["base_hist"]) > 0, tensor)
        # The failing backward case counts in each gradient's group, its check named.
        failed = next(r for r in backward if r["verdict"] == "fail")
        for tensor in ("dQ", "dK", "dV"):
            self.assertTrue(groups[(failed["subject"], failed["dtype"], tensor)]["failures"])

    def test_the_report_bins_by_the_edges_the_records_carry(self):
        import copy
        from flashcheck_report import aggregate, load
        warnings = []
        cases = [r for r in load.read_records([self.path], warnings)
                 if r.get("verdict") == "pass" and r.get("subject") == "scripted"]
        self.assertTrue(cases)
        before = aggregate.accuracy(copy.deepcopy(cases))
        # The same counts, written with edges ten times larger: the percentiles follow the edges.
        shifted = copy.deepcopy(cases)
        for r in shifted:
            r["histogram_edges"]["log10"] = [x * 10 if isinstance(x, float) else x
                                             for x in r["histogram_edges"]["log10"]]
        after = aggregate.accuracy(shifted)
        for key, group in before.items():
            self.assertGreater(group["p99"], 0)
            self.assertAlmostEqual(after[key]["p99"], 10 * group["p99"], delta=1e-9 * group["p99"])
        # Cases binned otherwise cannot be merged: one line, never a silent sum.
        with self.assertRaises(load.BadInput):
            aggregate.accuracy(copy.deepcopy(cases[:1]) + shifted)


if __name__ == "__main__":
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        print("SKIPPED: this Python has no jsonschema (Debian: python3-jsonschema)", file=sys.stderr)
        sys.exit(77)
    unittest.main()
