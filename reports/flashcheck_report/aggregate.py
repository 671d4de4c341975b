"""From records to what the report shows: per (subject, dtype) accuracy with
merged histograms and pooled statistics, the bench's newest timings and the
machine's ceilings, the comparison with a baseline run, and the summary that
summary.json holds and the HTML and Markdown render."""
import collections
import datetime
import math
import statistics

from .load import GRADIENTS, BadInput, LEGACY_HISTOGRAM_EDGES, errors_of, histogram_edges, kind_of, num, problem_fields

# Thresholds of the baseline comparison, named here and printed in the report.
SPEED_MIN_CHANGE = 0.05      # a slowdown below 5% is never flagged
SPEED_NOISE_FACTOR = 3.0     # nor one below 3x the runs' relative interquartile range
ERROR_GROWTH = 2.0           # an error (O RMSE or max) that more than doubles on the same problem
ERROR_ABS_FLOOR = 1e-12      # ... and grows by more than this (exact zeros do not "double")


# ---- accuracy ------------------------------------------------------------------------------------


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
    """Per (subject, dtype, tensor): cases, verdicts, failures, merged histograms,
    pooled statistics. The tensor is O for forward cases; a backward case
    (pass=bwd) counts in the groups of dQ, dK and dV, each with its own errors.
    A case outside its domain or unavailable has no tensor of its own: its
    problem line's pass says which groups it counts in."""
    groups = collections.OrderedDict()
    def order(r):
        return (str(r.get("subject", "")), str(r.get("dtype", "")),
                problem_fields(r.get("problem")).get("pass", "fwd"))
    for r in sorted((r for r in records if kind_of(r) == "case"), key=order):
        backward = "gradients" in r or problem_fields(r.get("problem")).get("pass") == "bwd"
        for tensor in (GRADIENTS if backward else ("O",)):
            add_case(groups, r, tensor)
    for g in groups.values():
        g["worst"].sort(key=lambda t: -(t[0] if t[0] is not None else 0))
        g["rmse"] = math.sqrt(g["sq_sum"] / g["count"]) if g["count"] else None
        relative = [v for _, v in g["per_case"]]
        g["rel_rmse_median"] = statistics.median(relative) if relative else None
        g["rel_rmse_max"] = max(relative) if relative else None
        hist = g["hist"] or []
        edges = g["hist_edges"] or LEGACY_HISTOGRAM_EDGES["log10"]
        g["p50"], g["p99"], g["p999"] = (quantile_edge(hist, edges, q) for q in (0.5, 0.99, 0.999))
    return groups


def add_case(groups, r, tensor):
    """Adds one case to its (subject, dtype, tensor) group."""
    key = (r.get("subject", "?"), r.get("dtype") or problem_fields(r.get("problem")).get("dtype", "?"), tensor)
    label = key[1] if tensor == "O" else f"{key[1]}, {tensor}"
    g = groups.setdefault(key, dict(subject=key[0], dtype=key[1], tensor=tensor, label=label, cases=0, passes=0,
                                     unsupported=0, unavailable=0,
                                     vacuous=0, deviations=0, deviated=[], on_sampled_rows=0,
                                     every_row_unavailable=collections.Counter(),
                                     failures=collections.Counter(), failed=[], worst=[], hist=None,
                                     hist_edges=None, ulp=None, base_hist=None, base_ulp=None, peer_hist=None,
                                     peer_ulp=None, max_abs=0.0, sq_sum=0.0, count=0, max_ulp=0.0, per_case=[],
                                     versions=set(), edges=None))
    verdict = r.get("verdict", "error")
    if verdict == "unsupported":
        g["unsupported"] += 1
        return
    if verdict == "unavailable":  # the machine could not run it: neither a pass nor a failure
        g["unavailable"] += 1
        return
    g["cases"] += 1
    if r.get("rows_basis") == "sampled":  # schema 3: the verdict rests on sampled rows
        g["on_sampled_rows"] += 1
        if r.get("every_row_unavailable"):
            g["every_row_unavailable"][r["every_row_unavailable"]] += 1
    if r.get("subject_version"):
        g["versions"].add(r["subject_version"])
    if verdict == "vacuous":  # nothing compared: counted apart, never a pass
        g["vacuous"] += 1
        return
    if verdict == "deviation":  # a limit the subject declares: counted and listed apart
        g["deviations"] += 1
        g["deviated"].append(dict(problem=r.get("problem", ""), reproducer=r.get("reproducer", ""),
                                  message=r.get("deviation") or r.get("rule", "")))
        return
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
    e = errors_of(r, "metrics", tensor)
    if e:
        g["hist"] = add_into(g["hist"], e.get("histogram_log10"))
        edges = histogram_edges(r)
        if g["edges"] is None:
            g["edges"], g["hist_edges"] = edges, edges["log10"]
        elif edges != g["edges"]:  # counts of other bins cannot be added
            raise BadInput(f"{r.get('_file', '?')}: a case of {key[0]} ({key[1]}) has histogram edges unlike "
                           "the other cases' (records of another flashcheck version?): report them apart")
        g["ulp"] = add_into(g["ulp"], e.get("histogram_ulp_log2"))
        g["max_abs"] = max(g["max_abs"], num(e.get("max_abs")))
        g["max_ulp"] = max(g["max_ulp"], num(e.get("max_ulp")))
        n = int(num(e.get("count")))
        g["sq_sum"] += num(e.get("rmse")) ** 2 * n
        g["count"] += n
        if num(e.get("ref_rms")) > 0 and math.isfinite(num(e.get("rmse"))):
            g["per_case"].append((problem_fields(r.get("problem")), num(e.get("rmse")) / num(e.get("ref_rms"))))
    for where, hist_key, ulp_key in (("baseline", "base_hist", "base_ulp"), ("peer", "peer_hist", "peer_ulp")):
        b = errors_of(r, where, tensor)
        if b:
            g[hist_key] = add_into(g[hist_key], b.get("histogram_log10"))
            g[ulp_key] = add_into(g[ulp_key], b.get("histogram_ulp_log2"))


