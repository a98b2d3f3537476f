"""Turn run records (docs/records.md) into a static report: index.html, report.md and PNG plots.

The page opens from the file system with no network: images are files next to it, styles are
inline. Tables are built once as plain text cells and then written both as HTML (jinja2,
autoescaped) and Markdown, so the two versions cannot disagree. Usage::

    tbd report results.jsonl -o report/
    python -m tbdzoo.profiling.report results.jsonl -o report/
"""
import argparse
import html
import json
import os
import re
import sys
from collections import OrderedDict
from datetime import UTC, datetime

import jinja2

from ..errors import TbdError
from . import plots
from .plots import CATEGORIES, dig, fmt_bytes, memory_entry, number

SCHEMA_NAME = "tbdzoo.run"
KNOWN_MAJORS = (1,)
REQUIRED_KEYS = ("model", "backend", "status")
DASH = "—"


class ReportInputError(TbdError, ValueError):
    """A results file or record the report cannot read; the message names file and line."""


class Entry:
    """One record with where it came from, so every error and note can point at its line."""

    def __init__(self, record, source, origin, order):
        self.record, self.source, self.origin, self.order = record, source, origin, order

    def key(self):
        r = self.record
        return (r.get("model"), r.get("backend"), r.get("config"), r.get("batch_size"),
                r.get("precision"), r.get("execution") or "default",
                (r.get("distributed") or {}).get("world_size", 1),
                (r.get("asynchronous") or {}).get("learners"))


# ---------------------------------------------------------------- reading

def check_schema(record, where):
    """Refuse what this reader cannot interpret rather than report it wrongly."""
    schema = record.get("schema")
    expected = "{}/{}".format(SCHEMA_NAME, KNOWN_MAJORS[-1])
    if schema is None:
        raise ReportInputError("{}: the record has no 'schema' key (expected {!r}); it is not a "
                               "tbdzoo run record".format(where, expected))
    match = re.fullmatch(re.escape(SCHEMA_NAME) + r"/(\d+)(?:\.\d+)*", str(schema))
    if not match:
        raise ReportInputError("{}: unknown record schema {!r} (expected {!r})"
                               .format(where, schema, expected))
    if int(match.group(1)) not in KNOWN_MAJORS:
        raise ReportInputError("{}: record schema {!r} has major version {}, which this reader "
                               "does not know (it reads {}); upgrade tbdzoo to report it"
                               .format(where, schema, match.group(1), expected))
    missing = [k for k in REQUIRED_KEYS if not isinstance(record.get(k), str)]
    if missing:
        raise ReportInputError("{}: the record lacks {}".format(where, ", ".join(missing)))


def parse_line(text, where):
    try:
        record = json.loads(text)
    except ValueError as e:
        raise ReportInputError("{} is not JSON ({}); a results file must be JSON Lines: one JSON "
                               "object per line".format(where, e)) from None
    if not isinstance(record, dict):
        raise ReportInputError("{} holds a JSON {}, not an object; a results file must be JSON "
                               "Lines: one record object per line"
                               .format(where, type(record).__name__))
    check_schema(record, where)
    return record


