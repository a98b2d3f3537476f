"""Cross-framework consistency: one reference record, every backend compared against it.

The reference backend (PyTorch on the CPU) runs a fixed protocol on each case's initial
weights and one synthetic batch; another backend runs the same protocol from the same weights
and batch, and its results are compared at the tolerances below (docs/consistency.md).

Protocol: set weights -> predict (inference mode) -> loss and gradients (training mode, no
update) -> ``steps`` optimizer steps (their losses form the trajectory; the first is the
first-step loss, a training-mode forward pass from the reference's weights).

``tbd consistency record`` writes one .npz per case; ``tbd consistency check`` runs every
backend on them from the main environment (CNTK through its worker) and prints a table per
case. ``python -m tbdzoo.consistency`` is the same command (its parser and command alone).
"""
import argparse
import fnmatch
import os
import sys
import time
from collections import OrderedDict, namedtuple

import numpy as np

from .backends.registry import BACKEND_NAMES, build, build_native, list_backends
from .errors import ConsistencyReferenceError, TbdError, UnknownNameError
from .progress import rich_console
from .weights import load_arrays, save_arrays
from .models.probes import PROBES

REFERENCE_BACKEND = "torch"
STEPS = 3

# docs/consistency.md. Gradients also get an absolute floor scaled to the tensor: a gradient is
# a sum over the batch, and entries that nearly cancel have no meaningful relative error.
# ``atol_of_global`` is a floor scaled to the largest gradient of the whole model: a parameter
# whose gradient is zero in exact arithmetic (attention's b_k: softmax ignores a shift shared by
# all keys) holds only rounding noise (~1e-8 of the largest), which has no direction to compare.
# ``loss`` holds each objective's value from loss_and_gradients and the first-step loss (the
# first train_step's, from the same weights and batch): one training-mode forward pass, which
# float32 backends reproduce to a few float32 roundings of the loss (every case within 4.5e-7
# relative on every backend, Inception-v3 aside); ``atol`` covers losses that sum terms of
# opposite sign (A3C's, 7e-3 from terms of about 1), whose rounding is relative to the terms.
TOLERANCES = {
    "forward": {"rtol": 1e-4, "atol": 1e-5},
    "loss": {"rtol": 1e-6, "atol": 1e-7},
    "gradients": {"rtol": 1e-3, "atol_of_max": 1e-4, "atol_of_global": 1e-6, "min_cosine": 0.9999},
    "trajectory": {"atol": 1e-3},
}

Case = namedtuple("Case", "model overrides seed tolerances backend_overrides replays_targets")


def _case(model, overrides=None, seed=0, tolerances=None, backend_overrides=None,
          replays_targets=False):
    return Case(model, dict(overrides or {}), seed, tolerances or {}, backend_overrides or {},
                replays_targets)


# Inception-v3 tiny (docs/consistency.md, "Inception-v3 tiny is ill-conditioned"): 94 BatchNorm
# + ReLU layers hold 1.1 million ReLU inputs spread around zero, and float32 rounding carries
# some across zero, so:
# - lr 0.0045, not the config's 0.045: at 0.045 PyTorch in float32 lands 7e-3 from PyTorch in
#   float64 at the third step, which no float32 implementation can be held to;
# - its loss, in float32 on every backend, is 1e-6 to 5.4e-6 relative from PyTorch in float64
#   (seeds 0-2; PyTorch itself 1.3e-6): 94 normalisations each scale their input's rounding by
#   1 / std. rtol 1.5e-5 holds that and still catches a backend 2e-5 off;
# - a gradient may miss the element-wise tolerance by float32 noise (PyTorch against itself,
#   weights perturbed by 1e-6, misses it on most tensors), never the direction: every
#   gradient keeps a cosine above 0.9995 (CNTK's lowest).
INCEPTION_TOLERANCES = {
    "loss": {"rtol": 1.5e-5, "atol": 1e-7},
    "gradients": {"elementwise": False, "atol_of_global": 1e-6, "min_cosine": 0.9995},
}


# WGAN (both configs): the critic's loss is mean D(fake) - mean D(real), about -0.53 from terms
# of about 1.05 and 1.6, and every backend's critic output is a few float32 roundings off
# (6.4e-7 to 7.1e-7 of its largest on CNTK and TensorFlow, layer by layer as PyTorch's): the
# difference keeps their absolute error, about 1e-6 (CNTK: 2e-6 relative on the original
# WGAN's critic). atol 3e-6 holds that and still fails any of its losses 2e-5 off.
WGAN_TOLERANCES = {"loss": {"rtol": 1e-6, "atol": 3e-6}}


