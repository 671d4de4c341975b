#!/usr/bin/env python3
"""flashcheck's report: JSON Lines records (from `flashcheck run --record`,
`fuzz` and `bench --record`) -> OUTDIR/report.html (one self-contained file,
plots inlined), OUTDIR/summary.md and OUTDIR/summary.json.

    report.py PATH... -o OUTDIR [--baseline PATH...] [--title TEXT]

A PATH is a records file or a folder searched for *.jsonl. Exit codes: 0 a
report was written; 1 it was written and the baseline comparison found
regressions; 2 bad input (no records, unreadable files, records of another
schema, matplotlib missing), with one line on stderr.
"""
import argparse
import base64
import collections
import datetime
import html
import io
import json
import math
import os
import statistics
import sys

SCHEMA = 4  # core/record.hpp kRecordSchema
# Schema 1 lacks the verdicts `vacuous` and `deviation`: its passes that compared
# no row are read as vacuous (normalise_verdict). Schemas 1 and 2 lack
# `rows_basis` (every or sampled rows) and `every_row_unavailable`. Schemas 1
# to 3 lack `histogram_edges`: their histograms have the bins of
# LEGACY_HISTOGRAM_EDGES. From schema 4 on, each judged case carries its edges.
READABLE_SCHEMAS = (1, 2, 3, 4)
LEGACY_HISTOGRAM_EDGES = dict(log10=[0.0, 0.0] + [10.0 ** (i - 16) for i in range(21)] + [math.inf],
                              ulp_log2=[0.0, 0.0] + [2.0 ** (i - 8) for i in range(29)] + [math.inf])
# Thresholds of the baseline comparison, named here and printed in the report.
SPEED_MIN_CHANGE = 0.05      # a slowdown below 5% is never flagged
SPEED_NOISE_FACTOR = 3.0     # nor one below 3x the runs' relative interquartile range
ERROR_GROWTH = 2.0           # an error (O RMSE or max) that more than doubles on the same problem
ERROR_ABS_FLOOR = 1e-12      # ... and grows by more than this (exact zeros do not "double")


class BadInput(Exception):
    pass


def fail(message):
    print(f"report: {message}", file=sys.stderr)
    sys.exit(2)


# ---- reading -------------------------------------------------------------------------------------


def record_files(paths):
    files = []
    for path in paths:
        if os.path.isdir(path):
            for root, _, names in sorted(os.walk(path)):
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".jsonl")]
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise BadInput(f"{path}: no such file or folder")
    return files


SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "record.schema.json")


def record_validator(warnings):
    """The validator of docs/record.schema.json, or None (with a warning)
    where this Python has no jsonschema (Debian: python3-jsonschema)."""
    try:
        import jsonschema
    except ImportError:
        warnings.append("records not validated against docs/record.schema.json: this Python has no jsonschema "
                        "(Debian: apt install python3-jsonschema)")
        return None
    try:
        with open(SCHEMA_FILE, encoding="utf-8") as f:
            schema = json.load(f)
    except OSError as error:
        warnings.append(f"records not validated: cannot read {SCHEMA_FILE} ({error.strerror})")
        return None
    return jsonschema.Draft202012Validator(schema)


def schema_problem(validator, record):
    """Why `record` does not follow the schema (one line), or None."""
    if validator is None:
        return None
    import jsonschema
    error = jsonschema.exceptions.best_match(validator.iter_errors(record))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "the record"
    return f"{where}: {error.message[:200]}"


def read_records(paths, warnings):
    """Every record under `paths`; a torn last line (a killed run), unreadable
    lines and records that do not follow docs/record.schema.json are reported
    in `warnings` and skipped."""
    validator = record_validator(warnings)
    files = record_files(paths)
    if not files:
        raise BadInput(f"no records: no *.jsonl file under {', '.join(paths)} (write them with flashcheck run "
                       "--record, fuzz --out or bench --record)")
    records, schemas = [], collections.Counter()
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as error:
            raise BadInput(f"{path}: cannot read it ({error.strerror})")
        lines = text.split("\n")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                last = number == len(lines) or (number == len(lines) - 1 and lines[-1] == "")
                if last and not text.endswith("\n"):
                    warnings.append(f"{path}: the last line is truncated (a killed run?); it was skipped")
                else:
                    warnings.append(f"{path}:{number}: not a JSON record; skipped")
                continue
            if not isinstance(record, dict):
                warnings.append(f"{path}:{number}: not a JSON object; skipped")
                continue
            schema = record.get("schema", None)
            schemas[schema] += 1
            if schema not in READABLE_SCHEMAS:
                raise BadInput(f"{path}:{number}: a record of schema {schema}; this report reads schema "
                               f"{' or '.join(map(str, READABLE_SCHEMAS))} "
                               "(records from another flashcheck version: re-run them, or report them with "
                               "that version)")
            problem = schema_problem(validator, record)
            if problem:
                warnings.append(f"{path}:{number}: does not follow docs/record.schema.json ({problem}); skipped")
                continue
            record["_file"] = path
            normalise_verdict(record)
            records.append(record)
    if not records:
        raise BadInput(f"no records: the *.jsonl files under {', '.join(paths)} hold none")
    return records


