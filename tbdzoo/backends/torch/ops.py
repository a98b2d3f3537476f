"""The spec's node types in PyTorch: one function per op, ``fn(inputs, params, attrs, training)``.

This backend is the consistency reference, so each function spells out the semantics plainly
(see tbdzoo/spec/ops.py); where PyTorch has a native op with identical math it is used.
"""
import math
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from ..common import attention, pooling
from .fused_loss import smoothed_cross_entropy


def _pad(x, pads, value=0.0):
    (t, b), (l, r) = pads
    return F.pad(x, (l, r, t, b), value=value) if (t or b or l or r) else x


def conv2d(inputs, p, a, training):
    x, = inputs
    sym = pooling.symmetric(a["padding"])
    if sym is None:
        x, sym = _pad(x, a["padding"]), (0, 0)
    return F.conv2d(x, p["weight"], p.get("bias"), a["stride"], sym, a["dilation"], a["groups"])


def batchnorm(inputs, p, a, training):
    # PyTorch's running-statistics update is the spec's: new-batch weight, unbiased variance.
    # Without running statistics the batch's own normalise in inference too.
    return F.batch_norm(inputs[0], p.get("running_mean"), p.get("running_var"), p["gamma"],
                        p["beta"], training or not a["track_running_stats"], a["momentum"], a["eps"])


def relu(inputs, p, a, training):
    return F.relu(inputs[0])


def add(inputs, p, a, training):
    out = inputs[0]
    for x in inputs[1:]:
        out = out + x
    return out


def relu_inplace(inputs, p, a, training):
    """ReLU writing over its input; a block (native.py) uses it only where that input is dead and no
    backward pass needs it (a BatchNorm or add output), as torchvision's in-place ReLUs do."""
    return F.relu_(inputs[0])


def add_inplace(inputs, p, a, training):
    """add accumulating into its first input, under the same conditions as relu_inplace."""
    out = inputs[0]
    for x in inputs[1:]:
        out = out.add_(x)
    return out


def maxpool2d(inputs, p, a, training):
    x, = inputs
    sym = pooling.symmetric(a["padding"])
    if pooling.needs_explicit_padding(a):
        x, sym = _pad(x, a["padding"], value=-math.inf), (0, 0)
    return F.max_pool2d(x, a["kernel"], a["stride"], sym)


def avgpool2d(inputs, p, a, training):
    x, = inputs
    if not pooling.needs_explicit_padding(a):
        return F.avg_pool2d(x, a["kernel"], a["stride"], pooling.symmetric(a["padding"]),
                            count_include_pad=a["count_include_pad"])
    summed = F.avg_pool2d(_pad(x, a["padding"]), a["kernel"], a["stride"])
    if a["count_include_pad"]:
        return summed
    ones = _pad(torch.ones_like(x[:1, :1]), a["padding"])
    return summed / F.avg_pool2d(ones, a["kernel"], a["stride"])


def global_avgpool(inputs, p, a, training):
    return inputs[0].mean(dim=(2, 3))


def flatten(inputs, p, a, training):
    return torch.flatten(inputs[0], 1)


def dense(inputs, p, a, training):
    return F.linear(inputs[0], p["weight"], p.get("bias"))


def embedding(inputs, p, a, training):
    out = F.embedding(inputs[0], p["weight"])
    return out * a["scale"] if a["scale"] != 1.0 else out


