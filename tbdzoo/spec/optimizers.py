"""The optimizers, one table: for each, the hyperparameters its formula reads besides the
scheduled learning rate, which of them are switches, whether a model may name it as its
``optimizer`` (else only a training program's parameter group uses it, docs/programs.md), and
the tensors it keeps per parameter. Every backend, the spec's programs, the models' rules and
the memory model read it; the formulas are docs/optimizers.md's, written out in NumPy by
tbdzoo/reference/optimizers.py (the reference every backend is tested against).
Valid Python 3.6 (the CNTK worker reads it)."""
from collections import OrderedDict, namedtuple

Optimizer = namedtuple("Optimizer", "hyperparameters switches model_level slots")

OPTIMIZERS = OrderedDict([
    # buf = momentum buf + g (a buffer only with momentum)
    ("sgd", Optimizer(("momentum", "nesterov", "weight_decay"), ("nesterov",), True,
                      lambda hp: 1 if hp.get("momentum") else 0)),
    # first and second moments
    ("adam", Optimizer(("beta1", "beta2", "eps", "weight_decay"), (), True, lambda hp: 2)),
    # squared-gradient average and momentum buffer (+ the mean gradient when centred)
    ("rmsprop", Optimizer(("alpha", "eps", "momentum", "centered", "weight_decay"), ("centered",),
                          False, lambda hp: 3 if hp.get("centered") else 2)),
])
# What a model's ``optimizer`` may name: every backend runs these for a whole model.
MODEL_OPTIMIZERS = tuple(name for name, o in OPTIMIZERS.items() if o.model_level)


def optimizer_hyperparameters(name, hparams):
    """``name``'s hyperparameters from ``hparams`` (a model's, or a program group's optimizer
    entry), switches as bools and the rest as floats, in the table's order."""
    switches = OPTIMIZERS[name].switches
    return OrderedDict((k, bool(hparams[k]) if k in switches else float(hparams[k]))
                       for k in OPTIMIZERS[name].hyperparameters)


def state_slots(name, hparams):
    """Tensors ``name`` keeps per trainable parameter under ``hparams`` (0 for no optimizer)."""
    return OPTIMIZERS[name].slots(hparams) if name in OPTIMIZERS else 0