def cases():
    """Case name -> Case. Consistency runs use the tiny configs without dropout, whose masks no
    two frameworks draw alike."""
    out = OrderedDict(("probe/" + p, _case("probe/" + p)) for p in PROBES)
    out["resnet50"] = _case("resnet50")
    out["transformer"] = _case("transformer", {"dropout": 0.0})
    out["seq2seq"] = _case("seq2seq")          # ragged sentences: padding, masks and lengths
    out["deepspeech2"] = _case("deepspeech2")  # ragged utterances, convolutions, GRUs and CTC
    out["a3c"] = _case("a3c")                  # a recorded rollout's update
    # the auxiliary loss, RMSProp and gradient clipping; TensorFlow eager: tracing and
    # optimising each gradient and update graph costs more than the whole eager protocol
    out["inception_v3"] = _case("inception_v3", {"dropout": 0.0, "lr": 0.0045},
                                tolerances=INCEPTION_TOLERANCES,
                                backend_overrides={"tensorflow": {"execution": "eager"}})
    # WGAN-GP: the generator's and the critic's objectives, the gradient penalty included.
    # Seed 1: at seed 0 inputs of the generator's ReLUs sit within float32 rounding of zero
    # (docs/consistency.md), so which side they land on follows the order of float32 sums.
    out["wgan"] = _case("wgan", seed=1, tolerances=WGAN_TOLERANCES)
    # the targets step runs once, on the reference, and every backend trains on its targets
    out["faster_rcnn"] = _case("faster_rcnn", replays_targets=True)
    return out


def select(patterns=None):
    """The cases named by ``patterns`` (names or shell patterns: 'probe/*'), in case order."""
    every = cases()
    if not patterns:
        return every
    unknown = [p for p in patterns if not fnmatch.filter(every, p)]
    if unknown:
        raise UnknownNameError("consistency case", unknown[0], list(every))
    return OrderedDict((n, c) for n, c in every.items()
                       if any(fnmatch.fnmatchcase(n, p) for p in patterns))


def tolerances_of(case):
    """TOLERANCES with the case's own, each with its reason beside the case."""
    out = OrderedDict((k, dict(v)) for k, v in TOLERANCES.items())
    for key, value in case.tolerances.items():
        out[key] = dict(value)
    return out


# -- the protocol ---------------------------------------------------------------------------------

def run_protocol(model, weights, batch, steps=STEPS):
    """What one backend produces under the protocol, as a flat dict of arrays."""
    model.set_weights(weights)
    out = OrderedDict()
    predicted = model.predict(batch)
    if isinstance(predicted, dict):  # detections: boxes, scores, labels, counts
        out.update(("forward/" + k, np.asarray(v, np.float64)) for k, v in predicted.items())
    else:
        out["forward"] = np.asarray(predicted, np.float64)
    loss, grads = model.loss_and_gradients(batch)
    out.update(_per_objective("loss", [loss]))
    for name, g in grads.items():
        out["grad/" + name] = np.asarray(g, np.float64)
    out.update(_per_objective("trajectory", [model.train_step(batch) for _ in range(steps)]))
    return out


def _per_objective(key, values):
    """{key: array} for losses that are floats; {key/objective: array} for a training program
    of several objectives, whose losses are {objective: float} (a single value squeezed)."""
    if isinstance(values[0], dict):
        return OrderedDict(("{}/{}".format(key, name), _squeezed(key, [v[name] for v in values]))
                           for name in values[0])
    return OrderedDict([(key, _squeezed(key, values))])


def _squeezed(key, values):
    return np.float64(values[0]) if key == "loss" else np.asarray(values, np.float64)


# -- the comparison -------------------------------------------------------------------------------

# One line of a case's table: the quantity, its worst difference from the reference, the
# tolerance, whether it holds, and the failures it stands for (one per parameter for gradients).
Row = namedtuple("Row", "quantity worst tolerance passed failures")


