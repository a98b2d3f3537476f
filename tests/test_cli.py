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
    (["run", "resnet", "--backend", "torch"], "unknown model 'resnet'; known: a3c, deepspeech2, faster_rcnn, inception_v3, resnet50, seq2seq, transformer, wgan"),
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


# -- options and hyperparameters ------------------------------------------------------------
def main(capsys, *args):
    """The CLI in this process, for errors raised before any run; (exit code, stderr)."""
    from tbdzoo import cli
    try:
        code = cli.main(list(args))
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["run", "resnet50", "--backend", "torch", "--set", "lr=x"],
     "hyperparameter lr: cannot read 'x' as a number; lr takes a number > 0"),
    (["run", "resnet50", "--backend", "torch", "--set", "batch_size=-3"],
     "batch_size of resnet50 = -3 is not allowed; batch_size takes an integer >= 1"),
    (["run", "resnet50", "--backend", "torch", "--set", "nesterov=maybe"],
     "nesterov: cannot read 'maybe' as true or false"),
    (["sweep", "resnet50", "--backend", "torch", "--batch-sizes", "8", "--set", "blocks=3,x"],
     "blocks: cannot read '3,x' as comma-separated integers"),
    (["run", "resnet50", "--backend", "torch", "--set", "vocab=100"],
     "unknown hyperparameter of resnet50 'vocab'; known: batch_size, blocks"),
    (["bench", "--backends", "torch", "--set", "depth=3"],
     "unknown hyperparameter of resnet50 or transformer or inception_v3 or wgan or seq2seq or "
     "deepspeech2 or a3c or faster_rcnn 'depth'; known: allow_empty_images"),
    (["run", "resnet50", "--backend", "torch", "--set", "lr"], "NAME=VALUE, e.g. lr=0.05"),
    (["run", "resnet50", "--backend", "torch", "--precision", "fp64"], "invalid choice: 'fp64'"),
    (["run", "resnet50", "--backend", "torch", "--batch-size", "8", "--set", "batch_size=16"],
     "the batch size is given twice"),
    (["sweep", "resnet50", "--backend", "torch", "--batch-sizes", "8", "--set", "batch_size=16"],
     "drop --set batch_size"),
    (["run", "transformer", "--backend", "torch", "--config", "tiny", "--set", "heads=3"],
     "d_model 16 is not divisible by heads 3"),
])
def test_bad_options_exit_2_before_any_run(capsys, args, message):
    code, err = main(capsys, *args)
    assert code == 2 and message in err, err