def group_warnings(groups):
    """What the accuracy groups say the reader should know: subject versions
    mixed, verdicts resting on sampled rows where every row was asked for."""
    warnings = []
    for g in groups.values():
        if len(g["versions"]) > 1:
            warnings.append(f"{g['subject']}: records from {len(g['versions'])} subject versions are mixed: "
                            f"{', '.join(sorted(g['versions']))}")
        for reason, count in g["every_row_unavailable"].items():
            warnings.append(f"{g['subject']} ({g['label']}): {count} verdict(s) rest on sampled rows: the every-row "
                            f"check was asked for and could not run ({reason})")
    return warnings


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
    """Regressions of `records` against the `baseline` records (speed beyond noise, error growth, a pass
    turned fail, a timed pair gone) and notes on what was compared."""
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


# ---- the summary ---------------------------------------------------------------------------------


def summarise(groups, rows, ceilings, regressions, notes, warnings, inputs, baseline_inputs):
    """What summary.json holds, and what report.html and summary.md show."""
    subjects = []
    for g in groups.values():
        if not g["cases"]:
            continue  # every case outside its domain or unavailable: in the warnings below
        judged = g["cases"] - g["vacuous"] - g["deviations"]  # cases that compared something under the rule
        subjects.append(dict(subject=g["subject"], dtype=g["dtype"], tensor=g["tensor"], label=g["label"],
                             cases=g["cases"], passes=g["passes"],
                             pass_rate=g["passes"] / judged if judged else None, unsupported=g["unsupported"],
                             unavailable=g["unavailable"], vacuous=g["vacuous"], deviations=g["deviations"],
                             deviated=g["deviated"][:50], on_sampled_rows=g["on_sampled_rows"],
                             failures_by_check=dict(g["failures"]), failures=g["failed"][:50],
                             worst_ratios=[dict(ratio=r, problem=p) for r, p in g["worst"][:5]],
                             abs_error=dict(p50_at_most=g["p50"], p99_at_most=g["p99"], p999_at_most=g["p999"],
                                              max=g["max_abs"], rmse=g["rmse"], max_ulp=g["max_ulp"],
                                              relative_rmse_median=g["rel_rmse_median"],
                                              relative_rmse_max=g["rel_rmse_max"]),
                             versions=sorted(g["versions"])))
    bench = [{**{k: r.get(k) for k in ("subject", "problem", "dtype", "bound", "median_ms", "min_ms", "max_ms", "tflops",
                                       "fraction_of_gemm", "gbps", "fraction_of_copy", "fraction_of_read",
                                       "input_sets")},
              # the peer's time over the subject's (records before the peer was named: cuDNN's)
              "speed_vs_peer": r.get("speed_vs_peer", r.get("speed_vs_cudnn")),
              "peer_subject": r.get("peer_subject", "cudnn" if "speed_vs_cudnn" in r else None)}
             for r in sorted(rows, key=lambda r: (r["problem"], r["subject"]))]
    unsupported_only = sorted(f"{g['subject']} ({g['label']})" for g in groups.values()
                              if not g["cases"] and not g["unavailable"])
    if unsupported_only:
        warnings = warnings + [f"{len(unsupported_only)} subject/dtype pair(s) had only unsupported cases (outside "
                               f"their domain): {', '.join(unsupported_only)}"]
    unavailable = sorted(f"{g['subject']} ({g['label']}, {g['unavailable']} case(s))" for g in groups.values()
                         if g["unavailable"])
    if unavailable:
        warnings = warnings + [f"{len(unavailable)} subject/dtype pair(s) were unavailable on the machine that ran "
                               f"them (no GPU, no driver, or too old a GPU), not judged: {', '.join(unavailable)}"]
    return dict(generated=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), inputs=inputs,
                baseline=baseline_inputs, warnings=warnings, regressions=regressions, comparison_notes=notes,
                ceilings={k: ceilings.get(k) for k in ("device", "gemm_bf16_tflops", "gemm_f32_tflops", "copy_gbps", "read_gbps",
                                                       "method")} if ceilings else None,
                subjects=subjects, bench=bench)
