"""The UUID PyTorch reports for a CUDA device, for the GPU sampler (tbdzoo/profiling/gpu.py)."""
import sys


def device_uuid(ordinal):
    """The UUID of CUDA device ``ordinal``, or None when PyTorch is not loaded in this process
    (a model on another framework: nothing to ask, and importing PyTorch would be slow) or
    cannot say."""
    if "torch" not in sys.modules:
        return None
    try:
        import torch
        return str(torch.cuda.get_device_properties(ordinal).uuid)
    except Exception:  # noqa: BLE001  (no CUDA, no such device, an old driver: no UUID, no reading)
        return None
