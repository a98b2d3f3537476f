"""Where the JAX backend's step time goes, against the hand-written Flax step, in one process.

    python3 -m benchmarks.jax_step_anatomy --out step_anatomy.json
    python3 -m benchmarks.jax_step_anatomy --models resnet50 --precisions bf16,tf32 --steps 30

For each model and precision (the paper config at its paper batch on a GPU, the CPU benchmark
batch on a CPU): tbdzoo's ``train_step`` and the Flax step of benchmarks/flax_handwritten.py,
each timed two ways in interleaved rounds: ``sync``, the loss read back every step (the anchors'
protocol, host work and device time add up), and ``queued``, ``--steps`` steps dispatched and
then waited for (the host's work hides behind the device's where it is shorter). A third model
of tbdzoo's with the non-finite guard off (``guard_steps = False``) prices the guard, and a
fourth takes the guard as one ``nnx.cond`` around the optimizer's update (Optax's
``apply_if_finite`` way) where the backend selects every variable. ``flax_spin_sync`` is Flax's
synchronous step polling for its loss, as tbdzoo's does on a GPU, where ``flax_sync`` waits as
``float()`` does. Then one synchronous tbdzoo step in its parts: the dropout key, the check of
the tree for a user's changes, reading the variables' values (both twice: first right after the
last step's wait, then warm), dispatching the compiled program, setting the new values, and
waiting for the loss; and the number of fusions, library calls (convolutions and products),
transposes and copies in each side's optimised XLA program, with the guard and without it
(``--hlo-dir`` writes the programs). Medians over rounds; run from the repository root with the
interpreter that has JAX and Flax.
"""
import argparse
import json
import re
import statistics
import sys
import time

import numpy as np

from benchmarks import harness

MODELS = ("resnet50", "transformer")


def _count(text):
    return {"fusions": len(re.findall(r"= \S+ fusion\(", text)),
            "custom_calls": len(re.findall(r"custom-call\(", text)),
            "transposes": len(re.findall(r" transpose\(", text)),
            "copies": len(re.findall(r" copy\(", text))}


def _cond_guard_body(model):
    """The model's update with the guard as one ``nnx.cond``: the optimizer's update (or the
    restore of the running statistics the forward pass moved) in a branch, where the backend
    computes both and selects every variable."""
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from tbdzoo.backends.jax import ops

    def update(m, optimizer, batch, lr, key):
        before = nnx.as_pure(nnx.state(m, nnx.BatchStat))

        def loss_fn(mm):
            with ops.running(ops.Context(True, key)) as ctx:
                ctx.root = mm
                return model._loss(mm, batch)
        loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.Param))(m)
        bad = ~jnp.isfinite(loss + optax.global_norm(grads))

        def skip(m, optimizer, grads, before):
            nnx.update(m, before)

        def apply(m, optimizer, grads, before):
            optimizer.update(m, grads, learning_rate=lr)
        nnx.cond(bad, skip, apply, m, optimizer, grads, before)
        return loss, bad
    return update


def _spin(value):
    """Wait for ``value`` by polling (the waiting core stays awake), then read it."""
    while not value.is_ready():
        pass
    return float(value)


