"""One recurrent layer of a paper model on the JAX backend, forward and backward, in the ways its
loops can be laid out, in one process.

    python3 -m benchmarks.jax_recurrence --out jax_recurrence.json
    python3 -m benchmarks.jax_recurrence --models deepspeech2 --precisions bf16 --rounds 10

The layer is the model's second recurrent layer at its paper config and batch (Deep Speech 2: a
bidirectional GRU of 1,760 units over 785 steps from 3,520 features, batch 8; Seq2Seq: the
decoder's LSTM), with the backend's own modules and weights. Its gradient of a fixed linear
function of the outputs is timed, one compiled program per variant:

- ``jax_derivative``: ``recurrent.plain_scan``, a ``jax.lax.scan`` a direction over the
  cell's step, differentiated by JAX itself (which adds each step's outer product into the
  kernels' gradient inside the backward loop);
- ``own`` variants: the backend's recurrence (``recurrent._recurrence``: both directions in one
  loop, the kernels' gradient one product after it) laid out as ``recurrent.Loop(unroll,
  gates_multiple)``; ``gates_multiple=1`` leaves the backward loop's kernel unpadded;
- ``own_forward``: the backend's layout, the forward pass alone.

Rounds interleave the variants; each variant's figure is the median over rounds of the mean
call time in a round. Beside each: XLA's temporary bytes for the program, and the bytes its pad
operations write in one iteration of its loops (a loop-invariant kernel padded at every step).
Run from the repository root with the interpreter that has JAX and Flax.
"""
import argparse
import json
import platform
import re
import statistics
import sys
import time

MODELS = ("deepspeech2", "seq2seq")
PRECISIONS = ("bf16", "tf32")


def _layer(model, config, precision, device):
    """(the backend's model, its second recurrent node's name, that node's input shape)."""
    from tbdzoo.backends.registry import build_native

    m = build_native(model, "jax", config=config, device=device, precision=precision)
    graph = m.spec
    names = [n for n, node in graph.nodes.items() if node.op in ("gru", "lstm")]
    name = names[1] if len(names) > 1 else names[0]
    shape = (m.hparams["batch_size"],) + tuple(graph.shape_of(graph.nodes[name].inputs[0]))
    return m, name, shape


def _variants(module, shape, dtype, seed):
    """{name: (function of (state, x), the gradient or the forward)} and their inputs."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from tbdzoo.backends.jax import recurrent

    n, t = shape[0], shape[1]
    lengths = jnp.asarray([t - (i * t) // (4 * n) for i in range(n)])
    keys = jax.random.split(jax.random.PRNGKey(seed), 2)
    x = jax.random.normal(keys[0], shape).astype(dtype)
    directions = len(module.directions)
    hidden = module.l0.fw.hidden_features
    weights = jax.random.normal(keys[1], (n, t, hidden * directions)).astype(dtype)
    graphdef, state = nnx.split(module)

    def layer(run):
        def loss(state, x):
            m = nnx.merge(graphdef, state)
            mask = recurrent.valid(lengths, t)[:, :, None]
            cells = [getattr(m.l0, d) for d in m.directions]
            ys = jnp.concatenate([y * mask for y in run(cells, x)], axis=-1)
            return (ys.astype(jnp.float32) * weights).sum()
        return loss

    def own(loop):
        return lambda cells, x: recurrent._run(cells, x, lengths, loop)

    grad = lambda run: jax.grad(layer(run), argnums=(0, 1))   # noqa: E731
    made = {"jax_derivative": grad(lambda cells, x: recurrent.plain_scan(cells, x, lengths))}
    for unroll, multiple in ((1, 1), (1, 256), (4, 256), (8, 256)):
        made["own_unroll{}_gates{}".format(unroll, multiple)] = grad(own(recurrent.Loop(unroll,
                                                                                        multiple)))
    made["own_forward"] = layer(own(recurrent.LOOP))
    return made, (state, x)


_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "s32": 4, "pred": 1}


def _padded_in_loops(text):
    """Bytes that the pad operations inside an optimised XLA program's loops write in one
    iteration (a loop-invariant kernel padded at every step shows here)."""
    total = 0
    for line in text.splitlines():
        if "while/body" not in line or not re.search(r"\bpad\(|pad_fusion", line):
            continue
        shape = re.match(r"\s*%\S+ = (\w+)\[([\d,]*)\]", line)
        if shape:
            size = 1
            for d in filter(None, shape.group(2).split(",")):
                size *= int(d)
            total += size * _BYTES.get(shape.group(1), 4)
    return total


def run_cell(model, config, precision, device, rounds, calls):
    import jax

    from tbdzoo.backends.jax.native import lookup

    m, name, shape = _layer(model, config, precision, device)
    module = lookup(m.native, name)
    dtype = "bfloat16" if precision == "bf16" else "float32"
    made, args = _variants(module, shape, dtype, m.seed)
    compiled, cells = {}, {}
    with m._matmul_precision():
        for variant, function in made.items():
            program = jax.jit(function).lower(*args).compile()
            memory = program.memory_analysis()
            compiled[variant] = program
            cells[variant] = {"temporary_bytes": int(memory.temp_size_in_bytes),
                              "padded_bytes_per_iteration": _padded_in_loops(program.as_text()),
                              "round_ms": []}
            for _ in range(2):
                jax.block_until_ready(program(*args))
    for _ in range(rounds):
        for variant, program in compiled.items():
            start = time.perf_counter()
            for _ in range(calls):
                out = program(*args)
            jax.block_until_ready(out)
            cells[variant]["round_ms"].append(1e3 * (time.perf_counter() - start) / calls)
    for cell in cells.values():
        cell["median_ms"] = statistics.median(cell["round_ms"])
    return {"model": model, "config": config, "precision": precision, "layer": name,
            "input_shape": list(shape), "variants": cells}


def _environment():
    import flax
    import jax

    device = jax.devices()[0]
    return {"jax": jax.__version__, "flax": flax.__version__, "python": platform.python_version(),
            "device": device.device_kind, "platform": device.platform}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="jax_recurrence.json")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--precisions", default=",".join(PRECISIONS))
    parser.add_argument("--config", default="paper")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5, help="calls per variant in a round")
    args = parser.parse_args(argv)
    record = {"benchmark": "jax_recurrence", "command": " ".join(["python3 -m benchmarks."
                                                                  "jax_recurrence"] + sys.argv[1:]),
              "environment": _environment(), "cells": []}
    for model in args.models.split(","):
        for precision in args.precisions.split(","):
            print("{} {}".format(model, precision), flush=True)
            cell = run_cell(model, args.config, precision, args.device, args.rounds, args.calls)
            for variant, figures in cell["variants"].items():
                print("  {:22s} {:9.2f} ms  temporaries {:9.1f} MiB  padded in loops {:8.2f} MiB"
                      .format(variant, figures["median_ms"], figures["temporary_bytes"] / 2 ** 20,
                              figures["padded_bytes_per_iteration"] / 2 ** 20), flush=True)
            record["cells"].append(cell)
            with open(args.out, "w") as f:    # rewritten after each cell: a cut run keeps them
                json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
