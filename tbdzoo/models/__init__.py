"""One builder per model: hyperparameters in one place, the graph built from them."""
from .catalog import get_model, list_models
from .registry import ModelDef, register_model

__all__ = ["ModelDef", "get_model", "list_models", "register_model"]
