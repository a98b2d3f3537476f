"""The GPU comparisons' harness (benchmarks/harness.py): the repeat protocol's summary and
verdict, the interleaved rounds' order, and merging processes run apart. CPU only, no timing
asserts."""
from benchmarks import harness


def _cell(tbdzoo, baselines, peaks=None):
    times = {"tbdzoo": tbdzoo}
    times.update(baselines)
    return {"times": times, "peak_bytes": peaks or {name: None for name in times}}


def test_a_lead_inside_the_spread_is_parity_and_a_clean_one_is_not():
    # the baseline is 10% slower in every round of both processes: ahead
    ahead = [_cell([1.0] * 5, {"b": [1.1] * 5}), _cell([2.0] * 5, {"b": [2.2] * 5})]
    s = harness.summarize(ahead, "tbdzoo", ["b"], items=10)
    assert s["speed_verdict"] == "ahead" and abs(s["speed"] - 1.1) < 1e-12
    # a median lead, but one round on the other side of 1.0: parity
    mixed = [_cell([1.0] * 5, {"b": [1.1, 1.1, 1.1, 1.1, 0.9]}), _cell([1.0] * 5, {"b": [1.05] * 5})]
    s = harness.summarize(mixed, "tbdzoo", ["b"])
    assert s["speed_verdict"] == "parity" and s["speed"] > 1.0
    assert s["ratios"]["b"]["speed_rounds"][0] < 1.0 < s["ratios"]["b"]["speed_rounds"][1]
    behind = [_cell([1.0] * 5, {"b": [0.8] * 5}), _cell([1.0] * 5, {"b": [0.9] * 5})]
    assert harness.summarize(behind, "tbdzoo", ["b"])["speed_verdict"] == "behind"


def test_the_faster_baseline_is_the_baseline_and_ratios_pair_rounds_within_a_process():
    # process 2 runs everything twice as slow: paired ratios stay 1.2 / 1.5
    cells = [_cell([1.0] * 5, {"nchw": [1.2] * 5, "cl": [1.5] * 5}, {"tbdzoo": 90, "nchw": 100, "cl": 120}),
             _cell([2.0] * 5, {"nchw": [2.4] * 5, "cl": [3.0] * 5}, {"tbdzoo": 90, "nchw": 100, "cl": 120})]
    s = harness.summarize(cells, "tbdzoo", ["nchw", "cl"], items=384)
    assert s["baseline"] == "nchw"
    assert abs(s["speed"] - 1.2) < 1e-12 and abs(s["ratios"]["cl"]["speed"] - 1.5) < 1e-12
    assert s["ratios"]["nchw"]["speed_processes"] == [1.2, 1.2]
    assert abs(s["memory"] - 0.9) < 1e-12 and s["contenders"]["cl"]["peak_bytes"] == 120
    assert s["contenders"]["tbdzoo"]["step_s_process_medians"] == [1.0, 2.0]
    assert s["rounds_per_process"] == [5, 5] and s["processes"] == 2


def test_rounds_rotate_the_order_and_time_every_contender_each_round():
    calls = []
    contenders = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    times = harness.interleaved_rounds(contenders, "cpu", steps=2, rounds=3)
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3}
    firsts = [calls[i] for i in range(0, len(calls), 2)]
    assert firsts == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_an_aggregate_splits_back_into_its_processes():
    record = {"environment": {"gpu": "x"}, "cells": []}
    for t in (1.0, 1.1):
        record["cells"].append({"model": "m", "precision": "tf32", "execution": "eager", "items_per_step": 4,
                                "first_loss": {"tbdzoo": 1.0, "b": 1.0}, "checks": {},
                                "times": {"tbdzoo": [t] * 5, "b": [2 * t] * 5},
                                "peak_bytes": {"tbdzoo": 1, "b": 2}})
    first = dict(record, cells=record["cells"][:1])
    second = dict(record, cells=record["cells"][1:])
    merged = harness.aggregate([first, second], "cmd", {})
    (cell,) = merged["cells"]
    assert cell["processes"] == 2 and cell["meets_protocol"] and cell["speed_verdict"] == "ahead"
    again = harness.aggregate(harness.records_of(merged), "cmd", {})
    assert again["cells"][0]["ratios"] == cell["ratios"]


