"""The report generator: files, numbers in the tables, escaping, input errors, and a real
browser loading every image of the page."""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from conftest import IN_CI
from tbdzoo.profiling.report import ReportInputError, write_report

CHROMIUM = "/usr/bin/chromium"
GiB, MiB = 2 ** 30, 2 ** 20
HOSTILE = "<img src=x onerror=alert(1)> & | *bold*"


def memory(weights, feature_maps, peak=None, fm_source="analytic", workspace=None, runtime=None):
    """A memory object as a run writes it: gradients equal weights, momentum SGD one slot;
    ``runtime``: the framework's own resident memory, which a CPU run derives."""
    def entry(size, source):
        return {"bytes": size, "source": source}
    categories = {"weights": entry(weights, "analytic"), "gradients": entry(weights, "analytic"),
                  "optimizer_state": entry(weights, "analytic"),
                  "feature_maps": entry(feature_maps, fm_source),
                  "input_batch": entry(feature_maps // 50, "analytic")}
    if runtime is not None:
        categories["framework_runtime"] = entry(runtime, "derived")
    if peak is not None:
        attributed = sum(c["bytes"] for c in categories.values())
        categories["workspace"] = entry(workspace if workspace is not None
                                        else max(0, peak - attributed), "derived")
        categories["peak"] = entry(peak, "measured")
    else:
        categories["peak"] = None
    return categories


UNITS = {"resnet50": ("images/s", 1, 4.1e9), "transformer": ("tokens/s", 256, 256 * 1.3e8)}


def record(model, backend, batch, value, timestamp="2026-01-10T12:00:00+00:00", gpu=False,
           status="ok", error=None, config="paper", mem=None, flops_util=None):
    """A realistic tbdzoo.run/1 record; values are chosen so formatted numbers are unambiguous.
    The step time follows from the throughput: items per step / items per second."""
    unit, items_per_example, forward = UNITS[model]
    r = {"schema": "tbdzoo.run/1", "model": model, "backend": backend, "config": config,
         "status": status, "error": error, "batch_size": batch, "precision": "fp32",
         "device": "cuda:0" if gpu else "cpu", "timestamp": timestamp,
         "command": "tbd run {} --backend {} --batch-size {}".format(model, backend, batch),
         "env": {"tbdzoo": "0.3.0", "framework": backend, "framework_version": "1.0",
                 "python": "3.11.2", "hostname": HOSTILE,
                 "gpu_name": "NVIDIA H200" if gpu else None}}
    if status != "ok":
        return r
    step = batch * items_per_example / value
    r.update({
        "throughput": {"value": value, "unit": unit, "items_per_step": batch * items_per_example},
        "step_time": {"median": step, "min": step * 0.98, "max": step * 1.05, "cv": 0.0213, "n": 3},
        "first_step_s": 4.321, "build_s": 1.5, "protocol": {"warmup": 2, "steps": 10, "repeats": 3},
        "cpu": {"cores": 16, "process_cores_busy": 1.6, "process_utilization": 0.1,
                "system_per_core": [0.1] * 16, "source": "measured"},
        "gpu": None, "memory": mem or memory(100 * MiB, batch * 3 * MiB),
        "flops": {"forward_per_example": forward, "per_step": 3 * forward * batch,
                  "achieved_per_s": 3 * forward * batch / step, "peak_per_s": None,
                  "utilization": flops_util, "source": "analytic"},
    })
    if gpu:
        r["gpu"] = {"name": "NVIDIA H200", "index": 0,
                    "utilization": {"median": 0.97, "mean": 0.95},
                    "memory_used_bytes": 30 * GiB, "power_w": {"median": 420.0, "max": 610.0},
                    "energy_j_per_step": 40.0, "samples": 120,
                    "gpm": {"sm_activity": 0.81, "sm_occupancy": 0.4, "tensor_activity": 0.22}}
        r["flops"]["peak_per_s"] = 494.7e12
    return r


def gpu_memory(batch):
    """Measured feature maps and peak; the peak leaves 512 MiB of workspace."""
    attributed = 3 * 100 * MiB + batch * 40 * MiB + batch * 40 * MiB // 50
    return memory(100 * MiB, batch * 40 * MiB, peak=attributed + 512 * MiB, fm_source="measured")


@pytest.fixture(scope="module")
def records():
    """Two models, four backends, a torch and a tensorflow sweep, a rerun, an oom and an error."""
    return [
        record("resnet50", "torch", 64, 1800.4, gpu=True, mem=gpu_memory(64), flops_util=0.045),
        record("resnet50", "torch", 128, 2600.4, gpu=True, mem=gpu_memory(128), flops_util=0.065),
        record("resnet50", "torch", 256, 2999.4, gpu=True, mem=gpu_memory(256), flops_util=0.07,
               timestamp="2026-01-10T09:00:00+00:00"),
        record("resnet50", "torch", 256, 3170.4, gpu=True, mem=gpu_memory(256), flops_util=0.079,
               timestamp="2026-01-11T09:00:00Z"),
        record("resnet50", "tensorflow", 8, 12.34),
        record("resnet50", "tensorflow", 16, 14.56),
        record("resnet50", "tensorflow", 512, None, status="oom",
               error="ResourceExhaustedError: OOM when allocating tensor"),
        record("resnet50", "mxnet", 8, 10.87),
        record("transformer", "torch", 16, 4567.4,
               mem=memory(100 * MiB, 48 * MiB, peak=1 * GiB, fm_source="measured", runtime=512 * MiB)),
        record("transformer", "mxnet", 16, 2345.6),
        record("transformer", "cntk", 16, None, status="error", error="RuntimeError: " + HOSTILE),
    ]


def write_jsonl(path, records, blank_lines=True):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
            if blank_lines:
                f.write("\n")
    return str(path)


@pytest.fixture(scope="module")
def report(tmp_path_factory, records):
    """One report from two files, shared by the tests that only read it."""
    where = tmp_path_factory.mktemp("report")
    half = len(records) // 2
    first = write_jsonl(where / "a.jsonl", records[:half])
    second = write_jsonl(where / "b.jsonl", records[half:], blank_lines=False)
    index = write_report([first, second], str(where / "report"))
    return where / "report", index


def markdown_rows(text, heading):
    """The rows of the table under a Markdown heading, as lists of cells."""
    section = text.split("## " + heading + "\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows[1:]]


def row_for(rows, *cells):
    matches = [r for r in rows if r[:len(cells)] == list(cells)]
    assert len(matches) == 1, (cells, rows)
    return matches[0]


def test_writes_page_markdown_and_plots(report):
    out, index = report
    assert index == str(out / "index.html")
    names = {"index.html", "report.md", "throughput.png", "throughput_vs_batch.png", "memory.png",
             "memory_vs_batch.png", "utilization.png"}
    assert names <= set(os.listdir(out))
    for png in (n for n in names if n.endswith(".png")):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "index.html").read_text()
    srcs = re.findall(r'<img src="([^"]+)"', page)
    assert sorted(srcs) == sorted(n for n in names if n.endswith(".png"))
    assert not re.search(r"(src|href)=\"(https?:)?//", page), "the page must load nothing remote"
    md = (out / "report.md").read_text()
    assert all("]({})".format(s) in md for s in srcs)


def test_results_table_numbers(report):
    md = (report[0] / "report.md").read_text()
    rows = markdown_rows(md, "Results")
    assert len(rows) == 8  # 9 ok records, one of them superseded by a rerun
    torch = row_for(rows, "resnet50", "torch", "paper", "256")
    assert torch[4:8] == ["fp32", "default", "cuda:0", "3,170 images/s"]  # newer rerun, not 2,999
    step = 256 / 3170.4
    assert torch[8:12] == ["{:.1f} ms".format(1000 * step),
                           "{:.1f}–{:.1f} ms".format(980 * step, 1050 * step), "2.1%", "4.32 s"]
    assert torch[12:] == ["{:.2f} TFLOP/s".format(3 * 4.1e9 * 3170.4 / 1e12), "7.9%", "11.0 GiB"]
    tf = row_for(rows, "resnet50", "tensorflow", "paper", "8")
    assert tf[6:9] == ["cpu", "12.34 images/s", "648.3 ms"]  # 8 images / 12.34 images/s
    assert tf[13:] == ["—", "—"]  # no FLOP utilisation and no measurable peak on this CPU run
    transformer = row_for(rows, "transformer", "torch", "paper", "16")
    assert transformer[7:9] == ["4,567 tokens/s", "896.8 ms"]  # 16 x 256 tokens a step
    assert transformer[12] == "{:.2f} TFLOP/s".format(3 * 1.3e8 * 4567.4 / 1e12)  # per token
    assert "newest was used" in md and "a.jsonl line 5" in md and "b.jsonl line 1" in md


def test_memory_table_sizes_shares_and_sources(report, records):
    rows = markdown_rows((report[0] / "report.md").read_text(), "Memory")
    torch = row_for(rows, "resnet50", "torch", "paper", "256")
    mem = records[3]["memory"]
    total = sum(mem[c]["bytes"] for c in ("weights", "gradients", "optimizer_state", "feature_maps",
                                          "input_batch", "workspace"))
    assert torch[4] == "100.0 MiB ({:.1f}%, analytic)".format(100 * 100 * MiB / total)
    assert torch[7] == "10.0 GiB ({:.1f}%, measured)".format(100 * 256 * 40 * MiB / total)
    assert torch[9] == "—"  # a GPU run has no framework runtime in device memory
    assert torch[10] == "512.0 MiB ({:.1f}%, derived)".format(100 * 512 * MiB / total)
    assert torch[11] == torch[12] == "11.0 GiB"  # the sum of categories is the measured peak
    mxnet = row_for(rows, "resnet50", "mxnet", "paper", "8")
    assert mxnet[7] == "24.0 MiB ({:.1f}%, analytic)".format(100 * 24 / (3 * 100 + 24 + 24 / 50))
    assert mxnet[9] == mxnet[10] == mxnet[12] == "—"
    cpu = row_for(rows, "transformer", "torch", "paper", "16")
    # the framework's runtime is its own category, and workspace what is left of the peak
    assert cpu[9] == "512.0 MiB (50.0%, derived)"
    assert cpu[10].startswith("{:.1f} MiB".format(1024 - 512 - 300 - 48 - 48 / 50))
    assert cpu[11] == cpu[12] == "1.0 GiB"


def test_failures_only_in_failures_table_and_escaped(report):
    out = report[0]
    md = (out / "report.md").read_text()
    failures = markdown_rows(md, "Failures")
    assert [r[5] for r in failures] == ["oom", "error"]
    assert "OOM when allocating tensor" in failures[0][6]
    assert all(r[3] != "512" for r in markdown_rows(md, "Results"))
    assert "<img src=x" not in md
    assert "&lt;img src=x onerror=alert(1)&gt; &amp; \\| \\*bold\\*" in md
    page = (out / "index.html").read_text()
    assert "<img src=x" not in page
    assert "RuntimeError: &lt;img src=x onerror=alert(1)&gt; &amp; | *bold*" in page
    assert page.count("<details>") == 8  # the protocol and env line of each shown run


def test_single_path_and_record_dicts(tmp_path, records):
    index = write_report(write_jsonl(tmp_path / "r.jsonl", records[4:6]), str(tmp_path / "one"))
    assert os.path.exists(index)
    # one model at two batch sizes on one backend: the sweep plots exist, CPU-only: no GPU bars
    assert os.path.exists(tmp_path / "one" / "throughput_vs_batch.png")
    index = write_report(records[6:7], str(tmp_path / "one"))  # only a failure: no plots
    assert not [n for n in os.listdir(tmp_path / "one") if n.endswith(".png")], "stale plots left"
    assert "No successful runs to plot." in pathlib.Path(index).read_text()


@pytest.mark.parametrize("line, message", [
    ('{"schema": "tbdzoo.run/2", "model": "m", "backend": "b", "status": "ok"}',
     r"bad\.jsonl line 2: record schema 'tbdzoo.run/2' has major version 2"),
    ('{"model": "m", "backend": "b", "status": "ok"}',
     r"bad\.jsonl line 2: the record has no 'schema'"),
    ("model,backend,throughput", r"bad\.jsonl line 2 is not JSON .*JSON Lines"),
    ('[{"schema": "tbdzoo.run/1"}]', r"bad\.jsonl line 2 holds a JSON list, not an object"),
])
def test_bad_input_names_file_and_line(tmp_path, records, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(records[0]) + "\n" + line + "\n")
    with pytest.raises(ReportInputError, match=message):
        write_report(str(path), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists(), "nothing is written from refused input"


def test_not_jsonl_files(tmp_path):
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps({"schema": "tbdzoo.run/1"}, indent=2))
    with pytest.raises(ReportInputError, match=r"pretty\.json line 1 is not JSON"):
        write_report(str(pretty), str(tmp_path / "out"))
    binary = tmp_path / "plot.png"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00")
    with pytest.raises(ReportInputError, match=r"plot\.png is not a text file"):
        write_report(str(binary), str(tmp_path / "out"))
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    with pytest.raises(ReportInputError, match="holds no records"):
        write_report(str(tmp_path / "empty.jsonl"), str(tmp_path / "out"))
    with pytest.raises(ReportInputError, match="cannot read results file"):
        write_report(str(tmp_path / "missing.jsonl"), str(tmp_path / "out"))


class ImageSources(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sources = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.sources.append(dict(attrs).get("src"))


# The page under test is loaded untouched in an iframe; this test-only wrapper reads its images.
PROBE = """<!DOCTYPE html><html><body><pre id="status">pending</pre>
<iframe id="page" src="{page}" width="1400" height="900"></iframe>
<script>
document.getElementById("page").addEventListener("load", function () {{
  var out = document.getElementById("status"), doc;
  try {{ doc = this.contentDocument; }} catch (e) {{ out.textContent = "NO-ACCESS " + e; return; }}
  if (!doc) {{ out.textContent = "NO-ACCESS"; return; }}
  var lines = [];
  for (var img of doc.images) {{
    lines.push((img.complete && img.naturalWidth > 0 ? "LOADED " : "BROKEN ") +
               img.getAttribute("src") + " " + img.naturalWidth + "x" + img.naturalHeight);
  }}
  out.textContent = "IMAGES " + doc.images.length + "\\n" + lines.join("\\n") + "\\nDONE";
}});
</script></body></html>
"""


def chromium_or_skip():
    if os.path.exists(CHROMIUM):
        return CHROMIUM
    message = "{} is missing; run scripts/ensure_chromium.sh".format(CHROMIUM)
    if IN_CI:
        pytest.fail(message + " (CI must run the browser test)")
    pytest.skip(message)


def image_status(chromium, index, tmp_path):
    """Open index.html in headless Chromium; one 'LOADED src WxH' or 'BROKEN src 0x0' per <img>."""
    probe = tmp_path / "probe.html"
    probe.write_text(PROBE.format(page=index.as_uri()))
    profile = tmp_path / "chromium-profile"
    profile.mkdir(exist_ok=True)
    args = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--user-data-dir={}".format(profile),
            "--allow-file-access-from-files",  # lets the wrapper read the framed file:// page
            "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()]
    try:
        proc = subprocess.run(args, capture_output=True, timeout=25,
                              text=True)
    finally:
        shutil.rmtree(str(profile), ignore_errors=True)
    status = re.search(r'<pre id="status">(.*?)</pre>', proc.stdout, re.S)
    assert status, "no DOM from chromium (rc {}): {}".format(proc.returncode, proc.stderr[-2000:])
    lines = status.group(1).split("\n")
    assert lines[0].startswith("IMAGES ") and lines[-1] == "DONE", lines
    return lines[1:-1]


def test_every_image_loads_in_chromium(report, tmp_path):
    chromium = chromium_or_skip()
    out, index = report
    parser = ImageSources()
    parser.feed(pathlib.Path(index).read_text())
    assert len(parser.sources) >= 5
    lines = image_status(chromium, out / "index.html", tmp_path)
    assert len(lines) == len(parser.sources), lines
    assert all(line.startswith("LOADED ") for line in lines), lines
    # the probe sees a missing image: a copy of the report without one PNG has one broken <img>
    copy = tmp_path / "copy"
    shutil.copytree(str(out), str(copy))
    (copy / "memory.png").unlink()
    lines = image_status(chromium, copy / "index.html", tmp_path)
    assert [line.split()[:2] for line in lines if line.startswith("BROKEN")] == [
        ["BROKEN", "memory.png"]], lines


def test_the_report_states_tbds_memory_finding_from_measured_h200_records(tmp_path):
    """The committed H200 records (benchmarks/results): at the paper's batch of 32, feature
    maps are ResNet-50's largest memory category, 70-90% of it as TBD found."""
    import os

    from tbdzoo.profiling.report import write_report
    records = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "results",
                           "h200_profile_records.jsonl")
    write_report([records], str(tmp_path / "out"))
    text = (tmp_path / "out" / "report.md").read_text()
    line = next(l for l in text.splitlines() if l.startswith("- resnet50 on torch (batch 32"))
    share = int(line.split("feature maps is the largest category, ")[1].split("%")[0])
    assert 70 <= share <= 90 and "(measured)" in line


def test_sweeps_of_the_recurrent_models_report_in_their_own_units(tmp_path):
    """`tbd sweep` of Seq2Seq and Deep Speech 2 (tiny, PyTorch, two batch sizes each): every run
    is a record in the model's unit, target tokens and audio seconds per step as the model
    counts them in its synthetic batch, and the report shows both sweeps (tables, throughput
    against batch size) with every image loading."""
    import tbdzoo
    out = tmp_path / "r.jsonl"
    for model in ("seq2seq", "deepspeech2"):
        proc = subprocess.run(
            [sys.executable, "-m", "tbdzoo.cli", "sweep", model, "--backend", "torch", "--config",
             "tiny", "--batch-sizes", "1,2", "--steps", "1", "--warmup", "1", "--repeats", "1",
             "--no-samplers", "-o", str(out)], capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["model"], r["batch_size"], r["status"]) for r in records] == [
        ("seq2seq", 1, "ok"), ("seq2seq", 2, "ok"), ("deepspeech2", 1, "ok"),
        ("deepspeech2", 2, "ok")]
    for r in records:
        md = tbdzoo.get_model(r["model"])
        hp = md.hparams("tiny")
        items = md.items(hp, md.synthetic_batch(hp, r["batch_size"], 0))
        assert r["throughput"]["unit"] == md.unit
        assert r["throughput"]["items_per_step"] == pytest.approx(items)
        assert r["throughput"]["value"] == pytest.approx(items / r["step_time"]["median"])
    assert {r["throughput"]["unit"] for r in records} == {"target tokens/s", "audio seconds/s"}
    write_report(str(out), str(tmp_path / "report"))
    rows = markdown_rows((tmp_path / "report" / "report.md").read_text(), "Results")
    for r in records:
        row = row_for(rows, r["model"], "torch", "tiny", str(r["batch_size"]))
        assert row[7].endswith(" " + r["throughput"]["unit"])
    assert (tmp_path / "report" / "throughput_vs_batch.png").exists()
    chromium = chromium_or_skip()
    lines = image_status(chromium, tmp_path / "report" / "index.html", tmp_path)
    assert lines and all(line.startswith("LOADED ") for line in lines), lines


def data_fed(r, value, wait, tree_cores, augment=True):
    """The record's "data" part as `tbd run --data` writes it (docs/records.md)."""
    step = r["batch_size"] / value
    r = dict(r)
    r["data"] = {"dir": "/data/imagenet", "split": "train", "examples": 1281167, "classes": 1000,
                 "pipeline": "torch.utils.data.DataLoader", "workers": 2, "prefetch": 2,
                 "augment": augment, "deterministic": False, "seed": 0,
                 "throughput": {"value": value, "unit": "images/s",
                                "items_per_step": r["batch_size"]},
                 "step_time": {"median": step, "min": step, "max": step, "cv": 0.0, "n": 3},
                 "first_batch_s": 0.5, "input_wait_fraction": wait,
                 "cpu": {"cores": 16, "process_tree_cores_busy": tree_cores,
                         "process_tree_utilization": tree_cores / 16,
                         "system_per_core": [0.5] * 16, "source": "measured"},
                 "losses": [6.9], "vs_synthetic": value / r["throughput"]["value"],
                 "input_bound": wait > 0.1}
    return r


def test_data_fed_runs_sit_beside_their_synthetic_figures(tmp_path):
    fed = [data_fed(record("resnet50", "torch", 64, 1800.4, gpu=True), 450.1, 0.72, 7.5),
           data_fed(record("resnet50", "tensorflow", 8, 12.34), 12.0, 0.02, 1.9, augment=False),
           record("resnet50", "mxnet", 8, 10.87)]
    write_report([write_jsonl(tmp_path / "fed.jsonl", fed)], str(tmp_path / "out"))
    md = (tmp_path / "out" / "report.md").read_text()
    rows = markdown_rows(md, "Data-fed training")
    assert len(rows) == 2  # the run without --data has no row here
    torch = row_for(rows, "resnet50", "torch", "paper", "64")
    assert torch[4:] == ["torch.utils.data.DataLoader", "2", "yes", "1,800 images/s",
                         "450.1 images/s", "0.25x", "72.0%", "1.60", "7.50", "input pipeline"]
    tf = row_for(rows, "resnet50", "tensorflow", "paper", "8")
    assert tf[6:] == ["no", "12.34 images/s", "12.00 images/s", "0.97x", "2.0%", "1.60", "1.90",
                      "model"]
    page = (tmp_path / "out" / "index.html").read_text()
    assert 'id="data-fed"' in page and "450.1 images/s" in page
    write_report([write_jsonl(tmp_path / "plain.jsonl", fed[2:])], str(tmp_path / "plain"))
    assert "Data-fed training" not in (tmp_path / "plain" / "report.md").read_text()


def test_a_learners_sweep_of_asynchronous_a3c_reports_frames_updates_and_cpu(tmp_path):
    """`tbd sweep a3c --learners 1,2` (CartPole, PyTorch): one record per learner count with
    frames/s, updates/s and each learner's CPU utilisation, shown in the report's own table and
    figure, and kept out of the batch-size tables."""
    out = tmp_path / "a3c.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "tbdzoo.cli", "sweep", "a3c", "--backend", "torch", "--config",
         "cartpole", "--learners", "2,1", "--frames", "100", "--set", "hidden=8,8", "-o",
         str(out)], capture_output=True, text=True,
        timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["model"], r["status"], r["asynchronous"]["learners"]) for r in records] == [
        ("a3c", "ok", 1), ("a3c", "ok", 2)]
    for r in records:
        a = r["asynchronous"]
        assert r["throughput"] == {"value": a["frames_per_second"], "unit": "frames/s"}
        assert a["frames"] >= 100 and a["frames"] == 5 * a["updates"]
        assert a["frames_per_second"] == pytest.approx(a["frames"] / a["seconds"], rel=1e-3)
        assert len(a["cpu_utilisation_per_learner"]) == a["learners"]
        assert a["frames_per_cpu_second"] == pytest.approx(
            a["frames"] / sum(a["cpu_seconds_per_learner"]), rel=1e-3)
        assert r["overrides"] == {"hidden": [8, 8]}
    write_report(str(out), str(tmp_path / "report"))
    text = (tmp_path / "report" / "report.md").read_text()
    assert markdown_rows(text, "Results") == []
    rows = markdown_rows(text, "Asynchronous A3C")
    for r in records:
        a = r["asynchronous"]
        row = row_for(rows, "torch", "cartpole", "cpu", "CartPole-v1", str(a["learners"]))
        assert row[10] == "{:.2f}–{:.2f}".format(min(a["cpu_utilisation_per_learner"]),
                                                max(a["cpu_utilisation_per_learner"]))
    assert (tmp_path / "report" / "asynchronous.png").exists()
    assert not (tmp_path / "report" / "throughput.png").exists()