def sinusoid_table(length, dim, device=None):
    """PE[p, 2i] = sin(p / 10000^(2i/D)), PE[p, 2i+1] = cos(p / 10000^(2i/D))."""
    position = torch.arange(length, dtype=torch.float64, device=device)[:, None]
    rate = torch.pow(10000.0, -torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)
    table = torch.zeros(length, dim, dtype=torch.float64, device=device)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate[: dim // 2])
    return table.float()


def positional_encoding(inputs, p, a, training):
    x, = inputs
    return x + sinusoid_table(x.shape[1], x.shape[2], x.device).to(x.dtype)


def layernorm(inputs, p, a, training):
    x, = inputs
    return F.layer_norm(x, (x.shape[-1],), p["gamma"], p["beta"], a["eps"])


def dropout(inputs, p, a, training):
    return F.dropout(inputs[0], a["rate"], training) if a["rate"] else inputs[0]


def attention_bias(keys, pad_id, causal, t, dtype):
    """Additive mask (N, 1, T|1, S): -1e9 on padded keys and, if causal, on later keys.

    Adding -1e9 and setting to -1e9 give the same softmax wherever a row keeps one key (the
    data always does); additive masks let PyTorch pick its fused attention kernels."""
    bias = torch.zeros(keys.shape, dtype=dtype, device=keys.device)
    bias = bias.masked_fill(keys == pad_id, attention.MASKED_LOGIT)[:, None, None, :]
    if causal:
        later = torch.ones(t, keys.shape[1], dtype=torch.bool, device=keys.device).triu(1)
        bias = bias.masked_fill(later, attention.MASKED_LOGIT)
    return bias


def multi_head_attention(inputs, p, a, training):
    q_in, kv_in, keys = inputs
    n, t, d = q_in.shape
    s = kv_in.shape[1]
    h = a["num_heads"]
    dh = d // h

    def split(x, length, parts):
        """(N, L, parts * D) -> parts tensors of (N, H, L, dh)."""
        return x.view(n, length, parts, h, dh).permute(2, 0, 3, 1, 4).unbind(0)

    # One GEMM for the projections that read the same input, as nn.MultiheadAttention does.
    if q_in is kv_in:
        q, k, v = split(F.linear(q_in, torch.cat([p["W_q"], p["W_k"], p["W_v"]]),
                                 torch.cat([p["b_q"], p["b_k"], p["b_v"]])), t, 3)
    else:
        q, = split(F.linear(q_in, p["W_q"], p["b_q"]), t, 1)
        k, v = split(F.linear(kv_in, torch.cat([p["W_k"], p["W_v"]]),
                              torch.cat([p["b_k"], p["b_v"]])), s, 2)
    bias = attention_bias(keys, a["pad_id"], a["causal"], t, q.dtype)
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias,
                                             dropout_p=a["dropout"] if training else 0.0)
    return F.linear(context.transpose(1, 2).reshape(n, t, d), p["W_o"], p["b_o"])


def softmax_cross_entropy(logits, labels, loss, overwrite_logits=False):
    """Mean over counted positions of -sum_k q_k log p_k, q = (1-eps) onehot + eps/K.

    Run eagerly, the loss keeps only the logits for backward (fused_loss); under
    torch.compile, F.cross_entropy, which the compiler already fuses. ``overwrite_logits``: the
    caller reads the logits no more, so the backward pass may write the gradient over them."""
    ignore = loss["ignore_index"]
    flat_logits, flat_labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    if torch.compiler.is_compiling():
        return F.cross_entropy(flat_logits, flat_labels, ignore_index=-100 if ignore is None else ignore,
                               label_smoothing=loss["label_smoothing"])
    return smoothed_cross_entropy(flat_logits, flat_labels, ignore, loss["label_smoothing"],
                                  overwrite_logits=overwrite_logits)



def concat(inputs, p, a, training):
    return torch.cat(inputs, dim=a["axis"] + 1)


def tanh(inputs, p, a, training):
    return torch.tanh(inputs[0])


def upsample_nearest(inputs, p, a, training):
    return F.interpolate(inputs[0], scale_factor=a["factor"], mode="nearest")


def reshape(inputs, p, a, training):
    x, = inputs
    return x.reshape((x.shape[0],) + tuple(a["shape"]))


def channel_layernorm(inputs, p, a, training):
    """One mean and (biased) variance per example over (C, H, W); affine per channel."""
    x, = inputs
    y = F.layer_norm(x, x.shape[1:], eps=a["eps"])
    return y * p["gamma"][:, None, None] + p["beta"][:, None, None]


def lerp(inputs, p, a, training):
    x, y, t = inputs
    t = t.reshape((t.shape[0],) + (1,) * (x.dim() - 1))
    return t * x + (1 - t) * y


def scale(inputs, p, a, training):
    return inputs[0] * a["factor"]


def stop_gradient(inputs, p, a, training):
    return inputs[0].detach()


def ones_like(inputs, p, a, training):
    return torch.ones_like(inputs[0])


def conv2d_input_grad(inputs, p, a, training):
    """A transposed convolution of dy with the forward kernel. With symmetric padding it is
    PyTorch's own (its output padding restores the rows the stride left unread); otherwise one
    without padding, cut by the forward padding (rows past its end come back as zeros)."""
    dy, = inputs
    _, h, w = a["input_shape"]
    (top, bottom), (left, right) = a["padding"]
    (sh, sw), (dh, dw) = a["stride"], a["dilation"]
    (kh, kw), (ho, wo) = a["kernel"], dy.shape[2:]
    extra = (h - ((ho - 1) * sh - 2 * top + dh * (kh - 1) + 1),
             w - ((wo - 1) * sw - 2 * left + dw * (kw - 1) + 1))
    if top == bottom and left == right and 0 <= extra[0] < max(sh, dh) and 0 <= extra[1] < max(sw, dw):
        return F.conv_transpose2d(dy, p["weight"], None, a["stride"], (top, left), extra,
                                  a["groups"], a["dilation"])
    full = F.conv_transpose2d(dy, p["weight"], None, a["stride"], 0, 0, a["groups"], a["dilation"])
    full = F.pad(full, (0, max(0, left + w - full.shape[3]), 0, max(0, top + h - full.shape[2])))
    return full[:, :, top:top + h, left:left + w]


