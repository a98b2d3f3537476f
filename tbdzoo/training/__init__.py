"""Training to a target accuracy: a task per model family (how to make training batches from a
data folder and how to score the held-out split), the loop that trains until the target is met
(`train_to_target`), MLPerf-style log lines and the record `tbd train` appends.
docs/training.md."""
from .errors import TrainingError
from .loop import TrainResult
from .proxies import proxy_overrides
from .run import train_to_target
from .targets import Target, parse_target

__all__ = ["train_to_target", "TrainResult", "TrainingError", "Target", "parse_target",
           "proxy_overrides"]
