"""tbdzoo's recurrent models on the PyTorch backend against hand-written PyTorch loops, on one GPU.

    python3 benchmarks/gpu_recurrent.py --out results.json
    python3 benchmarks/gpu_recurrent.py --models deepspeech2 --executions eager --precisions bf16
    python3 benchmarks/gpu_recurrent.py --device cpu --tiny --steps 2 --repeats 1 --warmup 1
    python3 benchmarks/gpu_recurrent.py --models seq2seq --batch-size 16 --profile profiles/

The hand-written contenders are what a PyTorch user writes instead, with tbdzoo's shapes
(tbdzoo/models/seq2seq.py, tbdzoo/models/deepspeech2.py, docs/models.md):

- **Seq2Seq**: ``nn.Embedding`` for each language; a 2-layer ``nn.LSTM`` encoder over the
  ``pack_padded_sequence`` of the (already reversed) source; a ``nn.LSTM`` decoder over the
  padded teacher-forced target in one cuDNN call (no input feeding, so nothing needs packing:
  its padded steps reach only labels the loss ignores); additive attention
  ``v . tanh(W_q q + W_m m)`` with the source mask built for all decoder steps at once; the
  attention layer (a bias-free ``nn.Linear`` over ``[output; context]``, no tanh, as tbdzoo has
  it); a bias-free projection to the target vocabulary; ``F.cross_entropy`` ignoring the pad;
  Adam 3e-4 after ``clip_grad_norm_(1.0)``.
- **Deep Speech 2**: the two ``nn.Conv2d`` (no bias), each followed by its activation (ReLU, or
  ReLU clipped at ``relu_ceiling``) and ``nn.BatchNorm2d``; then the steps are packed once and
  stay packed: each of the recurrent layers is ``nn.BatchNorm1d`` over the packed data (exactly
  the valid steps: sequence-wise BatchNorm) and a bidirectional ``nn.GRU`` whose directions
  are concatenated, as tbdzoo merges them; the bias-free FC, its BatchNorm1d and activation;
  the output layer and ``log_softmax``, all on the packed data; ``nn.CTCLoss`` (blank 0, summed
  per example, averaged over the batch as tbdzoo does); SGD momentum 0.9, lr 3e-4, after
  ``clip_grad_value_(100)`` (the paper config's element-wise clip).

Both sides start from the same weights (tbdzoo's, copied into the ``nn`` modules: per-gate
matrices concatenated in PyTorch's gate order, cuDNN's extra LSTM bias and the GRU's b_hr,
b_hz at zero), read the same synthetic batch, run under the same precision (TF32, or bf16
autocast for the whole step, master weights fp32) with cuDNN's autotuner on, and compile the
same function (forward and loss) with ``torch.compile`` when compiled. Each hand-written
optimizer is PyTorch's default implementation; tbdzoo's is its fused one on a GPU. The first
step's loss of each side goes into the JSON (``first_loss``): the same weights and batch give
the same loss when the two do the same work.

Per cell: build both, one step each (the first losses), peak memory of one step
(``max_memory_allocated`` after a reset, less what the other contender holds), warm-up, then
``repeats`` rounds of ``steps`` steps of each in alternating order, each round synchronised
(defaults per model in ``TIMING``; the eight cells are expected to take five to eight minutes
on an H200, most of it compiling Deep Speech 2).
With ``--profile DIR`` each cell then runs ``PROFILE_STEPS`` more steps of each side under
``torch.profiler`` and writes their operator tables (``DIR/<model>-<precision>-<execution>-
<side>.txt``, sorted by device time on a GPU, by CPU time otherwise); they are not timed.
Throughput is in the model's own unit (target tokens/s, audio s/s), counted by tbdzoo on the
shared batch. On a CPU (``--device cpu``, a check that the script runs) tf32 means fp32 and no
memory is measured.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch.nn.utils.rnn as rnn  # noqa: E402
from torch import nn  # noqa: E402

from gpu_handwritten import environment  # noqa: E402
from gpu_programs import held_bytes, peak_bytes  # noqa: E402

MODELS = ("seq2seq", "deepspeech2")
# Timing defaults per model (warm-up steps, steps per round, rounds), so that every cell's rounds
# take a few seconds on an H200 and the eight cells, compilation included, five to eight minutes:
# a Seq2Seq step takes some 30 ms there, a Deep Speech 2 step (batch 8 at 16 s) some 500 ms.
TIMING = {"seq2seq": (3, 20, 5), "deepspeech2": (2, 5, 3)}
PROFILE_STEPS = 3
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

    def forward(self, src, src_lengths, tgt_in, labels):
        """``src_lengths`` on the CPU, as packing wants them."""
        packed = rnn.pack_padded_sequence(self.src_embed(src), src_lengths, batch_first=True,
                                          enforce_sorted=False)
        memory = rnn.pad_packed_sequence(self.encoder(packed)[0], batch_first=True,
                                         total_length=src.shape[1])[0]
        out = self.decoder(self.tgt_embed(tgt_in))[0]
        scores = torch.tanh(self.w_query(out)[:, :, None] + self.w_memory(memory)[:, None]) @ self.v
        padded = src == self.pad  # the source pads with pad_id past its length
        scores = scores.masked_fill(padded[:, None, :], MASKED_LOGIT)
        context = torch.bmm(torch.softmax(scores, dim=-1), memory.to(scores.dtype))
        logits = self.projection(self.attention_layer(torch.cat([out, context.to(out.dtype)], -1)))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=self.pad)


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
            cat = lambda names: torch.cat([torch.as_tensor(w[q + n]) for n in names])  # noqa: E731
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
    src_lengths = torch.from_numpy(batch["src_lengths"]).long()  # stays on the CPU
    tgt_in = torch.from_numpy(batch["tgt_in"]).long().to(device)
    labels = torch.from_numpy(batch["labels"]).long().to(device)
    opt = torch.optim.Adam(net.parameters(), lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                           eps=hp["eps"])

    def clip():
        torch.nn.utils.clip_grad_norm_(net.parameters(), hp["grad_clip_norm"], foreach=True)
    return net, opt, lambda fn: fn(src, src_lengths, tgt_in, labels), clip


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
        """``steps``: each utterance's steps after the convolutions, on the CPU."""
        x = spectrogram[:, None]  # (N, 1, T, F)
        x = self.conv1_bn(self.act(self.conv1(x)))
        x = self.conv2_bn(self.act(self.conv2(x)))
        n, c, t, f = x.shape
        x = x.permute(2, 0, 1, 3).reshape(t, n, c * f)  # (T', N, C*F'), channel-major
        packed = rnn.pack_padded_sequence(x, steps, enforce_sorted=False)
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
    x = torch.from_numpy(batch["spectrogram"]).to(device)
    net = DeepSpeech2(hp, x.shape[-1])
    state = {k: torch.as_tensor(v) for k, v in deepspeech2_weights(hp, weights).items()}
    missing = net.load_state_dict(state, strict=False).missing_keys
    assert all(k.endswith("num_batches_tracked") for k in missing), missing
    net = net.to(device)
    if device.startswith("cuda"):
        net = net.to(memory_format=torch.channels_last)
    frames = torch.from_numpy(batch["spectrogram_lengths"]).long()  # stays on the CPU
    labels = torch.from_numpy(batch["labels"]).long().to(device)
    label_lengths = torch.from_numpy(batch["label_lengths"]).long()
    opt = torch.optim.SGD(net.parameters(), lr=hp["lr"], momentum=hp["momentum"])

    def clip():
        torch.nn.utils.clip_grad_value_(net.parameters(), hp["grad_clip_value"], foreach=True)
    return net, opt, lambda fn: fn(x, output_steps(hp, frames), labels, label_lengths), clip


