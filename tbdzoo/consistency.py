"""Cross-framework consistency: one reference record, every backend compared against it.

The reference backend (PyTorch on the CPU) runs a fixed protocol on shared initial weights and
one synthetic batch; another backend runs the same protocol from the same weights and its
results are compared with the tolerances below. Every backend runs in its own worker, so each
uses its own environment, exactly as the suite does.

Protocol: set weights -> predict (inference mode) -> loss and gradients (training mode, no
update) -> ``steps`` optimizer steps (their losses form the trajectory).
"""
import os
from collections import OrderedDict

import numpy as np

from .backends.registry import build
from .weights import load_arrays, save_arrays

REFERENCE_BACKEND = "torch"

# docs/consistency.md. Gradients also get an absolute floor scaled to the tensor: a gradient is
# a sum over the batch, and entries that nearly cancel have no meaningful relative error.
# ``atol_of_global`` is a floor scaled to the largest gradient of the whole model: a parameter
# whose gradient is zero in exact arithmetic (attention's b_k: softmax ignores a shift shared by
# all keys) holds only rounding noise (~1e-8 of the largest), which has no direction to compare.
TOLERANCES = {
    "forward": {"rtol": 1e-4, "atol": 1e-5},
    "gradients": {"rtol": 1e-3, "atol_of_max": 1e-4, "atol_of_global": 1e-6, "min_cosine": 0.9999},
    "trajectory": {"atol": 1e-3},
}


def run_protocol(model, weights, batch, steps=3):
    """What one backend produces under the protocol, as a flat dict of arrays."""
    model.set_weights(weights)
    out = OrderedDict()
    out["forward"] = np.asarray(model.predict(batch), np.float64)
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


def reference(model_name, config="tiny", seed=0, steps=3, **overrides):
    """(weights, batch, record) from the reference backend, in a worker of its own."""
    ref = build(model_name, backend=REFERENCE_BACKEND, config=config, seed=seed, isolate=True,
                **overrides)
    try:
        weights = ref.get_weights()
        batch = ref.synthetic_batch(seed=seed)
        record = run_protocol(ref, weights, batch, steps)
    finally:
        ref.close()
    return weights, batch, record


def compare(record, other):
    """A list of human-readable failures (empty when ``other`` matches ``record``)."""
    failures = []
    t = TOLERANCES
    a, b = other["forward"], record["forward"]
    if a.shape != b.shape:
        failures.append("forward: shape {} vs reference {}".format(a.shape, b.shape))
    elif not np.allclose(a, b, rtol=t["forward"]["rtol"], atol=t["forward"]["atol"]):
        failures.append("forward: max abs diff {:.3g} (max ref {:.3g})".format(
            float(np.max(np.abs(a - b))), float(np.max(np.abs(b)))))
    grad_keys = [k for k in record if k.startswith("grad/")]
    floor = t["gradients"]["atol_of_global"] * max(
        [float(np.max(np.abs(record[k]))) for k in grad_keys if record[k].size] or [0.0])
    for key in record:
        if not key.startswith("grad/"):
            continue
        if key not in other:
            failures.append("{}: missing".format(key))
            continue
        g, r = other[key], record[key]
        if g.shape != r.shape:
            failures.append("{}: shape {} vs reference {}".format(key, g.shape, r.shape))
            continue
        atol = max(t["gradients"]["atol_of_max"] * float(np.max(np.abs(r))), floor)
        cos = cosine(g, r) if float(np.max(np.abs(r))) > floor else 1.0
        if not np.allclose(g, r, rtol=t["gradients"]["rtol"], atol=atol) or cos < t["gradients"]["min_cosine"]:
            failures.append("{}: max abs diff {:.3g} (max ref {:.3g}), cosine {:.6f}".format(
                key, float(np.max(np.abs(g - r))), float(np.max(np.abs(r))), cos))
    for key in (k for k in record if k == "trajectory" or k.startswith("trajectory/")):
        if key not in other:
            failures.append("{}: missing".format(key))
        elif not np.allclose(other[key], record[key], rtol=0, atol=t["trajectory"]["atol"]):
            failures.append("{}: {} vs reference {}".format(
                key, np.round(other[key], 6).tolist(), np.round(record[key], 6).tolist()))
    return failures