def compare_rows(record, other, tolerances=None):
    """One Row per quantity: forward output(s), each objective's loss, gradients (element-wise
    and cosine, worst over parameters), each objective's first-step loss and later losses."""
    t = tolerances or TOLERANCES
    rows = []
    for key in (k for k in record if k == "forward" or k.startswith("forward/")):
        rows.append(_forward_row(key, record[key], other.get(key), t["forward"]))
    for key in (k for k in record if k == "loss" or k.startswith("loss/")):
        rows.append(_loss_row(key, record[key], other.get(key), t["loss"]))
    rows.extend(_gradient_rows(record, other, t["gradients"]))
    for key in (k for k in record if k == "trajectory" or k.startswith("trajectory/")):
        objective = key[len("trajectory"):]
        ours = other.get(key)
        rows.append(_loss_row("first-step loss" + objective, record[key][0],
                              None if ours is None else ours[0], t["loss"]))
        if len(record[key]) > 1:
            rows.append(_trajectory_row("later losses" + objective, record[key][1:],
                                        None if ours is None else ours[1:], t["trajectory"]))
    return rows


def compare(record, other, tolerances=None):
    """A list of human-readable failures (empty when ``other`` matches ``record``)."""
    out = []
    for row in compare_rows(record, other, tolerances):
        out.extend(f for f in row.failures if f not in out)
    return out


def _largest(a):
    return float(np.max(np.abs(a))) if a.size else 0.0


def _missing(quantity):
    return Row(quantity, "missing", "", False, ["{}: missing".format(quantity)])


def _forward_row(key, expected, value, tol):
    if value is None:
        return _missing(key)
    text = "rtol {:g}, atol {:g}".format(tol["rtol"], tol["atol"])
    if value.shape != expected.shape:
        return Row(key, "shape {}".format(value.shape), text, False,
                   ["{}: shape {} vs reference {}".format(key, value.shape, expected.shape)])
    worst = _largest(value - expected)
    passed = bool(np.allclose(value, expected, rtol=tol["rtol"], atol=tol["atol"]))
    return Row(key, "{:.3g} (largest {:.3g})".format(worst, _largest(expected)), text, passed,
               [] if passed else ["{}: max abs diff {:.3g} (max ref {:.3g})".format(
                   key, worst, _largest(expected))])


def _loss_row(quantity, expected, value, tol):
    """A loss (or a row of them, one per objective) against the reference's."""
    if value is None:
        return _missing(quantity)
    value, expected = np.asarray(value, np.float64), np.asarray(expected, np.float64)
    diff = np.abs(value - expected)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = float(np.max(np.where(diff == 0, 0.0, diff / np.abs(expected))))
    passed = bool(np.all(diff <= tol["atol"] + tol["rtol"] * np.abs(expected)))
    shown = " ".join("{:.7g}".format(v) for v in value.ravel())
    return Row(quantity, "{:.2g} relative ({})".format(rel, shown),
               "rtol {:g}, atol {:g}".format(tol["rtol"], tol["atol"]), passed,
               [] if passed else ["{}: {} vs reference {} ({:.2g} relative)".format(
                   quantity, shown, " ".join("{:.8g}".format(v) for v in expected.ravel()),
                   rel)])


def _trajectory_row(quantity, expected, values, tol):
    if values is None:
        return _missing(quantity)
    worst = _largest(values - expected)
    passed = bool(np.allclose(values, expected, rtol=0, atol=tol["atol"]))
    return Row(quantity, "{:.2g}".format(worst), "atol {:g}".format(tol["atol"]), passed,
               [] if passed else ["{}: {} vs reference {}".format(
                   quantity, np.round(values, 6).tolist(), np.round(expected, 6).tolist())])


def _gradient_rows(record, other, tol):
    """Two rows: the worst element-wise difference as a multiple of its tolerance, and the
    lowest cosine; a parameter that misses either is one failure."""
    keys = [k for k in record if k.startswith("grad/")]
    if not keys:
        return []
    floor = tol["atol_of_global"] * max(_largest(record[k]) for k in keys)
    worst_ratio, worst_cos = (0.0, "-"), (1.0, "-")
    elementwise_failures, cosine_failures = [], []
    for key in keys:
        name = key[len("grad/"):]
        if key not in other:
            elementwise_failures.append("{}: missing".format(key))
            worst_ratio = (float("inf"), name)
            continue
        g, r = other[key], record[key]
        if g.shape != r.shape:
            elementwise_failures.append("{}: shape {} vs reference {}".format(
                key, g.shape, r.shape))
            worst_ratio = (float("inf"), name)
            continue
        cos = cosine(g, r) if _largest(r) > floor else 1.0
        worst_cos = min(worst_cos, (cos, name))
        text = "{}: max abs diff {:.3g} (max ref {:.3g}), cosine {:.6f}".format(
            key, _largest(g - r), _largest(r), cos)
        if cos < tol["min_cosine"]:
            cosine_failures.append(text)
        if not tol.get("elementwise", True):
            continue
        atol = max(tol["atol_of_max"] * _largest(r), floor)
        # |g - r| <= atol + rtol |r| (np.allclose's rule), as a multiple of the bound
        bound = atol + tol["rtol"] * np.abs(r)
        excess = np.abs(g - r)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(bound > 0, excess / bound, np.where(excess > 0, np.inf, 0.0))
        ratio = float(np.max(ratio)) if ratio.size else 0.0
        worst_ratio = max(worst_ratio, (ratio, name))
        if ratio > 1:
            elementwise_failures.append(text)
    if tol.get("elementwise", True):
        elementwise = "rtol {:g}, atol {:g} x largest".format(tol["rtol"], tol["atol_of_max"])
        worst = "{:.3g} x tolerance ({})".format(*worst_ratio)
    else:
        elementwise, worst = "cosine only (see the case)", "-"
    return [
        Row("gradients ({} parameters)".format(len(keys)), worst, elementwise,
            not elementwise_failures, elementwise_failures),
        Row("gradient cosine", "{:.6f} ({})".format(*worst_cos),
            "> {:g}".format(tol["min_cosine"]), not cosine_failures, cosine_failures),
    ]


