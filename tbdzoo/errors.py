"""Errors a user can act on: each message names the problem and the fix."""


class TbdError(Exception):
    """Base class of every error tbdzoo raises on purpose."""


class UnknownNameError(TbdError, KeyError):
    """A model, config, hyperparameter or backend name that does not exist."""

    def __init__(self, kind, name, known):
        self.kind, self.name, self.known = kind, name, sorted(known)
        super().__init__("unknown {} {!r}; known: {}".format(
            kind, name, ", ".join(self.known) or "(none)"))

    def __str__(self):  # KeyError would otherwise print the repr of the message
        return self.args[0]


class BackendUnavailableError(TbdError):
    """The backend's framework or its environment is not installed."""


class WeightsError(TbdError, ValueError):
    """A weights file or dict does not match the model; nothing was loaded."""


class WorkerError(TbdError, RuntimeError):
    """A backend worker process failed, crashed or stopped answering."""


class UnsupportedOptionError(TbdError, ValueError):
    """A normalized option that this backend's framework cannot honour."""


class HyperparameterError(TbdError, ValueError):
    """A hyperparameter value of the wrong type or outside what the model allows."""


class UnsupportedOpError(TbdError, ValueError):
    """A model uses a node type its backend does not implement."""


class DistributedError(TbdError, RuntimeError):
    """A data-parallel run failed: a rank or helper process died, hung or was refused."""


class DetectionInputError(TbdError, ValueError):
    """A box, image size or class id given to the detection reference that it cannot use."""


class BatchError(TbdError, ValueError):
    """A batch the model cannot take: an input missing, of the wrong shape or type, or holding a
    value outside what the model allows. Raised before any framework sees the batch, so nothing
    changed. ``input``, ``position`` (an index tuple into that input, or None) and ``value`` name
    the first offence; ``allowed`` says what the input may hold."""

    input = position = value = allowed = None  # as they read on an error a worker raised

    def __init__(self, message, input=None, position=None, value=None, allowed=None):
        super().__init__(message)
        self.input, self.position, self.value, self.allowed = input, position, value, allowed


class NonFiniteStepError(TbdError, FloatingPointError):
    """A training step whose loss or gradients came out NaN or infinite. The update was not
    applied: weights, optimizer state, statistics and step counters are as before the step.
    ``objective`` names the objective and ``step`` the step count it would have been."""

    def __init__(self, message, objective=None, step=None):
        super().__init__(message)
        self.objective, self.step = objective, step


class ConsistencyReferenceError(TbdError, FileNotFoundError):
    """A consistency check asked for reference files that were never recorded."""
