"""The profiler's own cost: the same run with and without the samplers, interleaved.

    .venv/bin/python -m benchmarks.profiler_overhead --model resnet50 --config tiny
    python3 -m benchmarks.profiler_overhead --model resnet50 --batch-size 256 --precision bf16   # on a GPU

Each round profiles the model once with samplers (CPU meter, and the NVML/GPM sampler thread
on a GPU) and once without, alternating which goes first; the overhead is the ratio of the
median step times. The target is under 2%.
"""
import argparse
import json
import statistics
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--backend", default="torch")
    p.add_argument("--config", default="paper")
    p.add_argument("--batch-size", type=int)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--out")
    args = p.parse_args()
    from tbdzoo.backends.registry import build_native
    from tbdzoo.profiling.profile import profile
    overrides = {"precision": args.precision}
    if args.batch_size:
        overrides["batch_size"] = args.batch_size
    model = build_native(args.model, args.backend, config=args.config, **overrides)
    batch = model.synthetic_batch()
    medians = {True: [], False: []}
    for r in range(args.rounds):
        for samplers in ((True, False) if r % 2 == 0 else (False, True)):
            record = profile(model, steps=args.steps, warmup=2, repeats=1, batch=batch, samplers=samplers)
            medians[samplers].append(record["step_time"]["median"])
    on, off = statistics.median(medians[True]), statistics.median(medians[False])
    result = {"model": args.model, "backend": args.backend, "device": model.device,
              "batch_size": model.hparams["batch_size"], "precision": args.precision,
              "step_s_with_samplers": medians[True], "step_s_without": medians[False],
              "overhead": on / off - 1, "gpu_samples": record.get("gpu")}
    print("{} on {} ({}): step {:.4f} s with samplers, {:.4f} s without: overhead {:+.2%}".format(
        args.model, args.backend, model.device, on, off, result["overhead"]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