def read_jsonl(path):
    """Records of one JSONL file, blank lines skipped, as (record, path, 'path line N')."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except UnicodeDecodeError:
        raise ReportInputError("{} is not a text file; a results file must be JSON Lines"
                               .format(path)) from None
    except OSError as e:
        raise ReportInputError("cannot read results file {}: {}".format(path, e.strerror)) from None
    found = []
    for number_, text in enumerate(lines, 1):
        if text.strip():
            where = "{} line {}".format(path, number_)
            found.append((parse_line(text, where), path, where))
    if not found:
        raise ReportInputError("{} holds no records".format(path))
    return found


def load(records_or_paths):
    """Entries from paths, records, or a mix, in input order (the order breaks timestamp ties)."""
    if isinstance(records_or_paths, (str, os.PathLike, dict)):
        records_or_paths = [records_or_paths]
    found = []
    for i, item in enumerate(records_or_paths):
        if isinstance(item, dict):
            where = "record #{}".format(i + 1)
            check_schema(item, where)
            found.append((item, "records given in Python", where))
        else:
            found.extend(read_jsonl(os.fspath(item)))
    if not found:
        raise ReportInputError("no records given")
    return [Entry(record, source, where, order)
            for order, (record, source, where) in enumerate(found)]


def timestamp(record):
    """The finish time as an aware datetime, or None when absent or unreadable."""
    try:
        when = datetime.fromisoformat(str(record["timestamp"]))
    except (KeyError, ValueError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def newest(entries):
    """By timestamp when every candidate has one, else by input order."""
    stamps = [timestamp(e.record) for e in entries]
    if all(stamps):
        return max(zip(stamps, entries), key=lambda p: (p[0], p[1].order))[1]
    return max(entries, key=lambda e: e.order)


def select(entries):
    """One record per (model, backend, config, batch, precision), the newest; and notes on the
    superseded ones, so a reader knows a rerun replaced a result."""
    groups = OrderedDict()
    for e in entries:
        groups.setdefault(e.key(), []).append(e)
    chosen, notes = [], []
    for key, group in groups.items():
        kept = newest(group)
        chosen.append(kept)
        if len(group) > 1:
            older = [e for e in group if e is not kept]
            notes.append("{}: used {} ({}); superseded {}".format(
                describe(key), kept.origin, kept.record.get("timestamp") or "no timestamp",
                "; ".join("{} ({})".format(e.origin, e.record.get("timestamp") or "no timestamp")
                          for e in older)))
    return sorted(chosen, key=sort_key), notes


def describe(key):
    model, backend, config, batch, precision, execution, processes, learners = key
    return "{} on {}, config {}, batch {}, {}, {} execution{}{}".format(
        model, backend, config, batch, precision, execution,
        ", {} processes".format(processes) if processes != 1 else "",
        ", {} asynchronous learners".format(learners) if learners is not None else "")


def sort_key(entry):
    r = entry.record
    return (str(r.get("model")), str(r.get("backend")), str(r.get("config")),
            str(r.get("precision")), str(r.get("execution") or "default"),
            plots.world_size(r), r.get("batch_size") or 0,
            (r.get("asynchronous") or {}).get("learners") or 0)


# ---------------------------------------------------------------- formatting

def fmt_number(value):
    """Thousands separators for big numbers, three significant digits for small ones."""
    if abs(value) >= 1000:
        return "{:,.0f}".format(value)
    if abs(value) >= 100:
        return "{:.1f}".format(value)
    if abs(value) >= 1:
        return "{:.2f}".format(value)
    return "{:.3g}".format(value)


def fmt_percent(fraction):
    return DASH if fraction is None else "{:.1f}%".format(100 * fraction)


def fmt_ms(seconds):
    return DASH if seconds is None else "{:.1f} ms".format(1000 * seconds)


def fmt_flops(per_s):
    if per_s is None:
        return DASH
    for scale, unit in ((1e15, "PFLOP/s"), (1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s"),
                        (1e3, "kFLOP/s")):
        if per_s >= scale:
            return "{:.2f} {}".format(per_s / scale, unit)
    return "{:.0f} FLOP/s".format(per_s)


def fmt_seconds(seconds):
    return DASH if seconds is None else "{:.2f} s".format(seconds)


def text(value):
    return DASH if value is None else str(value)


# ---------------------------------------------------------------- tables

class Table:
    """Headers and rows of plain strings; renderers escape, so cells never carry markup."""

    def __init__(self, headers, rows, numeric=()):
        self.headers, self.rows, self.numeric = headers, rows, set(numeric)

    def align(self, column):
        return "right" if self.headers[column] in self.numeric else "left"


def throughput_cell(r):
    value = number(dig(r, "throughput", "value"))
    if value is None:
        return DASH
    return "{} {}".format(fmt_number(value), dig(r, "throughput", "unit") or "items/s")


def step_range(r):
    low, high = number(dig(r, "step_time", "min")), number(dig(r, "step_time", "max"))
    if low is None or high is None:
        return DASH
    return "{:.1f}–{:.1f} ms".format(1000 * low, 1000 * high)


def batch_cell(r):
    """The batch, and for a data-parallel run its split over the processes: '64 (2 x 32)'."""
    d = r.get("distributed")
    if not isinstance(d, dict) or plots.world_size(r) == 1:
        return text(r.get("batch_size"))
    return "{} ({} x {})".format(text(r.get("batch_size")), plots.world_size(r),
                                 text(d.get("per_replica_batch")))


def results_table(records):
    headers = ["Model", "Backend", "Config", "Batch", "Precision", "Execution", "Device",
               "Throughput", "Step time (median)", "Step min–max", "Step cv", "First step",
               "FLOP/s achieved", "FLOP utilisation", "Peak memory"]
    rows = [[text(r.get("model")), text(r.get("backend")), text(r.get("config")),
             batch_cell(r), text(r.get("precision")), text(r.get("execution") or "default"),
             text(r.get("device")),
             throughput_cell(r), fmt_ms(number(dig(r, "step_time", "median"))), step_range(r),
             fmt_percent(number(dig(r, "step_time", "cv"))),
             fmt_seconds(number(r.get("first_step_s"))),
             fmt_flops(number(dig(r, "flops", "achieved_per_s"))),
             fmt_percent(number(dig(r, "flops", "utilization"))),
             fmt_bytes(memory_entry(r, "peak")[0])] for r in records]
    return Table(headers, rows, numeric=headers[3:4] + headers[7:])


# A step time whose coefficient of variation over repeats passes this is listed under the
# results: the median of such a run moved with the machine's load or with too short repeats.
UNSTEADY_CV = 0.10
UNSTEADY_NOTE = ("Runs whose step time varied by more than 10% (cv) over their repeats: the "
                 "machine was busy or the repeats were short; rerun with more --repeats or a "
                 "longer --min-repeat-seconds before quoting them.")


def unsteady_runs(records):
    """One line per run whose step time's cv passes UNSTEADY_CV."""
    lines = []
    for r in records:
        cv = number(dig(r, "step_time", "cv"))
        if cv is not None and cv > UNSTEADY_CV:
            lines.append("{} on {}, batch {}: cv {} over {} repeats (step {})".format(
                r.get("model"), r.get("backend"), batch_cell(r), fmt_percent(cv),
                text(dig(r, "step_time", "n")), step_range(r)))
    return lines