def cosine(a, b):
    a, b = a.ravel(), b.ravel()
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(np.dot(a, b) / (na * nb))


def check_backend(model_name, backend, config="tiny", seed=0, steps=3, **overrides):
    """Run the reference and ``backend`` and return the failures (empty: consistent)."""
    weights, batch, record = reference(model_name, config, seed, steps, **overrides)
    other = build(model_name, backend=backend, config=config, seed=seed + 1, isolate=True,
                  **overrides)
    try:
        return compare(record, run_protocol(other, weights, batch, steps))
    finally:
        other.close()


# -- the file-based protocol: one reference run, one process per backend ------------------------
# The reference writes one .npz per case; ``check`` runs in the backend's own environment,
# builds every case natively in one process and writes its failures as JSON. The test-suite
# and `python -m tbdzoo.consistency` use these.

def cases():
    """Case name -> overrides. Consistency runs use the tiny configs without dropout."""
    from .models.probes import PROBES
    out = OrderedDict(("probe/" + p, {}) for p in PROBES)
    out["resnet50"] = {}
    out["transformer"] = {"dropout": 0.0}
    out["seq2seq"] = {}        # ragged sentences: padding, masks and lengths exercised
    out["deepspeech2"] = {}    # ragged utterances through the convolutions, GRUs and CTC
    out["a3c"] = {}            # a recorded rollout's update: policy gradient, entropy, value
    return out


def _file(directory, case):
    return os.path.join(directory, case.replace("/", "__") + ".npz")


def write_reference(directory, names=None, seed=0, steps=3):
    """Run the reference backend in this process and write one .npz per case."""
    from .backends.registry import build_native
    os.makedirs(directory, exist_ok=True)
    for case, overrides in cases().items():
        if names and case not in names:
            continue
        ref = build_native(case, REFERENCE_BACKEND, config="tiny", seed=seed, **overrides)
        weights = ref.get_weights()
        batch = ref.synthetic_batch(seed=seed)
        record = run_protocol(ref, weights, batch, steps)
        arrays = OrderedDict()
        arrays.update(("weight/" + k, v) for k, v in weights.items())
        arrays.update(("batch/" + k, v) for k, v in batch.items())
        arrays.update(("record/" + k, v) for k, v in record.items())
        save_arrays(_file(directory, case), arrays)


def _split(arrays, prefix):
    return OrderedDict((k[len(prefix):], v) for k, v in arrays.items() if k.startswith(prefix))


def check_directory(backend, directory, names=None, seed=1):
    """case -> list of failures for ``backend`` in this process, against the reference files."""
    from .backends.registry import build_native
    results = OrderedDict()
    for case, overrides in cases().items():
        if names and case not in names:
            continue
        try:
            arrays = load_arrays(_file(directory, case))
            record = _split(arrays, "record/")
            steps = len(record["trajectory"])
            model = build_native(case, backend, config="tiny", seed=seed, **overrides)
            other = run_protocol(model, _split(arrays, "weight/"), _split(arrays, "batch/"), steps)
            results[case] = compare(record, other)
        except Exception as e:  # one broken case must not hide the others
            results[case] = ["{}: {}".format(type(e).__name__, e)]
    return results


def main(argv=None):
    import argparse
    import json
    p = argparse.ArgumentParser(prog="python -m tbdzoo.consistency", description=__doc__)
    p.add_argument("action", choices=("record", "check"))
    p.add_argument("--dir", required=True, help="folder of reference .npz files")
    p.add_argument("--backend", help="backend to check (check only)")
    p.add_argument("--cases", help="comma-separated case names (default: all)")
    p.add_argument("--out", help="write the check's results as JSON here")
    args = p.parse_args(argv)
    if args.action == "check" and not args.backend:
        from .backends.registry import BACKEND_NAMES
        p.error("check needs --backend, the backend to compare with the reference: one of {}"
                .format(", ".join(BACKEND_NAMES)))
    names = args.cases.split(",") if args.cases else None
    if args.action == "record":
        write_reference(args.dir, names)
        return 0
    results = check_directory(args.backend, args.dir, names)
    text = json.dumps(results, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0 if not any(results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
