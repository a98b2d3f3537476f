"""The training-memory breakdown: analytic figures from the spec for every backend, measured
ones merged in where a framework can give them, and workspace as what is left of the peak.

Analytic rules: weights = trainable parameters x bytes per element; gradients = weights;
optimizer state = slots x weights (SGD with momentum 1, Adam 2); feature maps = every node
output some consumer keeps for its backward pass, counted once; input batch = the arrays fed.
Running statistics (BatchNorm) are not parameters; they count under workspace/other.
"""
from collections import OrderedDict

BYTES = {"fp32": 4, "tf32": 4, "bf16": 2}
OPTIMIZER_SLOTS = {"sgd": 1, "adam": 2}
CATEGORIES = ("weights", "gradients", "optimizer_state", "feature_maps", "input_batch", "workspace")

# Which inputs a node keeps for its backward pass ('in': its inputs, 'out': its output).
_SAVES = {"conv2d": "in", "batchnorm": "in", "relu": "out", "maxpool2d": "in", "avgpool2d": "",
          "global_avgpool": "", "flatten": "", "dense": "in", "embedding": "", "add": "",
          "positional_encoding": "", "layernorm": "in", "dropout": "mask",
          "multi_head_attention": "in+attn"}


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def feature_map_elements(graph, batch_size):
    """Elements kept for backward: each saved tensor once (a ReLU's output that the next
    convolution also keeps is one tensor), plus attention probabilities and dropout masks."""
    saved = set()
    extra = 0
    for node in graph.nodes.values():
        rule = _SAVES.get(node.op, "in")
        if rule in ("in", "in+attn"):
            saved.update(i for i in node.inputs if graph.dtype_of(i) == "float32")
        if rule == "out":
            saved.add(node.name)
        if rule == "in+attn":
            t, s = node.shape[0], graph.shape_of(node.inputs[1])[0]
            extra += 2 * node.attrs["num_heads"] * t * s + 4 * _size(node.shape)  # scores, probs, Q K V ctx
        if rule == "mask" and node.attrs["rate"]:
            extra += _size(node.shape) // 4  # one byte per element
    loss_logits = graph.loss["logits"] if graph.loss else None
    if loss_logits:
        saved.add(loss_logits)
    return batch_size * (sum(_size(graph.shape_of(n)) for n in saved) + extra)


def analytic(graph, hparams, batch_size, batch_arrays_bytes, precision="fp32"):
    width = BYTES[precision]
    trainable = graph.trainable_count()
    slots = OPTIMIZER_SLOTS.get(hparams["optimizer"], 0)
    out = OrderedDict()
    out["weights"] = trainable * 4  # master weights stay fp32 under mixed precision
    out["gradients"] = trainable * 4
    out["optimizer_state"] = slots * trainable * 4
    out["feature_maps"] = feature_map_elements(graph, batch_size) * width
    out["input_batch"] = batch_arrays_bytes
    return out


def breakdown(analytic_bytes, measured=None, peak=None):
    """Merge: measured figures win; workspace = peak - the rest (derived) when a peak exists.

    When the backend attributed the blocks live at the moment of the peak (``at_peak``, from
    the CUDA allocator's trace), those are the categories: they sum to the peak, workspace is
    measured, and ``unattributed`` says how much of the allocator's peak the replay missed.
    The full sizes of the tensors are kept under ``tensors``."""
    measured = dict(measured or {})
    at_peak = measured.pop("at_peak", None)
    if at_peak is not None and peak is not None:
        out = OrderedDict((k, {"bytes": int(at_peak[k]), "source": "measured"}) for k in CATEGORIES)
        out["peak"] = {"bytes": int(peak), "source": "measured"}
        out["unattributed"] = {"bytes": int(at_peak["unattributed"]), "source": "measured"}
        out["tensors"] = OrderedDict((k, int(v)) for k, v in measured.items() if v is not None)
        out["analytic"] = OrderedDict((k, int(v)) for k, v in analytic_bytes.items())
        return out
    out = OrderedDict()
    for key in CATEGORIES[:-1]:
        if key in measured and measured[key] is not None:
            out[key] = {"bytes": int(measured[key]), "source": "measured"}
        else:
            out[key] = {"bytes": int(analytic_bytes[key]), "source": "analytic"}
    attributed = sum(v["bytes"] for v in out.values())
    if peak is not None:
        out["workspace"] = {"bytes": max(int(peak) - attributed, 0), "source": "derived"}
        out["peak"] = {"bytes": int(peak), "source": "measured"}
    else:
        out["workspace"] = {"bytes": None, "source": None}
        out["peak"] = {"bytes": None, "source": None}
    out["analytic"] = OrderedDict((k, int(v)) for k, v in analytic_bytes.items())
    return out
