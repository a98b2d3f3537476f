"""MXNet's paper-config train step with training-mode batch norm in float64 (the backend's) or
MXNet's fused float32 operator (less exact: docs/backends.md), one variant per process.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.mxnet_batchnorm_step resnet50 --batch 4 \\
        --batchnorm fused

Prints the fastest and the median of ``--steps`` timed steps after two warm-up steps, in
seconds; run the variants alternately, each in a fresh process.
"""
import argparse
import time

from tbdzoo.backends.mxnet import ops
from tbdzoo.backends.registry import build


def fused_batchnorm(exact):
    """ops.batchnorm with MXNet's fused float32 BatchNorm in the train blocks."""
    def batchnorm(F, inputs, p, a, ctx):
        if not (a["track_running_stats"] and ctx.exact_bn_stats) or ctx.two_pass_statistics:
            return exact(F, inputs, p, a, ctx)
        out = F.BatchNorm(inputs[0], p["gamma"], p["beta"], p["running_mean"],
                          p["running_var"], momentum=1.0, output_mean_var=True, eps=a["eps"],
                          fix_gamma=False, use_global_stats=False, axis=1)
        variance = F.reciprocal(F.square(out[2])) - a["eps"]
        ctx.bn_stats.append((F.BlockGrad(out[1]), F.BlockGrad(variance)))
        return out[0]
    return batchnorm


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--batchnorm", choices=["float64", "fused"], default="float64")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    if args.batchnorm == "fused":
        ops.batchnorm = fused_batchnorm(ops.batchnorm)
    model = build(args.model, "mxnet", seed=0)
    batch = model.synthetic_batch(seed=0, batch_size=args.batch)
    for _ in range(2):
        model.train_step(batch)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        model.train_step(batch)
        times.append(time.perf_counter() - start)
    times.sort()
    print("{} batch {} {}: fastest {:.3f} s, median {:.3f} s".format(
        args.model, args.batch, args.batchnorm, times[0], times[len(times) // 2]))


if __name__ == "__main__":
    main()
