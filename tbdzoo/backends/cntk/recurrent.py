"""The recurrent ops of tbdzoo/spec/ops.py in CNTK 2.7: LSTM, reset-after GRU, Bahdanau
attention, sequence batch normalisation and the CTC loss. Valid Python 3.6.

Padded (T, D) examples become CNTK sequences of their valid steps only: the padded tensor is
turned into a full-length sequence (``to_sequence``), its valid steps are kept with
``sequence.gather`` (so every example is its own ragged sequence), and results return to
(T, H) through ``sequence.scatter`` (zeros at padded steps) and ``sequence.unpack``. On the
ragged axis the backward direction (``future_value``) reads each sequence reversed within its
own length, as the spec asks, and no step is spent on padding.

The cells are step functions written from the spec's equations (CNTK's LSTM block orders its
gates i, c~, f, o with one bias and its GRU resets before the recurrent matmul, so neither is
the spec's cell). The loop is CNTK's own recurrence over a dynamic axis (``past_value`` /
``future_value`` with a placeholder, what ``C.layers.Recurrence`` builds), the fastest exact
path on the CPU: the fused ``optimized_rnnstack`` is cuDNN-only. The input projections of all
steps are one matrix product outside the loop, and each step does one (4H or 3H, H) product.
The per-gate canonical parameters are spliced into those fused matrices inside the graph, so
loading, saving and gradients stay per canonical parameter with no conversion code.
"""
import cntk as C
import numpy as np

from ..common import attention

# A log-probability standing in for log(0): finite, so 0 * it stays 0 in masked sums.
_LOG_ZERO = -1e30


# -- padded tensors and ragged sequences ---------------------------------------------------------
def valid_steps(lengths, steps):
    """(steps,) 1.0 where t < length, 0.0 at padded steps, per example."""
    return C.less(C.constant(np.arange(steps, dtype=np.float32)), lengths)


class Ragged(object):
    """A padded (T, D) tensor as a sequence of its valid steps, and the way back."""

    def __init__(self, x, lengths):
        steps, features = x.shape
        self.steps = steps
        valid = C.reshape(valid_steps(lengths, steps), (steps, 1))
        full = C.to_sequence(C.splice(x, valid, axis=1))
        self.condition = C.slice(full, 0, features, features + 1)
        self.sequence = C.sequence.gather(C.slice(full, 0, 0, features), self.condition)

    def padded(self, y):
        """A sequence on the ragged axis back to (T, F), zeros at padded steps."""
        full = C.sequence.scatter(y, self.condition)
        unpacked = C.sequence.unpack(full, padding_value=0.0, no_mask_output=True)
        return C.reshape(unpacked, (self.steps, y.shape[0]))


def _loop(step, inputs, units, states, backwards):
    """Runs ``step(previous_states, inputs) -> new_states`` over the sequence ``inputs``
    (forward, or from each sequence's last step when ``backwards``), states starting at zero;
    returns the new states as sequences."""
    placeholders = [C.placeholder(shape=(units,), dynamic_axes=inputs.dynamic_axes)
                    for _ in range(states)]
    delay = C.sequence.future_value if backwards else C.sequence.past_value
    new = step([delay(p) for p in placeholders], inputs)
    C.combine([n.output for n in new]).replace_placeholders(
        dict((p, n.output) for p, n in zip(placeholders, new)))
    return [n.output for n in new]


def _fused(p, prefix, kind, names):
    """The per-gate canonical (H, X) matrices of one layer and direction as one (gates * H, X)."""
    return C.splice(*[p[prefix + kind + n] for n in names], axis=0)


def _gate(v, index, units):
    return C.slice(v, 0, index * units, (index + 1) * units)


def lstm_direction(x, p, prefix, units, backwards):
    """One LSTM direction over the ragged sequence x: i, f, g, o gates, one bias per gate."""
    projected = C.times_transpose(x, _fused(p, prefix, "w_", "ifgo")) + \
        C.splice(*[p[prefix + "b_" + g] for g in "ifgo"], axis=0)
    recurrent = _fused(p, prefix, "u_", "ifgo")

    def step(previous, xw):
        h, c = previous
        gates = xw + C.times_transpose(h, recurrent)
        i, f = C.sigmoid(_gate(gates, 0, units)), C.sigmoid(_gate(gates, 1, units))
        g, o = C.tanh(_gate(gates, 2, units)), C.sigmoid(_gate(gates, 3, units))
        cell = f * c + i * g
        return [o * C.tanh(cell), cell]
    return _loop(step, projected, units, 2, backwards)[0]


def gru_direction(x, p, prefix, units, backwards):
    """One GRU direction over the ragged sequence x, the reset applied after U_n h + b_hn."""
    projected = C.times_transpose(x, _fused(p, prefix, "w_", "rzn")) + \
        C.splice(p[prefix + "b_r"], p[prefix + "b_z"], p[prefix + "b_in"], axis=0)
    recurrent = _fused(p, prefix, "u_", "rzn")
    b_hn = p[prefix + "b_hn"]

    def step(previous, xw):
        h, = previous
        hu = C.times_transpose(h, recurrent)
        r = C.sigmoid(_gate(xw, 0, units) + _gate(hu, 0, units))
        z = C.sigmoid(_gate(xw, 1, units) + _gate(hu, 1, units))
        n = C.tanh(_gate(xw, 2, units) + r * (_gate(hu, 2, units) + b_hn))
        return [(1.0 - z) * n + z * h]
    return _loop(step, projected, units, 1, backwards)[0]


