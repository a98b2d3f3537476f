"""The error of training to a target: a bad target, a model without a task, a data folder of
the wrong layout. A TbdError, so `tbd` prints it and exits with code 2."""
from ..errors import TbdError


class TrainingError(TbdError, ValueError):
    """A target, model or data folder `train_to_target` cannot use; the message says the fix."""