def test_options_and_hyperparameters_travel_to_the_worker_and_into_the_record(tmp_path):
    out = tmp_path / "r.jsonl"
    proc = tbd("run", "transformer", "--backend", "torch", "--config", "tiny", "--steps", "1",
               "--warmup", "1", "--repeats", "1", "--no-samplers", "--precision", "bf16",
               "--execution", "eager", "--set", "d_model=32", "--set", "heads=4",
               "--set", "dropout=0", "--set", "lr=0.5", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    record = json.loads(out.read_text())
    assert record["status"] == "ok"
    # the worker built d_model=32 (the spec hashes agree, or the run fails) and ran bf16
    assert (record["precision"], record["execution"], record["memory_format"]) == ("bf16", "eager", "auto")
    assert record["overrides"] == {"d_model": 32, "heads": 4, "dropout": 0.0, "lr": 0.5,
                                   "precision": "bf16", "execution": "eager"}
    # the worker's spec was the wider one: its analytic FLOPs are those of d_model=32, heads=4
    from tbdzoo import get_model
    from tbdzoo.profiling.flops import forward_per_example
    md = get_model("transformer")
    wide, default = (forward_per_example(md.build_graph(md.hparams("tiny", **hp)))
                     for hp in ({"d_model": 32, "heads": 4, "dropout": 0.0}, {"dropout": 0.0}))
    assert record["flops"]["forward_per_example"] == wide != default


def test_bench_applies_a_setting_to_the_models_that_have_it(capsys):
    import argparse
    from tbdzoo import cli
    args = argparse.Namespace(config="tiny", set=[("vocab", "100"), ("lr", "0.5")],
                              precision="bf16", execution=None, memory_format=None, batch_size=None)
    overrides = cli.bench_overrides(["resnet50", "transformer"], args)
    assert overrides["resnet50"] == {"lr": 0.5, "precision": "bf16"}
    assert overrides["transformer"] == {"vocab": 100, "lr": 0.5, "precision": "bf16"}
    assert "--set vocab applies to transformer only; resnet50 runs without it" in capsys.readouterr().err


def _bench_sizes(monkeypatch, *args):
    """The (model, backend, batch size) that `tbd bench` would run, without running them."""
    from tbdzoo import cli
    runs = []
    monkeypatch.setattr(cli.Runner, "run", lambda self, m, b, size, overrides=None: runs.append((m, b, size)))
    monkeypatch.setattr(cli.Runner, "finish", lambda self: 0)
    assert cli.main(["bench", "--backends", "torch,mxnet"] + list(args)) == 0
    return runs


def test_bench_uses_cpu_sized_batches_only_on_a_cpu(monkeypatch):
    import torch
    from tbdzoo import suite
    # this machine: the device each backend would pick, asked of the backend itself
    gpu = torch.cuda.is_available()
    assert suite.ask_device("torch") == ("cuda:0" if gpu else "cpu")
    assert suite.ask_device("cntk") == ("cpu" if "cntk" in suite.ready_backends() else None)
    assert suite.default_device("torch") == ("cuda:0" if gpu else "cpu")
    here = None if gpu else 8
    assert suite.bench_batch_size("resnet50", "torch") == here
    assert suite.bench_batch_size("resnet50", "torch", device="cpu") == 8
    assert suite.bench_batch_size("resnet50", "torch", config="tiny") is None
    assert suite.bench_batch_size("resnet50", "torch", cpu_batches=False) is None
    # a GPU runs the configs' batch sizes; a CPU-only backend beside it keeps the small ones
    monkeypatch.setattr(suite, "default_device", lambda b: "cuda:0" if b == "torch" else "cpu")
    assert _bench_sizes(monkeypatch) == [
        ("resnet50", "torch", None), ("resnet50", "mxnet", 8), ("transformer", "torch", None),
        ("transformer", "mxnet", 16), ("inception_v3", "torch", None), ("inception_v3", "mxnet", 4),
        ("wgan", "torch", None), ("wgan", "mxnet", 2), ("seq2seq", "torch", None),
        ("seq2seq", "mxnet", 16), ("deepspeech2", "torch", None), ("deepspeech2", "mxnet", 1),
        ("a3c", "torch", None), ("a3c", "mxnet", None), ("faster_rcnn", "torch", None),
        ("faster_rcnn", "mxnet", 1)]
    assert _bench_sizes(monkeypatch, "--device", "cpu")[0] == ("resnet50", "torch", 8)
    # Deep Speech 2's utterances shrink on a CPU only (torch is on a GPU here, mxnet not)
    assert suite.bench_overrides("deepspeech2", "mxnet") == {"max_frames": 100}
    assert suite.bench_overrides("deepspeech2", "torch") == {}
    assert suite.bench_overrides("deepspeech2", "torch", device="cpu") == {"max_frames": 100}
    assert suite.bench_overrides("deepspeech2", "mxnet", config="tiny") == {}
    assert suite.bench_overrides("deepspeech2", "mxnet", cpu_batches=False) == {}
    assert suite.bench_overrides("resnet50", "mxnet") == {}
    assert suite.bench_overrides("faster_rcnn", "mxnet") == {"canvas": (600, 600), "rois_per_image": 32}
    assert _bench_sizes(monkeypatch, "--set", "batch_size=4")[0] == ("resnet50", "torch", None)
    assert _bench_sizes(monkeypatch, "--batch-size", "4")[0] == ("resnet50", "torch", 4)