DATA_NOTE = ("Runs with --data trained the same model again, each step on the next batch of "
             "the backend's own input pipeline reading real images (docs/pipelines.md). "
             "\u201cInput wait\u201d is the share of step time spent waiting for that batch; "
             "a run is input-bound when it passes 10%, and then the pipeline, not the model, "
             "sets the pace. CPU counts the whole process tree (loader workers included).")


def fmt_cores(value):
    return DASH if value is None else "{:.2f}".format(value)


def data_table(records):
    """Synthetic and data-fed throughput side by side, with what shows an input bottleneck."""
    headers = ["Model", "Backend", "Config", "Batch", "Pipeline", "Workers", "Augment",
               "Synthetic", "Data-fed", "Data-fed / synthetic", "Input wait",
               "CPU cores busy (synthetic)", "CPU cores busy (data-fed)", "Bound by"]
    rows = []
    for r in records:
        d = r.get("data")
        if not isinstance(d, dict) or "throughput" not in d:
            continue
        ratio = number(d.get("vs_synthetic"))
        rows.append([text(r.get("model")), text(r.get("backend")), text(r.get("config")),
                     text(r.get("batch_size")), text(d.get("pipeline")), text(d.get("workers")),
                     "yes" if d.get("augment") else "no", throughput_cell(r), throughput_cell(d),
                     DASH if ratio is None else "{:.2f}x".format(ratio),
                     fmt_percent(number(d.get("input_wait_fraction"))),
                     fmt_cores(number(dig(r, "cpu", "process_cores_busy"))),
                     fmt_cores(number(dig(d, "cpu", "process_tree_cores_busy"))),
                     "input pipeline" if d.get("input_bound") else "model"])
    return Table(headers, rows, numeric=[headers[3], headers[5]] + headers[7:13])


def memory_cell(size, total, source):
    if size is None:
        return DASH
    share = "{:.1f}%".format(100 * size / total) if total else DASH
    return "{} ({}, {})".format(fmt_bytes(size), share, source)