def dense_input_grad(inputs, p, a, training):
    return torch.matmul(inputs[0], p["weight"])


def relu_grad(inputs, p, a, training):
    """PyTorch's own ReLU backward, which keeps only x for its own backward pass: given the
    ReLU's output, a tensor the forward ReLU keeps anyway. (A product with a mask would keep
    the mask, a tensor of dy's size.)"""
    dy, x = inputs
    if x.dtype != dy.dtype:  # under autocast the two may differ
        return torch.where(x > 0, dy, torch.zeros((), dtype=dy.dtype, device=dy.device))
    return torch.ops.aten.threshold_backward(dy, x, 0.0)


def channel_layernorm_input_grad(inputs, p, a, training):
    """PyTorch's own layer-norm backward kernel (which autograd differentiates again), with
    gamma broadcast over (C, H, W) as its element-wise weight: the closed form of the spec,
    keeping for backward only dy, x and one example's worth of weight."""
    dy, x = inputs
    dtype = torch.promote_types(dy.dtype, x.dtype)  # under autocast the two may differ
    dy, x, shape = dy.to(dtype), x.to(dtype), list(x.shape[1:])
    if torch.compiler.is_compiling():
        return _channel_layernorm_input_grad_formula(dy, x, p["gamma"].to(dtype), a["eps"])
    with torch.no_grad():
        _, mean, rstd = torch.native_layer_norm(x, shape, None, None, a["eps"])
    weight = p["gamma"].to(dtype)[:, None, None].expand(shape).contiguous()
    return torch.ops.aten.native_layer_norm_backward(dy, x, shape, mean, rstd, weight, None,
                                                     [True, False, False])[0]


def _channel_layernorm_input_grad_formula(dy, x, gamma, eps):
    """The same closed form in plain tensor ops, for torch.compile: the compiler fuses them and
    chooses what to keep for backward itself (it cannot lower the backward kernel's own
    derivative with a weight)."""
    dims = (1, 2, 3)
    mean = x.mean(dim=dims, keepdim=True)
    rstd = torch.rsqrt(x.var(dim=dims, unbiased=False, keepdim=True) + eps)
    xhat = (x - mean) * rstd
    g = dy * gamma[:, None, None]
    return rstd * (g - g.mean(dim=dims, keepdim=True) - xhat * (g * xhat).mean(dim=dims, keepdim=True))


# -- loss kinds (tbdzoo/spec/losses.py) ---------------------------------------------------------
def loss(kind, inputs, attrs):
    return _LOSSES[kind](inputs, attrs)


def _softmax_cross_entropy_loss(inputs, attrs):
    return softmax_cross_entropy(inputs["logits"], inputs["labels"], attrs)


def _mean_loss(inputs, attrs):
    return inputs["x"].float().mean()


def _norm_penalty_loss(inputs, attrs):
    x = inputs["x"].float()
    return ((x.flatten(1).norm(dim=1) - attrs["target"]) ** 2).mean()


def _ctc_loss(inputs, attrs):
    """warp-ctc's summed cost per example, averaged over the batch: PyTorch's 'sum' divided by
    N (its 'mean' would also divide each cost by its label length)."""
    logits = inputs["logits"]  # float32 at least (bf16 logits under autocast)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    log_probs = F.log_softmax(logits, dim=-1).transpose(0, 1)  # (T, N, C)
    # the lengths from the host (as the kernel reads them), without waiting for the device
    total = F.ctc_loss(log_probs, inputs["labels"], _host_lengths(inputs["input_lengths"]),
                       _host_lengths(inputs["label_lengths"]), blank=attrs["blank"],
                       reduction="sum", zero_infinity=False)
    return total / logits.shape[0]