# -- the comparison scripts' arguments and calibration ---------------------------------------------
import pytest


def _scripts():
    from benchmarks import gpu_a3c, gpu_faster_rcnn, gpu_handwritten, gpu_programs, gpu_recurrent
    return {"gpu_programs": gpu_programs, "gpu_recurrent": gpu_recurrent,
            "gpu_handwritten": gpu_handwritten, "gpu_faster_rcnn": gpu_faster_rcnn, "gpu_a3c": gpu_a3c}


@pytest.mark.parametrize("name", ["gpu_programs", "gpu_recurrent", "gpu_handwritten", "gpu_faster_rcnn",
                                  "gpu_a3c"])
def test_every_script_defaults_to_the_repeat_protocol(name):
    _, args = _scripts()[name].arguments([])
    rounds = args.rounds if args.rounds is not None else min(r for _, _, r in _scripts()[name].TIMING.values())
    assert harness.check_protocol(rounds, args.processes)


@pytest.mark.parametrize("name, argv", [
    ("gpu_handwritten", ["--models", "resnet"]),
    ("gpu_handwritten", ["--rounds", "0"]),
    ("gpu_recurrent", ["--precisions", "fp16"]),
    ("gpu_programs", ["--executions", "jit"]),
    ("gpu_faster_rcnn", ["--canvas", "608"]),
    ("gpu_faster_rcnn", ["--learning-rate", "0"]),
    ("gpu_a3c", ["--learners", "0"]),
    ("gpu_a3c", ["--contenders", "classic,hogwild"]),
])
def test_bad_arguments_exit_2_naming_the_option(name, argv, capsys):
    with pytest.raises(SystemExit) as e:
        _scripts()[name].arguments(argv)
    assert e.value.code == 2
    assert argv[0].lstrip("-").split("-")[0] in capsys.readouterr().err


def test_result_files_of_one_script_merge_into_one(tmp_path):
    import json
    paths = []
    for execution, t in (("eager", 1.0), ("compiled", 0.5)):
        records = [{"environment": {"gpu": "x"}, "cells": [
            {"model": "m", "precision": "tf32", "execution": execution, "items_per_step": 4,
             "first_loss": {"tbdzoo": 1.0, "b": 1.0}, "checks": {"first_loss_rel_diff": {"b": 0.0}},
             "times": {"tbdzoo": [t * (1 + i)] * 5, "b": [1.2 * t * (1 + i)] * 5},
             "peak_bytes": {"tbdzoo": 1, "b": 2}}]} for i in range(2)]
        paths.append(str(tmp_path / (execution + ".json")))
        with open(paths[-1], "w") as f:
            json.dump(harness.aggregate(records, execution, {"processes": 2}), f)
    merged = harness.merge_files(paths)
    assert [c["execution"] for c in merged["cells"]] == ["eager", "compiled"]
    assert all(c["processes"] == 2 and abs(c["speed"] - 1.2) < 1e-12 for c in merged["cells"])
    assert merged["cells"][0]["checks"] == [{"first_loss_rel_diff": {"b": 0.0}}] * 2
    assert merged["command"] == "eager && compiled" and merged["protocol"] == {"processes": 2}