def memory_row(r):
    entries = [memory_entry(r, c) for c in CATEGORIES]
    total = sum(size for size, _ in entries if size)
    cells = [memory_cell(size, total, source) for size, source in entries]
    return ([text(r.get("model")), text(r.get("backend")), text(r.get("config")),
             text(r.get("batch_size"))] + cells
            + [fmt_bytes(total) if total else DASH, fmt_bytes(memory_entry(r, "peak")[0])])


def memory_table(records):
    headers = (["Model", "Backend", "Config", "Batch"] + [c.replace("_", " ") for c in CATEGORIES]
               + ["Sum", "Measured peak"])
    rows = [memory_row(r) for r in records if plots.has_memory(r)]
    return Table(headers, rows, numeric=headers[3:])


NETWORK_CATEGORIES = ("weights", "gradients", "optimizer_state", "feature_maps")


def network_memory_table(records):
    """One row per network of a run that trains several (a GAN's generator and critic): its
    parameters' weights, gradients and optimizer state, and what its own update keeps."""
    headers = (["Model", "Backend", "Config", "Batch", "Network"]
               + [c.replace("_", " ") for c in NETWORK_CATEGORIES])
    rows = []
    for r in records:
        for network, categories in (r.get("memory_by_network") or {}).items():
            cells = []
            for c in NETWORK_CATEGORIES:
                entry = categories.get(c) or {}
                size = number(entry.get("bytes"))
                cells.append(DASH if size is None else "{} ({})".format(fmt_bytes(size), entry.get("source")))
            rows.append([text(r.get("model")), text(r.get("backend")), text(r.get("config")),
                         text(r.get("batch_size")), text(network)] + cells)
    return Table(headers, rows, numeric=[headers[3]] + headers[5:])


def memory_findings(records):
    """One sentence per run: its largest memory category and that category's share, which is
    how TBD's finding (feature maps dominate training memory) shows up in the data."""
    lines = []
    for r in records:
        if not plots.has_memory(r):
            continue
        sizes = [(memory_entry(r, c)[0] or 0, c) for c in CATEGORIES]
        total = sum(size for size, _ in sizes)
        if not total:
            continue
        size, category = max(sizes)
        lines.append("{} on {} (batch {}, {}): {} is the largest category, {:.0%} of {} ({})".format(
            r.get("model"), r.get("backend"), r.get("batch_size"), r.get("precision"),
            category.replace("_", " "), size / total, fmt_bytes(total), memory_entry(r, category)[1]))
    return lines


def failures_table(records):
    headers = ["Model", "Backend", "Config", "Batch", "Precision", "Status", "Message", "Finished"]
    rows = [[text(r.get("model")), text(r.get("backend")), text(r.get("config")),
             text(r.get("batch_size")), text(r.get("precision")), text(r.get("status")),
             text(r.get("error") or "(no message)"), text(r.get("timestamp"))] for r in records]
    return Table(headers, rows)


def asynchronous_table(records):
    """Asynchronous A3C runs (docs/a3c.md): throughput in frames and updates per second and
    each learner's CPU utilisation, the figure where the learners' count tells its story."""
    headers = ["Backend", "Config", "Device", "Environment", "Learners", "Execution",
               "Frames/s", "Updates/s", "Frames per CPU second", "CPU per learner (mean)",
               "CPU per learner (min–max)", "Frames", "Seconds"]
    rows = []
    for r in records:
        a = r["asynchronous"]
        cpu = [c for c in (number(c) for c in a.get("cpu_utilisation_per_learner") or [])
               if c is not None]
        rows.append([text(r.get("backend")), text(r.get("config")), text(r.get("device")),
                     text(a.get("env")), text(a.get("learners")), text(a.get("execution")),
                     fmt_number(number(a.get("frames_per_second"))),
                     fmt_number(number(a.get("updates_per_second"))),
                     fmt_number(number(a.get("frames_per_cpu_second"))),
                     "{:.2f}".format(sum(cpu) / len(cpu)) if cpu else DASH,
                     "{:.2f}–{:.2f}".format(min(cpu), max(cpu)) if cpu else DASH,
                     text(a.get("frames")), fmt_seconds(number(a.get("seconds")))])
    return Table(headers, rows, numeric=headers[4:5] + headers[6:])