def cosine(a, b):
    a, b = a.ravel(), b.ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def reference(model_name, config="tiny", seed=0, steps=STEPS, **overrides):
    """(weights, batch, record) from the reference backend, in a worker of its own."""
    ref = build(model_name, backend=REFERENCE_BACKEND, config=config, seed=seed, isolate=True,
                device="cpu", **overrides)
    try:
        weights = ref.get_weights()
        batch = ref.synthetic_batch(seed=seed)
        record = run_protocol(ref, weights, batch, steps)
    finally:
        ref.close()
    return weights, batch, record


def check_backend(model_name, backend, config="tiny", seed=0, steps=STEPS, **overrides):
    """Run the reference and ``backend`` (each in a worker) and return the failures (empty:
    consistent)."""
    weights, batch, record = reference(model_name, config, seed, steps, **overrides)
    other = build(model_name, backend=backend, config=config, seed=seed + 1, isolate=True,
                  **overrides)
    try:
        return compare(record, run_protocol(other, weights, batch, steps))
    finally:
        other.close()


# -- record and check -----------------------------------------------------------------------------

def _file(directory, case):
    return os.path.join(directory, case.replace("/", "__") + ".npz")


def _overrides(case, backend):
    return dict(case.overrides, **case.backend_overrides.get(backend, {}))


def record_case(name, case, directory, steps=STEPS):
    """Run the reference backend on one case in this process and write its .npz: weights, the
    batch (with the targets step's inputs when the case replays them), the record."""
    ref = build_native(case.model, REFERENCE_BACKEND, config="tiny", seed=case.seed,
                       device="cpu", **_overrides(case, REFERENCE_BACKEND))
    try:
        weights = ref.get_weights()
        batch = ref.synthetic_batch(seed=case.seed)
        if case.replays_targets:
            batch = OrderedDict(batch, **ref.step_targets(batch))
        record = run_protocol(ref, weights, batch, steps)
    finally:
        ref.close()
    arrays = OrderedDict()
    arrays.update(("weight/" + k, v) for k, v in weights.items())
    arrays.update(("batch/" + k, v) for k, v in batch.items())
    arrays.update(("record/" + k, v) for k, v in record.items())
    save_arrays(_file(directory, name), arrays)


def _split(arrays, prefix):
    return OrderedDict((k[len(prefix):], v) for k, v in arrays.items() if k.startswith(prefix))


def read_reference(directory, name):
    """(weights, batch, record) of one recorded case."""
    missing_references(directory, [name])
    arrays = load_arrays(_file(directory, name))
    return _split(arrays, "weight/"), _split(arrays, "batch/"), _split(arrays, "record/")


def missing_references(directory, names):
    """Raise ConsistencyReferenceError naming the cases of ``names`` that ``directory`` has no
    reference for, and the command that records them."""
    missing = [n for n in names if not os.path.exists(_file(directory, n))]
    if not missing:
        return
    if len(missing) == len(names) or not os.path.isdir(directory):
        what, record = "no reference files", ""
        if len(names) < len(cases()):
            record = " --cases " + ",".join(missing)
    else:
        what = "no reference for case(s) {}".format(", ".join(repr(n) for n in missing))
        record = " --cases " + ",".join(missing)
    raise ConsistencyReferenceError(
        "{} in {}: run `tbd consistency record --dir {}{}` first".format(
            what, directory, directory, record))