def test_peaks_measured_in_processes_of_their_own_survive_a_merge(tmp_path):
    """flax_handwritten.py measures memory apart from the timing rounds (their peaks are None)
    and writes it into the aggregate; merging files keeps it."""
    import json
    paths = []
    for model in ("resnet50", "transformer"):
        records = [{"environment": {}, "cells": [
            {"model": model, "precision": "bf16", "execution": "jit", "items_per_step": 1,
             "first_loss": {"tbdzoo": 1.0, "flax": 1.0}, "checks": {},
             "times": {"tbdzoo": [1.0] * 5, "flax": [1.0] * 5},
             "peak_bytes": {"tbdzoo": None, "flax": None}}]}]
        result = harness.aggregate(records, model, {})
        cell = result["cells"][0]
        assert cell["memory"] is None
        for name, peak in (("tbdzoo", 3), ("flax", 2)):     # as flax_handwritten.add_memory
            cell["contenders"][name].update({"peak_bytes": peak, "peak_bytes_processes": [peak]})
        cell["ratios"]["flax"].update({"memory": 1.5, "memory_processes": [1.5]})
        cell["memory"] = 1.5
        paths.append(str(tmp_path / (model + ".json")))
        with open(paths[-1], "w") as f:
            json.dump(result, f)
    merged = harness.merge_files(paths)
    assert [c["memory"] for c in merged["cells"]] == [1.5, 1.5]
    assert merged["cells"][0]["contenders"]["flax"]["peak_bytes"] == 2


def test_a3c_cells_merge_by_learner_count_and_report_frames_per_second():
    from benchmarks import gpu_a3c
    records = []
    for _ in range(2):
        cells = [{"model": "a3c", "device": "cpu", "learners": n, "items_per_step": 1, "unit": "frames/s",
                  "first_loss": {}, "checks": {}, "peak_bytes": {"tbdzoo": None, "classic": None},
                  "times": {"tbdzoo": [1 / (100.0 * n)] * 5, "classic": [1 / (80.0 * n)] * 5}}
                 for n in (1, 4)]
        records.append({"environment": {}, "cells": cells})
    result = harness.aggregate(records, "cmd", {}, key=gpu_a3c.KEY)
    assert [c["learners"] for c in result["cells"]] == [1, 4]
    four = result["cells"][1]
    assert abs(four["contenders"]["tbdzoo"]["throughput"] - 400.0) < 1e-9
    assert abs(four["speed"] - 1.25) < 1e-12 and four["speed_verdict"] == "ahead"
    again = harness.aggregate(harness.records_of(result, gpu_a3c.KEY), "cmd", {}, key=gpu_a3c.KEY)
    assert [c["ratios"] for c in again["cells"]] == [c["ratios"] for c in result["cells"]]


def test_resnet_baseline_holds_tbdzoos_weights_and_takes_its_first_loss():
    """torchvision's ResNet from tbdzoo's weights (tiny blocks, torchvision's 64-wide stem),
    one SGD step each on the same batch: the same loss."""
    import torch

    import tbdzoo
    from benchmarks.gpu_handwritten import ResNetBaseline
    model = tbdzoo.build("resnet50", backend="torch", config="tiny", device="cpu", width=64, batch_size=2,
                         image_size=32)
    batch = model.synthetic_batch(seed=0)
    baseline = ResNetBaseline(model.hparams, model.get_weights(), batch, "cpu", "tf32", False, False)
    theirs = float(baseline.step())
    ours = float(model.train_step(model.prepare_batch(batch)))
    assert abs(ours - theirs) <= 1e-5 * abs(theirs)
    assert isinstance(baseline.opt, torch.optim.SGD)


def test_deepspeech2_baseline_sorted_once_takes_tbdzoos_first_loss():
    import tbdzoo
    from benchmarks.gpu_recurrent import handwritten_step, weight_difference
    model = tbdzoo.build("deepspeech2", backend="torch", config="tiny", device="cpu")
    batch = model.synthetic_batch(seed=0)
    net, _, step = handwritten_step("deepspeech2", model.hparams, model.get_weights(), batch, "cpu", "tf32", False)
    theirs = float(step())
    ours = float(model.train_step(model.prepare_batch(batch)))
    assert abs(ours - theirs) <= 1e-5 * abs(theirs)
    assert weight_difference("deepspeech2", model, net) < 1e-6


