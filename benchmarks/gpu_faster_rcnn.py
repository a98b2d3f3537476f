"""tbdzoo's Faster R-CNN training step on the PyTorch backend against torchvision's FasterRCNN,
on one GPU.

    python3 benchmarks/gpu_faster_rcnn.py --out results.json         # tf32 and bf16, eager
    python3 benchmarks/gpu_faster_rcnn.py --executions eager,compiled --precisions bf16
    python3 benchmarks/gpu_faster_rcnn.py --canvas config              # tbdzoo on 1,000 x 1,000
    python3 benchmarks/gpu_faster_rcnn.py --device cpu --tiny --out /tmp/frcnn_cpu.json

tbdzoo's side is ``tbdzoo.build("faster_rcnn", backend="torch", config="paper")``: ResNet-101
C4, one image per step, every step running its targets step inside the update's forward pass
(anchor targets, proposals 12,000 -> NMS 0.7 -> 2,000, 128 RoIs and RoIAlign's gather points;
on a GPU the NMS and the gather points run there, docs/detection.md).

torchvision's side is ``FasterRCNN`` assembled the same way (tbdzoo/detection/
torchvision_reference.py: the resnet101 trunk, conv1 .. layer3 as the backbone, ``RPNHead``,
layer4 + average pooling as the box head, ``FastRCNNPredictor``, frozen batch norm) with
tbdzoo's hyperparameters where its API takes them (RPN batch 256, half positive, IoU 0.7 /
0.3, pre / post NMS 12,000 / 2,000, NMS 0.7, 128 RoIs at most 25% foreground at IoU 0.5,
RoIAlign 14 x 14 with 2 x 2 samples; that module lists what differs), trained as its users
train it: a list of image tensors at their own size and a list of target dicts into
``model(images, targets)``, the sum of the four losses it returns, ``clip_grad_value_(5)``
(tbdzoo's element-wise clip) and PyTorch's default SGD (lr 1e-3, momentum 0.9, weight decay
5e-4; tbdzoo uses its fused one on a GPU). Its sampling and NMS run on the device.

The same work on both sides:

- **Pixels.** Both read one 600 x 1,000 image (a VOC image resized to short side 600, long
  side 1,000) holding three objects. torchvision's transform (mean 0, standard deviation 1,
  sizes that leave it unresized) pads it to a multiple of 32, 608 x 1,024; tbdzoo's canvas is
  set to the same 608 x 1,024 (``--canvas padded``, the default). ``--canvas config`` keeps
  the config's fixed 1,000 x 1,000 canvas, which holds portrait and landscape images alike
  and costs 1.6 times the pixels here; ``--torchvision-input canvas`` gives torchvision
  tbdzoo's whole padded canvas instead of the image.
- **RoIs.** Both start from tbdzoo's initial weights, with every frozen batch norm's
  statistics measured on the image first (``calibrate_frozen_batchnorm``; ``--frozen-bn
  initial`` skips it): with mean 0 and variance 1 ResNet-101's activations grow through its
  blocks, every proposal decodes to a sliver that the RPN's ``min_size`` removes, and
  torchvision's head then runs on the 3 ground-truth boxes where tbdzoo's runs on 128 RoIs
  (it pads a short sample). Both then step at learning rate 1e-12 (``--learning-rate``): the
  same kernels as a training step (weight decay and momentum included), but the weights stay
  where calibration put them. At the paper's 0.001 the untrained heads move the weights
  within a few steps to where some steps' proposals are all slivers again, torchvision's head
  sees from 3 to 128 RoIs from step to step, and with cuDNN's autotuner on it measures
  layer4's convolutions anew for each new count: 0.4-1.1 s steps that time the autotuner,
  not the model. The record carries the RoIs each side's head ran on.

Both run channels-last, with cuDNN's autotuner and the TF32 flags on, under the same
precision: tf32, or bf16 autocast for the whole forward pass (master weights fp32), as tbdzoo's
precision option does. ``compiled`` (optional) builds tbdzoo with ``execution="compiled"`` and
wraps torchvision's model in ``torch.compile`` (its sampling and NMS break the graph).

Per cell (PyTorch's generators seeded with 0, so torchvision's samples repeat from run to
run): build both, one step each (the first losses: they differ a little, since the two
draw different anchors and RoIs and differ in the points listed in the module above), the
peak memory of one step of each (``max_memory_allocated`` after a reset, less what the other
side holds), ``warmup`` steps each, then ``repeats`` rounds of ``steps`` steps of each side
alone in alternating order, each round synchronised; the figure is the median round. The
default run (tf32 and bf16, eager) is meant to take under two minutes on an H200, building
included. On a CPU (``--device cpu``, a check that the script runs) tf32 means fp32, PyTorch
runs one thread and no memory is measured.
"""
import argparse
import json
import os
import statistics
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from gpu_handwritten import environment  # noqa: E402
from benchmarks.harness import held_bytes, peak_bytes  # noqa: E402
from gpu_recurrent import (first_loss, host_environment, synchronize,  # noqa: E402
                           time_rounds)

