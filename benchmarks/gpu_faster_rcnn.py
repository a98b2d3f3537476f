"""tbdzoo's Faster R-CNN training step on the PyTorch backend against torchvision's FasterRCNN,
on one GPU.

    python3 -m benchmarks.gpu_faster_rcnn --profile --out benchmarks/results/h200_faster_rcnn.json
    python3 -m benchmarks.gpu_faster_rcnn --executions compiled --precisions bf16
    python3 -m benchmarks.gpu_faster_rcnn --canvas config               # tbdzoo on 1,000 x 1,000
    python3 -m benchmarks.gpu_faster_rcnn --device cpu --tiny --executions eager --precisions tf32 \\
        --steps 1 --rounds 2 --processes 1 --warmup 1 --out /tmp/check.json   # a check that it runs

Run from the repository root. tbdzoo's side is ``tbdzoo.build("faster_rcnn", backend="torch",
config="paper")``: ResNet-101 C4, one image per step, every step running its targets step inside
the update's forward pass (anchor targets, proposals 12,000 -> NMS 0.7 -> 2,000, 128 RoIs and
RoIAlign's gather points; on a GPU the NMS and the gather points run there, docs/detection.md).

torchvision's side is ``FasterRCNN`` assembled the same way (tbdzoo/backends/torch/
torchvision_reference.py: the resnet101 trunk, conv1 .. layer3 as the backbone, ``RPNHead``,
layer4 + average pooling as the box head, ``FastRCNNPredictor``, frozen batch norm) with
tbdzoo's hyperparameters where its API takes them (RPN batch 256, half positive, IoU 0.7 /
0.3, pre / post NMS 12,000 / 2,000, NMS 0.7, 128 RoIs at most 25% foreground at IoU 0.5,
RoIAlign 14 x 14 with 2 x 2 samples; that module lists what differs), trained as its users
train it: a list of image tensors at their own size and a list of target dicts into
``model(images, targets)``, the sum of the four losses it returns, ``clip_grad_value_(5)``
(tbdzoo's element-wise clip, foreach) and SGD (momentum 0.9, weight decay 5e-4; fused on a
GPU). Its sampling and NMS run on the device. It is built twice, plain NCHW
(``torchvision_nchw``) and channels-last (``torchvision_channels_last``): both are timed and the
faster is THE baseline of the cell.

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
  layer4's convolutions anew for each new count: steps that time the autotuner, not the
  model. Each cell records the RoIs each side's head ran on (``details``).

Both run with cuDNN's autotuner and the TF32 flags on, under the same precision: tf32, or bf16
autocast for the whole forward pass (master weights fp32), as tbdzoo's precision option does;
tbdzoo channels-last. ``compiled`` builds tbdzoo with ``execution="compiled"`` and wraps
torchvision's model in ``torch.compile`` (its sampling and NMS break the graph).

The first losses differ a little (the two draw different anchors and RoIs, and differ in the
points that torchvision_reference.py lists); they are recorded with their relative difference.

The repeat protocol is benchmarks/harness.py's: ``--processes`` fresh processes per execution
mode, each seeding PyTorch's generators with 0 (torchvision's samplers draw from them),
building both sides, one step each (first losses), one for peak memory (less what the other
contenders hold), ``--warmup`` steps, then ``--rounds`` interleaved rounds of ``--steps``
steps; ``--profile`` adds a torch.profiler summary per contender in the last process, and
``--attribute`` what is live at each contender's peak memory by allocation site. On a CPU
(``--device cpu --tiny``, a check that the script runs) tf32 means fp32, PyTorch runs one
thread and no memory is measured.
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(HERE) not in sys.path:  # also imported as a module of benchmarks/ by path
    sys.path.insert(0, os.path.dirname(HERE))

import numpy as np
import torch

from benchmarks import harness
from benchmarks.gpu_recurrent import first_loss

MODEL = "faster_rcnn"
OBJECTS = 3             # objects in the image (a VOC image holds 2.5 on average)
IMAGE_HEIGHT = 0.6      # of the canvas: 600 of 1,000, the short side the paper resizes to
TIMING = (3, 5)         # warm-up steps, steps per round
LAYOUTS = {"torchvision_nchw": False, "torchvision_channels_last": True}
STILL_LR = 1e-12        # > 0, as tbdzoo's hyperparameters require; the weights do not move


# -- the shared input -----------------------------------------------------------------------------
def image_hw(config_canvas):
    """The benchmark image's (height, width): IMAGE_HEIGHT of the config's canvas height and
    its whole width."""
    return int(round(config_canvas[0] * IMAGE_HEIGHT)), config_canvas[1]


def benchmark_batch(hp, config_canvas, seed=0):
    """One image of IMAGE_HEIGHT of the config's canvas height and its whole width, OBJECTS
    rectangles of distinct colours, on the model's canvas (tbdzoo's batch layout,
    docs/models/faster_rcnn.md)."""
    from tbdzoo.datasets.detection_batch import empty_batch, normalize, put_example, synthetic_image
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
    """torchvision's FasterRCNN (tbdzoo/backends/torch/torchvision_reference.py) holding ``weights``,
    its transform sized to leave ``image`` (3, h, w) unresized, on ``device``."""
    from tbdzoo.backends.torch import torchvision_reference
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
def torchvision_step(hp, weights, batch, device, precision, compiled, whole_canvas, channels_last=True):
    """torchvision's FasterRCNN from tbdzoo's weights and its training step, which returns its
    four losses (detached)."""
    images, targets = torchvision_inputs(batch, whole_canvas, device)
    h, w = images[0].shape[1:]
    net = torchvision_model(hp, weights, images[0], device)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    net.train()
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=hp["lr"], momentum=hp["momentum"],
                          weight_decay=hp["weight_decay"], nesterov=hp["nesterov"],
                          **({"fused": True} if device.startswith("cuda") else {"foreach": True}))
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
def environment():
    """The GPU machine's environment (benchmarks/faster_rcnn_step_phases.py records it too)."""
    return harness.environment("cuda:0")


