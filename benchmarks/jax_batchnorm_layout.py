"""The JAX backend's BatchNorm in the canonical channels-first layout (the backend's) or computed
channels-last between its channels-last convolutions, on a GPU, one variant per process.

    python3 -m benchmarks.jax_batchnorm_layout --out benchmarks/results/h100_jax_batchnorm_layout.json
    python3 -m benchmarks.jax_batchnorm_layout --models resnet50 --precision bf16 --steps 30

The backend computes BatchNorm over axis 1 of (N, C, H, W) between convolutions that run
channels-last, so XLA's program transposes around each BatchNorm (tbdzoo/backends/jax/ops.py);
summed channels-last, Inception-v3's float32 gradients leave the consistency tolerance
(docs/consistency.md). This measures what the transposes cost: each variant of each model in a
fresh process, the paper config at its paper batch, ``--rounds`` rounds of ``--steps`` steps
through ``train_step`` (which reads the loss back every step, as the Flax anchors' protocol does:
benchmarks/flax_handwritten.py), then the device's peak bytes. Run with the interpreter that has
JAX for the GPU, from the repository root.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

VARIANTS = ("channels_first", "channels_last")
MODELS = ("resnet50", "inception_v3")


def channels_last_batchnorm():
    """ops.batchnorm computed channels-last on images: the same statistics, running update and
    dtype rule as layers.BatchNorm, reduced over (N, H, W) of (N, H, W, C)."""
    import jax
    import jax.numpy as jnp

    from tbdzoo.backends.jax import ops
    backend = ops.batchnorm

    def batchnorm(inputs, layer, a, ctx):
        x = inputs[0]
        if x.ndim != 4 or ops.statistics_shared() or not layer.tracks:
            return backend(inputs, layer, a, ctx)

        def normalise(y):
            returned, y = y.dtype, y.astype(jnp.float32)
            if ctx.training:
                mean = y.mean(axis=(0, 1, 2))
                var = ((y - mean) ** 2).mean(axis=(0, 1, 2))
                n = y.size // y.shape[-1]
                keep = layer.momentum
                layer.mean[...] = keep * layer.mean[...] + (1 - keep) * jax.lax.stop_gradient(mean)
                layer.var[...] = keep * layer.var[...] + (1 - keep) * jax.lax.stop_gradient(
                    var * n / max(n - 1, 1))
            else:
                mean, var = layer.mean[...], layer.var[...]
            inv = layer.scale[...] * jax.lax.rsqrt(var + layer.epsilon)
            return ((y - mean) * inv + layer.bias[...]).astype(returned)
        return ops.channels_last(normalise, x)
    return batchnorm


def measure(model_name, variant, precision, rounds, steps, warmup):
    import jax

    from tbdzoo.backends.jax import ops
    from tbdzoo.backends.registry import build_native
    if variant == "channels_last":
        ops.batchnorm = channels_last_batchnorm()
    model = build_native(model_name, "jax", config="paper", device="cuda:0", precision=precision)
    batch = model.prepare_batch(model.synthetic_batch(seed=0))
    for _ in range(warmup):
        model.train_step(batch)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            loss = model.train_step(batch)
        times.append((time.perf_counter() - start) / steps)
    stats = jax.devices("gpu")[0].memory_stats() or {}
    return {"model": model_name, "variant": variant, "precision": precision,
            "batch_size": model.hparams["batch_size"], "step_s_median": statistics.median(times),
            "step_s_rounds": times, "peak_bytes": stats.get("peak_bytes_in_use"),
            "last_loss": loss}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--precision", default="bf16", choices=("fp32", "tf32", "bf16"))
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out")
    p.add_argument("--one", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        record = measure(*args.one, args.precision, args.rounds, args.steps, args.warmup)
        print("RECORD " + json.dumps(record), flush=True)
        return 0
    models = args.models.split(",")
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        p.error("--models: unknown {}; known: {}".format(", ".join(unknown), ", ".join(MODELS)))
    records = []
    for model_name in models:
        for variant in VARIANTS:
            argv_one = [sys.executable, "-m", "benchmarks.jax_batchnorm_layout", "--one", model_name,
                        variant, "--precision", args.precision, "--rounds", str(args.rounds),
                        "--steps", str(args.steps), "--warmup", str(args.warmup)]
            proc = subprocess.run(argv_one, capture_output=True, text=True)
            lines = [l for l in proc.stdout.splitlines() if l.startswith("RECORD ")]
            record = json.loads(lines[-1][len("RECORD "):]) if lines else {
                "model": model_name, "variant": variant, "error": proc.stderr[-2000:]}
            records.append(record)
            print(model_name, variant, "{:.2f} ms".format(1e3 * record["step_s_median"])
                  if "step_s_median" in record else "FAILED", flush=True)
            if args.out:    # rewritten after each process: a cut run keeps what it measured
                with open(args.out, "w") as f:
                    json.dump({"command": "python3 -m benchmarks.jax_batchnorm_layout " +
                               " ".join(argv if argv is not None else sys.argv[1:]),
                               "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