def normalise_verdict(record):
    """A schema-1 pass that compared no row (rows_compared 0), or no element of
    O (no finite pair and no NaN/Inf position), was vacuous: schema 1 wrote it
    as a pass. (Its fully masked rows counted as compared: schema 2 says
    rows_visible.)"""
    if record.get("schema") == 1 and record.get("verdict") == "pass":
        metrics = record.get("metrics") or {}
        o = metrics.get("o") or {}
        count = (o.get("errors") or {}).get("count")
        census = o.get("census") or {}
        nonfinite = sum(census.get(k, 0) for k in ("got_nan", "got_pos_inf", "got_neg_inf", "want_nan",
                                                   "want_pos_inf", "want_neg_inf"))
        if metrics.get("rows_compared") == 0 or (count == 0 and nonfinite == 0):
            record["verdict"] = "vacuous"


def problem_fields(line):
    fields = {}
    for token in (line or "").split():
        if "=" in token:
            key, value = token.split("=", 1)
            fields[key] = value
    return fields


def short_problem(line):
    """A problem's short label for tables and plots ("b2 h8/2 300x517 d128 bf16
    causal_br normal"); the full line goes beside it (a tooltip, a detail)."""
    f = problem_fields(line)
    if not f:
        return line or ""
    heads = f.get("hq", "?") + (f"/{f['hkv']}" if "hkv" in f and f["hkv"] != f.get("hq") else "")
    parts = [f"b{f.get('b', '?')}", f"h{heads}", f"{f.get('sq', '?')}x{f.get('skv', '?')}", f"d{f.get('d', '?')}",
             f.get("dtype", "")]
    if f.get("mask", "none") != "none":
        parts.append(f["mask"])
    if "values" in f:
        parts.append(f["values"].split("(")[0])
    return " ".join(p for p in parts if p)


def kind_of(record):
    return record.get("kind") or ("case" if "verdict" in record else "other")


# ---- accuracy ------------------------------------------------------------------------------------


def errors_of(record, where="metrics", tensor="o"):
    try:
        return record[where]["metrics"][tensor]["errors"] if where != "metrics" else record["metrics"][tensor]["errors"]
    except (KeyError, TypeError):
        return None


def num(value, default=0.0):
    """A record's number: core/record.cpp writes NaN and infinities as strings."""
    if value is None:
        return default
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return default
    return float(value)


def histogram_edges(record):
    """The edges of a case's histograms: the record's (schema 4 on), else the
    bins that schemas 1 to 3 were written with."""
    edges = record.get("histogram_edges")
    if not isinstance(edges, dict):
        return LEGACY_HISTOGRAM_EDGES
    return {key: [num(x, math.nan) for x in edges.get(key) or []] for key in ("log10", "ulp_log2")}


def bin_labels(edges, kind):
    """A label per bin, from its edges: "0", "<1e-16", "1e-16", ..., ">=1e4"."""
    def power(x):
        return f"1e{round(math.log10(x))}" if kind == "abs" else f"2^{round(math.log2(x))}"
    labels = []
    for low, high in zip(edges, edges[1:]):
        if high == 0:
            labels.append("0")
        elif low == 0:
            labels.append(f"<{power(high)}")
        elif math.isinf(high):
            labels.append(f">={power(low)}")
        else:
            labels.append(power(low))
    return labels


def add_into(total, counts):
    if counts is None:
        return total
    if total is None:
        return list(counts)
    return [a + b for a, b in zip(total, counts)]


def quantile_edge(histogram, edges, q):
    """The upper edge of the bin holding quantile q of a merged histogram."""
    total = sum(histogram)
    if not total:
        return None
    running = 0
    for i, count in enumerate(histogram):
        running += count
        if running >= q * total:
            if i == 0:
                return 0.0  # the bin of exact zeros
            return edges[i + 1] if i + 1 < len(edges) else math.inf
    return math.inf


