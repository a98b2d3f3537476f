"""The JAX backend's BatchNorm computed channels-last (the backend's) or in the canonical
channels-first layout, on a GPU, one variant per process.

    python3 -m benchmarks.jax_batchnorm_layout --out benchmarks/results/h100_jax_batchnorm_layout.json
    python3 -m benchmarks.jax_batchnorm_layout --models resnet50 --precision bf16 --steps 30

The backend's BatchNorm takes images (N, C, H, W) and normalises them channels-last, as the
convolutions around it run, so XLA's program has no transposes around it (tbdzoo/backends/jax/
layers.py); the other variant reduces over axes (0, 2, 3) of (N, C, H, W), with the transposes
that brings. Each variant of each model runs in a fresh process: the paper config at its paper
batch, ``--rounds`` rounds of ``--steps`` steps through ``train_step`` (which reads the loss back
every step, as the Flax anchors' protocol does: benchmarks/flax_handwritten.py), then the
device's peak bytes. Run with the interpreter that has JAX for the GPU, from the repository root.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time

from benchmarks import harness

VARIANTS = ("channels_first", "channels_last")
MODELS = ("resnet50", "inception_v3")


def channels_first_batchnorm():
    """The backend's BatchNorm (same statistics, running update and dtype rule) computed on
    (N, C, H, W), reduced over axes (0, 2, 3)."""
    import jax
    import jax.numpy as jnp

    from tbdzoo.backends.jax import layers, ops

    def call(self, x, use_running_average=None, *, mask=None):
        running = self.use_running_average if use_running_average is None else use_running_average
        returned, x = x.dtype, ops.float32(x)
        axes, shape = (0, 2, 3), (1, -1, 1, 1)
        if running:
            mean, var = self.mean[...], self.var[...]
        else:
            # the backend's one-pass moments (layers._moments), reduced over (N, H, W) in place
            k = jax.lax.stop_gradient(x[0, :, 0, 0]).reshape(shape)
            d = x - k
            shifted = d.mean(axis=axes)
            var = jnp.maximum((d * d).mean(axis=axes) - shifted * shifted, 0.0)
            mean = k.reshape(-1) + shifted
            n = x.size // x.shape[1]
            keep = self.momentum
            self.mean[...] = keep * self.mean[...] + (1 - keep) * jax.lax.stop_gradient(mean)
            self.var[...] = keep * self.var[...] + (1 - keep) * jax.lax.stop_gradient(
                var * n / max(n - 1, 1))
        inv = self.scale[...] * jax.lax.rsqrt(var + self.epsilon)
        y = (x - mean.reshape(shape)) * inv.reshape(shape) + self.bias[...].reshape(shape)
        return y.astype(returned)
    layers.BatchNorm.__call__ = call


def measure(model_name, variant, precision, rounds, steps, warmup, device):
    import jax

    from tbdzoo.backends.registry import build_native
    if variant == "channels_first":
        channels_first_batchnorm()
    sizes = {}
    if device == "cpu":     # the model's CPU benchmark batch
        from tbdzoo.models import get_model
        sizes["batch_size"] = get_model(model_name).benchmark.cpu_batch_size
    model = build_native(model_name, "jax", config="paper", device=device, precision=precision,
                         **sizes)
    batch = model.prepare_batch(model.synthetic_batch(seed=0))
    for _ in range(warmup):
        model.train_step(batch)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps):
            loss = model.train_step(batch)
        times.append((time.perf_counter() - start) / steps)
    stats = (jax.devices("gpu")[0].memory_stats() if device != "cpu" else None) or {}
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
    p.add_argument("--device", default="cuda:0", help="cuda:0 (the paper batch) or cpu (the "
                   "model's CPU benchmark batch)")
    p.add_argument("--out")
    p.add_argument("--one", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        record = measure(*args.one, args.precision, args.rounds, args.steps, args.warmup,
                         args.device)
        print("RECORD " + json.dumps(record), flush=True)
        return 0
    harness.check_choices(p, args, models=MODELS, precisions=None)
    models = args.models.split(",")
    records = []
    for model_name in models:
        for variant in VARIANTS:
            argv_one = [sys.executable, "-m", "benchmarks.jax_batchnorm_layout", "--one", model_name,
                        variant, "--precision", args.precision, "--rounds", str(args.rounds),
                        "--steps", str(args.steps), "--warmup", str(args.warmup),
                        "--device", args.device]
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
