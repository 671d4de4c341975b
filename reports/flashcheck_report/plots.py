"""The report's plots (matplotlib, Agg): error histograms per subject and
dtype, error against shape, values and mask, and speed against the machine's
ceilings; each a PNG as base64, for the HTML to inline."""
import base64
import collections
import io
import math
import statistics

from .load import LEGACY_HISTOGRAM_EDGES, bin_labels, problem_fields


def png(figure):
    # No bbox_inches="tight": each figure's layout (place) already keeps every
    # label inside it (the four figures compared by eye: nothing cut), and the
    # tight bounding box drew the whole figure once more to find it. Measured
    # on reports/testdata/h200-2026-11-21 (105 records, this repository's
    # 2-core CI machine, 2026-11-26): 13.2 s a report with it, 9.3 s without.
    # With place() instead of tight_layout (2026-11-28, same machine and
    # records): the four figures 8.8 -> 5.6 s, a report 8.4-10.0 -> 6.6-7.0 s,
    # reports/report_test.py's 15 tests 106 -> 84 s.
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    import matplotlib.pyplot as plt
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def place(figure, rows, columns, left, right, bottom, top, wgap, hgap):
    """Lays out a grid of panels with fixed margins, in inches: `left`,
    `right` and `bottom` around the grid, `top` the band above it (titles,
    legend), `wgap` and `hgap` between panels (each panel's tick labels,
    axis label and title). tight_layout found the same margins by measuring
    every tick label of every panel: 3.5 s of an 8.0 s report (24 panels,
    reports/testdata, this repository's 2-core machine, 2026-11-28)."""
    width, height = figure.get_size_inches()
    panel_width = (width - left - right - (columns - 1) * wgap) / columns
    panel_height = (height - bottom - top - (rows - 1) * hgap) / rows
    figure.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                           wspace=wgap / panel_width, hspace=hgap / panel_height)


def widest(figure, texts, fontsize):
    """The widest of `texts` drawn at `fontsize`, in inches (one probe text, measured)."""
    renderer = figure.canvas.get_renderer()
    probe = figure.text(0, 0, "", fontsize=fontsize)
    width = 0.0
    for text in texts:
        probe.set_text(text)
        width = max(width, probe.get_window_extent(renderer).width)
    probe.remove()
    return width / figure.dpi


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
        ax.set_title(plain(f"{g['subject']} ({g['label']}, {g['cases']} cases)"), fontsize=9)
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
    height = 2.8 * rows
    figure.suptitle("|error| against f64 (log10 bins)" if kind == "abs" else "ULP error in the output dtype (log2 bins)",
                    y=1 - 0.05 / height, va="top")
    figure.legend(handles, labels, loc="upper center", ncol=3, bbox_to_anchor=(0.5, 1 - 0.45 / height))
    # Panels: y tick labels and label on the left, x tick labels (45 degrees) below, a title above.
    ticks = widest(figure, [t.get_text() for ax in axes.flat[:len(panels)] for t in ax.get_xticklabels()], 7) * 0.71
    place(figure, rows, columns, left=0.65, right=0.15, bottom=ticks + 0.2, top=1.25, wgap=0.8, hgap=ticks + 0.55)
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
    dtypes = sorted({g["label"] for g in groups.values() if g["per_case"]})
    for dtype in dtypes:
        subjects = [g for g in groups.values() if g["label"] == dtype and len(g["per_case"]) >= 3]
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
        # Category labels at 45 degrees below, log-scale tick labels and the y label on the left.
        below = max(0.3, widest(figure, [t.get_text() for ax in axes for t in ax.get_xticklabels()], 7) * 0.71 + 0.15)
        place(figure, 1, 4, left=0.8, right=0.15, bottom=below + 0.1, top=0.75, wgap=0.85, hgap=0)
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
        # A decode against the read-only ceiling where the bench measured it (it reads K and V, writes little).
        read = memory and all(r.get("fraction_of_read") is not None for r in mine)
        key = "fraction_of_read" if read else "fraction_of_copy" if memory else "fraction_of_gemm"
        values = [100 * r[key] for r in mine]
        colors = ["C2" if r["subject"] == "cudnn" else "C0" for r in mine]
        ax.barh([plain(r["subject"]) for r in mine], values, color=colors)
        ceiling = "read bandwidth" if read else "copy bandwidth" if memory else "GEMM peak"
        ax.set_xlabel(f"% of the measured {ceiling}", fontsize=7)
        ax.tick_params(labelsize=7)
        fields = problem_fields(problem)
        short = " ".join(f"{k}={fields[k]}" for k in ("b", "hq", "hkv", "sq", "skv", "d", "dtype", "mask") if k in fields)
        ax.set_title(plain(short), fontsize=8)
    figure.suptitle("speed as a fraction of this machine's measured ceilings (cuDNN in green)")
    # Each panel's subject names on its left, its x label below, its title above.
    names = widest(figure, [plain(r["subject"]) for r in rows], 7) + 0.15
    place(figure, n_rows, columns, left=names + 0.05, right=0.25, bottom=0.55, top=0.8, wgap=names + 0.35, hgap=0.9)
    return png(figure)
