"""LSTM and GRU on MXNet's fused ``RNN`` operator (oneDNN's RNN primitive on the CPU).

The canonical per-gate parameters (tbdzoo/spec/ops.py) are concatenated inside the graph into
the operator's flat vector, so each stays one Gluon Parameter and its gradient comes back under
its own name. The flat layout is Gluon's own (``gluon.rnn._RNNLayer._forward_kernel``): every
weight (per layer, per direction: i2h then h2h), then every bias in the same order; gates in
PyTorch's order (LSTM i, f, g, o; GRU r, z, n with the reset after the recurrent matmul).
The spec's one bias per gate is the i2h bias, the h2h bias zero (GRU: [0, 0, b_hn]).

Lengths: MXNet 1.9's CPU ``RNN`` accepts ``use_sequence_length`` but neither zeroes the padded
outputs nor reverses within each length (cuDNN does both; this build has none), so the
boundary does the work. A forward direction is causal: the outputs
before each length are already right and padding is zeroed at the end. A backward direction
runs as its own fused call on the input reversed within each length (``SequenceReverse``),
its outputs reversed back; that needs one call per layer and direction in a bidirectional
stack, where a unidirectional stack is a single call of every layer.
"""

LSTM_GATES, LSTM_BIASES = ("i", "f", "g", "o"), ("b_i", "b_f", "b_g", "b_o")
GRU_GATES = ("r", "z", "n")


def _flat_parameters(F, p, mode, units, cells):
    """The fused operator's parameter vector for ``cells``, a list of "l{l}.{d}." prefixes in
    MXNet's order (layer, then direction)."""
    gates = LSTM_GATES if mode == "lstm" else GRU_GATES
    weights, biases = [], []
    for c in cells:
        weights += [F.reshape(p[c + "w_" + g], shape=(-1,)) for g in gates]
        weights += [F.reshape(p[c + "u_" + g], shape=(-1,)) for g in gates]
        if mode == "lstm":
            biases += [p[c + b] for b in LSTM_BIASES]
            biases.append(F.zeros(shape=(4 * units,)))
        else:
            biases += [p[c + "b_r"], p[c + "b_z"], p[c + "b_in"],
                       F.zeros(shape=(2 * units,)), p[c + "b_hn"]]
    return F._internal._rnn_param_concat(*(weights + biases), dim=0)


def _zero_state(F, x, layers, units):
    """(layers, N, units) zeros shaped from the time-major input ``x`` (T, N, D)."""
    first = F.slice_axis(F.slice_axis(x, axis=0, begin=0, end=1), axis=2, begin=0, end=1)
    return F.broadcast_axis(F.zeros_like(first), axis=(0, 2), size=(layers, units))


def _fused(F, x, p, mode, units, cells):
    """One fused call over ``cells`` (stacked layers of one direction), time-major."""
    layers = len(cells)
    states = [_zero_state(F, x, layers, units)] * (2 if mode == "lstm" else 1)
    return F.RNN(x, _flat_parameters(F, p, mode, units, cells), *states, state_size=units,
                 num_layers=layers, mode=mode, state_outputs=False)


def run(F, mode, x, lengths, p, a):
    """The spec's lstm / gru on x (N, T, D) with float32 lengths (N,); (N, T, H * dirs or H)."""
    units, layers = a["units"], a["num_layers"]
    x = F.swapaxes(x, dim1=0, dim2=1)  # (T, N, D): the operator's layout
    if not a["bidirectional"]:
        out = _fused(F, x, p, mode, units, ["l{}.fw.".format(l) for l in range(layers)])
    else:
        for layer in range(layers):
            fw = _fused(F, x, p, mode, units, ["l{}.fw.".format(layer)])
            reversed_x = F.SequenceReverse(x, lengths, use_sequence_length=True)
            bw = F.SequenceReverse(_fused(F, reversed_x, p, mode, units, ["l{}.bw.".format(layer)]),
                                   lengths, use_sequence_length=True)
            last = layer == layers - 1
            x = fw + bw if last and a["merge"] == "sum" else F.concat(fw, bw, dim=2)
        out = x
    out = F.SequenceMask(out, lengths, use_sequence_length=True, value=0.0, axis=0)
    return F.swapaxes(out, dim1=0, dim2=1)
