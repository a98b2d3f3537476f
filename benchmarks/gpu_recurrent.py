"""tbdzoo's recurrent models on the PyTorch backend against PyTorch baselines, on one GPU.

    python3 -m benchmarks.gpu_recurrent --models seq2seq --profile --out benchmarks/results/h200_recurrent.json
    python3 -m benchmarks.gpu_recurrent --models deepspeech2 --executions eager --precisions bf16
    python3 -m benchmarks.gpu_recurrent --device cpu --tiny --executions eager --precisions tf32 \\
        --steps 1 --rounds 2 --processes 1 --warmup 1 --out /tmp/check.json   # a check that it runs

Run from the repository root. The baselines are what a PyTorch user who wants speed writes, with
tbdzoo's shapes (tbdzoo/models/seq2seq/, tbdzoo/models/deepspeech2/, docs/models.md):

- **Seq2Seq** (``handwritten``): ``nn.Embedding`` for each language; a 2-layer cuDNN ``nn.LSTM``
  encoder over the padded (already reversed, right-padded) source: the encoder is
  unidirectional, so its outputs at the valid steps are exact without packing, and the
  attention masks the padded ones; a ``nn.LSTM`` decoder over the padded teacher-forced target
  in one cuDNN call (no input feeding: its padded steps reach only labels the loss ignores);
  additive attention ``v . tanh(W_q q + W_m m)`` with the source mask built for all decoder
  steps at once; the attention layer (a bias-free ``nn.Linear`` over ``[output; context]``, no
  tanh, as tbdzoo has it); a bias-free projection to the target vocabulary;
  ``F.cross_entropy`` ignoring the pad; fused Adam 3e-4 after ``clip_grad_norm_(1.0)``
  (foreach). No host synchronisation in the step. Compiled, ``torch.compile`` takes everything
  after the two LSTMs (attention, attention layer, projection, loss) as one graph: Dynamo does
  not trace ``nn.LSTM`` (it would break the graph there), and the embeddings are one gather each.
- **Deep Speech 2** (``handwritten``): the batch is sorted by length, longest first, once
  when it is built (the loss is a mean over utterances and the BatchNorms' statistics are over
  all valid steps, so the order changes no number), and every utterance's step count after the
  convolutions is computed then, on the host. A step runs the two ``nn.Conv2d`` (no bias),
  each followed by its activation (ReLU, or ReLU clipped at ``relu_ceiling``) and
  ``nn.BatchNorm2d``; then the steps are packed once (``enforce_sorted=True``: no sorting
  indices to send to the device or back, so no host synchronisation in the step) and stay
  packed through seven cuDNN GRUs: each recurrent layer is ``nn.BatchNorm1d`` over the packed
  data (exactly the valid steps: sequence-wise BatchNorm) and a bidirectional ``nn.GRU`` whose
  directions are concatenated, as tbdzoo merges them; the bias-free FC, its BatchNorm1d and
  activation; the output layer and ``log_softmax``, all on the packed data; ``nn.CTCLoss`` (blank
  0, summed per example, averaged over the batch as tbdzoo does); SGD momentum 0.9, lr 3e-4
  (fused on a GPU), after ``clip_grad_value_(100)`` (the paper config's element-wise clip).
  Compiled, ``torch.compile`` takes the whole module (Dynamo breaks at the GRUs).

Both sides start from the same weights (tbdzoo's, copied into the ``nn`` modules: per-gate
matrices concatenated in PyTorch's gate order, cuDNN's extra LSTM bias and the GRU's b_hr, b_hz
at zero), read the same synthetic batch and run under the same precision (TF32, or bf16 autocast
for the whole step, master weights fp32) with cuDNN's autotuner on. The first step's loss of each
side (``first_loss``) and the largest weight difference after it (``checks``) go into the JSON:
the same weights and batch give the same loss when the two do the same work.

The repeat protocol is benchmarks/harness.py's: ``--processes`` fresh processes per execution
mode, each taking one step per side (first losses), one for peak memory, ``--warmup`` steps, then
``--rounds`` interleaved rounds of ``--steps`` steps; ``--profile`` adds a torch.profiler
summary per side in the last process. Throughput is in the model's own unit (target tokens/s,
audio s/s), counted by tbdzoo on the shared batch. On a CPU (``--device cpu``, a check that the
script runs) tf32 means fp32 and no memory is measured.
"""
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F
import torch.nn.utils.rnn as rnn
from torch import nn