MODEL = "faster_rcnn"
OBJECTS = 3             # objects in the image (a VOC image holds 2.5 on average)
IMAGE_HEIGHT = 0.6      # of the canvas: 600 of 1,000, the short side the paper resizes to
TIMING = (3, 5, 3)      # warm-up steps, steps per round, rounds
STILL_LR = 1e-12        # > 0, as tbdzoo's hyperparameters require; the weights do not move


# -- the shared input -----------------------------------------------------------------------------
def image_hw(config_canvas):
    """The benchmark image's (height, width): IMAGE_HEIGHT of the config's canvas height and
    its whole width."""
    return int(round(config_canvas[0] * IMAGE_HEIGHT)), config_canvas[1]


def benchmark_batch(hp, config_canvas, seed=0):
    """One image of IMAGE_HEIGHT of the config's canvas height and its whole width, OBJECTS
    rectangles of distinct colours, on the model's canvas (tbdzoo's batch layout,
    docs/models.md)."""
    from tbdzoo.datasets.detection_batch import empty_batch, normalize, put_example, \
        synthetic_image
    h, w = image_hw(config_canvas)
    objects = min(OBJECTS, hp["max_boxes"])
    batch = empty_batch(1, hp["canvas"], hp["max_boxes"])
    image, boxes, labels = synthetic_image(seed, h, w, hp["num_classes"] - 1, objects, objects)
    normalize(image, out=put_example(batch, 0, (h, w), boxes, labels))
    return {k: batch[k] for k in ("images", "image_hw", "gt_boxes", "gt_labels", "gt_count")}


def torchvision_inputs(batch, whole_canvas, device):
    """torchvision's inputs for the batch's image: ([image (3, h, w)], [{"boxes", "labels"}]),
    the image cut to its own size (or the whole canvas)."""
    h, w = batch["images"].shape[2:] if whole_canvas else batch["image_hw"][0]
    count = int(batch["gt_count"][0])
    image = torch.from_numpy(np.ascontiguousarray(batch["images"][0, :, :h, :w])).to(device)
    target = {"boxes": torch.from_numpy(batch["gt_boxes"][0, :count]).to(device),
              "labels": torch.from_numpy(batch["gt_labels"][0, :count].astype(np.int64)).to(device)}
    return [image], [target]


# -- the shared start ------------------------------------------------------------------------------
def torchvision_model(hp, weights, image, device):
    """torchvision's FasterRCNN (tbdzoo/detection/torchvision_reference.py) holding ``weights``,
    its transform sized to leave ``image`` (3, h, w) unresized, on ``device``."""
    from tbdzoo.detection import torchvision_reference
    h, w = image.shape[1:]
    net = torchvision_reference.faster_rcnn(hp, min_size=min(h, w), max_size=max(h, w))
    torchvision_reference.load_weights(net, weights)
    return net.to(device)


