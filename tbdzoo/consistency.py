"""Cross-framework consistency: one reference record, every backend compared against it.

The reference backend (PyTorch on the CPU) runs a fixed protocol on shared initial weights and
one synthetic batch; another backend runs the same protocol from the same weights and its
results are compared with the tolerances below. Every backend runs in its own worker, so each
uses its own environment, exactly as the suite does.

Protocol: set weights -> predict (inference mode) -> loss and gradients (training mode, no
update) -> ``steps`` optimizer steps (their losses form the trajectory).
"""
from collections import OrderedDict

import numpy as np

from .backends.registry import build

REFERENCE_BACKEND = "torch"

# DESIGN.md section 6. Gradients also get an absolute floor scaled to the tensor: a gradient is
# a sum over the batch, and entries that nearly cancel have no meaningful relative error.
TOLERANCES = {
    "forward": {"rtol": 1e-4, "atol": 1e-5},
    "gradients": {"rtol": 1e-3, "atol_of_max": 1e-4, "min_cosine": 0.9999},
    "trajectory": {"atol": 1e-3},
}


def run_protocol(model, weights, batch, steps=3):
    """What one backend produces under the protocol, as a flat dict of arrays."""
    model.set_weights(weights)
    out = OrderedDict()
    out["forward"] = np.asarray(model.predict(batch), np.float64)
    loss, grads = model.loss_and_gradients(batch)
    out["loss"] = np.float64(loss)
    for name, g in grads.items():
        out["grad/" + name] = np.asarray(g, np.float64)
    out["trajectory"] = np.asarray([model.train_step(batch) for _ in range(steps)], np.float64)
    return out


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
        atol = t["gradients"]["atol_of_max"] * float(np.max(np.abs(r)))
        cos = cosine(g, r)
        if not np.allclose(g, r, rtol=t["gradients"]["rtol"], atol=atol) or cos < t["gradients"]["min_cosine"]:
            failures.append("{}: max abs diff {:.3g} (max ref {:.3g}), cosine {:.6f}".format(
                key, float(np.max(np.abs(g - r))), float(np.max(np.abs(r))), cos))
    if not np.allclose(other["trajectory"], record["trajectory"], rtol=0, atol=t["trajectory"]["atol"]):
        failures.append("trajectory: {} vs reference {}".format(
            np.round(other["trajectory"], 6).tolist(), np.round(record["trajectory"], 6).tolist()))
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