from benchmarks import harness
from benchmarks.gpu_programs import fast_optimizer

synchronize = harness.synchronize

MODELS = ("seq2seq", "deepspeech2")
# Timing defaults per model (warm-up steps, steps per round, rounds per process): a Seq2Seq step
# takes some 20-30 ms on an H200, a Deep Speech 2 step (batch 8 at 16 s) some 500 ms.
TIMING = {"seq2seq": (5, 20, 5), "deepspeech2": (2, 3, 5)}
MASKED_LOGIT = -1e9  # what tbdzoo writes past the source's length (docs/models.md)


# -- hand-written Seq2Seq ----------------------------------------------------------------------
class Seq2Seq(nn.Module):
    def __init__(self, hp):
        super().__init__()
        self.pad = hp["pad_id"]
        self.src_embed = nn.Embedding(hp["src_vocab"], hp["embed_dim"])
        self.tgt_embed = nn.Embedding(hp["tgt_vocab"], hp["embed_dim"])
        self.encoder = nn.LSTM(hp["embed_dim"], hp["units"], hp["encoder_layers"], batch_first=True)
        self.decoder = nn.LSTM(hp["embed_dim"], hp["units"], hp["decoder_layers"], batch_first=True)
        self.w_query = nn.Linear(hp["units"], hp["attention_units"], bias=False)
        self.w_memory = nn.Linear(hp["units"], hp["attention_units"], bias=False)
        self.v = nn.Parameter(torch.empty(hp["attention_units"]).uniform_(-0.1, 0.1))
        self.attention_layer = nn.Linear(2 * hp["units"], hp["attention_layer"], bias=False)
        self.projection = nn.Linear(hp["attention_layer"], hp["tgt_vocab"], bias=False)

        self.head = self.attend_and_score

    def forward(self, src, tgt_in, labels):
        """The padded source straight through the encoder: it runs left to right, so the outputs
        at the valid (leading) steps never see the padding after them."""
        memory = self.encoder(self.src_embed(src))[0]
        out = self.decoder(self.tgt_embed(tgt_in))[0]
        return self.head(out, memory, src, labels)

    def attend_and_score(self, out, memory, src, labels):
        scores = torch.tanh(self.w_query(out)[:, :, None] + self.w_memory(memory)[:, None]) @ self.v
        padded = src == self.pad  # the source pads with pad_id past its length
        scores = scores.masked_fill(padded[:, None, :], MASKED_LOGIT)
        context = torch.bmm(torch.softmax(scores, dim=-1), memory.to(scores.dtype))
        logits = self.projection(self.attention_layer(torch.cat([out, context.to(out.dtype)], -1)))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=self.pad)

    def compile_head(self):
        """Everything after the LSTMs as one compiled graph."""
        self.head = torch.compile(self.attend_and_score)
        return self


def seq2seq_weights(hp, w):
    """tbdzoo's canonical weights as the hand-written module's state dict."""
    state = {"src_embed.weight": w["encoder.embedding.weight"],
             "tgt_embed.weight": w["decoder.embedding.weight"],
             "w_query.weight": w["attention.w_query"], "w_memory.weight": w["attention.w_memory"],
             "v": w["attention.v"], "attention_layer.weight": w["attention_layer.weight"],
             "projection.weight": w["output_projection.weight"]}
    for side, layers in (("encoder", hp["encoder_layers"]), ("decoder", hp["decoder_layers"])):
        state.update(_rnn_state(side, side + ".lstm.", "ifgo", layers, ("fw",), w))
    return state


