"""The `tbd` command line: the documented commands, their output files and their errors."""
import json
import subprocess
import sys

import pytest


def tbd(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "tbdzoo.cli"] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout)


def test_list_shows_models_and_backends():
    proc = tbd("list")
    assert proc.returncode == 0
    for word in ("resnet50", "transformer", "25,557,032", "tensorflow", "mxnet", "cntk", "torch"):
        assert word in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["run", "resnet", "--backend", "torch"], "unknown model 'resnet'; known: resnet50, transformer"),
    (["run", "resnet50", "--backend", "caffe"], "unknown backend 'caffe'"),
    (["bench", "--models", "vgg"], "unknown model 'vgg'"),
])
def test_bad_names_exit_2_listing_the_known_ones(args, message):
    proc = tbd(*args)
    assert proc.returncode == 2 and message in proc.stderr


def test_bad_numbers_are_refused_by_the_parser():
    proc = tbd("sweep", "resnet50", "--backend", "torch", "--batch-sizes", "8,x")
    assert proc.returncode == 2 and "comma-separated integers" in proc.stderr
    proc = tbd("sweep", "resnet50", "--backend", "torch", "--batch-sizes", "8", "--memory-cap", "lots")
    assert proc.returncode == 2 and "8G" in proc.stderr


def test_run_appends_a_record_and_an_mlperf_log(tmp_path):
    out, mllog = tmp_path / "r.jsonl", tmp_path / "ml.log"
    for _ in range(2):
        proc = tbd("run", "transformer", "--backend", "torch", "--config", "tiny", "--steps", "1",
                   "--warmup", "1", "--repeats", "1", "-o", str(out), "--mllog", str(mllog))
        assert proc.returncode == 0, proc.stderr
    records = [json.loads(l) for l in out.read_text().splitlines()]
    assert len(records) == 2 and all(r["status"] == "ok" for r in records)
    assert records[0]["throughput"]["unit"] == "tokens/s"
    assert records[0]["command"].startswith("tbd run transformer")
    lines = mllog.read_text().splitlines()
    assert lines and all(l.startswith(":::MLLOG ") for l in lines)
    keys = [json.loads(l[len(":::MLLOG "):])["key"] for l in lines]
    assert "tbdzoo_throughput" in keys and keys[-1] == "run_stop"
    assert ":::MLLOG" not in proc.stdout
    proc = tbd("report", str(out), "-o", str(tmp_path / "report"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "report" / "index.html").exists()
    assert "transformer" in (tmp_path / "report" / "report.md").read_text()


def test_report_refuses_a_file_that_is_not_records(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    proc = tbd("report", str(bad), "-o", str(tmp_path / "report"))
    assert proc.returncode == 2 and "bad.jsonl" in proc.stderr
