"""What each hyperparameter may hold: a table of rules checked whenever a model is built.

``COMMON`` covers the names every model shares (the batch, the optimizer, the schedule, the
execution options); each model module adds the rules of its own names. ``ModelDef.hparams``
checks every value against its rule, in the caller's process and again in a worker, so a bad
value is refused by name before any framework builds anything. ``Rule.parse`` turns command-line
text into the type the rule holds. Valid Python 3.6: the CNTK worker imports it.
"""
import math

from ..errors import HyperparameterError
from ..spec.optimizers import OPTIMIZERS

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def _number_text(value):
    return "{:g}".format(value) if isinstance(value, float) else str(value)


class Rule:
    """One hyperparameter's type and the values it allows.

    ``kind`` is int, float, bool, str or tuple (then ``item`` is the elements' type).
    ``low``/``high`` bound numbers (and tuple elements), inclusive unless ``open_low``/
    ``open_high``; ``choices`` lists every allowed value; ``ascending`` asks a tuple to be sorted.
    """

    def __init__(self, kind, low=None, high=None, open_low=False, open_high=False, choices=None,
                 item=None, ascending=False):
        self.kind, self.item = kind, item
        self.low, self.high, self.open_low, self.open_high = low, high, open_low, open_high
        self.choices, self.ascending = choices, ascending

    # -- what is allowed, in words ------------------------------------------------------------
    def _bounds(self):
        parts = []
        if self.low is not None:
            parts.append("{} {}".format(">" if self.open_low else ">=", _number_text(self.low)))
        if self.high is not None:
            parts.append("{} {}".format("<" if self.open_high else "<=", _number_text(self.high)))
        return " and ".join(parts)

    def allowed(self):
        if self.choices is not None:
            return "one of: " + ", ".join(str(c) for c in self.choices)
        if self.kind is bool:
            return "true or false"
        if self.kind is tuple:
            words = "a list of {}".format("integers" if self.item is int else "numbers")
            bounds = self._bounds()
            return words + (", each " + bounds if bounds else "") + (
                ", in ascending order" if self.ascending else "")
        words = {int: "an integer", float: "a number", str: "a string"}[self.kind]
        bounds = self._bounds()
        return words + (" " + bounds if bounds else "")

    def type_name(self):
        if self.kind is tuple:
            return "comma-separated {}".format("integers" if self.item is int else "numbers")
        return {int: "an integer", float: "a number", bool: "true or false (or 1/0, yes/no)",
                str: "a string"}[self.kind]

    # -- checking -----------------------------------------------------------------------------
    def _in_bounds(self, value):
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        if self.high is not None and (value >= self.high if self.open_high else value > self.high):  # noqa: SIM103  (the two bounds read alike)
            return False
        return True

    @staticmethod
    def _scalar(kind, value):
        """``value`` as ``kind``, or None when it is not one (bool is never a number here)."""
        if isinstance(value, bool):
            return value if kind is bool else None
        if kind is int:
            return value if isinstance(value, int) else None
        if kind is float:
            return float(value) if isinstance(value, (int, float)) else None
        if kind is str:
            return value if isinstance(value, str) else None
        return None

    def check(self, name, value, model=None):
        """``value`` in the rule's type (ints become floats where a number is held; lists
        become tuples), or HyperparameterError naming the hyperparameter, value and rule."""
        if self.kind is tuple:
            if not isinstance(value, (tuple, list)):
                raise self.error(name, value, model)
            items = [self._scalar(self.item, v) for v in value]
            if any(v is None or not self._in_bounds(v) for v in items) or (
                    self.ascending and items != sorted(items)):
                raise self.error(name, value, model)
            return tuple(items)
        checked = self._scalar(self.kind, value)
        if checked is None:
            raise self.error(name, value, model)
        if self.choices is not None and checked not in self.choices:
            raise self.error(name, value, model)
        if self.kind is float and not math.isfinite(checked):
            raise self.error(name, value, model)
        if self.kind in (int, float) and not self._in_bounds(checked):
            raise self.error(name, value, model)
        return checked

    def error(self, name, value, model=None):
        return HyperparameterError("hyperparameter {}{} = {!r} is not allowed; {} takes {}".format(
            name, " of " + model if model else "", value, name, self.allowed()))

    # -- parsing ------------------------------------------------------------------------------
    def parse(self, name, text):
        """Command-line text as the rule's type (not yet checked against its bounds)."""
        try:
            if self.kind is tuple:
                return tuple(self._parse_scalar(self.item, t.strip()) for t in text.split(",")
                             if t.strip())
            return self._parse_scalar(self.kind, text.strip())
        except ValueError:
            raise HyperparameterError("hyperparameter {}: cannot read {!r} as {}; {} takes {}".format(
                name, text, self.type_name(), name, self.allowed())) from None

    @staticmethod
    def _parse_scalar(kind, text):
        if kind is bool:
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ValueError(text)
        return kind(text)


def integer(low=None, high=None):
    return Rule(int, low, high)


def number(low=None, high=None, open_low=False, open_high=False):
    return Rule(float, low, high, open_low, open_high)


def boolean():
    return Rule(bool)


def choice(*values):
    return Rule(type(values[0]), choices=values)


def integers(low=None, high=None, ascending=False):
    return Rule(tuple, low, high, item=int, ascending=ascending)


def fraction():
    """A probability-like rate: 0 <= p < 1 (dropout, label smoothing, momentum, Adam's betas)."""
    return number(0.0, 1.0, open_high=True)


# The rules every model shares; a model module's own table adds the rest.
COMMON = {
    # the step
    "batch_size": integer(1),
    "optimizer": choice(*OPTIMIZERS),
    "lr": number(0.0, open_low=True),
    "momentum": fraction(),
    "nesterov": boolean(),
    "weight_decay": number(0.0),
    "beta1": fraction(),
    "beta2": fraction(),
    "eps": number(0.0, open_low=True),
    "alpha": fraction(),                 # RMSProp's decay of the squared-gradient average
    "centered": boolean(),
    "grad_clip_norm": number(0.0),       # 0: no clipping
    "label_smoothing": fraction(),
    "dropout": fraction(),
    "attention_dropout": fraction(),
    # the learning-rate schedule (tbdzoo/schedules.py)
    "lr_schedule": choice("constant", "step", "exponential", "inverse_sqrt", "linear"),
    "decay_epochs": integer(1),
    "lr_decay": number(0.0, 1.0, open_low=True),
    "lr_milestones": integers(0, ascending=True),
    "train_examples": integer(1),
    "steps_per_epoch": integer(1),
    "warmup_steps": integer(1),
    "anneal_steps": integer(1),          # the linear schedule reaches 0 after this many steps
    # how a step executes (tbdzoo/models/registry.py: EXECUTION_DEFAULTS)
    "precision": choice("fp32", "tf32", "bf16"),
    "execution": choice("default", "eager", "compiled"),
    "memory_format": choice("auto", "channels_first", "channels_last"),
}


def rules_for(model_rules=None):
    """The full table of one model: the common rules, then its own (which may tighten them)."""
    table = dict(COMMON)
    table.update(model_rules or {})
    return table