HANDWRITTEN = {"seq2seq": handwritten_seq2seq, "deepspeech2": handwritten_deepspeech2}
AS_STATE = {"seq2seq": seq2seq_weights, "deepspeech2": deepspeech2_weights}


def handwritten_step(model_name, hp, weights, batch, device, precision, compiled):
    net, opt, call, clip = HANDWRITTEN[model_name](hp, weights, batch, device)
    loss_fn = torch.compile(net) if compiled else net
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
def time_rounds(contenders, device, steps, repeats):
    """Seconds per step of each contender, one figure per round, rounds in alternating order."""
    times = {name: [] for name in contenders}
    order = list(contenders)
    for r in range(repeats):
        for name in (order if r % 2 == 0 else order[::-1]):
            synchronize(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                contenders[name]()
            synchronize(device)
            times[name].append((time.perf_counter() - t0) / steps)
    return times


def synchronize(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


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


def write_profiles(directory, cell_name, contenders, device):
    """Both sides' operator tables over ``PROFILE_STEPS`` steps each, one file per side."""
    from torch.profiler import ProfilerActivity, profile
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    os.makedirs(directory, exist_ok=True)
    for name, step in contenders.items():
        synchronize(device)
        with profile(activities=activities, record_shapes=True) as prof:
            for _ in range(PROFILE_STEPS):
                step()
            synchronize(device)
        table = prof.key_averages().table(
            sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=60)
        path = os.path.join(directory, "{}-{}.txt".format(cell_name, name))
        with open(path, "w") as f:
            f.write("{} {}: {} steps\n{}\n".format(cell_name, name, PROFILE_STEPS, table))


def run_cell(model_name, precision, compiled, device, warmup, steps, repeats, tiny,
             batch_size=None, profile_dir=None):
    import tbdzoo
    cuda = device.startswith("cuda")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    start = time.perf_counter()
    if compiled:  # each cell compiles from scratch, within dynamo's recompilation limit
        torch._dynamo.reset()
    ours_precision = precision if cuda or precision != "tf32" else "fp32"  # no TF32 on a CPU
    sizes = {} if batch_size is None else {"batch_size": batch_size}
    model = tbdzoo.build(model_name, backend="torch", config="tiny" if tiny else "paper",
                         device=device, precision=ours_precision,
                         execution="compiled" if compiled else "eager", **sizes)
    batch = model.synthetic_batch(seed=0)
    prepared = model.prepare_batch(batch)
    net, opt, theirs = handwritten_step(model_name, model.hparams, model.get_weights(), batch,
                                        device, precision, compiled)
    ours = lambda: model.train_step(prepared, sync=False)  # noqa: E731
    contenders = {"tbdzoo": ours, "handwritten": theirs}
    losses = {"tbdzoo": first_loss(model.train_step(prepared)), "handwritten": float(theirs())}
    drift = weight_difference(model_name, model, net)
    synchronize(device)
    alone = {"tbdzoo": None, "handwritten": None}
    if cuda:
        alone = {"tbdzoo": peak_bytes(ours, device) - held_bytes([net], [opt]),
                 "handwritten": peak_bytes(theirs, device) - held_bytes(
                     [model.native], list(model._optimizers.values()))}
    for step in contenders.values():
        for _ in range(warmup):
            step()
    times = time_rounds(contenders, device, steps, repeats)
    if profile_dir:
        write_profiles(profile_dir, "{}-{}-{}".format(
            model_name, precision, "compiled" if compiled else "eager"), contenders, device)
    items = model.model_def.items(model.hparams, batch)
    result = {"model": model_name, "precision": precision, "execution": "compiled" if compiled else "eager",
              "config": "tiny" if tiny else "paper", "device": device,
              "batch_size": model.hparams["batch_size"], "unit": model.model_def.unit,
              "warmup": warmup, "steps": steps, "repeats": repeats,
              "items_per_step": items, "first_loss": losses, "first_step_weight_diff": drift,
              "first_loss_rel_diff": abs(losses["tbdzoo"] - losses["handwritten"]) / max(
                  abs(losses["handwritten"]), 1e-12),
              "cell_seconds": None}
    for name in contenders:
        median = statistics.median(times[name])
        result[name] = {"step_s": times[name], "step_s_median": median, "throughput": items / median,
                        "peak_bytes": alone[name]}
    result["throughput_ratio"] = result["tbdzoo"]["throughput"] / result["handwritten"]["throughput"]
    result["memory_ratio"] = alone["tbdzoo"] / alone["handwritten"] if cuda else None
    result["cell_seconds"] = time.perf_counter() - start
    del model, net, opt, contenders, ours, theirs
    if cuda:
        torch.cuda.empty_cache()
    return result


def host_environment():
    return {"device": "cpu", "torch": torch.__version__, "python": platform.python_version(),
            "host_cpus": os.cpu_count()}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--precisions", default="tf32,bf16")
    p.add_argument("--executions", default="eager,compiled")
    p.add_argument("--warmup", type=int, help="warm-up steps per side (default: per model, TIMING)")
    p.add_argument("--steps", type=int, help="steps per timed round (default: per model)")
    p.add_argument("--repeats", type=int, help="timed rounds per side (default: per model)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (a check that it runs)")
    p.add_argument("--tiny", action="store_true", help="tiny configs of both sides (a CPU check)")
    p.add_argument("--batch-size", type=int, help="batch size of both sides (default: the config's)")
    p.add_argument("--profile", metavar="DIR",
                   help="also write torch.profiler tables of both sides per cell into DIR")
    p.add_argument("--out", default=os.path.join(HERE, "results", "gpu_recurrent.json"))
    args = p.parse_args()
    unknown = sorted(set(args.models.split(",")) - set(MODELS))
    if unknown:
        p.error("unknown model(s) {}: choose from {}".format(", ".join(unknown), ", ".join(MODELS)))
    device = args.device
    if device == "cuda":
        device = "cuda:0"
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --tiny to check the script", file=sys.stderr)
        return 2
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    results = {"command": " ".join(["benchmarks/gpu_recurrent.py"] + sys.argv[1:]),
               "environment": environment() if device.startswith("cuda") else host_environment(),
               "cells": []}
    for model_name in args.models.split(","):
        for execution in args.executions.split(","):
            for precision in args.precisions.split(","):
                timing = [given if given is not None else default for given, default in
                          zip((args.warmup, args.steps, args.repeats), TIMING[model_name])]
                try:
                    cell = run_cell(model_name, precision, execution == "compiled", device,
                                    *timing, args.tiny, args.batch_size, args.profile)
                except Exception as e:  # a failed cell is recorded, the others still run
                    traceback.print_exc()
                    cell = {"model": model_name, "precision": precision, "execution": execution,
                            "error": "{}: {}".format(type(e).__name__, e)}
                    print(cell, flush=True)
                else:
                    memory = "" if cell["memory_ratio"] is None else \
                        " {:>7.3f}x memory".format(cell["memory_ratio"])
                    print("{:<12} {:<5} {:<9} {:>12,.1f} {:>12,.1f} {:>7.3f}x speed{} loss {:.5g} vs "
                          "{:.5g} ({:.0f}s)".format(
                              model_name, precision, execution, cell["tbdzoo"]["throughput"],
                              cell["handwritten"]["throughput"], cell["throughput_ratio"], memory,
                              cell["first_loss"]["tbdzoo"], cell["first_loss"]["handwritten"],
                              cell["cell_seconds"]), flush=True)
                results["cells"].append(cell)
                os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