def test_marian_baseline_holds_tbdzoos_weights_and_takes_its_first_loss():
    """MarianMTModel from tbdzoo's Transformer weights, epsilon and sinusoid table, dropout off:
    one Adam step each on the same batch, the same loss."""
    pytest.importorskip("transformers")
    import tbdzoo
    from benchmarks.gpu_handwritten import MarianBaseline
    model = tbdzoo.build("transformer", backend="torch", config="tiny", device="cpu", dropout=0.0)
    batch = model.synthetic_batch(seed=0)
    theirs = float(MarianBaseline(model.hparams, model.get_weights(), batch, "cpu", "tf32", False).step())
    ours = float(model.train_step(model.prepare_batch(batch)))
    assert abs(ours - theirs) <= 1e-5 * abs(theirs)


def test_run_cells_records_a_failed_cell_and_runs_the_others(tmp_path, capsys):
    import json
    p = harness.comparison_parser("d", "x.json", warmup=3, models=("a", "b"), overrides={"--batch-size": None})
    harness.add_process_options(p, "x.json")
    args = p.parse_args(["--executions", "eager", "--precisions", "tf32,bf16",
                         "--process-out", str(tmp_path / "rec.json")])
    assert (args.models, args.warmup, args.out) == ("a,b", 3, "x.json") and not hasattr(args, "batch_size")
    seen = []

    def run_cell(model, precision, compiled, device, args):
        seen.append((model, precision, compiled))
        with open(args.process_out) as f:  # the cells before this one are on disk already
            assert len(json.load(f)["cells"]) == len(seen) - 1
        if model == "a" and precision == "bf16":
            raise RuntimeError("no bf16 here")
        return {"model": model, "precision": precision, "execution": "eager", "times": {"tbdzoo": [0.002]},
                "first_loss": {"tbdzoo": 1.5}, "cell_seconds": 1.0}

    assert harness.run_cells(args, "cpu", run_cell, describe=harness.first_losses) == 0
    assert seen == [("a", "tf32", False), ("a", "bf16", False), ("b", "tf32", False), ("b", "bf16", False)]
    with open(args.process_out) as f:
        cells = json.load(f)["cells"]
    assert cells[1] == {"model": "a", "precision": "bf16", "execution": "eager",
                        "error": "RuntimeError: no bf16 here"}
    assert [c.get("precision") for c in cells] == ["tf32", "bf16", "tf32", "bf16"]
    assert "  b tf32 eager: tbdzoo 2.00 ms first loss 1.5 (1s)" in capsys.readouterr().out
    with pytest.raises(ValueError):
        harness.comparison_parser("d", "x.json", warmup=3, overrides={"--no-such": None})


def test_step_op_counts_attribute_a_seq2seq_step_and_put_the_patches_back(capsys):
    """One counted step of each side on the GPU's paths (tiny config): phases on both sides,
    tbdzoo's guard on its own, its forward pass no longer than the hand-written one."""
    from benchmarks import step_op_counts
    from tbdzoo.backends.torch import model as torch_model
    from tbdzoo.backends.torch import ops as torch_ops

    on_host, padded = torch_model.Model._checks_on_host, torch_ops._runs_padded
    assert step_op_counts.main(["--config", "tiny", "--gpu-paths", "--warmup", "1"]) == 0
    assert torch_model.Model._checks_on_host is on_host and torch_ops._runs_padded is padded
    totals = {}
    lines = capsys.readouterr().out.splitlines()
    for line in lines[lines.index("") + 2:]:
        phase, *counts = line.split()
        totals[phase] = [int(c) for c in counts[:2]]
    assert {"forward", "backward", "clip", "optimizer", "all"} <= set(totals)
    assert totals["guard"][0] > 0 and totals["guard"][1] == 0
    assert totals["forward"][0] <= totals["forward"][1]
    assert totals["clip"][0] == totals["clip"][1]
