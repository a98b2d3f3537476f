"""Dropout on every backend, in training mode: which elements it drops, how many, and by how
much it scales the others; and that inference mode leaves its input alone.

No backend exposes a dropout output, so the test reads it from gradients. The probe is
x -> dropout -> flatten -> dense (head.fc) -> cross-entropy, run on ONE example: then
d loss / d W[k, j] = g_k * h_j and d loss / d b[k] = g_k, where h = flatten(dropout(x)) and g is
the gradient of the logits, so h = grad W[k] / grad b[k] for any k with g_k != 0, element by
element: the mask and the scale that backend really used in that step.

Exact agreement where masks can be fed: no framework here lets a caller give its dropout op a
mask (torch.nn.functional.dropout, tf.nn.dropout, mxnet Dropout and cntk.dropout take a rate and
at most a seed, each for its own generator), so two backends never drop the same elements, and
swapping their dropout for x * mask / (1 - rate) would test that multiplication, not their
dropout. Instead each backend's training-mode loss is checked exactly (float32 tolerance)
against the NumPy reference fed the mask that backend drew, recovered as above.
"""
import math

import numpy as np
import pytest

import tbdzoo
from conftest import require_backend
from tbdzoo import reference as ref

RATE = 0.3
LENGTH, WIDTH = 2000, 6  # the probe's input (T, D): 12,000 Bernoulli draws per step
N = LENGTH * WIDTH
FALSE_FAILURE = 1e-9  # probability that a correct dropout falls outside the bounds, per check


def binomial_bounds(n, p, alpha):
    """(lo, hi) with P(X < lo) <= alpha / 2 and P(X > hi) <= alpha / 2 for X ~ Binomial(n, p),
    from the exact distribution (log-space pmf, summed from each tail)."""
    log_pmf = [math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
               + k * math.log(p) + (n - k) * math.log(1 - p) for k in range(n + 1)]
    pmf = [math.exp(v) for v in log_pmf]
    lo, tail = 0, 0.0
    while tail + pmf[lo] <= alpha / 2:
        tail += pmf[lo]
        lo += 1
    hi, tail = n, 0.0
    while tail + pmf[hi] <= alpha / 2:
        tail += pmf[hi]
        hi -= 1
    return lo, hi


# With n = 12,000 and keep probability 0.7 the kept count has mean 8,400 and standard deviation
# 50.2; the bounds sit about 6.1 standard deviations out (+-307), so a correct dropout fails with
# probability <= 1e-9 per check. A rate off by 0.05 moves the mean 600 away, 6 standard
# deviations beyond a bound, and fails with probability > 1 - 1e-9; the keep probability used as
# the rate (mean 3,600) always fails.
KEPT_LO, KEPT_HI = binomial_bounds(N, 1 - RATE, FALSE_FAILURE)


def test_the_bounds_are_the_binomial_quantiles():
    lo, hi = binomial_bounds(100, 0.5, 0.05)  # the textbook 95% interval of 100 fair coins
    assert (lo, hi) == (40, 60)
    assert 8400 - 320 < KEPT_LO < 8400 - 290 and 8400 + 290 < KEPT_HI < 8400 + 320


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.RandomState(11)
    # Inputs in [1, 2]: a kept element (>= 1 / 0.7) can never be mistaken for a dropped one (0).
    x = rng.uniform(1.0, 2.0, size=(1, LENGTH, WIDTH)).astype(np.float32)
    labels = np.array([2], np.int32)
    return {"x": x, "labels": labels}


def _weights(model):
    rng = np.random.RandomState(4)
    w = model.get_weights()
    w["head.fc.weight"] = (rng.standard_normal(w["head.fc.weight"].shape) / np.sqrt(N)).astype(np.float32)
    w["head.fc.bias"] = rng.standard_normal(w["head.fc.bias"].shape).astype(np.float32)
    return w


def dropout_output(model, batch):
    """(training-mode loss, this step's dropout output h of the single example, flattened)."""
    loss, grads = model.loss_and_gradients(batch)
    gw, gb = grads["head.fc.weight"], grads["head.fc.bias"]
    k = int(np.argmax(np.abs(gb)))
    return loss, gw[k].astype(np.float64) / float(gb[k])


@pytest.mark.parametrize("backend", ["torch", "tensorflow", "mxnet", "cntk", "jax"])
def test_dropout_drops_the_rate_and_scales_the_rest(backend, inputs):
    require_backend(backend)
    model = tbdzoo.build("probe/dropout", backend=backend, config="tiny", batch_size=1,
                         dropout=RATE, sequence_length=LENGTH)
    try:
        weights = _weights(model)
        model.set_weights(weights)
        graph = model.spec
        x = inputs["x"].reshape(-1).astype(np.float64)

        # Inference mode: dropout is the identity.
        expected = ref.forward(graph, weights, inputs, training=False)[graph.output]
        np.testing.assert_allclose(model.predict(inputs), expected, rtol=1e-5, atol=1e-6)

        masks = []
        for _ in range(2):
            loss, h = dropout_output(model, inputs)
            kept = h > 0.5  # kept elements are >= 1 / 0.7, dropped ones 0 up to rounding
            np.testing.assert_allclose(h[~kept], 0.0, atol=1e-6)
            # Every kept element is scaled by exactly 1 / (1 - rate): float32 rounding only.
            np.testing.assert_allclose(h[kept], x[kept] / (1 - RATE), rtol=1e-5)
            assert KEPT_LO <= kept.sum() <= KEPT_HI, (
                "{} kept {} of {} at rate {}; a correct dropout keeps {}..{} (false-failure "
                "probability 1e-9)".format(backend, kept.sum(), N, RATE, KEPT_LO, KEPT_HI))
            # Expectation preserved: mean(h / x) = kept / (n (1 - rate)) is 1 within the same
            # binomial bounds; without the 1 / (1 - rate) scaling it would be 0.7.
            assert KEPT_LO / (N * (1 - RATE)) <= np.mean(h / x) <= KEPT_HI / (N * (1 - RATE))

            # Given the mask this backend drew, its training-mode loss is the reference's.
            mask = kept.reshape(LENGTH, WIDTH)[None].astype(np.float64)
            outputs = ref.forward(graph, weights, inputs, training=True, masks={"drop": mask})
            assert loss == pytest.approx(ref.loss(graph, outputs, inputs), rel=1e-5)
            masks.append(kept)
        # A fresh mask each step: two equal masks of 12,000 draws have probability 0.58^12000.
        assert not np.array_equal(masks[0], masks[1])
    finally:
        model.close()