def _rnn_state(module, prefix, gates, layers, directions, w):
    """nn.LSTM / nn.GRU weights from per-gate tensors; the bias tbdzoo does not have is 0
    (LSTM's bias_hh; the GRU's hidden biases but b_hn)."""
    state = {}
    for layer in range(layers):
        for d in directions:
            q, suffix = "{}l{}.{}.".format(prefix, layer, d), "_l{}{}".format(
                layer, "_reverse" if d == "bw" else "")
            def cat(names, q=q):
                return torch.cat([torch.as_tensor(w[q + n]) for n in names])
            state[module + ".weight_ih" + suffix] = cat(["w_" + g for g in gates])
            state[module + ".weight_hh" + suffix] = cat(["u_" + g for g in gates])
            if gates == "ifgo":
                bias = cat(["b_" + g for g in gates])
                state[module + ".bias_ih" + suffix], state[module + ".bias_hh" + suffix] = \
                    bias, torch.zeros_like(bias)
            else:
                hn = torch.as_tensor(w[q + "b_hn"])
                state[module + ".bias_ih" + suffix] = cat(["b_r", "b_z", "b_in"])
                state[module + ".bias_hh" + suffix] = torch.cat(
                    [torch.zeros_like(hn), torch.zeros_like(hn), hn])
    return state


def handwritten_seq2seq(hp, weights, batch, device):
    net = Seq2Seq(hp)
    net.load_state_dict({k: torch.as_tensor(v) for k, v in seq2seq_weights(hp, weights).items()})
    net = net.to(device)
    src = torch.from_numpy(batch["src"]).long().to(device)
    tgt_in = torch.from_numpy(batch["tgt_in"]).long().to(device)
    labels = torch.from_numpy(batch["labels"]).long().to(device)
    opt = torch.optim.Adam(net.parameters(), lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                           eps=hp["eps"], **fast_optimizer(device))

    def clip():
        torch.nn.utils.clip_grad_norm_(net.parameters(), hp["grad_clip_norm"], foreach=True)
    return net, opt, lambda fn: fn(src, tgt_in, labels), clip


# -- hand-written Deep Speech 2 ---------------------------------------------------------------
class DeepSpeech2(nn.Module):
    def __init__(self, hp, bins):
        super().__init__()
        self.hp, c = hp, hp["channels"]
        bn = dict(eps=hp["bn_eps"], momentum=hp["bn_momentum"])
        self.conv1 = nn.Conv2d(1, c, hp["conv1_kernel"], hp["conv1_stride"], bias=False)
        self.conv1_bn = nn.BatchNorm2d(c, **bn)
        self.conv2 = nn.Conv2d(c, c, hp["conv2_kernel"], hp["conv2_stride"], bias=False)
        self.conv2_bn = nn.BatchNorm2d(c, **bn)
        width = bins
        for conv in ("conv1", "conv2"):
            width = (width - hp[conv + "_kernel"][1]) // hp[conv + "_stride"][1] + 1
        features, h = c * width, hp["rnn_units"]
        self.rnn_bn, self.rnn = nn.ModuleList(), nn.ModuleList()
        for i in range(hp["rnn_layers"]):
            self.rnn_bn.append(nn.BatchNorm1d(features if i == 0 else 2 * h, **bn))
            self.rnn.append(nn.GRU(features if i == 0 else 2 * h, h, bidirectional=True))
        self.fc = nn.Linear(2 * h, hp["fc_units"], bias=False)
        self.fc_bn = nn.BatchNorm1d(hp["fc_units"], **bn)
        self.output = nn.Linear(hp["fc_units"], hp["num_classes"])

    def act(self, x):
        ceiling = self.hp["relu_ceiling"]
        return F.hardtanh(x, 0.0, ceiling) if ceiling > 0 else F.relu(x)

    def forward(self, spectrogram, steps, labels, label_lengths):
        """``steps``: each utterance's steps after the convolutions, on the CPU, longest first."""
        x = spectrogram[:, None]  # (N, 1, T, F)
        x = self.conv1_bn(self.act(self.conv1(x)))
        x = self.conv2_bn(self.act(self.conv2(x)))
        n, c, t, f = x.shape
        x = x.permute(2, 0, 1, 3).reshape(t, n, c * f)  # (T', N, C*F'), channel-major
        packed = rnn.pack_padded_sequence(x, steps, enforce_sorted=True)
        data = packed.data
        for bn, gru in zip(self.rnn_bn, self.rnn):
            data = gru(packed._replace(data=bn(data)))[0].data
        data = self.output(self.act(self.fc_bn(self.fc(data))))
        data = F.log_softmax(data.float(), dim=-1)
        log_probs = rnn.pad_packed_sequence(packed._replace(data=data), total_length=t)[0]
        total = F.ctc_loss(log_probs, labels, steps, label_lengths, blank=0, reduction="sum")
        return total / n


