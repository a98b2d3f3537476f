"""The cost of the non-finite step guard (docs/backends.md, "Atomic steps") on one GPU: the
same model timed with the guard on and off (``model.guard_steps``, the benchmarking switch),
in interleaved rounds, PyTorch backend.

    python3 benchmarks/gpu_step_guard.py --rounds 5 --steps 20 --warmup 2

Cells: ResNet-50 bf16 eager and compiled at batch 256, Transformer bf16 eager at batch 128 x
128 tokens (benchmarks/gpu_handwritten.py's shapes). Each cell: warm-up steps in both modes
(compilation included), then ``--rounds`` rounds, each timing ``--steps`` queued steps
(``sync=False``, one synchronisation a round) of each mode in alternating order. Reports every
round, the median and min-max per mode, and the cost as the ratio of the medians (on / off).
Then a check on the GPU: a step made non-finite (learning rate 1e30) is skipped on the device and
reported at the synchronisation, with the
weights unchanged. One JSON document goes to stdout and to ``--out``.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np
import torch

import tbdzoo
from tbdzoo.errors import NonFiniteStepError

SHAPES = {"resnet50": {"batch_size": 256},  # benchmarks/gpu_handwritten.py's, the paper's
          "transformer": {"batch_size": 128, "src_len": 128, "tgt_len": 128}}
CELLS = [("resnet50", "bf16", "eager"), ("resnet50", "bf16", "compiled"),
         ("transformer", "bf16", "eager")]


def timed(model, batch, steps):
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        model.train_step(batch, sync=False)
    model.synchronize()
    return (time.perf_counter() - start) / steps


def cell(name, precision, execution, rounds, steps, warmup):
    m = tbdzoo.build(name, backend="torch", precision=precision, execution=execution,
                     **SHAPES[name])
    batch = m.prepare_batch(m.synthetic_batch(seed=0))
    for guard in (True, False):
        m.guard_steps = guard
        for _ in range(warmup):
            m.train_step(batch)
    times = {"on": [], "off": []}
    for r in range(rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        for guard in order:
            m.guard_steps = guard
            times["on" if guard else "off"].append(timed(m, batch, steps))
    m.guard_steps = True
    med = {k: statistics.median(v) for k, v in times.items()}
    row = {"model": name, "precision": precision, "execution": execution,
           "batch": m.hparams["batch_size"], "steps_per_round": steps, "rounds": rounds,
           "step_s": times, "median_s": med,
           "min_max_s": {k: [min(v), max(v)] for k, v in times.items()},
           "cost": med["on"] / med["off"] - 1.0,
           "peak_bytes": torch.cuda.max_memory_allocated()}
    del m, batch
    torch.cuda.empty_cache()
    return row


def nonfinite_check():
    """A non-finite step on the GPU, queued: skipped there, raised at synchronize()."""
    m = tbdzoo.build("resnet50", backend="torch", config="tiny", precision="bf16", lr=1e30)
    batch = m.prepare_batch(m.synthetic_batch(seed=0))
    first = m.train_step(batch)
    before = m.get_weights()
    m.train_step(batch, sync=False)
    m.train_step(batch, sync=False)
    out = {"first_loss": first}
    try:
        m.synchronize()
        out["raised"] = False
    except NonFiniteStepError as e:
        out.update(raised=True, objective=e.objective, step=e.step, message=str(e))
    after = m.get_weights()
    out["weights_unchanged"] = all(np.array_equal(before[k], after[k]) for k in before)
    out["step_count"] = m.step_count
    try:
        m.train_step(batch)
        out["sync_raised"] = False
    except NonFiniteStepError as e:
        out.update(sync_raised=True, sync_step=e.step)
    out["weights_unchanged_after_sync_step"] = all(
        np.array_equal(before[k], v) for k, v in m.get_weights().items())
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cells", default=",".join("{}:{}:{}".format(*c) for c in CELLS))
    p.add_argument("--out", default=os.path.join(HERE, "results", "h200_step_guard.json"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_step_guard.py needs a CUDA GPU; PyTorch sees none")
    doc = {"command": " ".join(["python3 benchmarks/gpu_step_guard.py"] + sys.argv[1:]),
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "nonfinite_check": nonfinite_check(), "rows": []}
    print(json.dumps(doc["nonfinite_check"]), flush=True)
    for spec in args.cells.split(","):
        row = cell(*spec.split(":"), rounds=args.rounds, steps=args.steps, warmup=args.warmup)
        print(json.dumps(row), flush=True)
        doc["rows"].append(row)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