def _smooth_l1_loss(inputs, attrs):
    """sum(weight * smoothL1_sigma(prediction - target)) / (normalizer * rows), mx-rcnn's form,
    which is PyTorch's smooth_l1_loss with beta = 1 / sigma^2."""
    prediction = inputs["prediction"].float()
    per = F.smooth_l1_loss(prediction, inputs["target"].float(), reduction="none",
                           beta=1.0 / float(attrs["sigma"]) ** 2)
    return (inputs["weight"].float() * per).sum() / (attrs["normalizer"] * prediction.shape[0])


def _sigmoid_cross_entropy_loss(inputs, attrs):
    """sum(weight * BCE-with-logits) / max(sum(weight), 1)."""
    weight = inputs["weight"].float()
    total = F.binary_cross_entropy_with_logits(inputs["logits"].float(), inputs["labels"].float(),
                                               weight=weight, reduction="sum")
    return total / weight.sum().clamp(min=1.0)


def _log_policy(logits):
    """log softmax over the actions in float32 at least (bf16 logits under autocast)."""
    return F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


def _policy_gradient_loss(inputs, attrs):
    log_p = _log_policy(inputs["logits"])
    picked = log_p.gather(-1, inputs["actions"].long().unsqueeze(-1)).squeeze(-1)
    return -(picked * inputs["advantages"].float()).mean()


def _entropy_loss(inputs, attrs):
    log_p = _log_policy(inputs["logits"])
    return -(log_p.exp() * log_p).sum(dim=-1).mean()


def _squared_error_loss(inputs, attrs):
    diff = inputs["prediction"].float() - inputs["target"].float()
    return 0.5 * (diff * diff).mean()


_LOSSES = {"softmax_cross_entropy": _softmax_cross_entropy_loss, "mean": _mean_loss,
           "norm_penalty": _norm_penalty_loss, "ctc": _ctc_loss,
           "policy_gradient": _policy_gradient_loss, "entropy": _entropy_loss,
           "squared_error": _squared_error_loss,
           "smooth_l1": _smooth_l1_loss, "sigmoid_cross_entropy": _sigmoid_cross_entropy_loss}


# -- recurrent models ------------------------------------------------------------------------
def valid_mask(lengths, t, dtype):
    """(N, T) 1 where t < length, else 0."""
    return (torch.arange(t, device=lengths.device)[None, :] < lengths[:, None]).to(dtype)


def _host_lengths(lengths):
    """The lengths on the CPU, as packing needs them; one copy per tensor, shared by every
    recurrent node reading it (a deep stack syncs with the GPU once, not once per layer)."""
    cached = getattr(lengths, "_tbdzoo_host", None)
    if cached is None:
        cached = lengths.detach().to("cpu", torch.int64)
        if _keeps_tables(lengths):
            lengths._tbdzoo_host = cached
    return cached


def _keeps_tables(lengths):
    """Whether what is computed from a lengths tensor (its host copy, packing, masks) is kept
    on it for the next node and step reading it: on a device, where a prepared batch is a copy
    that nothing writes; a CPU tensor may share its memory with the caller's NumPy array."""
    return lengths.device.type != "cpu"


def _length_mask(lengths, size, kind, dtype):
    """(N, size) of ``dtype`` from each example's length: ``"valid"`` 1 before it and 0 past it
    (a product zeroes the padding: one kernel forward and one backward, where ``masked_fill``
    copies and fills in both passes), ``"bias"`` 0 before it and -1e9 past it (a sum masks
    logits: one kernel forward, none backward). Kept on ``lengths`` (``_keeps_tables``), so a
    step over a prepared batch does not build it again per node and step; under
    ``torch.compile``, which fuses it into its neighbours, computed in the graph."""
    key, compiling = (size, kind, dtype), torch.compiler.is_compiling()
    cache = None if compiling else getattr(lengths, "_tbdzoo_masks", None)
    if cache is not None and key in cache:
        return cache[key]
    positions = torch.arange(size, device=lengths.device)[None, :]
    if kind == "valid":
        mask = (positions < lengths[:, None]).to(dtype)
    else:
        mask = (positions >= lengths[:, None]).to(dtype) * attention.MASKED_LOGIT
    if _keeps_tables(lengths) and not compiling:
        if cache is None:
            cache = lengths._tbdzoo_masks = {}
        cache[key] = mask
    return mask


_GATES = {"lstm": ("i", "f", "g", "o"), "gru": ("r", "z", "n")}


