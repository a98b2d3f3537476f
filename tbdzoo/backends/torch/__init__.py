"""PyTorch backend: the spec as a ``torch.nn.Module``; the consistency reference."""
from .model import Model, SpecModule

__all__ = ["Model", "SpecModule"]