ASYNC_NOTE = ("Asynchronous A3C (docs/a3c.md): every learner steps its own environment and "
              "updates the shared parameters without locks. Frames count skipped frames (4 per "
              "agent step on Atari); a learner's CPU utilisation is its CPU seconds (its process, "
              "or its thread, plus its worker process on CNTK) over its wall seconds, so 1.00 is "
              "one core kept busy.")


def protocol_line(r):
    """How the figures were measured, in one sentence (docs/profiling.md)."""
    a = r.get("asynchronous")
    if isinstance(a, dict):
        return ("{} on {}, config {}, {} on {}: {} asynchronous learner(s) ({}) for {} frames "
                "over {}".format(r.get("model"), r.get("backend"), r.get("config"), a.get("env"),
                                 r.get("device"), a.get("learners"), a.get("execution"),
                                 text(a.get("frames")), fmt_seconds(number(a.get("seconds")))))
    p = r.get("protocol") or {}
    return ("{} on {}, config {}, batch {}, {} on {}: {} warm-up step(s) excluded, then {} timed "
            "step(s) x {} repeat(s); step time is the median of {} repeats; first step {}, build {}"
            .format(r.get("model"), r.get("backend"), r.get("config"), r.get("batch_size"),
                    r.get("precision"), r.get("device"), text(p.get("warmup")),
                    text(p.get("steps")), text(p.get("repeats")),
                    text(dig(r, "step_time", "n")), fmt_seconds(number(r.get("first_step_s"))),
                    fmt_seconds(number(r.get("build_s")))))


def provenance(entries):
    """Per record: the protocol line, then env, command and origin as (key, value) pairs."""
    items = []
    for e in entries:
        r = e.record
        env = r.get("env") if isinstance(r.get("env"), dict) else {}
        pairs = [(str(k), text(v)) for k, v in env.items()]
        pairs += [("command", text(r.get("command"))), ("finished", text(r.get("timestamp"))),
                  ("record", e.origin)]
        items.append((protocol_line(r), pairs))
    return items


# ---------------------------------------------------------------- rendering

def build_context(entries, sources):
    """Everything both renderers show, computed once."""
    chosen, notes = select(entries)
    ok = [e for e in chosen if e.record.get("status") == "ok"]
    failed = [e for e in chosen if e.record.get("status") != "ok"]
    asynchronous = [e.record for e in ok if plots.is_asynchronous(e.record)]
    synchronous = [e for e in ok if not plots.is_asynchronous(e.record)]
    return {
        "asynchronous": asynchronous_table(asynchronous), "async_note": ASYNC_NOTE,
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "sources": sources, "read": len(entries), "ok": ok, "failed": failed, "notes": notes,
        "results": results_table([e.record for e in synchronous]),
        "unsteady": unsteady_runs([e.record for e in synchronous]),
        "unsteady_note": UNSTEADY_NOTE,
        "data": data_table([e.record for e in synchronous]),
        "memory": memory_table([e.record for e in synchronous]),
        "memory_findings": memory_findings([e.record for e in synchronous]),
        "network_memory": network_memory_table([e.record for e in synchronous]),
        "failures": failures_table([e.record for e in failed]),
        "provenance": provenance(ok),
    }


def md_escape(value):
    """Markdown cells: backslash-escape markup, entity-escape HTML (renderers pass raw HTML)."""
    value = re.sub(r"([\\`*_\[\]|#!{}])", r"\\\1", str(value))
    return html.escape(" ".join(value.splitlines()), quote=False)


def md_table(table):
    if not table.rows:
        return "_none_\n"
    lines = ["| " + " | ".join(md_escape(h) for h in table.headers) + " |",
             "|" + "|".join("---:" if table.align(i) == "right" else "---"
                            for i in range(len(table.headers))) + "|"]
    lines += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines) + "\n"


MEMORY_LEGEND = ("Each category: size (share of the sum of categories, source). measured = read "
                 "from the framework; analytic = computed from the spec; derived = from measured "
                 "resident memory: framework runtime (CPU only) is what stays resident between "
                 "steps beyond the model's tensors (libraries, thread pools, caches), workspace "
                 "is the measured peak minus every other category, never below 0. Weights are "
                 "the whole model state, BatchNorm running statistics included.")