def recurrent_layers(direction, inputs, p, a):
    """The stacked, optionally bidirectional layers; directions are concatenated between
    layers and merged as ``merge`` says after the last."""
    x, lengths = inputs
    ragged = Ragged(x, lengths)
    units, layers = a["units"], a["num_layers"]
    directions = ("fw", "bw") if a["bidirectional"] else ("fw",)
    sequence = ragged.sequence
    for layer in range(layers):
        outputs = [direction(sequence, p, "l{}.{}.".format(layer, d), units, d == "bw")
                   for d in directions]
        if len(outputs) == 1:
            sequence = outputs[0]
        elif layer == layers - 1 and a["merge"] == "sum":
            sequence = outputs[0] + outputs[1]
        else:
            sequence = C.splice(outputs[0], outputs[1], axis=0)
    return ragged.padded(sequence)


def lstm(inputs, p, a):
    return recurrent_layers(lstm_direction, inputs, p, a)


def gru(inputs, p, a):
    return recurrent_layers(gru_direction, inputs, p, a)


# -- attention -------------------------------------------------------------------------------------
def additive_attention(inputs, p, a):
    """e[t, s] = v . tanh(W_q q_t + W_m m_s) as one (T, S, A) tensor per example, masked past
    each memory's length, softmax over s, contexts as one (T, S) x (S, Dm) product."""
    query, memory, lengths = inputs
    (t, _), (s, dm), units = query.shape, memory.shape, a["units"]
    q = C.times_transpose(query, p["w_query"])            # (T, A)
    m = C.times_transpose(memory, p["w_memory"])          # (S, A)
    hidden = C.tanh(C.reshape(q, (t, 1, units)) + C.reshape(m, (1, s, units)))
    scores = C.reshape(C.times(C.reshape(hidden, (t * s, units)), C.reshape(p["v"], (units, 1))),
                       (t, s))
    padded = C.reshape(1.0 - valid_steps(lengths, s), (1, s))
    scores = C.element_select(padded, C.constant(attention.MASKED_LOGIT), scores)
    return C.times(C.softmax(scores, axis=-1), memory)


# -- sequence batch normalisation ------------------------------------------------------------------
def sequence_batchnorm(inputs, p, a, ctx):
    """Statistics over the batch and the valid steps only, from CNTK reductions: masked sums
    over T, then over the batch axis. In training the moments (mean, unbiased variance) are
    recorded for the model, which updates the running statistics after each step; an
    inference graph normalises by the running statistics. Padded steps give 0 in both."""
    x, lengths = inputs
    steps, features = x.shape
    mask = C.reshape(valid_steps(lengths, steps), (steps, 1))
    if ctx.inference and a["track_running_stats"]:
        mean, variance = p["running_mean"], p["running_var"]
    else:
        batch = C.Axis.default_batch_axis()

        def total(v):
            return C.reduce_sum(C.reduce_sum(v, axis=0), axis=batch)
        count = total(mask)                                   # (1,): valid steps of the batch
        mean = total(x * mask) / count                        # (1, D)
        variance = total(C.square((x - mean) * mask)) / count
        if a["track_running_stats"] and not ctx.inference:
            unbiased = variance * count / C.element_max(count - 1.0, 1.0)
            ctx.moments[ctx.node] = (mean, unbiased)
    y = (x - mean) * C.reciprocal(C.sqrt(variance + a["eps"])) * p["gamma"] + p["beta"]
    return y * mask


# -- CTC ---------------------------------------------------------------------------------------------
def frame_labels(labels, label_lengths, steps, classes):
    """CNTK's frame-level CTC labels (T, C) built in the graph from (labels, label_lengths):
    row t < label_length is 2 * onehot(labels[t]) (a label's first frame), later rows repeat
    the last label with value 1, which ``labels_to_graph`` reads as the label sequence."""
    max_labels = labels.shape[0]
    t = C.constant(np.arange(steps, dtype=np.float32).reshape(steps, 1))
    source = C.element_min(t, label_lengths - 1.0)                                  # (T, 1)
    pick = C.equal(source, C.constant(np.arange(max_labels, dtype=np.float32)[None]))  # (T, L)
    ids = C.times(pick, C.reshape(labels, (max_labels, 1)))                          # (T, 1)
    onehot = C.equal(ids, C.constant(np.arange(classes, dtype=np.float32)[None]))    # (T, C)
    return onehot * (1.0 + C.less(t, label_lengths))


def ctc(inputs, attrs):
    """CNTK's exact forward-backward criterion (``forward_backward`` on ``labels_to_graph``,
    log-softmax inside, blank 0) over each example's first input_length frames: the sum over
    the batch, divided by the batch size."""
    logits, labels = inputs["logits"], inputs["labels"]
    input_lengths, label_lengths = inputs["input_lengths"], inputs["label_lengths"]
    steps, classes = logits.shape
    frames = frame_labels(labels, label_lengths, steps, classes)
    ragged = Ragged(C.splice(logits, frames, axis=1), input_lengths).sequence
    scores = C.slice(ragged, 0, 0, classes)
    graph = C.labels_to_graph(C.slice(ragged, 0, classes, 2 * classes))
    total = C.forward_backward(graph, scores, blankTokenId=int(attrs["blank"]))
    examples = C.reduce_sum(C.ones_like(input_lengths), axis=C.Axis.all_axes())
    return total / examples