def distributed(r, world, per_replica):
    """The record of a data-parallel run of ``world`` processes (docs/records.md)."""
    r = dict(r)
    r["distributed"] = {"world_size": world, "per_replica_batch": per_replica, "nproc": world,
                        "nnodes": 1}
    return r


def test_runs_of_other_world_sizes_precisions_or_executions_are_separate_lines(tmp_path):
    """One process and two processes at the same batch sizes are two lines (and two kept rows),
    as are bf16 against fp32 and compiled against eager; labels name only what differs."""
    from matplotlib.figure import Figure

    from tbdzoo.profiling import plots
    one = [record("resnet50", "torch", b, v) for b, v in ((8, 10.0), (16, 12.0))]
    two = [distributed(record("resnet50", "torch", b, v), 2, b // 2)
           for b, v in ((8, 17.0), (16, 21.0))]
    ax = Figure().add_subplot()
    plots.draw_lines(ax, one + two, plots.backend_colors({"torch"}))
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}
    assert lines == {"torch (paper · fp32 · 1 process)": [10.0, 12.0],
                     "torch (paper · fp32 · 2 processes)": [17.0, 21.0]}
    bf16 = [dict(r, precision="bf16", execution="compiled") for r in one]
    ax = Figure().add_subplot()
    plots.draw_lines(ax, one + bf16, plots.backend_colors({"torch"}))
    assert sorted(line.get_label() for line in ax.get_lines()) == [
        "torch (paper · bf16 · compiled)", "torch (paper · fp32 · default)"]
    ax = Figure().add_subplot()
    plots.draw_lines(ax, one, plots.backend_colors({"torch"}))
    assert [line.get_label() for line in ax.get_lines()] == ["torch"]

    two[1]["step_time"] = dict(two[1]["step_time"], cv=0.354)  # a busy machine's repeats
    write_report([write_jsonl(tmp_path / "w.jsonl", one + two)], str(tmp_path / "out"))
    md = (tmp_path / "out" / "report.md").read_text()
    rows = markdown_rows(md, "Results")
    assert [r[3] for r in rows] == ["8", "16", "8 (2 x 4)", "16 (2 x 8)"]
    assert "superseded" not in md  # a two-process run is not a rerun of the one-process run
    assert (tmp_path / "out" / "throughput_vs_batch.png").exists()
    # the spread sits beside every figure, and a run that varied over 10% is named under them
    assert [r[10] for r in rows] == ["2.1%", "2.1%", "2.1%", "35.4%"]
    unsteady = [l for l in md.splitlines() if l.startswith("- resnet50 on torch, batch")]
    assert unsteady == ["- resnet50 on torch, batch 16 (2 x 8): cv 35.4% over 3 repeats "
                        "(step {})".format(rows[3][9])]
    assert "varied by more than 10%" in (tmp_path / "out" / "index.html").read_text()


def test_a_report_of_steady_runs_names_no_unsteady_run(report):
    assert "varied by more than 10%" not in (report[0] / "report.md").read_text()
