"""Learning-rate schedules as plain functions of the step, shared by every backend.

Backends receive the learning rate as a number each step, so a schedule is written once and
means the same everywhere. ``step`` counts the optimizer steps already taken (0 for the first).
Epoch-based schedules count epochs as ``steps_per_epoch`` steps, which a model derives from the
dataset size its config assumes (``train_examples``) and the batch, so milestones stay in epochs
whatever the batch size.
"""
import math


def steps_per_epoch(train_examples, batch_size):
    """Optimizer steps in one pass over ``train_examples``, the last batch partial."""
    return -(-int(train_examples) // int(batch_size))


def learning_rate(hp, step):
    kind = hp["lr_schedule"]
    if kind == "constant":
        return float(hp["lr"])
    if kind == "step":
        epoch = step // hp["steps_per_epoch"]
        passed = sum(1 for m in hp["lr_milestones"] if epoch >= m)
        return float(hp["lr"] * hp["lr_decay"] ** passed)
    if kind == "exponential":
        # lr x decay every ``decay_epochs`` whole epochs (a staircase, as Inception-v3 trains)
        epoch = step // hp["steps_per_epoch"]
        return float(hp["lr"] * hp["lr_decay"] ** (epoch // hp["decay_epochs"]))
    if kind == "linear":
        # annealed linearly to 0 over ``anneal_steps`` steps, then held at 0 (A3C)
        return float(hp["lr"] * max(0.0, 1.0 - step / float(hp["anneal_steps"])))
    if kind == "inverse_sqrt":
        # Vaswani et al.: lr * d_model^-0.5 * min(n^-0.5, n * warmup^-1.5), n counted from 1
        n = step + 1
        return float(hp["lr"] * hp["d_model"] ** -0.5 *
                     min(n ** -0.5, n * hp["warmup_steps"] ** -1.5))
    raise ValueError("unknown lr_schedule {!r}; known: constant, step, exponential, linear, inverse_sqrt".format(kind))


def check(hp):
    """Fail at build time, not at step 40,000, on a schedule that cannot be evaluated."""
    value = learning_rate(hp, 0)
    if not math.isfinite(value) or value < 0:
        raise ValueError("learning rate {} at step 0 is not a finite non-negative number".format(value))