def recurrent_weights(p, op, num_layers, directions):
    """The canonical per-gate tensors as PyTorch's RNN weights, per layer and direction:
    weight_ih (gates H, D_l), weight_hh, bias_ih, bias_hh. Concatenation keeps autograd's path to
    the canonical tensors. LSTM: b_ih = (b_i, b_f, b_g, b_o), b_hh = 0; GRU: b_ih = (b_r, b_z,
    b_in), b_hh = (0, 0, b_hn), the only place cuDNN's reset-after GRU reads b_hn. A model holds
    these tensors flat already (``p["flat_weights"]``, tbdzoo/backends/torch/recurrent.py); this
    is for calls with the per-gate tensors themselves."""
    gates, flat = _GATES[op], []
    for layer in range(num_layers):
        for d in directions:
            q = "l{}.{}.".format(layer, d)
            w_ih = torch.cat([p[q + "w_" + g] for g in gates])
            w_hh = torch.cat([p[q + "u_" + g] for g in gates])
            if op == "lstm":
                b_ih = torch.cat([p[q + "b_" + g] for g in gates])
                b_hh = torch.zeros_like(b_ih)
            else:
                zero = torch.zeros_like(p[q + "b_hn"])
                b_ih = torch.cat([p[q + "b_r"], p[q + "b_z"], p[q + "b_in"]])
                b_hh = torch.cat([zero, zero, p[q + "b_hn"]])
            flat += [w_ih, w_hh, b_ih, b_hh]
    return flat


def _kernel_weights(op, x, p, a, directions):
    """The model's flat weights as they are, or the per-gate tensors concatenated. Under CUDA
    autocast the kernel casts the flat buffer itself, once (as for ``nn.LSTM``); elsewhere a
    low-precision input gets weights of its dtype."""
    if "flat_weights" in p:
        weights = p["flat_weights"]
    else:
        weights = recurrent_weights(p, op, a["num_layers"], directions)
    if x.dtype != weights[0].dtype and not (x.is_cuda and torch.is_autocast_enabled("cuda")):
        weights = [w.to(x.dtype) for w in weights]
    return weights


def _packing(lengths, t, device):
    """Where a batch-first (N, T) batch's valid steps go in the packed, time-major order the
    fused kernel reads (longest example first at each step): the flat (N T) row of each packed
    row, on ``device``, and the per-step batch sizes, on the host. Computed once per lengths
    tensor from its host copy and shared by every node reading it, so a deep stack packs and
    unpacks with one gather and one scatter per layer where ``pack_padded_sequence`` and
    ``pad_packed_sequence`` copy once per time step, in both passes. A lookup that finds them
    is traced by ``torch.compile``; only computing them leaves its graph."""
    cached = getattr(lengths, "_tbdzoo_packing", None)
    key = (t, str(device))
    if cached is not None and key in cached:
        return cached[key]
    return _compute_packing(lengths, t, device, key)


@torch.compiler.disable
def _compute_packing(lengths, t, device, key):
    cache = getattr(lengths, "_tbdzoo_packing", None)
    if cache is None:
        cache = {}
        if _keeps_tables(lengths):
            lengths._tbdzoo_packing = cache
    host = _host_lengths(lengths).numpy()
    order = np.argsort(-host, kind="stable")
    valid = host[order][None, :] > np.arange(t)[:, None]  # (T, N), time-major, sorted
    rows = (order[None, :] * t + np.arange(t)[:, None])[valid]
    batch_sizes = valid.sum(axis=1)
    rows = torch.from_numpy(rows.astype(np.int64))
    if device.type == "cuda":
        rows = rows.pin_memory()
    cache[key] = (rows.to(device, non_blocking=True),
                  torch.from_numpy(batch_sizes[batch_sizes > 0].astype(np.int64)))
    return cache[key]


def _recurrent(op, inputs, p, a, training):
    """PyTorch's fused multi-layer kernel (cuDNN on a GPU); every output past an example's
    length is exactly 0. On a GPU a unidirectional recurrence runs over the padded batch, as a
    user of ``nn.LSTM`` writes it: step t reads only steps up to t, so the valid outputs are
    those of the valid steps alone, and zeroing the rest stops every gradient into the padding;
    cuDNN's step is bound by launches there, not by the rows it computes. On the CPU, where the
    rows are the cost, and for a bidirectional recurrence, whose backward direction must start
    at each example's own end, the kernel reads the packed valid steps (``_packing``)."""
    x, lengths = inputs
    n, t, _ = x.shape
    h, directions = a["units"], ("fw", "bw") if a["bidirectional"] else ("fw",)
    weights = _kernel_weights(op, x, p, a, directions)
    zeros = x.new_zeros(a["num_layers"] * len(directions), n, h)
    hidden = (zeros, zeros) if op == "lstm" else zeros
    kernel = torch._VF.lstm if op == "lstm" else torch._VF.gru
    if _runs_padded(x, a):
        out = _quietly(kernel, x, hidden, weights, True, a["num_layers"], 0.0, training, False,
                       True)[0]
        # the mask first: the product is laid out as the mask, batch-major and contiguous,
        # where the kernel's batch-first output is a transposed view that every dense layer
        # reading it would copy
        return _length_mask(lengths, t, "valid", out.dtype)[:, :, None] * out
    if torch.compiler.is_exporting():
        out = _by_layer_and_direction(kernel, x, lengths, weights, a, training)
    else:
        rows, batch_sizes = _packing(lengths, t, x.device)
        out = _quietly(kernel, _pack(x, rows), batch_sizes, hidden, weights, True,
                       a["num_layers"], 0.0, training, a["bidirectional"])[0]
        out = _unpack(out, rows, n, t)
    if a["merge"] == "sum":
        out = out[..., :h] + out[..., h:]
    return out


