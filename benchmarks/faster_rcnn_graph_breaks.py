"""What ``torch.compile`` makes of a compiled Faster R-CNN training step: Dynamo's graph breaks and
recompilations with their causes, and the graphs it compiled with their op counts, for tbdzoo's
model (``execution="compiled"``) and, with ``--torchvision``, torchvision's FasterRCNN as
benchmarks/gpu_faster_rcnn.py builds and compiles it.

    .venv/bin/python -m benchmarks.faster_rcnn_graph_breaks                     # tiny, CPU
    .venv/bin/python -m benchmarks.faster_rcnn_graph_breaks --config paper --canvas 320,320 \\
        --backend aot_eager --steps 2                                          # paper, CPU
    python3 -m benchmarks.faster_rcnn_graph_breaks --device cuda --config paper --canvas padded \\
        --torchvision --precision bf16 --out graph_breaks.json                 # a GPU

Each side runs ``--steps`` training steps (the first compiles; a graph compiled in a later step
is a recompilation, and one per step is a step that never stops compiling). A graph break
splits the step into more graphs, and Python runs between them; a recompilation compiles a
graph again because a guard (a shape, a Python value) changed. ``--backend`` is the compiler
behind Dynamo: ``inductor`` (what ``torch.compile`` uses and the default), or ``aot_eager``
(the same graphs and autograd split, no code generation: fast on a CPU). Graph breaks and
recompilations are Dynamo's and the same under both. The model and image are
benchmarks/gpu_faster_rcnn.py's (one image 0.6 of the config's canvas high, or of
``--canvas H,W``'s), its frozen batch norm calibrated on the image, the learning rate 1e-12.
"""
import argparse
import contextlib
import functools
import json
import logging
import os
import re
import sys
import time
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(HERE) not in sys.path:
    sys.path.insert(0, os.path.dirname(HERE))

import torch
import torch._dynamo

from benchmarks import gpu_faster_rcnn as bench

_GRAPH_OPS = ("call_function", "call_method", "call_module")


class Recorder:
    """A Dynamo backend that records each graph it is given (its compile id and op count) and
    hands it to ``backend``; and the graph breaks and recompilations Dynamo reports meanwhile."""

    def __init__(self, backend):
        self.backend = backend
        self.graphs, self.recompiles = [], []
        self.step = 0

    def __call__(self, gm, example_inputs):
        ops = sum(1 for n in gm.graph.nodes if n.op in _GRAPH_OPS)
        compile_id = torch._guards.CompileContext.current_compile_id()
        self.graphs.append({"compile_id": str(compile_id), "ops": ops, "step": self.step})
        if self.backend == "inductor":
            from torch._inductor.compile_fx import compile_fx
            return compile_fx(gm, example_inputs)
        return torch._dynamo.backends.registry.lookup_backend(self.backend)(gm, example_inputs)

    @contextlib.contextmanager
    def watching(self):
        """Dynamo's counters cleared, its recompilation log read into ``recompiles``."""
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        recorder = self

        class Handler(logging.Handler):
            def emit(self, record):
                recorder.recompiles.append({"step": recorder.step,
                                            "cause": _recompile_cause(record.getMessage())})
        torch._logging.set_logs(recompiles=True)  # Dynamo writes the log only when asked
        logger = logging.getLogger("torch._dynamo.guards.__recompiles")
        handler, propagate = Handler(), logger.propagate
        logger.addHandler(handler)
        logger.propagate = False  # here, not on stderr too
        try:
            yield self
        finally:
            logger.removeHandler(handler)
            logger.propagate = propagate
            torch._logging.set_logs()

    def breaks(self):
        """[(count, reason)] of Dynamo's graph breaks, most frequent first."""
        reasons = torch._dynamo.utils.counters["graph_break"]
        return sorted(((n, _one_line(r)) for r, n in reasons.items()), reverse=True)


def _one_line(text, width=160):
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 3] + "..."


def _recompile_cause(message):
    """The function recompiled and its first failed guard, from Dynamo's recompilation log."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    head = lines[0] if lines else message
    guard = next((line.lstrip("- ") for line in lines[1:] if line.startswith("- ")
                  and "User stack" not in line), "")
    head = re.sub(r"in \S*?(tbdzoo|torchvision|torch)/", r"in \1/", head)
    return _one_line(head.replace("Recompiling function ", "") + ": " + guard.split(" # ")[0])


# -- the two sides -------------------------------------------------------------------------------
def tbdzoo_model(args, recorder):
    """tbdzoo's compiled Faster R-CNN, ``torch.compile`` using ``recorder`` as its backend, and
    its prepared benchmark batch."""
    import tbdzoo
    overrides = {"lr": bench.STILL_LR}
    if args.canvas == "padded":
        overrides["canvas"] = bench.padded_canvas(_config(args))
    elif args.canvas:
        overrides["canvas"] = tuple(int(v) for v in args.canvas.split(","))
    if args.rois:
        overrides["rois_per_image"] = args.rois
    with _compiling_with(recorder):
        model = tbdzoo.build(bench.MODEL, backend="torch", config=args.config,
                             device=args.device, precision=args.precision,
                             execution="compiled", memory_format="channels_last", **overrides)
    batch = _batch(model.hparams, args)
    if args.frozen_bn == "calibrated":
        model.set_weights(bench.calibrate_frozen_batchnorm(model.hparams, model.get_weights(),
                                                           batch, args.device)[0])
    return model, batch


def _batch(hp, args):
    """gpu_faster_rcnn.py's image: 0.6 of the config's canvas height by its width, or of
    ``--canvas H,W``'s."""
    canvas = hp["canvas"] if args.canvas not in (None, "padded") else _config(args)["canvas"]
    return bench.benchmark_batch(hp, canvas)