NETWORK_NOTE = ("Runs that train several networks (a GAN's generator and critic), each by its "
                "own updates: its parameters' weights, gradients and optimizer state, and the "
                "feature maps its own update keeps (the networks' updates run one after another, "
                "so the run's feature maps are the larger of these).")
READING_NOTE = ("Protocol (docs/profiling.md): warm-up steps are excluded (compilation and "
                "autotuning happen there, the first step is reported apart); then timed steps "
                "with the device synchronised, repeated; step time is the median over repeats "
                "with its min–max and coefficient of variation (cv). FLOPs are counted from the "
                "spec (a training step is 3x forward); FLOP utilisation is achieved over the "
                "device's peak.")


def render_markdown(ctx, figures):
    out = ["# tbdzoo training report", "",
           "Generated {} from {}. {} record(s) read: {} successful run(s) shown, {} failed."
           .format(ctx["generated"], md_escape(", ".join(ctx["sources"])), ctx["read"],
                   len(ctx["ok"]), len(ctx["failed"])), "", md_escape(READING_NOTE), ""]
    if ctx["notes"]:
        out += ["{} run(s) had older records with the same (model, backend, config, batch, "
                "precision); the newest was used:".format(len(ctx["notes"])), ""]
        out += ["- " + md_escape(n) for n in ctx["notes"]] + [""]
    out += ["## Results", "", md_table(ctx["results"])]
    if ctx["unsteady"]:
        out += [md_escape(UNSTEADY_NOTE), ""] + ["- " + md_escape(l) for l in ctx["unsteady"]]
        out += [""]
    if ctx["data"].rows:
        out += ["## Data-fed training", "", md_escape(DATA_NOTE), "", md_table(ctx["data"])]
    if ctx["asynchronous"].rows:
        out += ["## Asynchronous A3C", "", md_escape(ctx["async_note"]), "",
                md_table(ctx["asynchronous"])]
    for name, title, caption in figures:
        out += ["## {}".format(title), "", "![{}]({})".format(title, name), "", caption, ""]
    out += ["## Memory", "", md_escape(MEMORY_LEGEND), ""]
    out += ["- " + md_escape(line) for line in ctx["memory_findings"]] + [""]
    out += [md_table(ctx["memory"])]
    if ctx["network_memory"].rows:
        out += ["### Memory by network", "", md_escape(NETWORK_NOTE), "", md_table(ctx["network_memory"])]
    out += ["## Failures", "", md_table(ctx["failures"]), "## Protocol and environment", ""]
    for line, pairs in ctx["provenance"]:
        out.append("- " + md_escape(line))
        out += ["  - {}: {}".format(md_escape(k), md_escape(v)) for k, v in pairs]
    return "\n".join(out) + "\n"


