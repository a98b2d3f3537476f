"""Measuring training: step timing now; samplers, FLOP and memory accounting build on it."""
from .timing import summarize, time_training

__all__ = ["summarize", "time_training"]