def padded_canvas(hp):
    """The benchmark image's sides rounded up to a multiple of 32, what torchvision's transform
    pads it to: tbdzoo's canvas for the same pixels on both sides."""
    h, w = image_hw(hp["canvas"])
    return (-(-h // 32) * 32, -(-w // 32) * 32)


def run_cell(model_name, precision, compiled, device, args):
    import tbdzoo
    from tbdzoo.models import get_model
    cuda = device.startswith("cuda")
    # the flags tbdzoo's precision option sets for its own steps, here for torchvision's too
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)  # torchvision's samplers draw from PyTorch's generators
    start = time.perf_counter()
    if compiled:  # each cell compiles from scratch
        torch._dynamo.reset()
    execution = "compiled" if compiled else "eager"
    config = get_model(MODEL).configs["tiny" if args.tiny else "paper"]
    overrides = {"lr": args.learning_rate}
    if args.canvas == "padded":
        overrides["canvas"] = padded_canvas(config)
    elif args.canvas != "config":
        overrides["canvas"] = tuple(int(v) for v in args.canvas.split(","))
    model = tbdzoo.build(MODEL, backend="torch", config="tiny" if args.tiny else "paper", device=device,
                         precision=precision if cuda or precision != "tf32" else "fp32",
                         execution=execution, memory_format="channels_last", **overrides)
    hp = model.hparams
    batch = benchmark_batch(hp, config["canvas"])
    prepared = model.prepare_batch(batch)
    weights, calibrated = model.get_weights(), 0
    if args.frozen_bn == "calibrated":
        weights, calibrated = calibrate_frozen_batchnorm(hp, weights, batch, device)
        model.set_weights(weights)
    whole = args.torchvision_input == "canvas"
    sides = {name: torchvision_step(hp, weights, batch, device, precision, compiled, whole, cl)
             for name, cl in LAYOUTS.items()}
    contenders = {"tbdzoo": lambda: model.train_step(prepared, sync=False)}
    contenders.update({name: side[2] for name, side in sides.items()})
    held = {"tbdzoo": lambda: harness.held_bytes([model.native], model.torch_optimizers)}
    held.update({name: (lambda side=side: harness.held_bytes([side[0]], [side[1]])) for name, side in sides.items()})
    their_losses = {name: {k: float(v) for k, v in side[2]().items()} for name, side in sides.items()}
    first = {"tbdzoo": first_loss(model.train_step(prepared))}
    first.update({name: sum(losses.values()) for name, losses in their_losses.items()})
    checks = {"first_loss_rel_diff": {name: abs(first["tbdzoo"] - first[name]) / max(abs(first[name]), 1e-12)
                                      for name in sides}}
    peaks = harness.peak_memory(contenders, held, device)
    at_peak = None
    if args.attribute and cuda:
        from benchmarks.gpu_handwritten import peak_sites
        at_peak = {name: peak_sites(step, device) for name, step in contenders.items()}
    times = harness.warm_and_time(contenders, device, args.warmup, args.steps, args.rounds)
    rois = {"tbdzoo": hp["rois_per_image"]}  # tbdzoo's head always runs on rois_per_image
    rois.update({name: [min(side[4]), max(side[4])] for name, side in sides.items()})
    details = {"canvas": list(hp["canvas"]), "image_hw": [int(v) for v in batch["image_hw"][0]],
               "objects": int(batch["gt_count"][0]), "torchvision_input": args.torchvision_input,
               "torchvision_image_hw": list(sides["torchvision_nchw"][3]), "learning_rate": hp["lr"],
               "frozen_batchnorm": "calibrated on the image ({} layers)".format(calibrated)
               if calibrated else "initial statistics (mean 0, variance 1)",
               "rois_per_step": rois, "torchvision_first_losses": their_losses}
    if at_peak:
        details["at_peak"] = at_peak
    cell = harness.cell_record(args, device, contenders, start, model, batch, MODEL, precision,
                               execution, times, peaks, first, checks, batch_size=1, details=details)
    return cell


def worker(args, device):
    if not device.startswith("cuda"):
        torch.set_num_threads(1)  # a check, not a measurement: two threads wait on each other
    return harness.run_cells(args, device, run_cell, describe=harness.first_losses, models=[MODEL])


def arguments(argv=None):
    p = harness.comparison_parser(__doc__, "gpu_faster_rcnn.json", warmup=TIMING[0], overrides={
        "--executions": {"default": "eager", "help": "eager and/or compiled"},
        "--warmup": {"help": "warm-up steps per side"},
        "--steps": {"default": TIMING[1]},
        "--tiny": {"help": "tiny config on both sides (a CPU check)"},
        "--batch-size": None})
    p.add_argument("--attribute", action="store_true",
                   help="what is live at each contender's peak memory, by allocation site (GPU)")
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
    harness.add_process_options(p, "gpu_faster_rcnn.json")
    args = p.parse_args(argv)
    harness.check_choices(p, args)
    if args.canvas not in ("padded", "config"):
        try:
            ok = len([int(v) for v in args.canvas.split(",")]) == 2
        except ValueError:
            ok = False
        if not ok:
            p.error("--canvas takes padded, config or H,W, e.g. 608,1024; got {!r}".format(args.canvas))
    if args.learning_rate <= 0:
        p.error("--learning-rate {}: tbdzoo's hyperparameters take a rate above 0 (1e-12 keeps "
                "the weights still)".format(args.learning_rate))
    return p, args


def main(argv=None):
    return harness.main("benchmarks.gpu_faster_rcnn", arguments, worker, argv)


if __name__ == "__main__":
    sys.exit(main())