def accuracy(records):
    """Per (subject, dtype): cases, verdicts, failures, merged histograms, pooled statistics."""
    groups = collections.OrderedDict()
    for r in sorted((r for r in records if kind_of(r) == "case"), key=lambda r: (str(r.get("subject", "")), str(r.get("dtype", "")))):
        key = (r.get("subject", "?"), r.get("dtype") or problem_fields(r.get("problem")).get("dtype", "?"))
        g = groups.setdefault(key, dict(subject=key[0], dtype=key[1], cases=0, passes=0, unsupported=0, unavailable=0,
                                         vacuous=0, deviations=0, deviated=[], on_sampled_rows=0,
                                         every_row_unavailable=collections.Counter(),
                                         failures=collections.Counter(), failed=[], worst=[], hist=None,
                                         ulp=None, base_hist=None, base_ulp=None, peer_hist=None, peer_ulp=None,
                                         max_abs=0.0, sq_sum=0.0, count=0, max_ulp=0.0, per_case=[],
                                         versions=set(), edges=None))
        verdict = r.get("verdict", "error")
        if verdict == "unsupported":
            g["unsupported"] += 1
            continue
        if verdict == "unavailable":  # the machine could not run it: neither a pass nor a failure
            g["unavailable"] += 1
            continue
        g["cases"] += 1
        if r.get("rows_basis") == "sampled":  # schema 3: the verdict rests on sampled rows
            g["on_sampled_rows"] += 1
            if r.get("every_row_unavailable"):
                g["every_row_unavailable"][r["every_row_unavailable"]] += 1
        if r.get("subject_version"):
            g["versions"].add(r["subject_version"])
        if verdict == "vacuous":  # nothing compared: counted apart, never a pass
            g["vacuous"] += 1
            continue
        if verdict == "deviation":  # a limit the subject declares: counted and listed apart
            g["deviations"] += 1
            g["deviated"].append(dict(problem=r.get("problem", ""), reproducer=r.get("reproducer", ""),
                                      message=r.get("deviation") or r.get("rule", "")))
            continue
        if verdict == "pass":
            g["passes"] += 1
        else:
            check = r.get("check") or verdict
            g["failures"][check] += 1
            g["failed"].append(dict(check=check, problem=r.get("problem", ""), reproducer=r.get("reproducer", ""),
                                    message=r.get("message") or r.get("rule", "")))
        ratio = r.get("worst_ratio", (r.get("tolerance") or {}).get("worst_ratio"))
        if ratio is not None:
            g["worst"].append((num(ratio), r.get("problem", "")))
        e = errors_of(r)
        if e:
            edges = histogram_edges(r)
            if g["edges"] is None:
                g["edges"] = edges
            elif edges != g["edges"]:  # counts of other bins cannot be added
                raise BadInput(f"{r.get('_file', '?')}: a case of {key[0]} ({key[1]}) has histogram edges unlike "
                               "the other cases' (records of another flashcheck version?): report them apart")
            g["hist"] = add_into(g["hist"], e.get("histogram_log10"))
            g["ulp"] = add_into(g["ulp"], e.get("histogram_ulp_log2"))
            g["max_abs"] = max(g["max_abs"], num(e.get("max_abs")))
            g["max_ulp"] = max(g["max_ulp"], num(e.get("max_ulp")))
            n = int(num(e.get("count")))
            g["sq_sum"] += num(e.get("rmse")) ** 2 * n
            g["count"] += n
            if num(e.get("ref_rms")) > 0 and math.isfinite(num(e.get("rmse"))):
                g["per_case"].append((problem_fields(r.get("problem")), num(e.get("rmse")) / num(e.get("ref_rms"))))
        for where, hist_key, ulp_key in (("baseline", "base_hist", "base_ulp"), ("peer", "peer_hist", "peer_ulp")):
            b = errors_of(r, where)
            if b:
                g[hist_key] = add_into(g[hist_key], b.get("histogram_log10"))
                g[ulp_key] = add_into(g[ulp_key], b.get("histogram_ulp_log2"))
    for g in groups.values():
        g["worst"].sort(key=lambda t: -(t[0] if t[0] is not None else 0))
        g["rmse"] = math.sqrt(g["sq_sum"] / g["count"]) if g["count"] else None
        relative = [v for _, v in g["per_case"]]
        g["rel_rmse_median"] = statistics.median(relative) if relative else None
        g["rel_rmse_max"] = max(relative) if relative else None
        hist = g["hist"] or []
        edges = (g["edges"] or LEGACY_HISTOGRAM_EDGES)["log10"]
        g["p50"], g["p99"], g["p999"] = (quantile_edge(hist, edges, q) for q in (0.5, 0.99, 0.999))
    return groups


# ---- performance ---------------------------------------------------------------------------------


def iqr_fraction(samples, median):
    if not samples or len(samples) < 4 or not median:
        return 0.0
    q = statistics.quantiles(samples, n=4)
    return (q[2] - q[0]) / median


BENCH_FIELDS = ("subject", "problem", "median_ms", "tflops", "fraction_of_gemm", "gbps", "fraction_of_copy")


def bench_rows(records, warnings=None):
    """The bench records with every field the report reads (older benches
    wrote fewer: they are skipped, with a warning)."""
    rows = [r for r in records if kind_of(r) == "bench"]
    complete = [r for r in rows if all(r.get(k) is not None for k in BENCH_FIELDS) and num(r.get("median_ms")) > 0]
    if warnings is not None and len(complete) < len(rows):
        warnings.append(f"{len(rows) - len(complete)} bench record(s) lack the fields of this report's bench "
                        "(an older flashcheck bench?) and were skipped")
    rows = complete
    latest = {}
    for r in rows:  # the newest timing of each (subject, problem)
        key = (r.get("subject"), r.get("problem"))
        if key not in latest or r.get("time", 0) >= latest[key].get("time", 0):
            latest[key] = r
    return list(latest.values())


def ceilings_of(records):
    found = [r for r in records if kind_of(r) == "ceiling"]
    return max(found, key=lambda r: r.get("time", 0)) if found else None


# ---- the baseline comparison ---------------------------------------------------------------------


