"""The one source of randomness of the detection samplers: a ``numpy.random.RandomState`` per
(run seed, step, purpose, image). RandomState's stream is frozen across NumPy versions, so the
CNTK worker (NumPy 1.19) and the main environment (NumPy 1.26) draw the same samples."""
from ....spec.targets import seeded_rng

ANCHOR_TARGETS = "anchor_targets"
SAMPLE_ROIS = "sample_rois"


def step_rng(run_seed, step, purpose, image=0):
    """A RandomState seeded from (run seed, step, purpose, image in the batch), each sampler its
    own, so the boxes one sampler picks never shift another's draws (the program's targets
    seeding, tbdzoo/spec/targets.py)."""
    return seeded_rng(run_seed, step, purpose, image)