def _by_layer_and_direction(kernel, x, lengths, weights, a, training):
    """What the packed kernel computes, without the lengths on the host: for
    ``torch.export``, which cannot trace the packing's host copy. Each layer and direction is
    one call of the kernel over the padded batch; the backward direction reads each example's
    steps reversed within its length (a gather: the padding stays at the end, where no valid
    step reads it) and its outputs are put back in order by the same gather. Every valid
    output is then the packed kernel's; the padding is zeroed once, at the end."""
    n, t, _ = x.shape
    h, directions = a["units"], 2 if a["bidirectional"] else 1
    steps = torch.arange(t, device=x.device)[None, :]
    valid = steps < lengths[:, None]
    reverse = torch.where(valid, lengths[:, None] - 1 - steps, steps).long()[:, :, None]
    for layer in range(a["num_layers"]):
        outs = []
        for d in range(directions):
            first = 4 * (layer * directions + d)  # w_ih, w_hh, b_ih, b_hh of each
            zeros = x.new_zeros(1, n, h)
            hidden = (zeros, zeros) if kernel is torch._VF.lstm else zeros
            source = x if d == 0 else torch.gather(x, 1, reverse.expand(-1, -1, x.shape[2]))
            y = kernel(source, hidden, weights[first:first + 4], True, 1, 0.0, training, False,
                       True)[0]
            outs.append(y if d == 0 else torch.gather(y, 1, reverse.expand(-1, -1, h)))
        x = torch.cat(outs, -1) if directions > 1 else outs[0]
    return x * valid[:, :, None].to(x.dtype)


def _quietly(kernel, *args):
    """The fused kernel without cuDNN's warning that its weights are not one contiguous chunk:
    they are the per-gate tensors, concatenated, and compacted per call by design. Under
    ``torch.compile`` the call is left alone, since a warnings context breaks the graph."""
    if torch.compiler.is_compiling():
        return kernel(*args)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*contiguous chunk of memory.*")
        return kernel(*args)


def _runs_padded(x, attrs):
    """Whether the kernel reads the padded batch (``_recurrent`` says when and why)."""
    return x.is_cuda and not attrs["bidirectional"]


def _pack(x, rows):
    """The valid rows of a batch-first (N, T, C) tensor in packed order. A tensor that
    ``_unpack`` made from packed rows with these indices gives those rows back: gathering its
    scatter would copy them again, and the kernel that made them keeps them for its backward
    already, so a BatchNorm reading a recurrence's output (or a recurrence a BatchNorm's) holds
    one packed copy, not two."""
    source = getattr(x, "_tbdzoo_packed", None)
    if source is not None and source[0] is rows:
        return source[1]
    n, t, c = x.shape
    return x.reshape(n * t, c).index_select(0, rows)


def _unpack(packed, rows, n, t):
    """Packed rows back to a batch-first (N, T, C) tensor, zeros in the padding."""
    out = packed.new_zeros(n * t, packed.shape[1]).index_copy(0, rows, packed).view(n, t, -1)
    out._tbdzoo_packed = (rows, packed)
    return out


def lstm(inputs, p, a, training):
    return _recurrent("lstm", inputs, p, a, training)


def gru(inputs, p, a, training):
    return _recurrent("gru", inputs, p, a, training)


