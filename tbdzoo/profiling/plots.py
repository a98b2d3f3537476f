"""The report's figures, drawn with matplotlib's Agg canvas into PNG files.

Figures are built on ``matplotlib.figure.Figure`` rather than pyplot so that drawing a report
never touches a display or pyplot's global state. Every figure colours a backend the same way,
so a reader learns the colours once. Absent values are left out, never drawn as zero.
"""
import os
from collections import OrderedDict

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

from .memory import CATEGORIES

# Fixed colours for the known backends keep reports comparable with each other.
KNOWN_BACKEND_COLORS = OrderedDict([("torch", "#d62728"), ("tensorflow", "#ff7f0e"),
                                    ("mxnet", "#1f77b4"), ("cntk", "#2ca02c")])
EXTRA_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
CATEGORY_COLORS = dict(zip(CATEGORIES, ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                        "#9c755f", "#b07aa1")))
SOURCE_HATCH = {"measured": "", "analytic": "///", "derived": "..."}
UTILIZATION_METRICS = (
    ("CPU process utilisation\n(CPU time / wall / cores)", ("cpu", "process_utilization")),
    ("GPU utilisation\n(NVML, median)", ("gpu", "utilization", "median")),
    ("SM activity\n(GPM)", ("gpu", "gpm", "sm_activity")),
    ("Tensor activity\n(GPM)", ("gpu", "gpm", "tensor_activity")),
    ("FLOP utilisation\n(achieved / peak)", ("flops", "utilization")),
)
DPI = 110
UTILIZATION_ROW_SLOTS = 18


def dig(record, *keys):
    """A nested value or None: optional objects (``gpu``, ``gpm``) may be null or absent."""
    value = record
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def number(value):
    """A finite float or None, so a malformed or missing figure is simply not drawn."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


def memory_entry(record, category):
    """(bytes, source) of one memory category; accepts a bare byte count too."""
    entry = dig(record, "memory", category)
    if isinstance(entry, dict):
        return number(entry.get("bytes")), entry.get("source") or "analytic"
    return number(entry), "measured" if category == "peak" else "analytic"


def backend_colors(backends):
    """Known backends keep their colour; others take the spare colours in name order."""
    colors = OrderedDict((b, KNOWN_BACKEND_COLORS[b]) for b in sorted(backends)
                         if b in KNOWN_BACKEND_COLORS)
    spare = iter(EXTRA_COLORS * (1 + len(backends) // len(EXTRA_COLORS)))
    for b in sorted(backends):
        if b not in colors:
            colors[b] = next(spare)
    return colors


def plain(text):
    """Text shown literally: matplotlib would read ``$...$`` in a name as mathtext."""
    return str(text).replace("$", r"\$")


def world_size(record):
    """Processes of a data-parallel run; 1 for a run of one process."""
    return dig(record, "distributed", "world_size") or 1


def variant(record):
    """What distinguishes runs of one model and backend apart from the batch size: config,
    precision, execution and the number of processes (a one-process and a two-process run of
    the same batch are two different measurements, never one line)."""
    return (str(record.get("config")), str(record.get("precision")),
            str(record.get("execution") or "default"),
            "{} processes".format(world_size(record)) if world_size(record) > 1 else "1 process")


# variant()'s parts always named in a label; the others only where the runs differ in them.
ALWAYS_NAMED = 2


def variant_labels(variants):
    """{variant: label}: config and precision always, execution and processes only where the
    given variants differ in them, so a plain report keeps its short labels."""
    variants = sorted(set(variants))
    shown = [i for i in range(len(variants[0]) if variants else 0)
             if i < ALWAYS_NAMED or len({v[i] for v in variants}) > 1]
    return OrderedDict((v, " · ".join(v[i] for i in shown)) for v in variants)


def largest_batches(records):
    """Per (model, backend) and variant (config, precision, execution, processes), the record
    with the largest batch: the one closest to the paper's setting where a sweep gave several."""
    best = OrderedDict()
    for r in records:
        key = (r.get("model"), r.get("backend")) + variant(r)
        if key not in best or (r.get("batch_size") or 0) > (best[key].get("batch_size") or 0):
            best[key] = r
    return list(best.values())