def calibrate_frozen_batchnorm(hp, weights, batch, device):
    """tbdzoo's weights with every frozen batch norm's running mean and variance set to the
    statistics of its input on the benchmark image, as a pretrained backbone's are: one
    evaluation forward pass of torchvision's model (fp32), each batch norm measured just
    before it runs, so it sees the layers before it already calibrated. With the initial
    statistics (0 and 1) ResNet-101's activations grow through its 33 blocks, the RPN's boxes
    decode to slivers that its ``min_size`` removes, and a step samples only the ground-truth
    boxes as RoIs: torchvision's head then runs on 3 RoIs where tbdzoo's runs on 128 (it pads a
    short sample), and the two steps do different work."""
    from torchvision.ops import FrozenBatchNorm2d
    images, _ = torchvision_inputs(batch, False, device)
    net = torchvision_model(hp, weights, images[0], device).eval()

    def measure(module, inputs):
        x = inputs[0].float()
        module.running_mean.copy_(x.mean(dim=(0, 2, 3)))
        module.running_var.copy_(x.var(dim=(0, 2, 3), unbiased=False))
    hooks = [m.register_forward_pre_hook(measure) for m in net.modules()
             if isinstance(m, FrozenBatchNorm2d)]
    with torch.no_grad():
        net(images)
    for hook in hooks:
        hook.remove()
    calibrated = dict(weights)
    for name, value in net.named_buffers():
        if name.endswith((".running_mean", ".running_var")):
            calibrated[name] = value.detach().cpu().numpy().astype(np.float32)
    return calibrated, len(hooks)


# -- torchvision's side ---------------------------------------------------------------------------
def torchvision_step(hp, weights, batch, device, precision, compiled, whole_canvas):
    """torchvision's FasterRCNN from tbdzoo's weights and its training step, which returns its
    four losses (detached)."""
    images, targets = torchvision_inputs(batch, whole_canvas, device)
    h, w = images[0].shape[1:]
    net = torchvision_model(hp, weights, images[0], device)
    net = net.to(memory_format=torch.channels_last)
    net.train()
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=hp["lr"], momentum=hp["momentum"],
                          weight_decay=hp["weight_decay"], nesterov=hp["nesterov"],
                          **({"fused": True} if device.startswith("cuda") else {}))
    forward = torch.compile(net) if compiled else net
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16,
                              enabled=precision == "bf16")

    rois = []   # the RoIs its box head ran on, per step
    net.roi_heads.box_head.register_forward_pre_hook(lambda m, i: rois.append(int(i[0].shape[0])))

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast:
            losses = forward(images, targets)
        total = sum(losses.values())
        total.backward()
        torch.nn.utils.clip_grad_value_(params, hp["grad_clip_value"], foreach=True)
        opt.step()
        return {k: v.detach() for k, v in losses.items()}
    return net, opt, step, (int(h), int(w)), rois