def additive_attention(inputs, p, a, training):
    """e = v . tanh(W_q q_t + W_m m_s), -1e9 past the memory's length, softmax over s."""
    query, memory, lengths = inputs
    keys = F.linear(memory, p["w_memory"])  # (N, S, A)
    queries = F.linear(query, p["w_query"])  # (N, T, A)
    v = p["v"]
    if v.dtype != keys.dtype and not torch.is_autocast_enabled(keys.device.type):
        v = v.to(keys.dtype)  # under autocast, matmul's own cast (cached for the step)
    scores = torch.matmul(torch.tanh(queries[:, :, None, :] + keys[:, None, :, :]), v)  # (N, T, S)
    # -1e9 added past the memory's length: the softmax gives those positions exactly 0 (the
    # scores are bounded by |v|), and its gradient there is 0
    scores = scores + _length_mask(lengths, memory.shape[1], "bias", scores.dtype)[:, None, :]
    weights = torch.softmax(scores, dim=-1)
    # the memory in the scores' dtype (bf16 under autocast: no round trip through float32);
    # bmm casts the float32 softmax itself
    return torch.bmm(weights, memory.to(scores.dtype))


def sequence_batchnorm(inputs, p, a, training):
    """BatchNorm over the batch's valid steps only: the valid rows are gathered in packed order
    (``_packing``, shared with the recurrences), normalised by PyTorch's own fused batch norm
    (statistics in float32; running update with new-batch weight ``momentum`` and the variance
    unbiased over the n valid steps, the spec's rule) and scattered back, zeros in the padding.
    Backward then keeps only the valid rows, as ``BatchNorm1d`` over packed steps does."""
    x, lengths = inputs
    n, t, _c = x.shape
    if torch.compiler.is_exporting():
        return _sequence_batchnorm_masked(x, lengths, p, a, training)
    rows, _ = _packing(lengths, t, x.device)
    track = a["track_running_stats"]
    y = F.batch_norm(_pack(x, rows),
                     p["running_mean"] if track else None, p["running_var"] if track else None,
                     p["gamma"], p["beta"], training or not track, a["momentum"], a["eps"])
    return _unpack(y, rows, n, t)


def _sequence_batchnorm_masked(x, lengths, p, a, training):
    """``sequence_batchnorm`` without the lengths on the host, for ``torch.export``: in
    inference every row normalised by the running statistics; in training the valid rows'
    statistics by a mask, the running ones updated by the same rule; zeros in the padding."""
    n, t, c = x.shape
    valid = valid_mask(lengths, t, x.dtype)[:, :, None]
    track = a["track_running_stats"]
    if track and not training:
        y = F.batch_norm(x.reshape(n * t, c), p["running_mean"], p["running_var"], p["gamma"],
                         p["beta"], False, 0.0, a["eps"])
        return y.view(n, t, c) * valid
    count = valid.sum()
    mean = (x * valid).sum((0, 1)) / count
    variance = ((x - mean) * valid).square().sum((0, 1)) / count
    if track:
        with torch.no_grad():
            m = a["momentum"]
            p["running_mean"].mul_(1 - m).add_(mean, alpha=m)
            p["running_var"].mul_(1 - m).add_(variance * count / (count - 1), alpha=m)
    y = (x - mean) * torch.rsqrt(variance + a["eps"]) * p["gamma"] + p["beta"]
    return y * valid


def clipped_relu(inputs, p, a, training):
    # hardtanh's gradient is 1 strictly inside (min, max), as the spec says (clamp's is not)
    return F.hardtanh(inputs[0], 0.0, a["ceiling"])


def transpose(inputs, p, a, training):
    return inputs[0].permute((0,) + tuple(i + 1 for i in a["perm"]))