def deepspeech2_weights(hp, w):
    state = {"conv1.weight": w["conv1.weight"], "conv2.weight": w["conv2.weight"],
             "fc.weight": w["fc.weight"], "output.weight": w["output.weight"],
             "output.bias": w["output.bias"]}
    bns = [("conv1_bn", "conv1.bn"), ("conv2_bn", "conv2.bn"), ("fc_bn", "fc.bn")] + \
        [("rnn_bn.{}".format(i), "rnn.{}.bn".format(i)) for i in range(hp["rnn_layers"])]
    for ours, theirs in bns:
        for a, b in (("weight", "gamma"), ("bias", "beta"), ("running_mean", "running_mean"),
                     ("running_var", "running_var")):
            state["{}.{}".format(ours, a)] = w["{}.{}".format(theirs, b)]
    for i in range(hp["rnn_layers"]):
        state.update(_rnn_state("rnn.{}".format(i), "rnn.{}.".format(i), "rzn", 1, ("fw", "bw"), w))
    return state


def output_steps(hp, frames):
    """Steps after the unpadded convolutions, at least one (tbdzoo's lengths_after_conv)."""
    for conv in ("conv1", "conv2"):
        k, s = hp[conv + "_kernel"][0], hp[conv + "_stride"][0]
        frames = ((frames - k) // s + 1).clamp(min=1)
    return frames


def handwritten_deepspeech2(hp, weights, batch, device):
    frames = torch.from_numpy(batch["spectrogram_lengths"]).long()
    order = torch.argsort(frames, descending=True, stable=True)  # longest first, once
    x = torch.from_numpy(batch["spectrogram"])[order].to(device)
    net = DeepSpeech2(hp, x.shape[-1])
    state = {k: torch.as_tensor(v) for k, v in deepspeech2_weights(hp, weights).items()}
    missing = net.load_state_dict(state, strict=False).missing_keys
    assert all(k.endswith("num_batches_tracked") for k in missing), missing
    net = net.to(device)
    if device.startswith("cuda"):
        net = net.to(memory_format=torch.channels_last)
    steps = output_steps(hp, frames[order])  # on the CPU, as packing and CTC take them
    labels = torch.from_numpy(batch["labels"])[order].long().to(device)
    label_lengths = torch.from_numpy(batch["label_lengths"])[order].long()
    opt = torch.optim.SGD(net.parameters(), lr=hp["lr"], momentum=hp["momentum"], **fast_optimizer(device))

    def clip():
        torch.nn.utils.clip_grad_value_(net.parameters(), hp["grad_clip_value"], foreach=True)
    return net, opt, lambda fn: fn(x, steps, labels, label_lengths), clip


HANDWRITTEN = {"seq2seq": handwritten_seq2seq, "deepspeech2": handwritten_deepspeech2}
AS_STATE = {"seq2seq": seq2seq_weights, "deepspeech2": deepspeech2_weights}


def handwritten_step(model_name, hp, weights, batch, device, precision, compiled):
    net, opt, call, clip = HANDWRITTEN[model_name](hp, weights, batch, device)
    loss_fn = net
    if compiled:
        loss_fn = net.compile_head() if hasattr(net, "compile_head") else torch.compile(net)
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=precision == "bf16")
    net.train()

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = call(loss_fn)
        loss.backward()
        clip()
        opt.step()
        return loss.detach()
    return net, opt, step


# -- measuring ---------------------------------------------------------------------------------
def first_loss(value):
    """A program step's result (a float, or the losses by objective) as one float."""
    if isinstance(value, dict):
        (value,) = value.values()
    return float(value)


