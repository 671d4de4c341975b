"""Writing the report: report.html from the Jinja2 templates beside this file
(autoescaped: every name and message is text), summary.md, summary.json."""
import json
import math
import os

from . import aggregate
from .load import problem_fields

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")


def fmt_float(x, spec=".3g"):
    if x is None:
        return "-"
    if x == math.inf:
        return "inf"
    return format(x, spec)


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


def failures_by_check(subject):
    """A summary subject's failures as "check: count, ...", or "-"."""
    return ", ".join(f"{k}: {v}" for k, v in subject["failures_by_check"].items()) or "-"


def worst_ratio(subject):
    return subject["worst_ratios"][0]["ratio"] if subject["worst_ratios"] else None


# ---- HTML ----------------------------------------------------------------------------------------


def sections_of(summary, images):
    """The report's sections in order, each a heading and the template that
    draws it (with its images): the table of contents lists them."""
    sections = [dict(title="Accuracy per subject", template="accuracy.html.j2")]
    for key, title in (("abs", "Error distributions: |error| against the f64 oracle"),
                       ("ulp", "Error distributions: ULP error")):
        if images.get(key):
            sections.append(dict(title=title, template="histograms.html.j2", image=images[key]))
    if images.get("drift"):
        sections.append(dict(title="Error against sequence length, head dim, values and mask",
                             template="drift.html.j2", images=images["drift"]))
    if summary["bench"]:
        sections.append(dict(title="Performance", template="performance.html.j2", image=images.get("bench")))
    return sections


def environment():
    import jinja2
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True,
                             lstrip_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["num"] = fmt_float
    env.filters["short_problem"] = short_problem
    env.globals.update(failures_by_check=failures_by_check, worst_ratio=worst_ratio)
    return env


def html_report(summary, images, title):
    thresholds = dict(speed_min_change=aggregate.SPEED_MIN_CHANGE, speed_noise_factor=aggregate.SPEED_NOISE_FACTOR,
                      error_growth=aggregate.ERROR_GROWTH)
    return environment().get_template("report.html.j2").render(
        summary=summary, title=title, sections=sections_of(summary, images), thresholds=thresholds)


# ---- Markdown ------------------------------------------------------------------------------------


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
    out += ["| subject | dtype, tensor (O; dQ, dK, dV for pass=bwd) | cases | pass rate | failures by check | vacuous | deviations | worst ratio | "
            "p99 abs err ≤ | rel. RMSE (median) |",
            "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for s in summary["subjects"]:
        rate = f"{100 * s['pass_rate']:.1f}%" if s["pass_rate"] is not None else "-"
        out.append(f"| {s['subject']} | {s['label']} | {s['cases']} | {rate} | {failures_by_check(s)} | {s['vacuous']} | "
                   f"{s['deviations']} | {fmt_float(worst_ratio(s), '.2f')} | "
                   f"{fmt_float(s['abs_error']['p99_at_most'], '.0e')} | {fmt_float(s['abs_error']['relative_rmse_median'])} |")
    if summary["bench"]:
        c = summary["ceilings"] or {}
        out += ["", f"Speed on {c.get('device', '?')}: bf16 GEMM {fmt_float(c.get('gemm_bf16_tflops'), '.0f')} TFLOP/s, "
                    f"f32 GEMM {fmt_float(c.get('gemm_f32_tflops'), '.1f')} TFLOP/s, copy "
                    f"{fmt_float(c.get('copy_gbps'), '.0f')} GB/s, read {fmt_float(c.get('read_gbps'), '.0f')} GB/s "
                    "(measured in the same run; read: a kernel that only reads, the ceiling of a decode).", "",
                "| problem | subject | median ms | TFLOP/s | % GEMM | GB/s | % copy | % read | × peer |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for b in summary["bench"]:
            read = b.get("fraction_of_read")
            out.append(f"| `{b['problem']}` | {b['subject']} | {fmt_float(b['median_ms'], '.3f')} | "
                       f"{fmt_float(b['tflops'], '.1f')} | {fmt_float(100 * (b['fraction_of_gemm'] or 0), '.0f')}% | "
                       f"{fmt_float(b['gbps'], '.0f')} | {fmt_float(100 * (b['fraction_of_copy'] or 0), '.0f')}% | "
                       f"{fmt_float(100 * read, '.0f') + '%' if read is not None else '-'} | "
                       f"{fmt_float(b.get('speed_vs_peer'), '.2f')} |")
    return "\n".join(out) + "\n"


# ---- the three files -----------------------------------------------------------------------------


def write(out, summary, images, title):
    """report.html, summary.md and summary.json in the folder `out` (made if missing)."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.html"), "w", encoding="utf-8") as f:
        f.write(html_report(summary, images, title))
    with open(os.path.join(out, "summary.md"), "w", encoding="utf-8") as f:
        f.write(markdown(summary, title))
    with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, default=str)
