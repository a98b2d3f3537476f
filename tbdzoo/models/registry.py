"""The model registry: ``@register_model`` adds a model definition (catalog.py finds it)."""
from collections import OrderedDict

from .. import schedules
from ..errors import HyperparameterError, UnknownNameError
from . import constraints

_MODELS = OrderedDict()


# How a step executes, the same knobs for every model; each backend honours what its framework
# can and refuses the rest by name (BackendModel.OPTIONS).
EXECUTION_DEFAULTS = {
    "precision": "fp32",        # fp32 | tf32 (fp32 storage, TF32 matmuls on GPUs) | bf16 (mixed)
    "execution": "default",     # default (the framework's idiom) | eager | compiled
    "memory_format": "auto",    # auto | channels_first | channels_last (convolutions)
}


class ModelDef:
    """What a model is, independent of any framework.

    ``configs`` maps a config name to a full hyperparameter dict; ``paper`` is the default.
    ``build_graph(hp)`` returns the spec; ``synthetic_batch(hp, batch_size, seed)`` returns
    NumPy arrays keyed by the graph's input names; ``items(hp, batch)`` counts the throughput
    unit in a batch (by the hyperparameters: the Transformer's padding id, for one).
    ``check_batch(hp, batch)``, if given, raises BatchError for a batch the model cannot take
    beyond what the graph alone tells (Seq2Seq's labels past a target's length, say); every
    backend runs it on every batch, on the inputs the call reads, as part of the one batch
    check (tbdzoo/backends/common/batches.py).
    ``inference(model, batch)``, if given, is what ``model.predict(batch)`` returns, for a model
    whose inference is more than its graph's output (Faster R-CNN: proposals, the head on
    them and NMS around the graph); it reads graph values with ``model.values(batch, names)``
    and the inputs ``inference_inputs`` names (without a hook: those the output reads).
    Every hyperparameter has a rule (tbdzoo/models/constraints.py): the shared table plus the
    model's own, set with :meth:`constrain`, with ``checks`` for values that must agree.
    The rest of the model's card (tbdzoo/models/card.py), each None where it does not apply:
    ``training`` (its task, metrics, default target and proxy config), ``benchmark`` (the
    suite's CPU batch and overrides), ``consistency`` (its cross-framework case), ``image``
    (the image pipelines' normalisation) and ``measured`` (parameters, FLOPs per example).
    """

    def __init__(self, name, domain, configs, build_graph, synthetic_batch, unit, items,
                 check_batch=None, inference=None, inference_inputs=None, training=None,
                 benchmark=None, consistency=None, image=None, measured=None):
        configs = {k: _with_steps_per_epoch(dict(EXECUTION_DEFAULTS, **v)) for k, v in configs.items()}
        self.name, self.domain, self.configs = name, domain, configs
        self.build_graph, self.synthetic_batch = build_graph, synthetic_batch
        self.unit, self.items = unit, items
        self.check_batch = check_batch
        self.inference = inference
        self.inference_inputs = None if inference_inputs is None else tuple(inference_inputs)
        self.training, self.benchmark, self.consistency = training, benchmark, consistency
        self.image, self.measured = image, measured
        self.constrain()

    def constrain(self, rules=None, checks=()):
        """Set the model's own rules (on top of the shared ones) and cross-checks; returns self."""
        self.rules, self.checks = constraints.rules_for(rules), tuple(checks)
        return self

    def hparams(self, config="paper", **overrides):
        """The config's hyperparameters with ``overrides`` applied, every value checked against
        its rule: unknown names raise UnknownNameError, bad values HyperparameterError."""
        if config not in self.configs:
            raise UnknownNameError("config of " + self.name, config, self.configs)
        hp = dict(self.configs[config])
        unknown = sorted(set(overrides) - set(hp))
        if unknown:
            raise UnknownNameError("hyperparameter of " + self.name, unknown[0], hp)
        hp.update(overrides)
        for key in sorted(hp):
            if key not in self.rules:
                raise HyperparameterError("hyperparameter {} of {} has no rule; add one to the "
                                          "model's table".format(key, self.name))
            hp[key] = self.rules[key].check(key, hp[key], self.name)
        if "steps_per_epoch" not in overrides:  # epochs stay epochs when the batch changes
            hp = _with_steps_per_epoch(hp, derive=True)
        for check in self.checks:
            message = check(hp)
            if message:
                raise HyperparameterError("{}: {}".format(self.name, message))
        hp["model"], hp["config"] = self.name, config
        return hp

    def uncovered(self):
        """Config keys that have no rule (none, when the table is complete)."""
        return sorted(set(k for hp in self.configs.values() for k in hp) - set(self.rules))


def _with_steps_per_epoch(hp, derive=False):
    """Fill ``steps_per_epoch`` from the dataset size the config assumes (``train_examples``)
    and the batch; a config or override that sets it explicitly keeps its value."""
    if "train_examples" in hp and (derive or "steps_per_epoch" not in hp):
        hp = dict(hp, steps_per_epoch=schedules.steps_per_epoch(hp["train_examples"], hp["batch_size"]))
    return hp


def register_model(name, domain, configs, unit, items, synthetic_batch, rules=None, checks=(),
                   check_batch=None, inference=None, inference_inputs=None, **card):
    """Decorator for a graph builder ``fn(hp) -> Graph``; ``card`` takes ModelDef's card
    fields (training, benchmark, consistency, image, measured)."""
    def wrap(build_graph):
        if name in _MODELS:
            raise ValueError("model {!r} is registered twice".format(name))
        _MODELS[name] = ModelDef(name, domain, configs, build_graph, synthetic_batch, unit,
                                 items, check_batch, inference, inference_inputs,
                                 **card).constrain(rules, checks)
        return build_graph
    return wrap
