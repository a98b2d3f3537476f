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
    for i, t in enumerate((1.0, 1.1)):
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
