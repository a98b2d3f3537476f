"""Timing measures finished work, on the GPU the run uses, for the batch that ran."""
import json
import os

import pytest

import tbdzoo
from tbdzoo.backends import environments

import completion_probe
from conftest import require_backend, run_in_env

# A step that returned with work still queued leaves a large part of its own time to drain
# (MXNet once returned with its backward pass and update queued: 20-70% of the step here);
# a complete one leaves nothing. The median over trials keeps a preempted drain from counting.
QUEUED_AT_MOST = 0.05


def _median(values):
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _probe(backend):
    require_backend(backend)
    if environments.importable_here(backend):
        model = tbdzoo.build("resnet50", backend, config="tiny", **completion_probe.OVERRIDES)
        prepared = model.prepare_batch(model.synthetic_batch())
        return completion_probe.probe_model(model, prepared, lambda: model.train_step(prepared))
    probe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "completion_probe.py")
    proc = run_in_env(environments.python_for(backend), [probe, backend], timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", ["tensorflow", "mxnet", "torch", "cntk"])
def test_a_step_and_every_timed_window_end_with_the_work_done(backend):
    fractions = _probe(backend)
    for moment in ("steps", "first_step", "last_window"):
        assert _median(fractions[moment]) <= QUEUED_AT_MOST, (
            "{}: work was still queued after {}: {}".format(backend, moment, fractions))
