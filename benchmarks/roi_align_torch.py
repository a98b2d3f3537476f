"""The spec's roi_align on PyTorch (a sparse bilinear mixing matrix times the feature rows),
the same by gathering every tap first (index_select), and torchvision's fused RoIAlign kernel,
forward and backward, at Faster R-CNN C4's size: layer3 features (1024, 38, 50) of one
600 x 800 image, 14 x 14 bins with 2 x 2 samples.

    .venv/bin/python -m benchmarks.roi_align_torch --rois 64
    python3 -m benchmarks.roi_align_torch --rois 128 --device cuda   # on a GPU

Gathering every tap (R x 14 x 14 x 4 x 4 rows of C floats) before averaging moves sr^2 x 4 =
16 times the output's memory; the numbers say what that costs.
"""
import argparse
import json
import statistics
import time


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rois", type=int, default=64)
    p.add_argument("--channels", type=int, default=1024)
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    import numpy as np
    import torch
    import torchvision

    from tbdzoo.backends.torch import ops
    from tbdzoo.reference import bilinear_taps

    h, w, size, sr = 38, 50, (14, 14), 2
    rng = np.random.RandomState(0)
    x0, y0 = rng.uniform(0, w - 4, args.rois), rng.uniform(0, h - 4, args.rois)
    boxes = np.stack([x0, y0, x0 + rng.uniform(2, w - x0), y0 + rng.uniform(2, h - y0)], 1)
    taps = [bilinear_taps(b, size, sr, h, w) for b in boxes]
    device = torch.device(args.device)
    indices = torch.from_numpy(np.stack([t[0] for t in taps])[None]).to(device)
    weights = torch.from_numpy(np.stack([t[1] for t in taps])[None]).to(device)
    features = torch.randn(1, args.channels, h, w, device=device, requires_grad=True)
    rois = [torch.from_numpy(boxes.astype(np.float32)).to(device)]
    attrs = {"output_size": size, "sampling_ratio": sr}

    def spec():
        return ops.roi_align([features, indices, weights], {}, attrs, True)

    def gathered():
        rows = features.permute(0, 2, 3, 1).reshape(-1, args.channels)
        picked = torch.index_select(rows, 0, indices.long().reshape(-1)) * weights.reshape(-1, 1)
        return picked.view(1, args.rois, 14, 14, 16, args.channels).sum(4).div(4.0).permute(
            0, 1, 4, 2, 3)

    def fused():
        return torchvision.ops.roi_align(features, rois, size, 1.0, sr, aligned=True)[None]

    np.testing.assert_allclose(spec().detach().cpu().numpy(), fused().detach().cpu().numpy(),
                               atol=1e-4)
    out = {}
    np.testing.assert_allclose(gathered().detach().cpu().numpy(),
                               fused().detach().cpu().numpy(), atol=1e-4)
    for name, fn in (("spec_sparse_mm", spec), ("gather_every_tap", gathered),
                     ("torchvision", fused)):
        times = []
        for _ in range(args.repeats + 1):
            features.grad = None
            start = time.perf_counter()
            fn().sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        out[name + "_ms"] = round(1000 * statistics.median(times[1:]), 2)
    out.update(rois=args.rois, channels=args.channels, device=args.device,
               gathered_taps_mb=round(args.rois * 14 * 14 * 16 * args.channels * 4 / 2 ** 20, 1))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
