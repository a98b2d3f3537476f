"""What the JAX backend's compiled training step holds in XLA's temporaries, beside the
hand-written Flax step where there is one, from XLA's own buffer assignment.

    python3 -m benchmarks.jax_buffers --models transformer --precision bf16 --out buffers.json
    python3 -m benchmarks.jax_buffers --models faster_rcnn --precision tf32 --top 20

For each model (the paper config at its paper batch on a GPU, the CPU benchmark batch on a CPU)
the step is compiled, in a child process, with ``--xla_dump_to`` into a fresh folder and JAX's
compilation cache off (a cached program is not compiled, so not dumped). Each dumped program's
``*buffer-assignment.txt`` names its temporary allocation and every value placed in it, with
its shape and size; values whose lifetimes do not overlap share bytes, so their sizes add up to
more than the allocation. Printed and written for each training program (a training program
such as Faster R-CNN's has one an update): the allocation's size, its largest values,
and the values' bytes summed by shape and dtype. The peak is the allocation's size plus the
step's arguments and outputs (weights, optimizer state, batch), which ``tbd run`` reports as
``xla_arguments`` and ``xla_outputs``. Run from the repository root with the interpreter that
has JAX and Flax.
"""
import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

# the programs' names: tbdzoo's updates (one a phase, in a training program) and the Flax step
SIDES = {"jit_pure": "tbdzoo", "jit_train_step": "flax"}
_TEMP = re.compile(r"^allocation \d+: size (\d+), (?:page \d+, )?preallocated-temp:\n((?: value:.*\n)*)",
                   re.M)
_VALUE = re.compile(r"value: <\d+ (\S+) @\d+> \(size=(\d+),offset=(\d+)\): (\S+)")


def temporaries(path, top):
    """The temporary allocation of one ``buffer-assignment.txt``: its bytes, its ``top``
    largest values, and its values' bytes by shape; None where it has none."""
    with open(path) as f:
        found = _TEMP.search(f.read())
    if found is None:
        return None
    values = [(name, int(size), int(offset), shape.split("{")[0])
              for name, size, offset, shape in _VALUE.findall(found.group(2))]
    by_shape = collections.Counter()
    for _, size, _, shape in values:
        by_shape[shape] += size
    largest = sorted(values, key=lambda v: -v[1])[:top]
    return {"program": os.path.basename(path).split(".")[1],
            "temporary_bytes": int(found.group(1)), "values": len(values),
            "largest": [{"value": n, "bytes": s, "offset": o, "shape": sh}
                        for n, s, o, sh in largest],
            "bytes_by_shape": dict(by_shape.most_common(top))}


def compile_steps(model_name, config, precision, device, flax_side):
    """Compile tbdzoo's training step (and, with ``flax_side``, the hand-written Flax step) of
    ``config``; returns the batch size."""
    from benchmarks import flax_handwritten
    from tbdzoo.backends.registry import build_native
    from tbdzoo.models import get_model
    sizes = {} if device.startswith("cuda") or config != "paper" else \
        {"batch_size": get_model(model_name).benchmark.cpu_batch_size}
    model = build_native(model_name, "jax", config=config, device=device, precision=precision,
                         **sizes)
    batch = model.synthetic_batch(seed=0)
    model.measure_memory(model.prepare_batch(batch))      # compiles every update
    if flax_side:
        side = flax_handwritten.FlaxStep(model_name, model.hparams, model.get_weights(), batch,
                                         flax_handwritten.jax_device(device), precision)
        with flax_handwritten.matmul_precision(precision):
            side._step.lower(side.state, side.batch).compile()
    return model.hparams["batch_size"]


def run(model_name, config, precision, device, top):
    with tempfile.TemporaryDirectory(prefix="tbdzoo-xla-") as dump:   # every program's HLO
        return _run_dumped(model_name, config, precision, device, top, dump)


def _run_dumped(model_name, config, precision, device, top, dump):
    from benchmarks import flax_handwritten
    # a child process: XLA reads its flags once, when the backend starts
    code = ("import sys; sys.path.insert(0, {!r}); from benchmarks import jax_buffers; "
            "print(jax_buffers.compile_steps({!r}, {!r}, {!r}, {!r}, {!r}))").format(
                os.getcwd(), model_name, config, precision, device,
                model_name in flax_handwritten.PARTS)
    env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false",
               XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " --xla_dump_to=" + dump).strip())
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError("{} {}: compiling failed\n{}".format(model_name, precision,
                                                               proc.stderr[-3000:]))
    programs = [t for t in (temporaries(p, top) for p in
                            sorted(glob.glob(os.path.join(dump, "*buffer-assignment.txt"))))
                if t is not None and t["program"] in SIDES]
    for p in programs:
        p["side"] = SIDES[p["program"]]
    return {"model": model_name, "config": config, "precision": precision, "device": device,
            "batch_size": int(proc.stdout.split()[-1]), "programs": programs}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="transformer")
    p.add_argument("--precision", default="bf16", choices=("fp32", "tf32", "bf16"))
    p.add_argument("--config", default="paper", help="paper, or tiny (a check that it runs)")
    p.add_argument("--device", default="cuda:0", help="cuda:N or cpu")
    p.add_argument("--top", type=int, default=12, help="values and shapes listed a program")
    p.add_argument("--out", default="jax_buffers.json")
    args = p.parse_args(argv)
    result = {"benchmark": "jax_buffers", "command": " ".join(
        ["python3 -m benchmarks.jax_buffers"] + list(sys.argv[1:] if argv is None else argv)),
        "cells": []}
    for model_name in args.models.split(","):
        cell = run(model_name, args.config, args.precision, args.device, args.top)
        result["cells"].append(cell)
        with open(args.out, "w") as f:      # rewritten after each model: a cut run keeps them
            json.dump(result, f, indent=1)
        for prog in sorted(cell["programs"], key=lambda q: q["side"]):
            print("{} {} {} ({}): temporaries {:.1f} MiB in {} values".format(
                model_name, args.precision, prog["side"], prog["program"],
                prog["temporary_bytes"] / 2 ** 20, prog["values"]))
            for v in prog["largest"]:
                print("  {:9.2f} MiB  {:28s} {}".format(v["bytes"] / 2 ** 20, v["shape"],
                                                        v["value"]))
            print("  by shape: " + ", ".join("{} {:.1f} MiB".format(s, b / 2 ** 20)
                                             for s, b in prog["bytes_by_shape"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
