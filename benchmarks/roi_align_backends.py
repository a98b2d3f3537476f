"""The spec's roi_align on TensorFlow and MXNet, the sparse product each backend runs against
the gather form (every tap gathered, weighted and summed), forward and backward on the CPU at
Faster R-CNN C4's size: layer3 features (1024, 38, 50) of one 600 x 800 image, 128 RoIs,
14 x 14 bins with 2 x 2 samples (docs/detection.md, "RoIAlign on each backend").

    .venv/bin/python -m benchmarks.roi_align_backends --out benchmarks/results/roi_align_cpu.json

Each (framework, form) runs in a process of its own, so its peak resident memory is its own:
``peak_extra_mb`` is the growth of the process's peak RSS over the run (inputs built, before
the first call). Times are the median of ``--repeats`` forward + backward passes after one
warm-up (which traces or hybridizes). The gathered taps alone are R x 14 x 14 x 16 x C floats.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FORMS = {"tensorflow": ("sparse", "gathered", "gathered_xla"), "mxnet": ("sparse", "gathered")}
HW, SIZE, SR, STRIDE = (38, 50), (14, 14), 2, 16


def inputs(rois, channels):
    """(features (1, C, H, W), indices, weights (1, R, S, 4)) from random RoIs on 600 x 800."""
    import numpy as np

    from tbdzoo.models.faster_rcnn.detection.roi_align import roi_align_points
    rng = np.random.RandomState(0)
    x1, y1 = rng.uniform(0, 700, rois), rng.uniform(0, 500, rois)
    boxes = np.stack([x1, y1, x1 + rng.uniform(16, 800 - x1), y1 + rng.uniform(16, 600 - y1)], 1)
    indices, weights = roi_align_points(boxes, HW, 1.0 / STRIDE, SIZE, SR, True)
    features = rng.standard_normal((1, channels) + HW).astype(np.float32)
    upstream = rng.standard_normal((1, rois, channels) + SIZE).astype(np.float32)
    return features, indices[None], weights[None], upstream


def tensorflow_step(form, features, indices, weights, upstream):
    import tensorflow as tf

    from tbdzoo.backends.tensorflow import ops
    attrs = {"output_size": SIZE, "sampling_ratio": SR}
    op = ops._roi_align_gathered if form.startswith("gathered") else ops.roi_align
    x = tf.Variable(features.transpose(0, 2, 3, 1))
    idx, w, up = tf.constant(indices), tf.constant(weights), tf.constant(upstream)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(op(x, idx, w, attrs) * up)
        return tape.gradient(loss, x)

    fn = tf.function(step, jit_compile=form == "gathered_xla", autograph=False)
    return lambda: fn().numpy()


def mxnet_step(form, features, indices, weights, upstream):
    from tbdzoo.backends.mxnet import framework as _  # noqa: F401  (NumPy shim before mxnet)
    # isort: split
    import mxnet as mx

    from tbdzoo.backends.mxnet import ops
    attrs = {"output_size": SIZE, "sampling_ratio": SR}
    ctx = ops.GraphContext({}, False)
    ctx.in_shapes = [features.shape[1:], indices.shape[1:], weights.shape[1:]]
    op = ops.roi_align if form == "gathered" else ops.roi_align_sparse

    class Block(mx.gluon.HybridBlock):
        def hybrid_forward(self, F, x, i, w, u):
            return F.sum(op(F, [x, i, w], {}, attrs, ctx) * u)

    block = Block()
    block.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.array(features)
    x.attach_grad()
    idx, w, up = mx.nd.array(indices), mx.nd.array(weights), mx.nd.array(upstream)

    def step():
        with mx.autograd.record():
            loss = block(x, idx, w, up)
        loss.backward()
        return x.grad.asnumpy()

    return step


def measure(framework, form, rois, channels, repeats):
    """One (framework, form) in this process: times and peak memory growth."""
    features, indices, weights, upstream = inputs(rois, channels)
    make = tensorflow_step if framework == "tensorflow" else mxnet_step
    step = make(form, features, indices, weights, upstream)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        grad = step()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"framework": framework, "form": form, "median_ms": round(1000 * statistics.median(
        times[1:]), 1), "first_ms": round(1000 * times[0], 1),
        "peak_extra_mb": round((peak - before) / 1024.0, 1),
        "grad_checksum": float(abs(grad).sum())}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rois", type=int, default=128)
    p.add_argument("--channels", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--frameworks", default="tensorflow,mxnet")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--one", help=argparse.SUPPRESS)  # framework:form, run in this process
    args = p.parse_args()
    if args.one:
        framework, form = args.one.split(":")
        print(json.dumps(measure(framework, form, args.rois, args.channels, args.repeats)))
        return
    rows = []
    for framework in args.frameworks.split(","):
        for form in FORMS[framework]:
            proc = subprocess.run(
                [sys.executable, "-m", "benchmarks.roi_align_backends", "--one",
                 framework + ":" + form,
                 "--rois", str(args.rois), "--channels", str(args.channels),
                 "--repeats", str(args.repeats)], capture_output=True, text=True, cwd=ROOT)
            if proc.returncode != 0:
                raise SystemExit("{}:{} failed:\n{}".format(framework, form, proc.stderr[-3000:]))
            rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(json.dumps(rows[-1]), flush=True)
    sums = {}
    for row in rows:  # every form must give the same gradient
        sums.setdefault(row["framework"], []).append(row.pop("grad_checksum"))
    for framework, values in sums.items():
        assert max(values) - min(values) <= 1e-3 * max(values), (framework, values)
    result = {"rois": args.rois, "channels": args.channels, "feature_hw": list(HW),
              "output_size": list(SIZE), "sampling_ratio": SR, "device": "cpu",
              "cpu_count": os.cpu_count(), "load_average": [round(v, 2) for v in os.getloadavg()],
              "gathered_taps_mb": round(args.rois * SIZE[0] * SIZE[1] * SR * SR * 4 *
                                        args.channels * 4 / 2 ** 20, 1),
              "command": "python -m benchmarks.roi_align_backends " + " ".join(sys.argv[1:]),
              "results": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
