#!/usr/bin/env python3
"""flashcheck's report: JSON Lines records (from `flashcheck run --record`,
`fuzz` and `bench --record`) -> OUTDIR/report.html (one self-contained file,
plots inlined), OUTDIR/summary.md and OUTDIR/summary.json.

    report.py PATH... -o OUTDIR [--baseline PATH...] [--title TEXT]

A PATH is a records file or a folder searched for *.jsonl. Exit codes: 0 a
report was written; 1 it was written and the baseline comparison found
regressions; 2 bad input (no records, unreadable files, records of another
schema, matplotlib or Jinja2 missing), with one line on stderr.

The work is done by the package beside this file, one role a module:
flashcheck_report/load.py, aggregate.py, plots.py, render.py (with templates/).
"""
import argparse
import importlib.util
import os
import sys

sys.dont_write_bytecode = True  # no __pycache__ left in the source tree (or an installed copy)
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))  # the package beside it, through a symlink too

from flashcheck_report import aggregate, load, plots, render  # noqa: E402


def fail(message):
    print(f"report: {message}", file=sys.stderr)
    sys.exit(2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("-o", "--out", required=True)
    parser.add_argument("--baseline", nargs="+")
    parser.add_argument("--title", default="flashcheck report")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
    except ImportError:
        fail("matplotlib is not installed (Debian: apt install python3-matplotlib; or pip install matplotlib)")
    if importlib.util.find_spec("jinja2") is None:  # render.py's templates
        fail(f"Jinja2 is not installed for {sys.executable} (Debian: apt install python3-jinja2; or pip install jinja2)")
    warnings = []
    try:
        records = load.read_records(args.paths, warnings)
        baseline = load.read_records(args.baseline, warnings) if args.baseline else None
        groups = aggregate.accuracy(records)  # BadInput where cases binned otherwise would be merged
    except load.BadInput as error:
        fail(str(error))
    rows = aggregate.bench_rows(records, warnings)
    if not groups and not rows:
        fail(f"no case or bench records among the {len(records)} record(s) under {', '.join(args.paths)}")
    warnings += aggregate.group_warnings(groups)
    regressions, notes = aggregate.compare(records, baseline) if baseline is not None else ([], [])
    images = dict(abs=plots.histogram_grid(groups, "abs"), ulp=plots.histogram_grid(groups, "ulp"),
                  drift=plots.drift_plots(groups), bench=plots.bench_plot(rows))
    summary = aggregate.summarise(groups, rows, aggregate.ceilings_of(records), regressions, notes, warnings,
                                  args.paths, args.baseline)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        fail(f"-o {args.out}: exists and is not a folder")
    render.write(args.out, summary, images, args.title)
    for w in warnings:
        print(f"report: warning: {w}", file=sys.stderr)
    print(f"report: {len(records)} record(s) -> {args.out}/report.html, summary.md, summary.json"
          + (f"; {len(regressions)} regression(s) against the baseline" if baseline is not None else ""))
    return 1 if regressions else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except Exception as error:  # a bug: one line and exit 2, never 1 (which means "regressions")
        fail(f"internal error: {type(error).__name__}: {error} (please report it with the input records)")
