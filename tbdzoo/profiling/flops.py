"""FLOPs from the spec and the peak they are measured against.

A training step counts 3x the forward FLOPs (the backward pass computes the gradients of the
inputs and of the weights, each about one forward): the convention of model-FLOPs utilisation,
so figures compare across frameworks whatever kernels each one picks. A training program's step
counts every update's objective (docs/programs.md); nodes a phase does not update are counted
3x too, an upper bound the convention accepts.
"""

from ..spec.program import objective_values
from ..spec.reads import values_read

BACKWARD_FACTOR = 2

# Dense peak FLOP/s per device name (NVML's name) and precision, from the vendors' datasheets.
PEAKS = {
    "NVIDIA H200": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12},
    "NVIDIA H100 80GB HBM3": {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12},
    "NVIDIA A100-SXM4-80GB": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12},
    "NVIDIA A100-SXM4-40GB": {"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12},
}


def forward_per_example(graph):
    """Forward FLOPs per example of one training step: of every node, or for a training
    program, of the nodes each update's objective reads, summed over the step's updates."""
    per_node = graph.flops()
    if graph.program is None:
        return sum(per_node.values())
    total = 0
    for phase in graph.program.phases:
        read = values_read(graph, objective_values(graph.program, phase["objective"]))
        total += phase["repeat"] * sum(f for name, f in per_node.items() if name in read)
    return total


def training_step(graph, batch_size):
    return (1 + BACKWARD_FACTOR) * forward_per_example(graph) * batch_size


def peak(device_name, precision, override=None):
    """The peak FLOP/s to measure against: ``override`` (FLOP/s) first, else the table."""
    if override:
        return float(override)
    return PEAKS.get(device_name or "", {}).get(precision)


def summary(graph, batch_size, step_seconds, device_name, precision, peak_override=None):
    per_step = training_step(graph, batch_size)
    achieved = per_step / step_seconds
    top = peak(device_name, precision, peak_override)
    return {"forward_per_example": forward_per_example(graph), "per_step": per_step,
            "achieved_per_s": achieved, "peak_per_s": top,
            "utilization": achieved / top if top else None, "source": "analytic"}