def lengths_after_conv(inputs, p, a, training):
    (before, after), k = a["padding"], a["kernel"]
    out = (inputs[0] + (before + after - a["dilation"] * (k - 1) - 1)) // a["stride"] + 1
    out = out.clamp(min=1)
    host = getattr(inputs[0], "_tbdzoo_host", None)
    if host is not None:  # keep the CPU copy in step, so packing needs no new sync
        out._tbdzoo_host = ((host + (before + after - a["dilation"] * (k - 1) - 1))
                            // a["stride"] + 1).clamp(min=1)
    return out


# -- detection ---------------------------------------------------------------------------------
def roi_align(inputs, p, a, training):
    """One sparse (N R oh ow, N H W) mixing matrix, each row a bin's sr^2 x 4 taps weighted by
    weights / sr^2 (columns offset by n H W), times the batch's (N H W, C) feature rows; the
    backward pass is its transpose times the output gradient, the spec's scatter-add. Gathering
    every tap first (index_select) moves 16 times the output's memory and took 13.8 s for a
    forward and backward pass at Faster R-CNN's size on the CPU, against 2.8 s for this and
    4.0 s for torchvision's RoIAlign (benchmarks/roi_align_torch.py). Computed in float32, autocast
    off (sparse kernels lack bf16; under autocast the product's backward fails).

    Under ``torch.compile`` the gather form (``roi_align_gather``) runs instead: Dynamo cannot
    trace sparse tensors and would break the graph here, and Inductor fuses the gather into
    the weighted sum, so the 16-fold copy is never made."""
    if torch.compiler.is_compiling():
        return roi_align_gather(inputs, p, a, training)
    features, indices, weights = inputs
    n, c, h, w = features.shape
    rois = indices.shape[1]
    (oh, ow), sr = a["output_size"], a["sampling_ratio"]
    rows = features.float().permute(0, 2, 3, 1).reshape(n * h * w, c)
    device, bins = features.device, n * rois * oh * ow
    columns = _tap_rows(indices, h * w)
    targets = torch.arange(bins, device=device).view(bins, 1).expand(bins, sr * sr * 4)
    mixing = torch.sparse_coo_tensor(
        torch.stack([targets.reshape(-1), columns.reshape(-1)]),
        weights.float().reshape(-1) / float(sr * sr), (bins, n * h * w), check_invariants=False)
    with torch.autocast(device_type=device.type, enabled=False):  # autocast would cast
        out = torch.sparse.mm(mixing, rows)  # the rows to bf16, whose backward then fails
    out = out.view(n, rois, oh, ow, c)
    return out.permute(0, 1, 4, 2, 3).to(features.dtype)


def roi_align_gather(inputs, p, a, training):
    """RoIAlign as a gather and a weighted sum: each bin's sr^2 x 4 feature rows (index_select)
    times weights / sr^2, summed, in float32 as the sparse form; autograd's backward is an
    index_add of the weighted output gradient into the taps' rows (the spec's scatter-add).
    Plain dense ops, so ``torch.compile`` traces it whole and under autocast it needs no
    exception (gathers and sums are not autocast ops; the float32 rows stay float32)."""
    features, indices, weights = inputs
    n, c, h, w = features.shape
    rois = indices.shape[1]
    (oh, ow), sr = a["output_size"], a["sampling_ratio"]
    rows = features.float().permute(0, 2, 3, 1).reshape(n * h * w, c)
    taps = sr * sr * 4
    columns = _tap_rows(indices, h * w).reshape(-1)
    scale = weights.float().reshape(-1, taps, 1) / float(sr * sr)
    out = (rows.index_select(0, columns).view(-1, taps, c) * scale).sum(dim=1)
    out = out.view(n, rois, oh, ow, c)
    return out.permute(0, 1, 4, 2, 3).to(features.dtype)


def _tap_rows(indices, hw):
    """RoIAlign's tap indices (N, R, S, 4) as rows of the batch's (N H W, C) feature rows."""
    n = indices.shape[0]
    return indices.long() + torch.arange(n, device=indices.device).view(n, 1, 1, 1) * hw


def to_batch(inputs, p, a, training):
    x, = inputs
    return x.reshape((x.shape[0] * x.shape[1],) + tuple(x.shape[2:]))


def frozen_batchnorm(inputs, p, a, training):
    """Folded into a per-channel scale and shift, as torchvision's FrozenBatchNorm2d. When none
    of the four tensors takes a gradient (Faster R-CNN's fixed gamma and beta), the fold is
    kept with gamma until one of them changes (their version counters), so a step launches one
    multiply-add per call: ResNet-101 has 104 of them, and their small launches, not the GPU,
    bound the step."""
    x, = inputs
    shape = (1, -1) + (1,) * (x.dim() - 2)
    tensors = (p["gamma"], p["beta"], p["running_mean"], p["running_var"])
    if torch.compiler.is_compiling() or any(t.requires_grad for t in tensors):
        scale, shift = _fold(tensors, a["eps"])
        return x * scale.view(shape).to(x.dtype) + shift.view(shape).to(x.dtype)
    key = (x.dtype, a["eps"]) + tuple(t._version for t in tensors)
    cached = getattr(p["gamma"], "_tbdzoo_fold", None)
    if cached is None or cached[0] != key:
        scale, shift = _fold(tensors, a["eps"])
        cached = (key, scale.view(shape).to(x.dtype), shift.view(shape).to(x.dtype))
        p["gamma"]._tbdzoo_fold = cached
    return torch.addcmul(cached[2], x, cached[1])


def _fold(tensors, eps):
    gamma, beta, mean, var = tensors
    scale = gamma * torch.rsqrt(var + eps)
    return scale, beta - mean * scale