def weight_difference(model_name, model, net):
    """The largest |tbdzoo - hand-written| over every weight and running statistic after both
    took one step from the same weights: near 0 when the gradients and updates agree. The
    biases only the nn modules have (cuDNN's second bias) are left out."""
    theirs = net.state_dict()
    ours = AS_STATE[model_name](model.hparams, model.get_weights())
    return max(float((torch.as_tensor(v).float() - theirs[k].detach().float().cpu()).abs().max())
               for k, v in ours.items() if "bias_hh" not in k)


def run_cell(model_name, precision, compiled, device, args):
    import tbdzoo
    cuda = device.startswith("cuda")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    start = time.perf_counter()
    if compiled:  # each cell compiles from scratch, within dynamo's recompilation limit
        torch._dynamo.reset()
    warmup, steps, _ = timing(args, model_name)
    ours_precision = precision if cuda or precision != "tf32" else "fp32"  # no TF32 on a CPU
    sizes = {} if args.batch_size is None else {"batch_size": args.batch_size}
    model = tbdzoo.build(model_name, backend="torch", config="tiny" if args.tiny else "paper",
                         device=device, precision=ours_precision,
                         execution="compiled" if compiled else "eager", **sizes)
    batch = model.synthetic_batch(seed=0)
    prepared = model.prepare_batch(batch)
    net, opt, theirs = handwritten_step(model_name, model.hparams, model.get_weights(), batch,
                                        device, precision, compiled)
    def ours():
        return model.train_step(prepared, sync=False)
    contenders = {"tbdzoo": ours, "handwritten": theirs}
    losses = {"tbdzoo": first_loss(model.train_step(prepared)), "handwritten": float(theirs())}
    checks = {"first_step_weight_diff": weight_difference(model_name, model, net),
              "first_loss_rel_diff": abs(losses["tbdzoo"] - losses["handwritten"]) / max(
                  abs(losses["handwritten"]), 1e-12)}
    held = {"tbdzoo": lambda: harness.held_bytes([model.native], model.torch_optimizers),
            "handwritten": lambda: harness.held_bytes([net], [opt])}
    peaks = harness.peak_memory(contenders, held, device)
    times = harness.warm_and_time(contenders, device, warmup, steps,
                                  args.rounds or timing(args, model_name)[2])
    cell = harness.cell_record(args, device, contenders, start, model, batch, model_name, precision,
                               "compiled" if compiled else "eager", times, peaks, losses, checks,
                               warmup=warmup, steps=steps)
    return cell


def timing(args, model_name):
    return [given if given is not None else default for given, default in
            zip((args.warmup, args.steps, args.rounds), TIMING[model_name])]


def host_environment():
    return {"device": "cpu", "torch": torch.__version__, "python": platform.python_version(),
            "host_cpus": os.cpu_count()}


def loss_pair(cell):
    """``run_cells``' ``describe``: the two sides' first losses."""
    return " loss {:.5g} vs {:.5g}".format(cell["first_loss"]["tbdzoo"], cell["first_loss"]["handwritten"])


def worker(args, device):
    return harness.run_cells(args, device, run_cell, describe=loss_pair)


def arguments(argv=None):
    p = harness.comparison_parser(__doc__, "gpu_recurrent.json", warmup=None, models=MODELS, overrides={
        "--warmup": {"help": "warm-up steps per side (default: per model, TIMING)"},
        "--steps": {"default": None, "help": "steps per timed round (default: per model)"},
        "--rounds": {"default": None, "help": "interleaved rounds per process (default: per model)"},
        "--tiny": {"help": "tiny configs of both sides (a CPU check)"},
        "--batch-size": {"help": "batch size of both sides (default: the config's)"},
        "--profile": {"help": "a torch.profiler summary of each side in the last process"}})
    harness.add_process_options(p, "gpu_recurrent.json")
    args = p.parse_args(argv)
    harness.check_choices(p, args, models=MODELS)
    return p, args


def main(argv=None):
    return harness.main("benchmarks.gpu_recurrent", arguments, worker, argv)


if __name__ == "__main__":
    sys.exit(main())