def _config(args):
    from tbdzoo.models import get_model
    return get_model(bench.MODEL).configs[args.config]


def tbdzoo_step(args, recorder):
    model, batch = tbdzoo_model(args, recorder)
    prepared = model.prepare_batch(batch)
    return lambda: model.train_step(prepared)


def torchvision_step(args, recorder):
    """torchvision's FasterRCNN from the same weights and image, compiled as
    gpu_faster_rcnn.py compiles it."""
    model, batch = tbdzoo_model(args, Recorder("eager"))
    with _compiling_with(recorder):
        step = bench.torchvision_step(model.hparams, model.get_weights(), batch, args.device,
                                      args.precision, True, False)[2]
    return lambda: float(sum(v.float() for v in step().values()))


@contextlib.contextmanager
def _compiling_with(recorder):
    """``torch.compile`` with ``recorder`` as the backend for what is built meanwhile."""
    original = torch.compile
    with mock.patch.object(torch, "compile", functools.partial(original, backend=recorder)):
        yield


def measure(name, make_step, args):
    recorder = Recorder(args.backend)
    with recorder.watching():
        step = make_step(args, recorder)
        times, losses = [], []
        for k in range(args.steps):
            recorder.step = k
            start = time.perf_counter()
            losses.append(step())
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    breaks = recorder.breaks()
    return {"side": name, "graph_breaks": sum(n for n, _ in breaks),
            "break_reasons": [{"count": n, "reason": r} for n, r in breaks],
            "recompiles": len(recorder.recompiles), "recompile_causes": recorder.recompiles,
            "graphs": len(recorder.graphs), "graph_list": recorder.graphs,
            "ops_per_graph": [g["ops"] for g in recorder.graphs],
            "graphs_after_first_step": sum(1 for g in recorder.graphs if g["step"] > 0),
            "step_seconds": times, "losses": [float(v) for v in losses]}


def table(results):
    lines = ["| side | graph breaks | recompiles | graphs (after step 1) | ops per graph |",
             "|---|---:|---:|---:|---|"]
    for r in results:
        lines.append("| {} | {} | {} | {} ({}) | {} |".format(
            r["side"], r["graph_breaks"], r["recompiles"], r["graphs"],
            r["graphs_after_first_step"], ", ".join(str(n) for n in r["ops_per_graph"])))
    for r in results:
        for b in r["break_reasons"]:
            lines.append("{} break x{}: {}".format(r["side"], b["count"], b["reason"]))
        for c in r["recompile_causes"]:
            lines.append("{} recompile in step {}: {}".format(r["side"], c["step"] + 1, c["cause"]))
    return "\n".join(lines)


def arguments(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    p.add_argument("--config", choices=("tiny", "paper"), default="tiny")
    p.add_argument("--canvas", metavar="H,W",
                   help="tbdzoo's canvas: H,W, or 'padded' (gpu_faster_rcnn.py's default: "
                        "its image padded to a multiple of 32); default the config's")
    p.add_argument("--rois", type=int, help="RoIs per image (default: the config's)")
    p.add_argument("--precision", choices=("fp32", "tf32", "bf16"), default="fp32",
                   help="tf32 only on a GPU")
    p.add_argument("--frozen-bn", choices=("calibrated", "initial"), default="calibrated",
                   help="frozen batch norm statistics, as gpu_faster_rcnn.py's option")
    p.add_argument("--backend", choices=("inductor", "aot_eager", "eager"), default="inductor")
    p.add_argument("--steps", type=int, default=3, help="training steps per side (default 3)")
    p.add_argument("--torchvision", action="store_true",
                   help="also torchvision's compiled FasterRCNN (gpu_faster_rcnn.py's)")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps {}: a recompilation shows from the second step on; take 2 or more"
                .format(args.steps))
    if args.canvas not in (None, "padded"):
        try:
            ok = len([int(v) for v in args.canvas.split(",")]) == 2
        except ValueError:
            ok = False
        if not ok:
            p.error("--canvas takes H,W, e.g. 320,320, or padded; got {!r}".format(args.canvas))
    return args


def main(argv=None):
    args = arguments(argv)
    if not args.device.startswith("cuda"):
        torch.set_num_threads(1)
    torch.manual_seed(0)
    results = [measure("tbdzoo", tbdzoo_step, args)]
    if args.torchvision:
        results.append(measure("torchvision", torchvision_step, args))
    print(table(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "arguments": vars(args),
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
