"""Cross-framework consistency: every backend, PyTorch included, against the float64 NumPy
reference (tbdzoo/reference/), and against PyTorch where a pairwise comparison adds something.

The reference interprets each case's spec on its initial weights and one synthetic batch. Every
backend runs a fixed protocol from the same weights and batch: set weights -> predict (inference
mode) -> loss and gradients (training mode, no update) -> ``steps`` optimizer steps (their
losses form the trajectory). Against the reference (docs/consistency.md):

- forward output(s) and each objective's loss, directly;
- gradients through directional derivatives: a few random unit directions per slice of each
  parameter group, where the reference's central difference of the objective (float64, two
  forward passes a direction) must equal the backend's gradient projected on the direction;
- the trajectory: the reference applies its own optimizer (tbdzoo/reference/optimizers.py) to
  the backend's gradients, update by update (the backend gives its gradients at the
  reference's weights), and its objective values at each step's weights are what the
  backend's steps must report.

Against PyTorch, which runs the same protocol once when the cases are recorded: each
parameter's gradient element-wise and by cosine, which sees a wrong entry of one tensor that a
few directions over many tensors can miss. ``run_protocol`` and ``compare`` are the pairwise
comparison of any two backends (tests use it).

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

from .backends.info import BACKEND_NAMES
from .backends.programs import step_result
from .backends.registry import build, build_native, list_backends
from .errors import ConsistencyReferenceError, TbdError, UnknownNameError
from .models import get_model, list_models
from .models.probes import PROBES
from .progress import rich_console
from .reference.model import Model, step_batch
from .reference.optimizers import clip_weights
from .weights import load_arrays, save_arrays

# The backend the pairwise gradient comparison holds the others to (each parameter's gradient
# element by element); every backend, this one included, is checked against the reference.
PAIRWISE_BACKEND = "torch"
STEPS = 3
# Directional derivatives: each parameter group's trainable parameters, in graph order, are cut
# into at most SLICES runs of whole tensors, with DIRECTIONS random unit directions each; EPSILON
# is the central difference's step along a unit direction. Small, because a step that carries
# some ReLU input or max-pool winner across its kink makes the difference no derivative: at 1e-5
# the tiny ResNet-50's second direction is 3e-3 off (every backend agreeing elsewhere), at 1e-6
# and 1e-7 the same to eight digits; float64 rounding, about 1e-16 / EPSILON of the loss, stays
# far below the tolerance.
SLICES, DIRECTIONS, EPSILON = 3, 2, 1e-7

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
    # a backend's gradient projected on a unit direction against the reference's central
    # difference: |g.d - D| <= rtol |D| + atol_of_norm ||g|| (g: the slice's gradient)
    "directions": {"rtol": 1e-3, "atol_of_norm": 1e-5},
}

Case = namedtuple("Case", "model overrides seed tolerances backend_overrides replays_targets")


def _case(model, overrides=None, seed=0, tolerances=None, backend_overrides=None,
          replays_targets=False):
    return Case(model, dict(overrides or {}), seed, tolerances or {}, backend_overrides or {},
                replays_targets)


def cases():
    """Case name -> Case: every probe, then every model with a consistency card
    (``get_model(name).consistency``: its overrides, seed and tolerances, each with its
    reason). Consistency runs use the tiny configs without dropout, whose masks no two
    frameworks draw alike."""
    out = OrderedDict(("probe/" + p, _case("probe/" + p)) for p in PROBES)
    for name in list_models():
        card = get_model(name).consistency
        if card is not None:
            out[name] = _case(name, card.overrides, card.seed, card.tolerances,
                              card.backend_overrides, card.replays_targets)
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

def _forward_values(predicted):
    """``predict``'s output as the protocol's float64 forward rows: "forward", or one
    "forward/<name>" each for a dict of outputs (detections: boxes, scores, labels, counts)."""
    if isinstance(predicted, dict):
        return OrderedDict(("forward/" + k, np.asarray(v, np.float64)) for k, v in predicted.items())
    return OrderedDict([("forward", np.asarray(predicted, np.float64))])


def run_protocol(model, weights, batch, steps=STEPS):
    """What one backend produces under the protocol, as a flat dict of arrays."""
    model.set_weights(weights)
    out = _forward_values(model.predict(batch))
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
    rows = _value_rows(record, other, t)
    rows.extend(_gradient_rows(record, other, t["gradients"]))
    return rows + _trajectory_rows(record, other, t)


def _value_rows(expected, other, t):
    """The rows of the forward values and the losses ``expected`` holds."""
    rows = []
    for key in (k for k in expected if k == "forward" or k.startswith("forward/")):
        rows.append(_forward_row(key, expected[key], other.get(key), t["forward"]))
    for key in (k for k in expected if k == "loss" or k.startswith("loss/")):
        rows.append(_loss_row(key, expected[key], other.get(key), t["loss"]))
    return rows


def _trajectory_rows(expected, other, t):
    """The rows of each objective's first-step loss and later losses."""
    rows = []
    for key in (k for k in expected if k == "trajectory" or k.startswith("trajectory/")):
        objective = key[len("trajectory"):]
        ours = other.get(key)
        rows.append(_loss_row("first-step loss" + objective, expected[key][0],
                              None if ours is None else ours[0], t["loss"]))
        if len(expected[key]) > 1:
            rows.append(_trajectory_row("later losses" + objective, expected[key][1:],
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
    """(weights, batch, record) from the pairwise backend (PyTorch), in a worker of its own."""
    ref = build(model_name, backend=PAIRWISE_BACKEND, config=config, seed=seed, isolate=True,
                device="cpu", **overrides)
    try:
        weights = ref.get_weights()
        batch = ref.synthetic_batch(seed=seed)
        record = run_protocol(ref, weights, batch, steps)
    finally:
        ref.close()
    return weights, batch, record


def check_backend(model_name, backend, config="tiny", seed=0, steps=STEPS, **overrides):
    """Run the pairwise backend and ``backend`` (each in a worker) and return the failures of
    their comparison (empty: consistent)."""
    weights, batch, record = reference(model_name, config, seed, steps, **overrides)
    other = build(model_name, backend=backend, config=config, seed=seed + 1, isolate=True,
                  **overrides)
    try:
        return compare(record, run_protocol(other, weights, batch, steps))
    finally:
        other.close()


# -- against the reference ------------------------------------------------------------------------

def reference_model(case):
    """The case's model run by the NumPy reference (tbdzoo/reference/model.py)."""
    return Model(case.model, "tiny", case.seed, **case.overrides)


def directions(ref):
    """[(phase index, {parameter: unit-direction slice})]: DIRECTIONS random directions on each of
    at most SLICES runs of whole tensors of each parameter group, for the objective of the
    group's first phase; drawn from the case's seed, so a record and a check agree."""
    rng = np.random.RandomState(ref.seed)
    out = []
    for names, phases in ref.groups().values():
        for chunk in np.array_split(np.arange(len(names)), min(SLICES, len(names))):
            chunk_names = [names[i] for i in chunk]
            for _ in range(DIRECTIONS):
                d = OrderedDict((n, rng.standard_normal(ref.weights[n].shape))
                                for n in chunk_names)
                norm = np.sqrt(sum(float(np.sum(v * v)) for v in d.values()))
                out.append((phases[0], OrderedDict((n, v / norm) for n, v in d.items())))
    return out


def _first_batches(ref, batch):
    """{phase index: the batch of its first update}."""
    out = OrderedDict()
    for phase_index, part in ref.updates(batch):
        out.setdefault(phase_index, part)
    return out


def directional_derivatives(ref, weights, batch):
    """The reference's central difference of each direction's objective, in float64, with
    every stop_gradient's value held at ``weights``' (a gradient does not flow through it)."""
    weights = OrderedDict((k, np.asarray(v, np.float64)) for k, v in weights.items())
    firsts = _first_batches(ref, batch)
    held = OrderedDict((p, ref.stopped(p, part, weights)) for p, part in firsts.items())
    out = []
    for phase_index, d in directions(ref):
        values = []
        for sign in (1.0, -1.0):
            moved = OrderedDict(weights)
            for name, v in d.items():
                moved[name] = weights[name] + sign * EPSILON * v
            values.append(ref.objective(phase_index, firsts[phase_index], moved,
                                        held[phase_index]))
        out.append((values[0] - values[1]) / (2.0 * EPSILON))
    return np.asarray(out, np.float64)


def projections(ref, grads):
    """(g.d, ||g||) of a backend's gradients ``grads`` for each direction (g: the slice's)."""
    dots, norms = [], []
    for _, d in directions(ref):
        g = [np.asarray(grads[n], np.float64) for n in d]
        dots.append(sum(float(np.sum(a * b)) for a, b in zip(g, d.values())))
        norms.append(np.sqrt(sum(float(np.sum(a * a)) for a in g)))
    return np.asarray(dots, np.float64), np.asarray(norms, np.float64)


def reference_record(ref, weights, batch):
    """What the reference says of the protocol's first three parts: forward output(s), each
    objective's loss, the directional derivatives."""
    out = _forward_values(ref.predict(batch))
    out.update(_per_objective("loss", [ref.losses(batch, weights)]))
    out["derivative"] = directional_derivatives(ref, weights, batch)
    return out


def _step_batch_for(ref, parts, k):
    """The step's batch in which update ``k``'s batch comes first within its phase: a backend's
    loss_and_gradients takes each group's gradient on its phase's first batch."""
    same = [i for i, (p, _) in enumerate(parts) if p == parts[k][0]]
    order = list(range(len(parts)))
    order[same[0]], order[k] = order[k], order[same[0]]
    return step_batch(ref, [parts[i] for i in order])


def reference_steps(ref, model, weights, batch, first_grads, steps):
    """The losses ``steps`` training steps report when the reference optimizer takes every
    update with ``model``'s gradients at the reference's weights (``first_grads``: the
    model's at ``weights``, from the protocol). Each update's objective is the reference's,
    on the update's batch; ``model``'s weights are left at the last ones asked about."""
    w = OrderedDict((k, np.asarray(v, np.float64)) for k, v in weights.items())
    groups = ref.optimizer_groups()
    group_of = OrderedDict((p, g) for g, (_, phases) in ref.groups().items() for p in phases)
    parts = ref.updates(batch)
    out = []
    for step in range(steps):
        values = OrderedDict()
        for k, (phase_index, part) in enumerate(parts):
            values[ref.objective_name(phase_index)] = ref.objective(phase_index, part, w)
            if step == 0 and k == 0:
                grads = first_grads
            else:
                model.set_weights(OrderedDict((n, v.astype(np.asarray(weights[n]).dtype))
                                              for n, v in w.items()))
                grads = model.loss_and_gradients(_step_batch_for(ref, parts, k))[1]
            groups[group_of[phase_index]].update(w, grads)
            for hook in ref.hooks(phase_index):  # clip_weights, the one hook kind
                names = groups[hook["group"]].names
                for n, v in zip(names, clip_weights([w[n] for n in names], hook["value"])):
                    w[n] = v
        out.append(values["loss"] if ref.program is None else
                   step_result(ref.program, values))
    return out


def expected_of(ref, model, weights, batch, record, other, steps):
    """The reference's side of the check: ``record`` (its forward, losses, derivatives and the
    pairwise backend's gradients) with the trajectory the reference steps through with
    ``model``'s gradients (``other``: the model's protocol results)."""
    first = OrderedDict((k[len("grad/"):], v) for k, v in other.items() if k.startswith("grad/"))
    expected = OrderedDict(record)
    expected.update(_per_objective(
        "trajectory", reference_steps(ref, model, weights, batch, first, steps)))
    return expected


def reference_rows(expected, other, tolerances=None):
    """One Row per quantity against the reference: forward output(s), each objective's loss,
    the gradient directions, each objective's first-step loss and later losses; then the
    pairwise gradient rows (element-wise and cosine) where ``expected`` holds the pairwise
    backend's gradients (``pairwise/grad/...``)."""
    t = tolerances or TOLERANCES
    rows = _value_rows(expected, other, t)
    if "derivative" in expected:
        rows.append(_direction_row(expected["derivative"], other.get("derivative"),
                                   other.get("derivative_norm"), t["directions"]))
    rows.extend(_trajectory_rows(expected, other, t))
    pairwise = OrderedDict((k[len("pairwise/"):], v) for k, v in expected.items()
                           if k.startswith("pairwise/grad/"))
    if pairwise:
        for row in _gradient_rows(pairwise, other, t["gradients"]):
            rows.append(row._replace(quantity=row.quantity.replace(
                "gradient", "{} gradient".format(PAIRWISE_BACKEND), 1)))
    return rows


def _direction_row(expected, dots, norms, tol):
    quantity = "gradient directions ({})".format(len(expected))
    if dots is None:
        return _missing(quantity)
    bound = tol["rtol"] * np.abs(expected) + tol["atol_of_norm"] * norms
    excess = np.abs(dots - expected)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(bound > 0, excess / bound, np.where(excess > 0, np.inf, 0.0))
    worst = int(np.argmax(ratio)) if ratio.size else 0
    failures = ["gradient direction {}: g.d {:.8g} vs reference {:.8g} (||g|| {:.3g})".format(
        i, dots[i], expected[i], norms[i]) for i in np.flatnonzero(ratio > 1)]
    return Row(quantity, "{:.3g} x tolerance (direction {})".format(
        float(ratio[worst]) if ratio.size else 0.0, worst),
        "rtol {:g}, atol {:g} x ||g||".format(tol["rtol"], tol["atol_of_norm"]),
        not failures, failures)


# -- record and check -----------------------------------------------------------------------------

def _file(directory, case):
    return os.path.join(directory, case.replace("/", "__") + ".npz")


def _overrides(case, backend):
    return dict(case.overrides, **case.backend_overrides.get(backend, {}))


def record_case(name, case, directory, steps=STEPS):
    """Write one case's .npz: the initial weights and the batch every backend starts from (with
    the reference's targets step's inputs when the case replays them), what the reference
    says of them, and the pairwise backend's gradients (run in this process)."""
    ref = reference_model(case)
    weights = OrderedDict((k, v.astype(np.float32)) for k, v in ref.weights.items())
    batch = ref.synthetic_batch(seed=case.seed)
    if case.replays_targets:
        batch = OrderedDict(batch, **ref.step_targets(batch))
    record = reference_record(ref, weights, batch)
    record["steps"] = np.asarray(steps)
    pairwise = build_native(case.model, PAIRWISE_BACKEND, config="tiny", seed=case.seed,
                            device="cpu", **_overrides(case, PAIRWISE_BACKEND))
    try:
        pairwise.set_weights(weights)
        grads = pairwise.loss_and_gradients(batch)[1]
    finally:
        pairwise.close()
    record.update(("pairwise/grad/" + k, np.asarray(v, np.float64)) for k, v in grads.items())
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
    worker, from a different seed than the case's (its weights are set)."""
    weights, batch, record = read_reference(directory, name)
    steps = int(record.pop("steps"))
    if backend == PAIRWISE_BACKEND:  # against itself the pairwise rows would say nothing
        record = OrderedDict((k, v) for k, v in record.items() if not k.startswith("pairwise/"))
    ref = reference_model(case)
    model = build(case.model, backend=backend, config="tiny", seed=case.seed + 1, device="cpu",
                  **_overrides(case, backend))
    try:
        other = run_protocol(model, weights, batch, steps)
        grads = OrderedDict((k[len("grad/"):], v) for k, v in other.items()
                            if k.startswith("grad/"))
        other["derivative"], other["derivative_norm"] = projections(ref, grads)
        expected = expected_of(ref, model, weights, batch, record, other, steps)
    finally:
        model.close()
    return reference_rows(expected, other, tolerances_of(case))


def default_backends():
    """Every ready backend."""
    return [b["name"] for b in list_backends() if b["ready"]]


# -- the command ----------------------------------------------------------------------------------

def add_parser(sub):
    """``tbd consistency record|check``: the subcommand's parser under ``sub``."""
    p = sub.add_parser("consistency", help="every backend against the NumPy reference, case "
                       "by case (docs/consistency.md)")
    actions = p.add_subparsers(dest="consistency_command", metavar="{record,check}")
    actions.required = True
    record = actions.add_parser("record", help="run the NumPy reference (and PyTorch's gradients, "
                                "CPU) and write one .npz per case")
    check = actions.add_parser("check", help="run each backend on the recorded cases; a table "
                               "per case; exit 1 on any failure")
    for q in (record, check):
        q.add_argument("--cases", "--models", dest="cases", default=None,
                       help="comma-separated case names or patterns: resnet50,probe/* "
                            "(default: every case; `tbd consistency check --list` lists them)")
        q.add_argument("--dir", default="consistency-reference",
                       help="folder of the reference .npz files (default: %(default)s)")
    check.add_argument("--backends", default=None,
                       help="comma-separated backends (default: every ready one)")
    check.add_argument("--list", action="store_true", help="list the cases and exit")
    return p


def command(args, console):
    """Run ``tbd consistency``; returns the exit status."""
    patterns = [c for c in (args.cases or "").split(",") if c]
    selected = select(patterns)
    if getattr(args, "list", False):
        for name in selected:
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
            except Exception as e:  # noqa: BLE001  (one broken case must not hide the others)
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
