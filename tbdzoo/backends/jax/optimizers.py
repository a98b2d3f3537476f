"""The normalized optimizers (tbdzoo/backends/common/optimizers.py, docs/optimizers.md) as Optax
gradient transformations, each taking the step's ``learning_rate`` as an extra argument (the
schedule moves it every step; the jitted step reads it as an input, not a constant):

  sgd      add_decayed_weights(wd) -> trace(momentum, nesterov) -> -lr      (Optax's trace is
           buf = g + momentum buf, PyTorch's buffer; nesterov: g + momentum buf)
  adam     add_decayed_weights(wd) -> scale_by_adam(b1, b2, eps) -> -lr     (bias-corrected
           moments, eps outside the root: the formula)
  rmsprop  add_decayed_weights(wd) -> scale_by_rms / scale_by_stddev (eps inside the root)
           -> momentum_of_rate: b = momentum b + lr u; w -= b (the rate inside the buffer,
           where optax.rmsprop puts it outside)

A group's clipping comes first: ``global_norm`` scales every gradient by
min(1, c / (norm + 1e-6)) (optax.clip_by_global_norm has no 1e-6), ``value`` is optax.clip.
"""
from . import framework  # noqa: F401  (first: JAX imported quietly, full float32 precision)

# isort: split
import jax
import jax.numpy as jnp
import optax

from ...spec.optimizers import optimizer_hyperparameters
from ..common import optimizers as normalized


def _descend():
    """u -> -learning_rate * u."""
    def init(params):
        return optax.EmptyState()

    def update(updates, state, params=None, *, learning_rate, **extra):
        return jax.tree.map(lambda u: -learning_rate * u, updates), state
    return optax.GradientTransformationExtraArgs(init, update)


def _momentum_of_rate(momentum):
    """b = momentum b + learning_rate u; the update is -b (RMSProp's buffer, which holds the
    rate, so a changing rate does not rescale the past)."""
    def init(params):
        return {"buffer": jax.tree.map(jnp.zeros_like, params)}

    def update(updates, state, params=None, *, learning_rate, **extra):
        buffer = jax.tree.map(lambda b, u: momentum * b + learning_rate * u, state["buffer"],
                              updates)
        return jax.tree.map(jnp.negative, buffer), {"buffer": buffer}
    return optax.GradientTransformationExtraArgs(init, update)


def clip_by_global_norm(value):
    """g * min(1, value / (norm + 1e-6)) for every gradient of the group."""
    def init(params):
        return optax.EmptyState()

    def update(updates, state, params=None, **extra):
        factor = jnp.minimum(1.0, value / (optax.global_norm(updates) + 1e-6))
        return jax.tree.map(lambda g: g * factor, updates), state
    return optax.GradientTransformationExtraArgs(init, update)


def transformation(name, o, clip=None):
    """The optimizer ``name`` with hyperparameters ``o`` (and a group's clipping ``clip``)."""
    parts = []
    if clip is not None:
        parts.append(clip_by_global_norm(clip["value"]) if clip["kind"] == "global_norm"
                     else optax.clip(clip["value"]))
    if o["weight_decay"]:
        parts.append(optax.add_decayed_weights(o["weight_decay"]))
    if name == "sgd":
        if o["momentum"]:
            parts.append(optax.trace(o["momentum"], o["nesterov"]))
        parts.append(_descend())
    elif name == "adam":
        parts += [optax.scale_by_adam(o["beta1"], o["beta2"], o["eps"]), _descend()]
    elif name == "rmsprop":
        scale = optax.scale_by_stddev if o["centered"] else optax.scale_by_rms
        parts += [scale(decay=o["alpha"], eps=o["eps"], initial_scale=0.0),
                  _momentum_of_rate(o["momentum"])]
    else:
        raise ValueError("optimizer {!r} has no Optax form here".format(name))
    return optax.chain(*parts)


def make(hparams):
    """A model's optimizer (its flat hyperparameters)."""
    name = normalized.check(hparams)
    return transformation(name, normalized.hyperparameters(hparams))


def make_group(spec):
    """The optimizer of a program's parameter group (its optimizer entry and clipping)."""
    optimizer = spec["optimizer"]
    return transformation(optimizer["kind"],
                          optimizer_hyperparameters(optimizer["kind"], optimizer), spec["clip"])