# -- measuring ------------------------------------------------------------------------------------
def padded_canvas(hp):
    """The benchmark image's sides rounded up to a multiple of 32, what torchvision's transform
    pads it to: tbdzoo's canvas for the same pixels on both sides."""
    h, w = image_hw(hp["canvas"])
    return (-(-h // 32) * 32, -(-w // 32) * 32)


def run_cell(precision, compiled, device, warmup, steps, repeats, tiny, whole_canvas,
             canvas="padded", calibrate=True, lr=STILL_LR):
    import tbdzoo
    cuda = device.startswith("cuda")
    # the flags tbdzoo's precision option sets for its own steps, here for torchvision's too
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)  # torchvision's samplers draw from PyTorch's generators
    start = time.perf_counter()
    if compiled:  # each cell compiles from scratch
        torch._dynamo.reset()
    execution = "compiled" if compiled else "eager"
    from tbdzoo.models.registry import get_model
    config = get_model(MODEL).configs["tiny" if tiny else "paper"]
    overrides = {"lr": lr}
    if canvas == "padded":
        overrides["canvas"] = padded_canvas(config)
    elif canvas != "config":
        overrides["canvas"] = canvas
    model = tbdzoo.build(MODEL, backend="torch", config="tiny" if tiny else "paper", device=device,
                         precision=precision if cuda or precision != "tf32" else "fp32",
                         execution=execution, memory_format="channels_last", **overrides)
    hp = model.hparams
    batch = benchmark_batch(hp, config["canvas"])
    prepared = model.prepare_batch(batch)
    weights, calibrated = model.get_weights(), 0
    if calibrate:
        weights, calibrated = calibrate_frozen_batchnorm(hp, weights, batch, device)
        model.set_weights(weights)
    net, opt, theirs, their_hw, their_rois = torchvision_step(hp, weights, batch, device,
                                                              precision, compiled, whole_canvas)
    ours = lambda: model.train_step(prepared, sync=False)  # noqa: E731
    contenders = {"tbdzoo": ours, "torchvision": theirs}
    build_seconds = time.perf_counter() - start
    their_losses = {k: float(v) for k, v in theirs().items()}
    losses = {"tbdzoo": first_loss(model.train_step(prepared)),
              "torchvision": sum(their_losses.values())}
    synchronize(device)
    held = {"tbdzoo": held_bytes([model.native], list(model._optimizers.values())),
            "torchvision": held_bytes([net], [opt])}
    alone = {"tbdzoo": None, "torchvision": None}
    if cuda:  # each side's peak less what the other side keeps allocated meanwhile
        alone = {"tbdzoo": peak_bytes(ours, device) - held["torchvision"],
                 "torchvision": peak_bytes(theirs, device) - held["tbdzoo"]}
    for step in contenders.values():
        for _ in range(warmup):
            step()
    times = time_rounds(contenders, device, steps, repeats)
    items = model.model_def.items(hp, batch)
    result = {"model": MODEL, "precision": precision, "execution": execution,
              "config": "tiny" if tiny else "paper", "device": device,
              "canvas": list(hp["canvas"]), "image_hw": [int(v) for v in batch["image_hw"][0]],
              "objects": int(batch["gt_count"][0]),
              "torchvision_input": "canvas" if whole_canvas else "image",
              "torchvision_image_hw": list(their_hw), "unit": model.model_def.unit,
              "learning_rate": hp["lr"],
              "frozen_batchnorm": "calibrated on the image ({} layers)".format(calibrated)
              if calibrate else "initial statistics (mean 0, variance 1)",
              # tbdzoo's head always runs on rois_per_image (a short sample is padded)
              "rois_per_step": {"tbdzoo": hp["rois_per_image"],
                                "torchvision_min": min(their_rois),
                                "torchvision_max": max(their_rois)},
              "warmup": warmup, "steps": steps, "repeats": repeats, "items_per_step": items,
              "first_loss": losses, "torchvision_first_losses": their_losses,
              "first_loss_rel_diff": abs(losses["tbdzoo"] - losses["torchvision"]) / max(
                  abs(losses["torchvision"]), 1e-12),
              "held_bytes": held, "build_seconds": build_seconds, "cell_seconds": None}
    for name in contenders:
        median = statistics.median(times[name])
        result[name] = {"step_s": times[name], "step_s_median": median,
                        "throughput": items / median, "peak_bytes": alone[name]}
    result["throughput_ratio"] = \
        result["tbdzoo"]["throughput"] / result["torchvision"]["throughput"]
    result["memory_ratio"] = alone["tbdzoo"] / alone["torchvision"] if cuda else None
    result["cell_seconds"] = time.perf_counter() - start
    del model, net, opt, contenders, ours, theirs, prepared
    if cuda:
        torch.cuda.empty_cache()
    return result


def summary(cell):
    """One line per cell: throughputs, ratios, first losses, seconds."""
    memory = ""
    if cell["memory_ratio"] is not None:
        memory = " {:>6.3f}x memory ({:.2f} / {:.2f} GiB)".format(
            cell["memory_ratio"], cell["tbdzoo"]["peak_bytes"] / 2 ** 30,
            cell["torchvision"]["peak_bytes"] / 2 ** 30)
    return ("{} {:<5} {:<9} {:>8.2f} {:>8.2f} img/s {:>6.3f}x speed{} loss {:.4g} vs {:.4g} "
            "({:.0f}s)".format(
                MODEL, cell["precision"], cell["execution"], cell["tbdzoo"]["throughput"],
                cell["torchvision"]["throughput"], cell["throughput_ratio"], memory,
                cell["first_loss"]["tbdzoo"], cell["first_loss"]["torchvision"],
                cell["cell_seconds"]))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precisions", default="tf32,bf16")
    p.add_argument("--executions", default="eager", help="eager and/or compiled")
    p.add_argument("--warmup", type=int, default=TIMING[0], help="warm-up steps per side")
    p.add_argument("--steps", type=int, default=TIMING[1], help="steps per timed round")
    p.add_argument("--repeats", type=int, default=TIMING[2], help="timed rounds per side")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (a check that it runs)")
    p.add_argument("--tiny", action="store_true", help="tiny config on both sides (a CPU check)")
    p.add_argument("--torchvision-input", choices=("image", "canvas"), default="image",
                   help="torchvision reads the image at its own size (default) or tbdzoo's "
                        "whole padded canvas")
    p.add_argument("--canvas", metavar="H,W", default="padded",
                   help="tbdzoo's canvas: 'padded' (default; the image padded to a multiple of "
                        "32, 608 x 1,024, what torchvision's transform makes), 'config' (the "
                        "config's fixed 1,000 x 1,000) or H,W")
    p.add_argument("--frozen-bn", choices=("calibrated", "initial"), default="calibrated",
                   help="frozen batch norm statistics: measured on the image (default; a "
                        "pretrained backbone's scale) or the initial mean 0, variance 1")
    p.add_argument("--learning-rate", type=float, default=STILL_LR,
                   help="both sides' SGD learning rate (default 1e-12: the same kernels as a "
                        "training step, and the weights, and so the RoIs each head samples, "
                        "stay where calibration put them; 0.001 is the paper's)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "gpu_faster_rcnn.json"))
    args = p.parse_args()
    for name, given, allowed in (("precision", args.precisions, ("tf32", "bf16")),
                                 ("execution", args.executions, ("eager", "compiled"))):
        unknown = sorted(set(given.split(",")) - set(allowed))
        if unknown:
            p.error("unknown {}(s) {}: choose from {}".format(name, ", ".join(unknown),
                                                            ", ".join(allowed)))
    for name in ("warmup", "steps", "repeats"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            p.error("--{} must be at least {}".format(name, 0 if name == "warmup" else 1))
    device = "cuda:0" if args.device == "cuda" else args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --tiny to check the script", file=sys.stderr)
        return 2
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    elif device == "cpu":
        torch.set_num_threads(1)  # a check, not a measurement: two threads wait on each other
    else:
        p.error("--device must be cuda, cuda:N or cpu, not {!r}".format(args.device))
    canvas = args.canvas
    if canvas not in ("padded", "config"):
        try:
            canvas = tuple(int(v) for v in args.canvas.split(","))
        except ValueError:
            canvas = ()
        if len(canvas) != 2:
            p.error("--canvas takes H,W, e.g. 608,1024; got {!r}".format(args.canvas))
    results = {"command": " ".join(["benchmarks/gpu_faster_rcnn.py"] + sys.argv[1:]),
               "environment": environment() if device.startswith("cuda") else host_environment(),
               "cells": []}
    began = time.perf_counter()
    for execution in args.executions.split(","):
        for precision in args.precisions.split(","):
            try:
                cell = run_cell(precision, execution == "compiled", device, args.warmup,
                                args.steps, args.repeats, args.tiny,
                                args.torchvision_input == "canvas", canvas,
                                args.frozen_bn == "calibrated", args.learning_rate)
            except Exception as e:  # a failed cell is recorded, the others still run
                traceback.print_exc()
                cell = {"model": MODEL, "precision": precision, "execution": execution,
                        "error": "{}: {}".format(type(e).__name__, e)}
                print(cell, flush=True)
            else:
                print(summary(cell), flush=True)
            results["cells"].append(cell)
            results["seconds"] = time.perf_counter() - began
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
    print("{} cell(s) in {:.0f}s, written to {}".format(len(results["cells"]),
                                                      results["seconds"], args.out))
    return 1 if any("error" in c for c in results["cells"]) else 0


if __name__ == "__main__":
    sys.exit(main())
