"""tbdzoo's PyTorch training step on one GPU, for models that have no hand-written contender
here yet (docs/gpu-comparisons.md): throughput, step time and peak allocator memory per precision.

    python3 benchmarks/gpu_steps.py --models seq2seq,deepspeech2 --precisions bf16,tf32

Each model at its paper config and batch, 3 warm-up steps, then ``--repeats`` rounds of
``--steps`` steps; the median round is reported. One JSON row per cell goes to stdout and to
``--out``.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch

import tbdzoo


def cell(model, precision, steps, repeats):
    m = tbdzoo.build(model, backend="torch", precision=precision)
    raw = m.synthetic_batch(seed=0)
    items = m.model_def.items(m.hparams, raw)
    batch = m.prepare_batch(raw)
    for _ in range(3):
        m.train_step(batch)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    rounds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            m.train_step(batch)
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - start) / steps)
    step = sorted(rounds)[len(rounds) // 2]
    return {"model": model, "precision": precision, "batch": m.hparams["batch_size"],
            "step_s": rounds, "step_s_median": step, "items_per_step": items,
            "throughput": items / step, "unit": m.model_def.unit,
            "peak_bytes": torch.cuda.max_memory_allocated()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="seq2seq,deepspeech2")
    p.add_argument("--precisions", default="bf16,tf32")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=os.path.join(HERE, "results", "gpu_steps.json"))
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_steps.py needs a CUDA GPU; PyTorch sees none")
    rows = []
    for model in args.models.split(","):
        for precision in args.precisions.split(","):
            row = cell(model, precision, args.steps, args.repeats)
            print(json.dumps(row), flush=True)
            rows.append(row)
    with open(args.out, "w") as f:
        json.dump({"command": " ".join(["benchmarks/gpu_steps.py"] + sys.argv[1:]),
                   "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