def compare(records, baseline):
    regressions, notes = [], []
    old_bench = {(r["subject"], r["problem"]): r for r in bench_rows(baseline)}
    new_bench = {(r["subject"], r["problem"]): r for r in bench_rows(records)}
    matched = 0
    if new_bench:  # a run with a bench: every pair the baseline timed must be timed again
        for key in sorted(set(old_bench) - set(new_bench)):
            regressions.append(dict(kind="missing", subject=key[0], problem=key[1],
                                    text="timed in the baseline, not in this run (a failed timing, or no GPU?)"))
    for r in new_bench.values():
        old = old_bench.get((r["subject"], r["problem"]))
        if not old:
            continue
        matched += 1
        noise = max(iqr_fraction(r.get("samples_ms"), r["median_ms"]), iqr_fraction(old.get("samples_ms"), old["median_ms"]))
        threshold = max(SPEED_MIN_CHANGE, SPEED_NOISE_FACTOR * noise)
        change = r["median_ms"] / old["median_ms"] - 1
        if change > threshold:
            regressions.append(dict(kind="speed", subject=r["subject"], problem=r["problem"],
                                    text=f"{old['median_ms']:.3f} ms -> {r['median_ms']:.3f} ms (+{100 * change:.0f}%, "
                                         f"beyond the {100 * threshold:.0f}% noise threshold)"))
    old_cases = {}
    for r in baseline:
        if kind_of(r) == "case" and r.get("verdict") not in ("unsupported", "unavailable") and r.get("subject") \
                and r.get("problem"):
            old_cases[(r.get("subject"), r.get("problem"))] = r
    for r in records:
        if kind_of(r) != "case" or r.get("verdict") in ("unsupported", "unavailable"):
            continue
        old = old_cases.get((r.get("subject"), r.get("problem")))
        if not old:
            continue
        matched += 1
        if old.get("verdict") == "pass" and r.get("verdict") != "pass":
            regressions.append(dict(kind="verdict", subject=r.get("subject"), problem=r.get("problem"),
                                    text=f"passed before, now {r.get('verdict')} ({r.get('check') or r.get('rule', '')})"))
            continue
        new_e, old_e = errors_of(r), errors_of(old)
        if not new_e or not old_e:
            continue
        for metric in ("rmse", "max_abs"):
            a, b = num(old_e.get(metric)), num(new_e.get(metric))
            if (math.isnan(b) and not math.isnan(a)) or (b > ERROR_GROWTH * a and b - a > ERROR_ABS_FLOOR):
                regressions.append(dict(kind="error", subject=r.get("subject"), problem=r.get("problem"),
                                        text=f"O {metric} {a:.3g} -> {b:.3g} (x{b / a if a else math.inf:.1f}) on the "
                                             "same problem"))
                break
    if not matched:
        notes.append("the baseline shares no (subject, problem) pair with these records: nothing was compared")
    else:
        notes.append(f"{matched} (subject, problem) pair(s) compared with the baseline")
    return regressions, notes


# ---- plots ---------------------------------------------------------------------------------------


def png(figure):
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def plain(text):
    """A name or message drawn as it is: a dollar sign escaped, so that no
    math text is parsed ($...$ in a subject's name made matplotlib raise).
    (Turning math text off for the whole figure broke the log axes' labels.)"""
    return str(text).replace("$", r"\$")


def histogram_grid(groups, kind):
    import matplotlib.pyplot as plt
    panels = [g for g in groups.values() if g["hist" if kind == "abs" else "ulp"]]
    if not panels:
        return None
    columns = 4
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 2.8 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, g in zip(axes.flat, panels):
        # The subject last and thickest, so that the baseline and the peer never hide it.
        series = [("same-precision baseline", g["base_hist"] if kind == "abs" else g["base_ulp"], "C1", 1.0, 2),
                  ("cuDNN (peer)", g["peer_hist"] if kind == "abs" else g["peer_ulp"], "C2", 1.0, 3),
                  ("subject", g["hist"] if kind == "abs" else g["ulp"], "C0", 1.8, 4)]
        for label, counts, color, width, order in series:
            if not counts or not sum(counts):
                continue
            total = sum(counts)
            ax.step(range(len(counts)), [c / total for c in counts], where="mid", label=label, color=color,
                    linewidth=width, zorder=order)
        edges = g["edges"] or LEGACY_HISTOGRAM_EDGES
        labels = bin_labels(edges["log10"] if kind == "abs" else edges["ulp_log2"], kind)
        ticks = list(range(0, len(labels), 4))
        ax.set_xticks(ticks)
        ax.set_xticklabels([labels[t] for t in ticks], fontsize=7, rotation=45)
        ax.set_title(plain(f"{g['subject']} ({g['dtype']}, {g['cases']} cases)"), fontsize=9)
        ax.set_ylabel("fraction of elements", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    for ax in axes.flat[1:len(panels)]:
        for h, l in zip(*ax.get_legend_handles_labels()):
            if l not in labels:
                handles.append(h)
                labels.append(l)
    # Title, then legend, then the panels: each in a band of its own (the
    # suptitle used to overlap the top row).
    top = 1 - 0.75 / (2.8 * rows)
    figure.suptitle("|error| against f64 (log10 bins)" if kind == "abs" else "ULP error in the output dtype (log2 bins)",
                    y=0.995, va="top")
    figure.legend(handles, labels, loc="upper center", ncol=3, bbox_to_anchor=(0.5, top + 0.3 / (2.8 * rows)))
    figure.tight_layout(rect=(0, 0, 1, top - 0.05 / rows))
    return png(figure)


def bucket_of(fields, axis):
    try:
        if axis == "seqlen_kv":
            n = int(fields.get("skv", "0"))
            return 2 ** round(math.log2(n)) if n > 0 else None  # no keys: nothing to plot on a log axis
        if axis == "head_dim":
            return int(fields.get("d", "0"))
        if axis == "values":
            return fields.get("values", "?").split("(")[0]
        if axis == "mask":
            return fields.get("mask", "none")
    except ValueError:
        return None
    return None


def drift_plots(groups):
    """Relative O RMSE (RMSE / RMS of the reference) per case against sequence
    length, head dim, value distribution and mask: the median per bucket, a
    line per subject, one figure per dtype."""
    import matplotlib.pyplot as plt
    images = []
    dtypes = sorted({g["dtype"] for g in groups.values() if g["per_case"]})
    for dtype in dtypes:
        subjects = [g for g in groups.values() if g["dtype"] == dtype and len(g["per_case"]) >= 3]
        if not subjects:
            continue
        figure, axes = plt.subplots(1, 4, figsize=(18, 3.6))
        for ax, axis in zip(axes, ("seqlen_kv", "head_dim", "values", "mask")):
            categorical = axis in ("values", "mask")
            categories = sorted({bucket_of(f, axis) for g in subjects for f, _ in g["per_case"]} - {None}, key=str)
            for g in subjects:
                buckets = collections.defaultdict(list)
                for fields, value in g["per_case"]:
                    b = bucket_of(fields, axis)
                    if b is not None and value > 0:
                        buckets[b].append(value)
                keys = [k for k in (categories if categorical else sorted(buckets)) if k in buckets]
                if not keys:
                    continue
                xs = [categories.index(k) for k in keys] if categorical else keys
                # Categories are not joined by lines: there is nothing between two of them.
                ax.plot(xs, [statistics.median(buckets[k]) for k in keys], marker="o", markersize=4 if categorical else 3,
                        linestyle="none" if categorical else "-", label=plain(g["subject"]))
            ax.set_yscale("log")
            if categorical:
                ax.set_xticks(range(len(categories)))
                ax.set_xticklabels([plain(c) for c in categories], rotation=45, fontsize=7, ha="right")
            elif axis == "seqlen_kv":
                ax.set_xscale("log", base=2)
            ax.set_title(f"against {axis.replace('_', ' ')}", fontsize=9)
            ax.set_ylabel("median relative O RMSE", fontsize=7)
        axes[0].legend(fontsize=6, loc="best")
        figure.suptitle(f"error against shape, values and mask: {dtype}")
        figure.tight_layout(rect=(0, 0, 1, 0.92))
        images.append((dtype, png(figure)))
    return images


def bench_plot(rows):
    import matplotlib.pyplot as plt
    problems = sorted({r["problem"] for r in rows})
    if not problems:
        return None
    columns = 2
    n_rows = math.ceil(len(problems) / columns)
    figure, axes = plt.subplots(n_rows, columns, figsize=(16, 3.2 * n_rows), squeeze=False)
    for ax in axes.flat[len(problems):]:
        ax.axis("off")
    for ax, problem in zip(axes.flat, problems):
        mine = sorted((r for r in rows if r["problem"] == problem), key=lambda r: -r["median_ms"])
        memory = mine[0].get("bound") == "memory"
        values = [100 * (r["fraction_of_copy"] if memory else r["fraction_of_gemm"]) for r in mine]
        colors = ["C2" if r["subject"] == "cudnn" else "C0" for r in mine]
        ax.barh([plain(r["subject"]) for r in mine], values, color=colors)
        ax.set_xlabel(f"% of the measured {'copy bandwidth' if memory else 'GEMM peak'}", fontsize=7)
        ax.tick_params(labelsize=7)
        fields = problem_fields(problem)
        short = " ".join(f"{k}={fields[k]}" for k in ("b", "hq", "hkv", "sq", "skv", "d", "dtype", "mask") if k in fields)
        ax.set_title(plain(short), fontsize=8)
    figure.suptitle("speed as a fraction of this machine's measured ceilings (cuDNN in green)")
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.4 / (3.2 * n_rows)))
    return png(figure)


