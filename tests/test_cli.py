"""The `tbd` command line: the documented commands, their output files and their errors."""
import json
import os
import re
import subprocess
import sys

import pytest


def tbd(*args, timeout=600, env=None):
    """`tbd ARGS` in a new process, its output piped (not a terminal); ``env``: variables added."""
    return subprocess.run([sys.executable, "-m", "tbdzoo.cli"] + list(args), capture_output=True,
                          text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def test_list_shows_models_and_backends():
    proc = tbd("list")
    assert proc.returncode == 0
    for word in ("resnet50", "transformer", "25,557,032", "tensorflow", "mxnet", "cntk", "torch"):
        assert word in proc.stdout


@pytest.mark.parametrize("args,message", [
    (["run", "resnet", "--backend", "torch"],
     "unknown model 'resnet'; known: a3c, deepspeech2, faster_rcnn, inception_v3, resnet50, seq2seq, "
     "transformer, wgan"),
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
               "--set", "dropout=0", "--set", "lr=0.5", "-o", str(out),
               env={"TBDZOO_PROGRESS_SECONDS": "0.25"})
    assert proc.returncode == 0, proc.stderr
    # output piped, not a terminal: plain lines as the run starts, while it runs, as it ends
    lines = [l for l in proc.stdout.splitlines() if re.match(r"\[ *\d+ s\] ", l)]
    assert any("transformer on torch: started" in l for l in lines), proc.stdout
    assert any("transformer on torch: finished, ok" in l for l in lines), proc.stdout
    assert any(re.search(r"transformer on torch: (building|training)", l) for l in lines), lines
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
    from tbdzoo.backends import environments
    # this machine: the device each backend would pick, asked of the backend itself
    gpu = torch.cuda.is_available()
    assert environments.ask_device("torch") == ("cuda:0" if gpu else "cpu")
    assert environments.ask_device("cntk") == ("cpu" if "cntk" in suite.ready_backends() else None)
    assert environments.default_device("torch") == ("cuda:0" if gpu else "cpu")
    here = None if gpu else 8
    assert suite.bench_batch_size("resnet50", "torch") == here
    assert suite.bench_batch_size("resnet50", "torch", device="cpu") == 8
    assert suite.bench_batch_size("resnet50", "torch", config="tiny") is None
    assert suite.bench_batch_size("resnet50", "torch", cpu_batches=False) is None
    # a GPU runs the configs' batch sizes; a CPU-only backend beside it keeps the small ones
    monkeypatch.setattr(environments, "default_device", lambda b: "cuda:0" if b == "torch" else "cpu")
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


def test_plain_progress_prints_a_line_per_running_task_every_interval():
    """Where output is not a terminal, progress is plain lines: one as a task starts, one per
    running task each interval (here on a fake clock), one as it ends with its frozen time."""
    from tbdzoo.progress import PlainProgress
    now, lines = [100.0], []
    progress = PlainProgress(lines.append, interval=10, clock=lambda: now[0])
    overall = progress.add_task("all runs", total=2, stage="")
    task = progress.add_task("resnet50 on torch (batch 8)", total=None, stage="building")
    assert lines == ["[        0 s] all runs: started, 0/2",
                     "[        0 s] resnet50 on torch (batch 8): started, building"]
    now[0] = 109.0
    assert progress.tick() == 0  # not yet 10 s since the last lines
    progress.update(task, completed=3, total=7, stage="step 3/7")
    now[0] = 172.5
    assert progress.tick() == 2
    assert lines[-2:] == ["[ 1 min 12 s] all runs: 0/2",
                          "[ 1 min 12 s] resnet50 on torch (batch 8): step 3/7"]
    progress.stop_task(task)
    progress.advance(overall)
    now[0] = 200.0
    assert progress.tick() == 1 and lines[-2:] == [
        "[ 1 min 12 s] resnet50 on torch (batch 8): finished, step 3/7",
        "[ 1 min 40 s] all runs: 1/2"]


def test_plain_progress_keeps_printing_while_a_step_is_silent():
    """The context's thread prints on its own: a run whose step takes minutes still shows."""
    import time

    from tbdzoo.progress import PlainProgress
    lines = []
    with PlainProgress(lines.append, interval=0.05) as progress:
        progress.add_task("deepspeech2 on mxnet", stage="training")
        time.sleep(0.4)
    beats = [l for l in lines if l.endswith("deepspeech2 on mxnet: training")]
    assert len(beats) >= 3, lines


# -- the frameworks' banners ------------------------------------------------------------------
def test_native_stderr_keeps_every_line_but_the_banners(capfd, monkeypatch):
    """What C++ libraries write to file descriptor 2 while a framework loads is held; the
    banners are dropped, anything else (a real error) is written back; TBDZOO_VERBOSE keeps all."""
    from tbdzoo.backends.common.quiet import filtered_native_stderr
    banners = (r"^I0000 .*\] oneDNN custom operations are on",)
    monkeypatch.delenv("TBDZOO_VERBOSE", raising=False)
    with filtered_native_stderr(banners):
        os.write(2, b"I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on. ...\n")
        os.write(2, b"libfoo.so: cannot open shared object file\n")
    assert capfd.readouterr().err == "libfoo.so: cannot open shared object file\n"
    monkeypatch.setenv("TBDZOO_VERBOSE", "1")
    with filtered_native_stderr(banners):
        os.write(2, b"I0000 00:00:1.0 1 port.cc:153] oneDNN custom operations are on.\n")
    assert "oneDNN" in capfd.readouterr().err


@pytest.mark.parametrize("python,backend", [(sys.executable, "tensorflow"),
                                            (sys.executable, "mxnet"), ("cntk", "cntk")])
def test_importing_a_backend_prints_nothing_unless_verbose(python, backend):
    """TensorFlow's absl and oneDNN lines, MXNet's deprecation warnings and CNTK's Linux and GPU
    warnings stay out of a session (Python warnings shown as `python -W default` would)."""
    from tbdzoo.backends import environments
    if python == "cntk":
        if "cntk" not in [b["name"] for b in __import__("tbdzoo").list_backends() if b["ready"]]:
            pytest.skip("no CNTK environment")
        python = environments.python_of("cntk")
    code = "import tbdzoo.backends.{}.model".format(backend)
    env = dict(environments.worker_environment(), TBDZOO_VERBOSE="")
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)
    quiet = subprocess.run([python, "-W", "default", "-c", code], stderr=subprocess.PIPE,
                           text=True, env=env, timeout=300)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    env["TBDZOO_VERBOSE"] = "1"
    loud = subprocess.run([python, "-W", "default", "-c", code], stderr=subprocess.PIPE,
                          text=True, env=env, timeout=300)
    assert loud.returncode == 0 and loud.stderr != ""  # the same import, its banners left on


def test_bad_numbers_name_the_option_and_what_it_takes(capsys):
    for args, message in [
            (["run", "resnet50", "--backend", "torch", "--batch-size", "x"],
             "argument --batch-size: 'x' is not a positive integer (1 or more)"),
            (["run", "resnet50", "--backend", "torch", "--steps", "0"],
             "argument --steps: '0' is not a positive integer (1 or more)"),
            (["bench", "--min-repeat-seconds", "-1"],
             "argument --min-repeat-seconds: '-1' is not a number of 0 or more"),
            (["run", "resnet50", "--backend", "torch", "--rank-timeout", "soon"],
             "argument --rank-timeout: 'soon' is not a positive number"),
            (["run", "resnet50", "--backend", "torch", "--peak-tflops", "nan"],
             "argument --peak-tflops: 'nan' is not a positive number"),
            (["run", "resnet50", "--backend", "torch", "--data-workers", "-2"],
             "argument --data-workers: '-2' is not a non-negative integer (0 or more)"),
            (["sweep", "a3c", "--backend", "torch", "--learners", "1,two"],
             "argument --learners: '1,two': learners are comma-separated integers"),
            (["data", "make", "voc-composed", "--out", "x", "--seed", "s"],
             "argument --seed: 's' is not a non-negative integer (0 or more)"),
            (["train", "resnet50", "--backend", "torch", "--max-minutes", "0"],
             "argument --max-minutes: '0' is not a positive number"),
            (["train", "resnet50", "--backend", "torch", "--seed", "1.5"],
             "argument --seed: '1.5' is not an integer")]:
        code, err = main(capsys, *args)
        assert code == 2 and message in err, (args, err)
        assert "invalid" not in err, err  # never argparse's "invalid _positive value"


def test_min_repeat_seconds_is_refused_for_a_data_parallel_run(capsys):
    code, err = main(capsys, "run", "resnet50", "--backend", "torch", "--nproc", "2",
                     "--min-repeat-seconds", "1")
    assert code == 2 and "--min-repeat-seconds applies to runs of one process" in err
