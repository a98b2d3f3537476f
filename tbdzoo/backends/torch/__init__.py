"""PyTorch backend: the spec as a ``torch.nn.Module`` (model.py); the consistency reference.

This file declares the backend (``BACKEND``) without importing PyTorch; its modules import it
as they are first used."""
from ..info import BackendInfo

BACKEND = BackendInfo(name="torch", framework="torch", environment="main",
                      imports=("torch", "torchvision"),
                      async_learners_on_gpu=True, gpu="gpu")