def check_case(name, case, backend, directory):
    """The backend's rows for one case against its reference file. Every backend runs from
    this process: natively where this interpreter has the framework, else (CNTK) through its
    worker, from a different seed than the reference's."""
    weights, batch, record = read_reference(directory, name)
    steps = len(next(v for k, v in record.items() if k.startswith("trajectory")))
    model = build(case.model, backend=backend, config="tiny", seed=case.seed + 1, device="cpu",
                  **_overrides(case, backend))
    try:
        other = run_protocol(model, weights, batch, steps)
    finally:
        model.close()
    return compare_rows(record, other, tolerances_of(case))


def default_backends():
    """Every ready backend but the reference."""
    return [b["name"] for b in list_backends() if b["ready"] and b["name"] != REFERENCE_BACKEND]


# -- the command ----------------------------------------------------------------------------------

def add_parser(sub):
    """``tbd consistency record|check``: the subcommand's parser under ``sub``."""
    p = sub.add_parser("consistency", help="every backend against the PyTorch reference, case "
                       "by case (docs/consistency.md)")
    actions = p.add_subparsers(dest="consistency_command", metavar="{record,check}")
    actions.required = True
    record = actions.add_parser("record", help="run the reference (PyTorch, CPU) and write one "
                                ".npz per case")
    check = actions.add_parser("check", help="run each backend on the recorded cases; a table "
                               "per case; exit 1 on any failure")
    for q in (record, check):
        q.add_argument("--cases", "--models", dest="cases", default=None,
                       help="comma-separated case names or patterns: resnet50,probe/* "
                            "(default: every case; `tbd consistency check --list` lists them)")
        q.add_argument("--dir", default="consistency-reference",
                       help="folder of the reference .npz files (default: %(default)s)")
    check.add_argument("--backends", default=None,
                       help="comma-separated backends (default: every ready one but torch)")
    check.add_argument("--list", action="store_true", help="list the cases and exit")
    return p


def command(args, console):
    """Run ``tbd consistency``; returns the exit status."""
    patterns = [c for c in (args.cases or "").split(",") if c]
    selected = select(patterns)
    if getattr(args, "list", False):
        for name, case in selected.items():
            console.print(name)
        return 0
    if args.consistency_command == "record":
        os.makedirs(args.dir, exist_ok=True)
        for name, case in selected.items():
            start = time.perf_counter()
            record_case(name, case, args.dir)
            console.print("recorded {} ({:.1f} s)".format(name, time.perf_counter() - start))
        console.print("{} case(s) recorded in {}".format(len(selected), args.dir))
        return 0
    backends = [b for b in (args.backends or "").split(",") if b] or default_backends()
    for backend in backends:
        if backend not in BACKEND_NAMES:
            raise UnknownNameError("backend", backend, BACKEND_NAMES)
    missing_references(args.dir, list(selected))  # refuse before running anything
    return _check(selected, backends, args.dir, console)


def _check(selected, backends, directory, console):
    from rich.markup import escape
    from rich.table import Table
    failed, total, started = [], 0, time.perf_counter()
    for name, case in selected.items():
        for backend in backends:
            total += 1
            start = time.perf_counter()
            try:
                rows = check_case(name, case, backend, directory)
            except Exception as e:  # one broken case must not hide the others
                rows = [Row("run", "{}: {}".format(type(e).__name__, e), "", False, [str(e)])]
            table = Table(title="{} on {} ({:.1f} s)".format(name, backend,
                                                             time.perf_counter() - start))
            for column in ("quantity", "worst difference", "tolerance", "result"):
                table.add_column(column)
            for row in rows:
                table.add_row(escape(row.quantity), escape(row.worst), escape(row.tolerance),
                              "PASS" if row.passed else "[bold red]FAIL[/]")
            console.print(table)
            if not all(row.passed for row in rows):
                failed.append("{} on {}".format(name, backend))
    summary = "{} of {} (case, backend) pairs passed in {:.0f} s".format(
        total - len(failed), total, time.perf_counter() - started)
    if failed:
        console.print(escape("FAIL: " + summary + "; failed: " + ", ".join(failed)))
        return 1
    console.print("PASS: " + summary)
    return 0


def main(argv=None):
    """``python -m tbdzoo.consistency``: ``tbd consistency``."""
    parser = argparse.ArgumentParser(prog="python -m tbdzoo")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["consistency"] + list(sys.argv[1:] if argv is None else argv))
    try:
        return command(args, rich_console())
    except TbdError as e:
        print("tbd: error: {}".format(e), file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