def measure(name, precision, device, steps, rounds, hlo_dir=None):
    import jax

    from benchmarks import flax_handwritten as fh
    from tbdzoo.backends.registry import build_native
    from tbdzoo.models import get_model
    sizes = {} if device != "cpu" else {"batch_size": get_model(name).benchmark.cpu_batch_size}

    def ours(guard):
        model = build_native(name, "jax", config="paper", device=device, precision=precision,
                             **sizes)
        model.guard_steps = guard
        return model, model.prepare_batch(model.synthetic_batch(seed=0))

    model, prepared = ours(True)
    unguarded, unguarded_batch = ours(False)
    conditional, conditional_batch = ours(True)
    conditional._bodies[None] = _cond_guard_body(conditional)
    batch = model.synthetic_batch(seed=0)
    flax = fh.FlaxStep(name, model.hparams, model.get_weights(), batch, fh.jax_device(device),
                       precision)

    def flax_queued():
        with fh.matmul_precision(precision):
            for _ in range(steps):
                _, flax.state = flax._step(flax.state, flax.batch)
        flax.block()

    def flax_spin():
        with fh.matmul_precision(precision):
            loss, flax.state = flax._step(flax.state, flax.batch)
        _spin(loss)

    def queued(m, b):
        def run():
            for _ in range(steps):
                m.train_step(b, sync=False)
            m.synchronize()
        return run

    def synced(step):
        def run():
            for _ in range(steps):
                step()
        return run

    contenders = {
        "tbdzoo_sync": synced(lambda: model.train_step(prepared)),
        "tbdzoo_queued": queued(model, prepared),
        "flax_sync": synced(flax.step),
        "flax_queued": flax_queued,
        "tbdzoo_unguarded_sync": synced(lambda: unguarded.train_step(unguarded_batch)),
        "tbdzoo_unguarded_queued": queued(unguarded, unguarded_batch),
        "tbdzoo_cond_guard_sync": synced(lambda: conditional.train_step(conditional_batch)),
        "tbdzoo_cond_guard_queued": queued(conditional, conditional_batch),
        "flax_spin_sync": synced(flax_spin),
    }
    for run in contenders.values():      # compiles, then warms up
        run()
    times = {k: [] for k in contenders}
    for _ in range(rounds):
        for k, run in contenders.items():
            start = time.perf_counter()
            run()
            times[k].append((time.perf_counter() - start) / steps)

    parts = {k: [] for k in ("key", "tree_check", "read_values", "tree_check_again",
                             "read_values_again", "dispatch", "set_values", "wait", "total")}
    lr = np.float32(model.learning_rate())
    with model._matmul_precision():
        for _ in range(steps * rounds):
            t0 = time.perf_counter()
            key = model._step_key()
            t1 = time.perf_counter()
            held = model._bound_update(None)
            t2 = time.perf_counter()
            values = held._values()
            t3 = time.perf_counter()
            model._bound_update(None)     # the same two again, warm: is the first slow?
            t3a = time.perf_counter()
            values = held._values()
            t3b = time.perf_counter()
            out, new = held.jitted(values, prepared.native, lr, key)
            t4 = time.perf_counter()
            held._set(new)
            t5 = time.perf_counter()
            jax.device_get(out)
            t6 = time.perf_counter()
            model.step_count += 1
            for k, a, b in (("key", t0, t1), ("tree_check", t1, t2), ("read_values", t2, t3),
                            ("tree_check_again", t3, t3a), ("read_values_again", t3a, t3b),
                            ("dispatch", t3b, t4), ("set_values", t4, t5), ("wait", t5, t6),
                            ("total", t0, t6)):
                parts[k].append(b - a)
    with model._matmul_precision():
        ours_hlo = held.lower(prepared.native, lr, key).compile().as_text()
        unguarded_hlo = unguarded._bound_update(None).lower(
            unguarded_batch.native, lr, key).compile().as_text()
    with fh.matmul_precision(precision):
        flax_hlo = flax._step.lower(flax.state, flax.batch).compile().as_text()
    if hlo_dir:
        import gzip
        import os
        os.makedirs(hlo_dir, exist_ok=True)
        for side, text in (("tbdzoo", ours_hlo), ("tbdzoo_unguarded", unguarded_hlo),
                           ("flax", flax_hlo)):
            with gzip.open(os.path.join(hlo_dir, "{}_{}_{}.hlo.gz".format(
                    name, precision, side)), "wt") as f:
                f.write(text)
    ms = lambda xs: 1e3 * statistics.median(xs)    # noqa: E731
    return {"model": name, "precision": precision, "device": str(jax.devices()[0].device_kind),
            "batch_size": model.hparams["batch_size"], "steps": steps, "rounds": rounds,
            "step_ms": {k: ms(v) for k, v in times.items()},
            "step_ms_rounds": {k: [1e3 * x for x in v] for k, v in times.items()},
            "tbdzoo_sync_step_parts_ms": {k: ms(v) for k, v in parts.items()},
            "variables": len(held.variables),
            "xla_program": {"tbdzoo": _count(ours_hlo),
                            "tbdzoo_unguarded": _count(unguarded_hlo),
                            "flax": _count(flax_hlo)}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet50")
    p.add_argument("--precisions", default="bf16")
    p.add_argument("--device", default="cuda:0", help="cuda:N or cpu")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out")
    p.add_argument("--hlo-dir", help="write each side's optimised XLA program here (gzip)")
    args = p.parse_args(argv)
    harness.check_choices(p, args, models=MODELS, precisions=("fp32", "tf32", "bf16"))
    models = args.models.split(",")
    records = []
    for name in models:
        for precision in args.precisions.split(","):
            record = measure(name, precision, args.device, args.steps, args.rounds,
                             args.hlo_dir)
            records.append(record)
            print(json.dumps({k: record[k] for k in ("model", "precision", "step_ms",
                                                     "tbdzoo_sync_step_parts_ms")}), flush=True)
            if args.out:    # rewritten after each cell: a cut run keeps what it measured
                with open(args.out, "w") as f:
                    json.dump({"command": "python3 -m benchmarks.jax_step_anatomy " + " ".join(
                        argv if argv is not None else sys.argv[1:]), "records": records}, f,
                        indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
