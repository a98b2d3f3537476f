"""What one Faster R-CNN training step keeps for its backward pass, tbdzoo against torchvision's
FasterRCNN, on the CPU: the bytes of every distinct storage that autograd saves during the
forward pass (``torch.autograd.graph.saved_tensors_hooks``), by shape.

    .venv/bin/python -m benchmarks.faster_rcnn_saved_tensors                    # paper config
    .venv/bin/python -m benchmarks.faster_rcnn_saved_tensors --frozen-bn initial

Both sides are set up as ``benchmarks/gpu_faster_rcnn.py`` sets them up (the same 600 x 1,000
image, tbdzoo's canvas 608 x 1,024 as torchvision pads it, frozen batch norm calibrated on the
image unless ``--frozen-bn initial``), so the feature maps a GPU run's peak memory holds can
be compared without a GPU: saved tensors are what a step's peak is made of, beside the
weights, gradients and momentum that both hold alike.
"""
import argparse
import collections
import os

HERE = os.path.dirname(os.path.abspath(__file__))

import torch

from benchmarks import gpu_faster_rcnn as bench


def saved_bytes(step):
    """(total bytes, Counter of bytes by (shape, dtype)) over the distinct storages saved."""
    seen, by_shape = set(), collections.Counter()

    def count(tensor, shape):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            by_shape[(shape, str(tensor.dtype).replace("torch.", ""))] += storage.nbytes()

    def pack(tensor):
        shape = tuple(tensor.shape)
        if tensor.is_sparse:   # RoIAlign's mixing matrix: its indices and values
            count(tensor._indices(), shape)
            count(tensor._values(), shape)
        else:
            count(tensor, shape)
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        step()
    return sum(by_shape.values()), by_shape


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frozen-bn", choices=("calibrated", "initial"), default="calibrated")
    p.add_argument("--top", type=int, default=8, help="shapes listed per side")
    args = p.parse_args()
    import tbdzoo
    from tbdzoo.models import get_model
    config = get_model(bench.MODEL).configs["paper"]
    model = tbdzoo.build(bench.MODEL, backend="torch", config="paper", device="cpu",
                         precision="fp32", memory_format="channels_last",
                         canvas=bench.padded_canvas(config))
    hp = model.hparams
    batch = bench.benchmark_batch(hp, config["canvas"])
    prepared = model.prepare_batch(batch)
    weights = model.get_weights()
    if args.frozen_bn == "calibrated":
        weights, _ = bench.calibrate_frozen_batchnorm(hp, weights, batch, "cpu")
        model.set_weights(weights)
    _, _, theirs, _, rois = bench.torchvision_step(hp, weights, batch, "cpu", "tf32", False,
                                                   False)
    for name, step in (("tbdzoo", lambda: model.train_step(prepared)), ("torchvision", theirs)):
        total, by_shape = saved_bytes(step)
        heads = hp["rois_per_image"] if name == "tbdzoo" else rois[-1]
        print("{}: {:.1f} MB saved for backward; its box head ran on {} RoIs".format(
            name, total / 1e6, heads))
        for (shape, dtype), size in by_shape.most_common(args.top):
            print("    {:<24} {:<8} {:8.1f} MB".format(str(shape), dtype, size / 1e6))


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