# ---- writing -------------------------------------------------------------------------------------


def fmt_float(x, spec=".3g"):
    if x is None:
        return "-"
    if x == math.inf:
        return "inf"
    return format(x, spec)


def summarise(groups, rows, ceilings, regressions, notes, warnings, inputs, baseline_inputs):
    subjects = []
    for g in groups.values():
        if not g["cases"]:
            continue  # every case outside its domain or unavailable: in the warnings below
        judged = g["cases"] - g["vacuous"] - g["deviations"]  # cases that compared something under the rule
        subjects.append(dict(subject=g["subject"], dtype=g["dtype"], cases=g["cases"], passes=g["passes"],
                             pass_rate=g["passes"] / judged if judged else None, unsupported=g["unsupported"],
                             unavailable=g["unavailable"], vacuous=g["vacuous"], deviations=g["deviations"],
                             deviated=g["deviated"][:50], on_sampled_rows=g["on_sampled_rows"],
                             failures_by_check=dict(g["failures"]), failures=g["failed"][:50],
                             worst_ratios=[dict(ratio=r, problem=p) for r, p in g["worst"][:5]],
                             o_abs_error=dict(p50_at_most=g["p50"], p99_at_most=g["p99"], p999_at_most=g["p999"],
                                              max=g["max_abs"], rmse=g["rmse"], max_ulp=g["max_ulp"],
                                              relative_rmse_median=g["rel_rmse_median"],
                                              relative_rmse_max=g["rel_rmse_max"]),
                             versions=sorted(g["versions"])))
    bench = [{**{k: r.get(k) for k in ("subject", "problem", "dtype", "bound", "median_ms", "min_ms", "max_ms", "tflops",
                                       "fraction_of_gemm", "gbps", "fraction_of_copy", "input_sets")},
              # the peer's time over the subject's (records before the peer was named: cuDNN's)
              "speed_vs_peer": r.get("speed_vs_peer", r.get("speed_vs_cudnn")),
              "peer_subject": r.get("peer_subject", "cudnn" if "speed_vs_cudnn" in r else None)}
             for r in sorted(rows, key=lambda r: (r["problem"], r["subject"]))]
    unsupported_only = sorted(f"{g['subject']} ({g['dtype']})" for g in groups.values()
                              if not g["cases"] and not g["unavailable"])
    if unsupported_only:
        warnings = warnings + [f"{len(unsupported_only)} subject/dtype pair(s) had only unsupported cases (outside "
                               f"their domain): {', '.join(unsupported_only)}"]
    unavailable = sorted(f"{g['subject']} ({g['dtype']}, {g['unavailable']} case(s))" for g in groups.values()
                         if g["unavailable"])
    if unavailable:
        warnings = warnings + [f"{len(unavailable)} subject/dtype pair(s) were unavailable on the machine that ran "
                               f"them (no GPU, no driver, or too old a GPU), not judged: {', '.join(unavailable)}"]
    return dict(generated=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), inputs=inputs,
                baseline=baseline_inputs, warnings=warnings, regressions=regressions, comparison_notes=notes,
                ceilings={k: ceilings.get(k) for k in ("device", "gemm_bf16_tflops", "gemm_f32_tflops", "copy_gbps",
                                                       "method")} if ceilings else None,
                subjects=subjects, bench=bench)