def by_model(records):
    groups = OrderedDict()
    for r in sorted(records, key=lambda r: str(r.get("model"))):
        groups.setdefault(r.get("model"), []).append(r)
    return groups


def byte_unit(largest):
    """The binary unit that keeps an axis's numbers between 1 and 1024."""
    for scale, name in ((2 ** 40, "TiB"), (2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if largest >= scale:
            return scale, name
    return 1, "B"


def fmt_bytes(size):
    """Binary units, as allocators and nvidia-smi count memory; None stays a dash."""
    if size is None:
        return "—"
    scale, unit = byte_unit(abs(size))
    return "{:.0f} B".format(size) if scale == 1 else "{:.1f} {}".format(size / scale, unit)


def compact(value):
    """A bar label short enough to sit over a bar."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return "{:.3g}{}".format(value / scale, suffix)
    return "{:.3g}".format(value)


def value_axis(ax, values, label):
    """Linear axis with thousands separators; logarithmic when values span over 100x (a CPU run
    beside a GPU run), so that the small bars stay visible."""
    positive = [v for v in values if v and v > 0]
    if positive and max(positive) > 100 * min(positive):
        ax.set_yscale("log")
        label += ", log scale"
    else:
        ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(FuncFormatter(
        lambda v, _: "{:,.0f}".format(v) if abs(v) >= 1000 else "{:g}".format(v)))
    ax.set_ylabel(label)


def center_slots(ax, count, slots=4):
    """Keep a lone bar as narrow as bars in a crowded panel, centred."""
    pad = max(0, slots - count) / 2
    ax.set_xlim(-0.5 - pad, count - 0.5 + pad)


def grid(count, max_columns=3):
    columns = min(count, max_columns)
    return (count + columns - 1) // columns, columns


def new_figure(width, height):
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def axes_grid(fig, count, max_columns=3):
    """``count`` axes in rows; unused cells of the last row are removed."""
    rows, columns = grid(count, max_columns)
    cells = fig.subplots(rows, columns, squeeze=False).ravel()
    for extra in cells[count:]:
        extra.remove()
    return list(cells[:count])


def save(fig, out_dir, name):
    fig.savefig(os.path.join(out_dir, name), dpi=DPI)
    return name


def backend_legend(fig, colors, backends):
    """On the figure (or subfigure) whose layout makes room for it, right of the plots."""
    handles = [Patch(facecolor=colors[b], label=plain(b)) for b in sorted(set(backends))]
    fig.legend(handles=handles, title="backend", loc="outside right upper")


def throughput_units(records):
    units = {dig(r, "throughput", "unit") for r in records} - {None}
    return " or ".join(sorted(units)) or "items/s"


def plot_throughput(records, colors, out_dir, name):
    """Grouped bars, one subplot per model: each model has its own unit (images/s, tokens/s)."""
    records = [r for r in largest_batches(records) if number(dig(r, "throughput", "value"))]
    if not records:
        return None
    groups = by_model(records)
    rows, columns = grid(len(groups))
    fig = new_figure(max(6.0, 4.6 * columns + 1.5), 3.8 * rows)
    for ax, (model, runs) in zip(axes_grid(fig, len(groups)), groups.items()):
        draw_throughput_bars(ax, runs, colors)
        ax.set_title(plain(model), fontsize=12, fontweight="bold")
        value_axis(ax, [dig(r, "throughput", "value") for r in runs],
                   "throughput ({})".format(plain(throughput_units(runs))))
    backend_legend(fig, colors, [r["backend"] for r in records])
    fig.suptitle("Training throughput (largest batch size run per backend)", fontsize=13)
    return save(fig, out_dir, name)


def draw_throughput_bars(ax, runs, colors):
    labels = variant_labels(variant(r) for r in runs)
    variants = list(labels)
    backends = sorted({r["backend"] for r in runs})
    width = 0.8 / len(backends)
    for r in runs:
        offset = backends.index(r["backend"]) - (len(backends) - 1) / 2
        x = variants.index(variant(r)) + offset * width
        value = number(dig(r, "throughput", "value"))
        ax.bar(x, value, width * 0.92, color=colors[r["backend"]])
        low, high = throughput_range(r)
        if low is not None:
            ax.errorbar(x, value, yerr=[[max(0.0, value - low)], [max(0.0, high - value)]],
                        color="black", capsize=2, linewidth=0.8)
        label = "{}{}\nb={} · {}".format(compact(value), spread_text(r), r.get("batch_size"),
                                         plain(r.get("device")))
        ax.annotate(label, (x, high if low is not None else value), xytext=(0, 2),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(variants)), [plain(labels[v]) for v in variants])
    ax.margins(y=0.22)
    ax.grid(axis="y", alpha=0.3)


def throughput_range(record):
    """(lowest, highest) throughput of a run's repeats, from its slowest and fastest repeat's
    step time; (None, None) where the record has no spread."""
    items = number(dig(record, "throughput", "items_per_step"))
    slow, fast = number(dig(record, "step_time", "max")), number(dig(record, "step_time", "min"))
    if not items or not slow or not fast:
        return None, None
    return items / slow, items / fast


def spread_text(record):
    """' ±2.1%': the step time's coefficient of variation over repeats, or '' without one."""
    cv = number(dig(record, "step_time", "cv"))
    return "" if cv is None else " ±{:.1%}".format(cv)


def plot_throughput_vs_batch(records, colors, out_dir, name):
    """One line per (model, backend) and variant over batch size (config, precision, execution
    and processes: runs that differ in any of them are separate lines); models with one batch
    size are skipped."""
    records = [r for r in records if number(dig(r, "throughput", "value")) and r.get("batch_size")]
    groups = OrderedDict((m, runs) for m, runs in by_model(records).items()
                         if len({r["batch_size"] for r in runs}) > 1)
    if not groups:
        return None
    rows, columns = grid(len(groups))
    fig = new_figure(max(6.0, 4.6 * columns + 1.5), 3.8 * rows)
    for ax, (model, runs) in zip(axes_grid(fig, len(groups)), groups.items()):
        draw_lines(ax, runs, colors)
        ax.set_title(plain(model), fontsize=12, fontweight="bold")
        ax.set_xlabel("batch size (examples per step, log scale)")
        value_axis(ax, [dig(r, "throughput", "value") for r in runs],
                   "throughput ({})".format(plain(throughput_units(runs))))
    fig.suptitle("Training throughput against batch size", fontsize=13)
    return save(fig, out_dir, name)


def draw_lines(ax, runs, colors):
    lines = OrderedDict()
    for r in sorted(runs, key=lambda r: r["batch_size"]):
        lines.setdefault((r["backend"],) + variant(r), []).append(r)
    styles = ("-", "--", ":", "-.")
    variants = sorted({key[1:] for key in lines})
    names = variant_labels(variants)
    for (backend, *rest), points in sorted(lines.items()):
        style = styles[variants.index(tuple(rest)) % len(styles)]
        label = backend if len(variants) == 1 else "{} ({})".format(backend, names[tuple(rest)])
        ax.plot([p["batch_size"] for p in points], [dig(p, "throughput", "value") for p in points],
                style, marker="o", color=colors[backend], label=plain(label))
    batches = sorted({r["batch_size"] for r in runs})
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def has_memory(record):
    return any(memory_entry(record, c)[0] for c in CATEGORIES)


def memory_legend(fig):
    """Colours name the category; hatching names where the figure came from."""
    handles = [Patch(facecolor=CATEGORY_COLORS[c], label=c.replace("_", " ")) for c in CATEGORIES]
    handles += [Patch(facecolor="white", edgecolor="black", hatch=SOURCE_HATCH[s], label=s)
                for s in ("measured", "analytic", "derived")]
    handles.append(Line2D([], [], color="black", marker="D", linestyle="none",
                          label="measured peak"))
    fig.legend(handles=handles, loc="outside right upper", title="category / source")


def draw_stacks(ax, runs, labels, colors):
    """Stacked category bars, one per run, with the measured peak as a diamond."""
    tops = [max(sum(memory_entry(r, c)[0] or 0 for c in CATEGORIES),
                memory_entry(r, "peak")[0] or 0) for r in runs]
    scale, unit = byte_unit(max(tops) or 1)
    for x, r in enumerate(runs):
        bottom = 0.0
        for c in CATEGORIES:
            size, source = memory_entry(r, c)
            if not size:
                continue
            ax.bar(x, size / scale, 0.6, bottom=bottom, color=CATEGORY_COLORS[c],
                   hatch=SOURCE_HATCH.get(source, ""), edgecolor="black", linewidth=0.5)
            bottom += size / scale
        peak = memory_entry(r, "peak")[0]
        if peak:
            ax.plot(x, peak / scale, marker="D", color="black", markersize=7, linestyle="none")
        ax.annotate(fmt_bytes(tops[x]), (x, tops[x] / scale), xytext=(0, 5),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
    center_slots(ax, len(runs), 3)
    ax.margins(y=0.12)
    ax.set_xticks(range(len(runs)), labels)
    for tick, r in zip(ax.get_xticklabels(), runs):
        tick.set_color(colors.get(r["backend"], "black"))
    ax.set_ylabel("training memory ({})".format(unit))
    ax.grid(axis="y", alpha=0.3)


def plot_memory(records, colors, out_dir, name):
    """Where training memory goes, per model and backend (largest batch of each backend)."""
    records = [r for r in largest_batches(records) if has_memory(r)]
    if not records:
        return None
    groups = by_model(records)
    rows, columns = grid(len(groups))
    fig = new_figure(max(7.0, 4.2 * columns + 2.8), 4.2 * rows)
    for ax, (model, runs) in zip(axes_grid(fig, len(groups)), groups.items()):
        runs = sorted(runs, key=lambda r: (r["backend"],) + variant(r))
        multi = len({variant(r) for r in runs}) > 1
        names = variant_labels(variant(r) for r in runs)
        labels = ["{}{}\nb={}".format(plain(r["backend"]), "\n" + plain(names[variant(r)])
                                      if multi else "", r.get("batch_size")) for r in runs]
        draw_stacks(ax, runs, labels, colors)
        ax.set_title(plain(model), fontsize=12, fontweight="bold")
    memory_legend(fig)
    fig.suptitle("Training memory by category (largest batch size run per backend)", fontsize=13)
    return save(fig, out_dir, name)


def plot_memory_vs_batch(records, colors, out_dir, name):
    """The breakdown at each batch size, for every (model, backend) run at several."""
    series = OrderedDict()
    for r in sorted(records, key=lambda r: (str(r.get("model")), r["backend"]) + variant(r)):
        if has_memory(r) and r.get("batch_size"):
            series.setdefault((r.get("model"), r["backend"]) + variant(r), []).append(r)
    series = OrderedDict((k, v) for k, v in series.items() if len({r["batch_size"] for r in v}) > 1)
    if not series:
        return None
    rows, columns = grid(len(series))
    fig = new_figure(max(7.0, 4.2 * columns + 2.8), 3.9 * rows)
    names = variant_labels(key[2:] for key in series)
    for ax, (key, runs) in zip(axes_grid(fig, len(series)), series.items()):
        model, backend, kind = key[0], key[1], key[2:]
        runs = sorted(runs, key=lambda r: r["batch_size"])
        draw_stacks(ax, runs, [str(r["batch_size"]) for r in runs], colors)
        ax.set_xlabel("batch size (examples per step)")
        ax.set_title("{} on {} ({})".format(plain(model), plain(backend), plain(names[kind])),
                     fontsize=11, fontweight="bold", color=colors.get(backend, "black"))
    memory_legend(fig)
    fig.suptitle("Training memory by category against batch size", fontsize=13)
    return save(fig, out_dir, name)


def plot_utilization(records, colors, out_dir, name):
    """One panel per metric; a run without a metric has no bar there (not a zero bar)."""
    records = sorted(largest_batches(records), key=lambda r: (str(r.get("model")), r["backend"]))
    panels = []
    for title, keys in UTILIZATION_METRICS:
        points = [(r, number(dig(r, *keys))) for r in records]
        points = [(r, v) for r, v in points if v is not None]
        if points:
            panels.append((title, points))
    if not panels:
        return None
    rows = pack_rows(panels, UTILIZATION_ROW_SLOTS)
    widest = max(sum(panel_slots(p) for _, p in row) for row in rows)
    fig = new_figure(max(8.0, 0.8 * widest + 2.5), 4.1 * len(rows))
    for subfig, row in zip(fig.subfigures(len(rows), 1, squeeze=False).ravel(), rows):
        ratios = [panel_slots(p) for _, p in row]
        spare = widest - sum(ratios)  # an empty cell keeps bars as wide as in the fullest row
        axes = subfig.subplots(1, len(row) + bool(spare), squeeze=False,
                               width_ratios=ratios + [spare] * bool(spare)).ravel()
        if spare:
            axes[-1].remove()
        for ax, (title, points) in zip(axes, row):
            draw_percent_bars(ax, points, colors)
            ax.set_title(title, fontsize=10, fontweight="bold")
        axes[0].set_ylabel("percent (%)")
    backend_legend(fig.subfigs[0], colors, [r["backend"] for r in records])
    fig.suptitle("Utilisation (largest batch size run per backend; absent metrics omitted)",
                 fontsize=13)
    return save(fig, out_dir, name)


def panel_slots(points):
    """Room for a panel: one slot a bar, three at least so that its title fits."""
    return max(len(points), 3)


def pack_rows(panels, slots):
    """Panels in rows of at most ``slots`` bar slots, so that panels with one bar stay narrow."""
    rows, width = [[]], 0
    for panel in panels:
        need = panel_slots(panel[1])
        if rows[-1] and width + need > slots:
            rows.append([])
            width = 0
        rows[-1].append(panel)
        width += need
    return rows


def draw_percent_bars(ax, points, colors):
    for x, (r, value) in enumerate(points):
        ax.bar(x, 100 * value, 0.6, color=colors[r["backend"]])
        ax.annotate("{:.1f}%".format(100 * value), (x, 100 * value), xytext=(0, 2),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
    labels = ["{}\n{}\nb={}".format(plain(r.get("model")), plain(r["backend"]), r.get("batch_size"))
              for r, _ in points]
    ax.set_xticks(range(len(points)), labels, fontsize=8)
    center_slots(ax, len(points), 2)
    ax.set_ylim(0, 110)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: "{:.0f}".format(v)))
    ax.grid(axis="y", alpha=0.3)


def plot_scaling(records, colors, out_dir, name):
    """Speedup against world size, one line per (backend, per-replica batch, scaling,
    precision) of each model, with the ideal (speedup = world size) dashed; each point is
    labelled with its scaling efficiency."""
    records = [r for r in records if dig(r, "distributed") and number(dig(r, "throughput", "value"))]
    lines = OrderedDict()
    for r in sorted(records, key=world_size):
        d = r["distributed"]
        key = (r["model"], r["backend"], d.get("per_replica_batch"), d.get("scaling"),
               r.get("precision"))
        lines.setdefault(key, []).append(r)
    points = OrderedDict()
    for key, runs in lines.items():
        one = [dig(r, "throughput", "value") for r in runs if world_size(r) == 1]
        xy = []
        for r in runs:
            speedup = (dig(r, "throughput", "value") / one[-1] if one
                       else number(dig(r, "distributed", "speedup")))
            if speedup is not None:
                xy.append((world_size(r), speedup))
        if len(xy) > 1 or (xy and xy[-1][0] > 1):
            points[key] = xy
    if not points:
        return None
    models = list(OrderedDict.fromkeys(key[0] for key in points))
    rows, columns = grid(len(models))
    fig = new_figure(max(6.0, 4.6 * columns + 1.5), 3.8 * rows)
    for ax, model in zip(axes_grid(fig, len(models)), models):
        sizes = sorted({x for key, xy in points.items() if key[0] == model for x, _ in xy} | {1})
        ax.plot(sizes, sizes, "--", color="grey", label="ideal")
        for (m, backend, per_replica, scaling, precision), xy in points.items():
            if m != model:
                continue
            label = "{} b={}/replica {} {}".format(backend, per_replica, scaling, precision)
            ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", color=colors[backend],
                    label=plain(label))
            for x, y in xy:
                ax.annotate("{:.0%}".format(y / x), (x, y), xytext=(0, 4),
                            textcoords="offset points", ha="center", fontsize=8)
        ax.set_title(plain(model), fontsize=12, fontweight="bold")
        ax.set_xlabel("processes (world size)")
        ax.set_ylabel("speedup over one process")
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Data-parallel scaling (labels: efficiency = speedup / processes)", fontsize=13)
    return save(fig, out_dir, name)


def is_asynchronous(record):
    """An asynchronous A3C run (docs/a3c.md): its figures are per number of learners, not per
    batch, so it has a figure of its own and stays out of the others."""
    return isinstance(record.get("asynchronous"), dict)


def plot_asynchronous(records, colors, out_dir, name):
    """Frames/s and mean CPU utilisation per learner against the number of learners, one line
    per (backend, config, device)."""
    records = [r for r in records if is_asynchronous(r) and
               number(dig(r, "asynchronous", "frames_per_second"))]
    if not records:
        return None
    lines = OrderedDict()
    for r in sorted(records, key=lambda r: dig(r, "asynchronous", "learners")):
        lines.setdefault((r["backend"], r.get("config"), r.get("device")), []).append(r)
    fig = new_figure(11.0, 4.0)
    axes = fig.subplots(1, 2)
    for (backend, config, device), points in sorted(lines.items(), key=lambda i: str(i[0])):
        learners = [dig(p, "asynchronous", "learners") for p in points]
        label = plain("{} ({}, {})".format(backend, config, device))
        for ax, key in zip(axes, ("frames_per_second", "mean_cpu_utilisation")):
            ax.plot(learners, [dig(p, "asynchronous", key) for p in points], "-", marker="o",
                    color=colors[backend], label=label)
    ticks = sorted({dig(r, "asynchronous", "learners") for r in records})
    for ax, ylabel in zip(axes, ("frames/s (skipped frames counted)",
                                 "CPU utilisation per learner (1 = one core)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("actor-learners")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Asynchronous A3C against the number of actor-learners", fontsize=13)
    return save(fig, out_dir, name)


FIGURES = (
    ("throughput.png", plot_throughput, "Throughput per model and backend",
     "Training throughput in each model's own unit; over each bar its value, batch size and "
     "device."),
    ("throughput_vs_batch.png", plot_throughput_vs_batch, "Throughput against batch size",
     "Every successful run; models run at a single batch size are left out."),
    ("memory.png", plot_memory, "Where training memory goes",
     "Stacked categories; plain = measured, hatched = analytic (from the spec), dotted = derived "
     "(measured peak minus the attributed categories); the diamond is the measured peak."),
    ("memory_vs_batch.png", plot_memory_vs_batch, "Memory breakdown against batch size",
     "The same categories at every batch size a backend ran."),
    ("utilization.png", plot_utilization, "Utilisation",
     "CPU process utilisation, NVML GPU utilisation, GPM SM and tensor activity and FLOP "
     "utilisation; a metric a run did not measure is omitted, not drawn as 0."),
    ("scaling.png", plot_scaling, "Data-parallel scaling",
     "Speedup of data-parallel runs over one process against the number of processes, from "
     "records with world size > 1 (docs/distributed.md); the dashed line is ideal scaling."),
    ("asynchronous.png", plot_asynchronous, "Asynchronous A3C against its learners",
     "Frames per second (skipped frames counted) and each learner's CPU utilisation (its CPU "
     "seconds over its wall seconds, the mean over learners) for every number of actor-learners "
     "a backend ran (docs/a3c.md)."),
)


def draw_all(records, out_dir):
    """Every figure the records allow, as [(file name, title, caption)]. A figure of an earlier
    report in out_dir that this one cannot draw is removed, so no stale plot lies beside it."""
    colors = backend_colors({r["backend"] for r in records})
    synchronous = [r for r in records if not is_asynchronous(r)]
    drawn = []
    for name, draw, title, caption in FIGURES:
        chosen = records if draw is plot_asynchronous else synchronous
        if chosen and draw(chosen, colors, out_dir, name):
            drawn.append((name, title, caption))
        elif os.path.exists(os.path.join(out_dir, name)):
            os.remove(os.path.join(out_dir, name))
    return drawn