HTML_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tbdzoo training report</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 1400px; padding: 0 1rem; color: #222; line-height: 1.45; }
h1 { margin-bottom: 0.2rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; }
.meta, .note { color: #555; font-size: 0.92rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.88rem; margin: 0.6rem 0; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.5rem; vertical-align: top; }
th { background: #f3f3f3; text-align: left; }
td.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
table.wrap td.num { white-space: normal; min-width: 6.5rem; }
td.msg { font-family: ui-monospace, monospace; font-size: 0.8rem; white-space: pre-wrap;
         max-width: 48rem; }
figure { margin: 1rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 0.9rem; }
details { margin: 0.3rem 0; } summary { cursor: pointer; }
details dl { display: grid; grid-template-columns: max-content auto; gap: 0.1rem 1rem;
             font-size: 0.85rem; margin: 0.3rem 0 0.6rem 1.2rem; }
dt { font-weight: 600; } dd { margin: 0; font-family: ui-monospace, monospace; }
</style>
</head>
<body>
<h1>tbdzoo training report</h1>
<p class="meta">Generated {{ generated }} from {{ sources | join(", ") }}.
{{ read }} record(s) read: {{ ok | length }} successful run(s) shown,
{{ failed | length }} failed.</p>
<p class="note">{{ reading_note }}</p>
{% if notes %}
<p class="note">{{ notes | length }} run(s) had older records with the same (model, backend,
config, batch, precision); the newest was used:</p>
<ul class="note">{% for n in notes %}<li>{{ n }}</li>{% endfor %}</ul>
{% endif %}
<h2 id="results">Results</h2>
{{ table(results) }}
{% if unsteady %}<p class="note">{{ unsteady_note }}</p>
<ul>{% for line in unsteady %}<li>{{ line }}</li>{% endfor %}</ul>{% endif %}
{% if data.rows %}
<h2 id="data-fed">Data-fed training</h2>
<p class="note">{{ data_note }}</p>
{{ table(data, kind="wrap") }}
{% endif %}
{% if asynchronous.rows %}
<h2 id="asynchronous">Asynchronous A3C</h2>
<p class="note">{{ async_note }}</p>
{{ table(asynchronous) }}
{% endif %}
{% for name, title, caption in figures %}
<h2>{{ title }}</h2>
<figure><img src="{{ name }}" alt="{{ title }}"><figcaption>{{ caption }}</figcaption></figure>
{% else %}
<p class="note">No successful runs to plot.</p>
{% endfor %}
<h2 id="memory">Memory</h2>
<p class="note">{{ memory_legend }}</p>
<ul>{% for line in memory_findings %}<li>{{ line }}</li>{% endfor %}</ul>
{{ table(memory, kind="wrap") }}
{% if network_memory.rows %}
<h3 id="memory-by-network">Memory by network</h3>
<p class="note">{{ network_note }}</p>
{{ table(network_memory, kind="wrap") }}
{% endif %}
<h2 id="failures">Failures</h2>
{{ table(failures, message_class="msg") }}
<h2 id="provenance">Protocol and environment</h2>
{% for line, pairs in provenance %}
<details><summary>{{ line }}</summary>
<dl>{% for k, v in pairs %}<dt>{{ k }}</dt><dd>{{ v }}</dd>{% endfor %}</dl>
</details>
{% endfor %}
</body>
</html>
"""

TABLE_MACRO = """{% macro table(t, message_class="", kind="") -%}
{% if t.rows %}<div class="scroll"><table{% if kind %} class="{{ kind }}"{% endif %}>
<thead><tr>{% for h in t.headers %}<th>{{ h }}</th>{% endfor %}</tr></thead>
<tbody>{% for row in t.rows %}
<tr>{% for cell in row %}<td{% if t.align(loop.index0) == "right" %} class="num"
  {%- elif message_class and t.headers[loop.index0] == "Message" %} class="{{ message_class }}"
  {%- endif -%}
  >{{ cell }}</td>{% endfor %}</tr>
{%- endfor %}</tbody>
</table></div>{% else %}<p class="note">None.</p>{% endif %}
{%- endmacro %}
"""


def render_html(ctx, figures):
    """Autoescaping is on for the whole page: every record value is user input."""
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    template = env.from_string(TABLE_MACRO + HTML_TEMPLATE)
    return template.render(figures=figures, reading_note=READING_NOTE,
                           memory_legend=MEMORY_LEGEND, network_note=NETWORK_NOTE,
                           data_note=DATA_NOTE, **ctx)


def write_report(records_or_paths, out_dir):
    """Write index.html, report.md and the PNG figures into out_dir; return index.html's path."""
    entries = load(records_or_paths)
    sources = list(OrderedDict.fromkeys(e.source for e in entries))
    ctx = build_context(entries, sources)
    os.makedirs(out_dir, exist_ok=True)
    figures = plots.draw_all([e.record for e in ctx["ok"]], out_dir)
    with open(os.path.join(out_dir, "report.md"), "w", encoding="utf-8") as f:
        f.write(render_markdown(ctx, figures))
    index = os.path.join(out_dir, "index.html")
    with open(index, "w", encoding="utf-8") as f:
        f.write(render_html(ctx, figures))
    return index


def parser():
    p = argparse.ArgumentParser(prog="tbd report", description="Write an HTML and Markdown "
                                "report with plots from JSONL run records.")
    p.add_argument("results", nargs="+", help="JSONL files of run records")
    p.add_argument("-o", "--output", default="report", help="output directory (default: report)")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        index = write_report(args.results, args.output)
    except TbdError as e:
        print("tbd report: error: {}".format(e), file=sys.stderr)
        return 2
    print("report written to {}".format(index))
    return 0


if __name__ == "__main__":
    sys.exit(main())