def markdown(summary, title):
    out = [f"# {title}", "", f"Generated {summary['generated']} from {', '.join(summary['inputs'])}.", ""]
    if summary["baseline"] is not None:
        if summary["regressions"]:
            out += [f"**{len(summary['regressions'])} regression(s) against {', '.join(summary['baseline'])}:**", ""]
            out += [f"- {r['kind']}: `{r['subject']}` {r['text']} — `{r['problem']}`" for r in summary["regressions"][:30]]
        else:
            out += [f"No regression against {', '.join(summary['baseline'])}."]
        out += [f"({'; '.join(summary['comparison_notes'])})", ""]
    for w in summary["warnings"]:
        out.append(f"> warning: {w}")
    if summary["warnings"]:
        out.append("")
    out += ["| subject | dtype | cases | pass rate | failures by check | vacuous | deviations | worst ratio | "
            "O p99 abs err ≤ | O rel. RMSE (median) |",
            "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for s in summary["subjects"]:
        by = ", ".join(f"{k}: {v}" for k, v in s["failures_by_check"].items()) or "-"
        worst = s["worst_ratios"][0]["ratio"] if s["worst_ratios"] else None
        rate = f"{100 * s['pass_rate']:.1f}%" if s["pass_rate"] is not None else "-"
        out.append(f"| {s['subject']} | {s['dtype']} | {s['cases']} | {rate} | {by} | {s['vacuous']} | {s['deviations']} | "
                   f"{fmt_float(worst, '.2f')} | "
                   f"{fmt_float(s['o_abs_error']['p99_at_most'], '.0e')} | {fmt_float(s['o_abs_error']['relative_rmse_median'])} |")
    if summary["bench"]:
        c = summary["ceilings"] or {}
        out += ["", f"Speed on {c.get('device', '?')}: bf16 GEMM {fmt_float(c.get('gemm_bf16_tflops'), '.0f')} TFLOP/s, "
                    f"f32 GEMM {fmt_float(c.get('gemm_f32_tflops'), '.1f')} TFLOP/s, copy "
                    f"{fmt_float(c.get('copy_gbps'), '.0f')} GB/s (measured in the same run).", "",
                "| problem | subject | median ms | TFLOP/s | % GEMM | GB/s | % copy | × peer |",
                "|---|---|---:|---:|---:|---:|---:|---:|"]
        for b in summary["bench"]:
            out.append(f"| `{b['problem']}` | {b['subject']} | {fmt_float(b['median_ms'], '.3f')} | "
                       f"{fmt_float(b['tflops'], '.1f')} | {fmt_float(100 * (b['fraction_of_gemm'] or 0), '.0f')}% | "
                       f"{fmt_float(b['gbps'], '.0f')} | {fmt_float(100 * (b['fraction_of_copy'] or 0), '.0f')}% | "
                       f"{fmt_float(b.get('speed_vs_peer'), '.2f')} |")
    return "\n".join(out) + "\n"


CSS = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1500px; }
table { border-collapse: collapse; margin: 8px 0 20px; font-size: 12px; }
th, td { border: 1px solid #ccc; padding: 3px 5px; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
th { white-space: normal; vertical-align: bottom; }
td.wrap { white-space: normal; overflow-wrap: anywhere; max-width: 640px; }
nav ul { columns: 2; margin: 4px 0 16px; } nav li { margin: 2px 0; }
code { font-size: 12px; } .bad { color: #b00020; font-weight: bold; } .ok { color: #1b5e20; }
.banner { padding: 10px 14px; margin: 10px 0; border-radius: 4px; }
.banner.bad { background: #fde7e9; } .banner.ok { background: #e8f5e9; } .warn { background: #fff8e1; padding: 6px 10px; }
img { max-width: 100%; display: block; margin: 8px 0 24px; }
details { margin: 4px 0 12px; }
"""

CHECKER = """
<script>
// What the browser test reads back (reports/browser_test.py): script errors,
// and images that failed to load or have no size.
window.__errors = [];
window.addEventListener("error", function (e) { window.__errors.push(String(e.message || e.type)); }, true);
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var broken = images.filter(function (i) {
    var box = i.getBoundingClientRect();
    return !(i.complete && i.naturalWidth > 0 && i.naturalHeight > 0 && box.width > 0 && box.height > 0);
  });
  document.body.setAttribute("data-images", String(images.length));
  document.body.setAttribute("data-broken-images", String(broken.length));
  document.body.setAttribute("data-errors", String(window.__errors.length));
  // How far the page is wider than the window (0: it fits).
  var width = Math.max(document.documentElement.scrollWidth, document.body.scrollWidth);
  document.body.setAttribute("data-overflow", String(Math.max(0, width - window.innerWidth)));
  document.body.setAttribute("data-loaded", "yes");
});
</script>
"""


def html_report(summary, groups, images, title):
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{CSS}</style>"
             f"{CHECKER}</head><body>", f"<h1>{e(title)}</h1>",
             f"<p>Generated {e(summary['generated'])} from {e(', '.join(summary['inputs']))}.</p>"]
    if summary["baseline"] is not None:
        if summary["regressions"]:
            parts.append(f"<div class='banner bad'><b>{len(summary['regressions'])} regression(s)</b> against "
                         f"{e(', '.join(summary['baseline']))}<ul>")
            parts += [f"<li>{e(r['kind'])}: <b>{e(r['subject'])}</b> {e(r['text'])} <code>{e(r['problem'])}</code></li>"
                      for r in summary["regressions"][:50]]
            parts.append("</ul></div>")
        else:
            parts.append(f"<div class='banner ok'>No regression against {e(', '.join(summary['baseline']))}.</div>")
        parts.append(f"<p>{e('; '.join(summary['comparison_notes']))}. Speed: flagged beyond "
                     f"max({100 * SPEED_MIN_CHANGE:.0f}%, {SPEED_NOISE_FACTOR:g} × the relative interquartile range); "
                     f"error: O RMSE or max more than {ERROR_GROWTH:g}× on the same problem, or a pass turned fail.</p>")
    for w in summary["warnings"]:
        parts.append(f"<p class='warn'>warning: {e(w)}</p>")

    parts.append("<h2>Accuracy per subject</h2><table><tr><th class='l'>subject</th><th>dtype</th><th>cases</th>"
                 "<th>pass rate</th><th class='l'>failures by check</th><th>vacuous</th><th>deviations</th>"
                 "<th>worst ratio</th><th>O |err| p50 ≤</th>"
                 "<th>p99 ≤</th><th>p99.9 ≤</th><th>max</th><th>RMSE</th><th>rel. RMSE median</th><th>rel. RMSE max</th>"
                 "<th>max ULP</th><th>unsupported</th><th>unavailable</th></tr>")
    for s in summary["subjects"]:
        rate = s["pass_rate"]
        css = "ok" if rate == 1 else "bad"
        by = ", ".join(f"{k}: {v}" for k, v in s["failures_by_check"].items()) or "-"
        a = s["o_abs_error"]
        worst = s["worst_ratios"][0]["ratio"] if s["worst_ratios"] else None
        parts.append(f"<tr><td class='l'>{e(s['subject'])}</td><td>{e(s['dtype'])}</td><td>{s['cases']}</td>"
                     f"<td class='{css}'>{'-' if rate is None else f'{100 * rate:.1f}%'}</td><td class='l'>{e(by)}</td>"
                     f"<td>{s['vacuous']}</td><td>{s['deviations']}</td>"
                     f"<td>{fmt_float(worst, '.2f')}</td><td>{fmt_float(a['p50_at_most'], '.0e')}</td>"
                     f"<td>{fmt_float(a['p99_at_most'], '.0e')}</td><td>{fmt_float(a['p999_at_most'], '.0e')}</td>"
                     f"<td>{fmt_float(a['max'])}</td><td>{fmt_float(a['rmse'])}</td><td>{fmt_float(a['relative_rmse_median'])}</td>"
                     f"<td>{fmt_float(a['relative_rmse_max'])}</td><td>{fmt_float(a['max_ulp'], '.3g')}</td>"
                     f"<td>{s['unsupported']}</td><td>{s['unavailable']}</td></tr>")
    parts.append("</table><p>Percentiles come from the merged log-scale histograms: each is the upper edge of "
                 "its bin. RMSE pools every compared element; cases of very different magnitude (near-overflow "
                 "values) dominate it, so the relative RMSE (a case's RMSE over its reference's RMS) is given per "
                 "case too. The worst ratio is the case's error over its tolerance bound (pass ≤ 1). The pass rate "
                 "counts the cases that compared something under the rule: vacuous cases (nothing compared: empty "
                 "or fully masked) and deviations (outside the rule, inside a limit the subject declares) are "
                 "counted apart, never as passes.</p>")
    for s in summary["subjects"]:
        if s["deviated"]:
            parts.append(f"<details><summary><b>{e(s['subject'])}</b> ({e(s['dtype'])}): {s['deviations']} "
                         "deviation(s), a limit the subject declares</summary><table><tr><th class='l'>limit</th>"
                         "<th class='l'>problem</th><th class='l'>replay</th></tr>")
            parts += [f"<tr><td class='l wrap'>{e(d['message'])}</td><td class='l'>{problem_cell(d['problem'])}</td>"
                      f"<td class='l wrap'><code>{e(d['reproducer'])}</code></td></tr>" for d in s["deviated"][:20]]
            parts.append("</table></details>")
        if s["failures"]:
            parts.append(f"<details><summary><b>{e(s['subject'])}</b> ({e(s['dtype'])}): {len(s['failures'])} "
                         "failure(s) shown</summary><table><tr><th class='l'>check</th><th class='l'>problem</th>"
                         "<th class='l'>replay</th></tr>")
            parts += [f"<tr><td class='l'>{e(f['check'])}</td><td class='l'>{problem_cell(f['problem'])}</td>"
                      f"<td class='l wrap'><code>{e(f['reproducer'])}</code></td></tr>" for f in s["failures"][:20]]
            parts.append("</table></details>")
        if s["worst_ratios"]:
            parts.append(f"<details><summary>{e(s['subject'])} ({e(s['dtype'])}): the worst error ratios</summary><table>")
            parts += [f"<tr><td>{fmt_float(w['ratio'], '.3f')}</td><td class='l wrap'><code>{e(w['problem'])}</code></td></tr>"
                      for w in s["worst_ratios"]]
            parts.append("</table></details>")

    for key, heading in (("abs", "Error distributions: |error| against the f64 oracle"),
                         ("ulp", "Error distributions: ULP error")):
        if images.get(key):
            parts.append(f"<h2>{heading}</h2><p>Per subject and dtype, the fraction of compared O elements per bin, "
                         "with the same-precision baseline on the same cases and cuDNN where it ran as the peer.</p>"
                         f"<img alt='{e(heading)}' src='data:image/png;base64,{images[key]}'>")
    if images.get("drift"):
        parts.append("<h2>Error against sequence length, head dim, values and mask</h2>")
        for dtype, data in images["drift"]:
            parts.append(f"<img alt='drift {e(dtype)}' src='data:image/png;base64,{data}'>")

    if summary["bench"]:
        c = summary["ceilings"] or {}
        parts.append("<h2>Performance</h2>")
        if c:
            parts.append(f"<p>Measured in the same run on <b>{e(str(c.get('device')))}</b>: bf16 GEMM "
                         f"{fmt_float(c.get('gemm_bf16_tflops'), '.0f')} TFLOP/s, f32 GEMM "
                         f"{fmt_float(c.get('gemm_f32_tflops'), '.1f')} TFLOP/s, copy {fmt_float(c.get('copy_gbps'), '.0f')} "
                         f"GB/s ({e(str(c.get('method')))}).</p>")
        if images.get("bench"):
            parts.append(f"<img alt='speed' src='data:image/png;base64,{images['bench']}'>")
        parts.append("<table><tr><th class='l'>problem</th><th class='l'>subject</th><th>median ms</th><th>min</th>"
                     "<th>max</th><th>TFLOP/s</th><th>% GEMM</th><th>GB/s</th><th>% copy</th><th>× peer</th></tr>")
        for b in summary["bench"]:
            parts.append(f"<tr><td class='l'>{problem_cell(b['problem'])}</td><td class='l'>{e(b['subject'])}</td>"
                         f"<td>{fmt_float(b['median_ms'], '.3f')}</td><td>{fmt_float(b['min_ms'], '.3f')}</td>"
                         f"<td>{fmt_float(b['max_ms'], '.3f')}</td><td>{fmt_float(b['tflops'], '.1f')}</td>"
                         f"<td>{fmt_float(100 * (b['fraction_of_gemm'] or 0), '.0f')}%</td><td>{fmt_float(b['gbps'], '.0f')}</td>"
                         f"<td>{fmt_float(100 * (b['fraction_of_copy'] or 0), '.0f')}%</td>"
                         f"<td>{fmt_float(b.get('speed_vs_peer'), '.2f')}</td></tr>")
        parts.append("</table><p>× peer: the peer's median time over the subject's on the same problem (above 1: "
                     "faster than the peer; the peer is cuDNN unless bench's --peer named another).</p>")
    parts.append("</body></html>")
    return with_contents("\n".join(parts))


def problem_cell(line):
    """A table cell's problem: the short label, the full line on hover."""
    return f"<code title='{html.escape(line or '')}'>{html.escape(short_problem(line))}</code>"


def with_contents(page):
    """The page with an id on every section heading and a table of contents
    after the introduction (before the first section)."""
    import re
    headings = []

    def anchor(match):
        headings.append(match.group(1))
        return f"<h2 id='s{len(headings)}'>{match.group(1)}</h2>"

    page = re.sub(r"<h2>(.*?)</h2>", anchor, page)
    if not headings:
        return page
    contents = "<nav><b>Contents</b><ul>" + "".join(
        f"<li><a href='#s{n}'>{title}</a></li>" for n, title in enumerate(headings, 1)) + "</ul></nav>"
    first = page.index("<h2 id='s1'>")
    return page[:first] + contents + page[first:]


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
    warnings = []
    try:
        records = read_records(args.paths, warnings)
        baseline = read_records(args.baseline, warnings) if args.baseline else None
        groups = accuracy(records)  # BadInput where cases binned otherwise would be merged
    except BadInput as error:
        fail(str(error))
    rows = bench_rows(records, warnings)
    if not groups and not rows:
        fail(f"no case or bench records among the {len(records)} record(s) under {', '.join(args.paths)}")
    for g in groups.values():
        if len(g["versions"]) > 1:
            warnings.append(f"{g['subject']}: records from {len(g['versions'])} subject versions are mixed: "
                            f"{', '.join(sorted(g['versions']))}")
        for reason, count in g["every_row_unavailable"].items():
            warnings.append(f"{g['subject']} ({g['dtype']}): {count} verdict(s) rest on sampled rows: the every-row "
                            f"check was asked for and could not run ({reason})")
    regressions, notes = compare(records, baseline) if baseline is not None else ([], [])
    images = dict(abs=histogram_grid(groups, "abs"), ulp=histogram_grid(groups, "ulp"), drift=drift_plots(groups),
                  bench=bench_plot(rows))
    summary = summarise(groups, rows, ceilings_of(records), regressions, notes, warnings, args.paths, args.baseline)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        fail(f"-o {args.out}: exists and is not a folder")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "report.html"), "w", encoding="utf-8") as f:
        f.write(html_report(summary, groups, images, args.title))
    with open(os.path.join(args.out, "summary.md"), "w", encoding="utf-8") as f:
        f.write(markdown(summary, args.title))
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, default=str)
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
