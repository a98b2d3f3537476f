"""Faster R-CNN (tbdzoo/models/faster_rcnn/, docs/models/faster_rcnn.md): the paper network's parameters
against torchvision's FasterRCNN assembled from resnet101, the program and its targets step,
and on PyTorch, TensorFlow, MXNet and CNTK: native objects, weights through the canonical .npz,
the four losses, the gradients, three steps and the detections of ``predict`` against the
PyTorch reference on the tiny config, and the refusals of a bad batch."""
from collections import OrderedDict

import numpy as np
import pytest

import tbdzoo
from conftest import require_backend
from tbdzoo import consistency
from tbdzoo.backends.registry import build, build_native
from tbdzoo.errors import BatchError, HyperparameterError
from tbdzoo.models import faster_rcnn
from tbdzoo.models.faster_rcnn.detection import anchors as anchor_grid
from tbdzoo.models.faster_rcnn.detection.targets import anchor_targets
from tbdzoo.spec.targets import seeded_rng

NAME = "faster_rcnn"
LOSSES = ("rpn_objectness", "rpn_box", "head_class", "head_box")


def _graph(config, **overrides):
    md = tbdzoo.get_model(NAME)
    hp = md.hparams(config, **overrides)
    return md, hp, md.build_graph(hp)


# -- the network -------------------------------------------------------------------------------
def test_paper_network_has_torchvisions_52094294_convolution_and_linear_parameters():
    _, hp, g = _graph("paper")
    trainable = OrderedDict((n, p.shape) for n, p in g.params().items() if p.trainable)
    assert sum(int(np.prod(s)) for s in trainable.values()) == 52094294
    assert g.trainable_count() == 52094294
    frozen = [n for n, p in g.params().items() if not p.trainable]
    assert all(g.nodes[g.params()[n].owner].op == "frozen_batchnorm" for n in frozen)
    assert g.shape_of("backbone.layer3.22.relu") == (1024, 63, 63)   # stride 16 on 1000 x 1000
    assert g.shape_of("roi_heads.box_head.layer4.2.relu") == (2048, 7, 7)
    assert g.shape_of(faster_rcnn.RPN_LOGITS) == (9, 63, 63)
    assert g.shape_of(faster_rcnn.BOX_DELTAS) == (84,)

    torch = pytest.importorskip("torch")
    torchvision_reference = _torchvision_reference()
    from torchvision.models import resnet101
    from torchvision.ops import FrozenBatchNorm2d
    nn = torch.nn
    theirs = torchvision_reference.faster_rcnn(hp)
    weights = OrderedDict(
        (module + "." + p, tuple(t.shape)) for module, m in theirs.named_modules()
        if isinstance(m, (nn.Conv2d, nn.Linear)) for p, t in m.named_parameters(recurse=False))
    assert sum(int(np.prod(s)) for s in weights.values()) == 52094294
    assert trainable == weights   # the same names, shapes and order
    # the trunk built from torchvision's Bottleneck is resnet101's, buffers included
    trunk, _, _ = torchvision_reference.resnet_trunk(hp)
    ours = OrderedDict((k, tuple(t.shape)) for k, t in nn.Sequential(trunk).state_dict().items())
    net = resnet101(weights=None, norm_layer=FrozenBatchNorm2d)
    resnet = OrderedDict((k, tuple(t.shape)) for k, t in net.state_dict().items()
                         if not k.startswith("fc."))
    assert ours == resnet


def _torchvision_reference():
    try:
        from tbdzoo.backends.torch import torchvision_reference
    except Exception as e:  # noqa: BLE001  (torchvision missing or built for another torch)
        pytest.skip("torchvision does not import: {}".format(e))
    return torchvision_reference


def test_torchvisions_model_takes_tbdzoos_weights_and_computes_the_same_outputs():
    """tbdzoo's weights loaded into torchvision's FasterRCNN (benchmarks/gpu_faster_rcnn.py
    trains it from them) give the same RPN outputs and, on the same RoIs, class scores."""
    require_backend("torch")
    import torch

    from tbdzoo.models.faster_rcnn.detection.roi_align import roi_align_points
    torchvision_reference = _torchvision_reference()
    model = build_native(NAME, "torch", config="tiny", seed=0)
    hp = model.hparams
    theirs = torchvision_reference.load_weights(
        torchvision_reference.faster_rcnn(hp), model.get_weights()).eval()
    images = model.synthetic_batch(seed=0)["images"][:1]
    rng = np.random.RandomState(1)
    corners = rng.uniform(0, 40, (hp["rois_per_image"], 2))
    rois = np.concatenate([corners, corners + rng.uniform(4, 24, corners.shape)], 1)
    indices, taps = roi_align_points(rois, faster_rcnn.feature_hw(model.spec),
                                     1.0 / hp["feature_stride"], hp["roi_size"],
                                     hp["roi_sampling_ratio"], hp["roi_aligned"])
    names = [faster_rcnn.RPN_LOGITS, faster_rcnn.RPN_DELTAS, faster_rcnn.CLASS_LOGITS]
    ours = model.values({"images": images, "roi_indices": indices[None],
                         "roi_weights": taps[None]}, names)
    with torch.no_grad():
        features = theirs.backbone(torch.from_numpy(images))
        logits, deltas = theirs.rpn.head([features])
        pooled = theirs.roi_heads.box_roi_pool({"0": features}, [torch.from_numpy(rois).float()],
                                               [images.shape[2:]])
        classes, _ = theirs.roi_heads.box_predictor(theirs.roi_heads.box_head(pooled))
    np.testing.assert_allclose(logits[0].numpy(), ours[names[0]], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(deltas[0].numpy(), ours[names[1]], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(classes.numpy(), ours[names[2]].reshape(classes.shape),
                               rtol=1e-4, atol=1e-5)


def test_tiny_program_reads_four_losses_and_the_targets_step_writes_every_target():
    _, hp, g = _graph("tiny")
    p = g.program
    assert list(p.losses) == list(LOSSES)
    assert p.losses["rpn_box"]["attrs"]["sigma"] == 3.0
    assert p.losses["rpn_box"]["attrs"]["normalizer"] == 16.0          # rpn_batch
    assert p.losses["head_box"]["attrs"]["sigma"] == 1.0
    assert p.losses["head_class"]["attrs"]["ignore_index"] == -1
    assert p.objectives["total"] == [[name, 1.0] for name in LOSSES] or \
        [tuple(t) for t in p.objectives["total"]] == [(name, 1.0) for name in LOSSES]
    assert p.groups["all"]["clip"] == {"kind": "value", "value": 5.0}
    assert p.targets_step["function"] == "faster_rcnn.targets"
    assert p.written_inputs() == list(faster_rcnn.WRITTEN)
    assert g.trainable_count() < 100000 and hp["canvas"] == (64, 64)
    paper = tbdzoo.get_model(NAME).hparams("paper")
    assert paper["lr"] == 1e-3 and paper["weight_decay"] == 5e-4 and paper["momentum"] == 0.9
    assert paper["lr_milestones"] == (7,) and paper["epochs"] == 10 and paper["batch_size"] == 1


@pytest.mark.parametrize("overrides,message", [
    ({"canvas": (64, 64, 64)}, "canvas must be .height, width."),
    ({"blocks": (1, 1, 1)}, "blocks must count the bottlenecks of layer1 to layer4"),
    ({"rpn_negative_iou": 0.8}, "rpn_negative_iou 0.8 is above rpn_positive_iou 0.7"),
    ({"bg_iou_low": 0.5}, "bg_iou_low 0.5 must be below fg_iou 0.5"),
    ({"anchor_ratios": (0.0, 1.0)}, "anchor_ratios"),
    ({"roi_sampling_ratio": 0}, "roi_sampling_ratio"),
])
def test_bad_hyperparameters_are_refused_by_name(overrides, message):
    with pytest.raises(HyperparameterError, match=message):
        tbdzoo.get_model(NAME).hparams("tiny", **overrides)


def test_the_targets_step_is_the_numpy_reference_in_the_rpns_layout():
    md, hp, _g = _graph("tiny")
    batch = md.synthetic_batch(hp, 2, seed=3)
    rng = np.random.RandomState(0)
    values = {faster_rcnn.RPN_LOGITS: rng.standard_normal((2, 6, 4, 4)).astype(np.float32),
              faster_rcnn.RPN_DELTAS: 0.1 * rng.standard_normal((2, 24, 4, 4)).astype(np.float32)}
    from tbdzoo.spec.targets import StepRandomState
    out = faster_rcnn.targets(values, {k: batch[k] for k in faster_rcnn.GT_INPUTS}, hp,
                              StepRandomState(5, 2, "targets/sample"))
    assert {k: v.shape for k, v in out.items()} == {
        "rpn_labels": (2, 6, 4, 4), "rpn_label_weights": (2, 6, 4, 4),
        "rpn_box_targets": (2, 24, 4, 4), "rpn_box_weights": (2, 24, 4, 4),
        "roi_indices": (2, 8, 64, 4), "roi_weights": (2, 8, 64, 4), "roi_labels": (2, 8),
        "roi_box_targets": (2, 8, 16), "roi_box_weights": (2, 8, 16)}
    grid = anchor_grid.anchors(4, 4, 16, (16, 32), (0.5, 1.0, 2.0))
    for i in range(2):
        n = batch["gt_count"][i]
        labels, targets, _ = anchor_targets(grid, batch["gt_boxes"][i][:n], batch["image_hw"][i],
                                            seeded_rng(5, 2, "anchor_targets", i), batch_size=16)
        # anchor (y, x, a) is row (y * 4 + x) * 6 + a, channel a (and 4a .. 4a + 3) of the maps
        np.testing.assert_array_equal(out["rpn_labels"][i].transpose(1, 2, 0).ravel(),
                                      (labels == 1).astype(np.float32))
        np.testing.assert_array_equal(out["rpn_label_weights"][i].transpose(1, 2, 0).ravel(),
                                      (labels >= 0).astype(np.float32))
        np.testing.assert_array_equal(
            out["rpn_box_targets"][i].reshape(6, 4, 4, 4).transpose(2, 3, 0, 1).reshape(-1, 4),
            targets)
        assert out["rpn_label_weights"][i].sum() <= 16
        labelled = out["roi_labels"][i]
        assert ((labelled >= -1) & (labelled < 4)).all() and (labelled >= 1).sum() <= 2
        fg = labelled >= 1
        assert (out["roi_box_weights"][i][fg].sum(axis=1) == 4).all()
        assert not out["roi_box_weights"][i][~fg].any()


def test_the_targets_step_makes_every_anchor_target_before_it_reads_the_rpn(monkeypatch):
    """The RPN's targets read only the inputs: the step makes them all before it first reads
    a value, so on a GPU the host works while the device still computes the RPN (HostValues
    fetches a value when first read), and gives what it gives on plain arrays."""
    from tbdzoo.spec.targets import HostValues, StepRandomState
    md, hp, _g = _graph("tiny")
    batch = md.synthetic_batch(hp, 2, seed=3)
    rng = np.random.RandomState(0)
    arrays = {faster_rcnn.RPN_LOGITS: rng.standard_normal((2, 6, 4, 4)).astype(np.float32),
              faster_rcnn.RPN_DELTAS: 0.1 * rng.standard_normal((2, 24, 4, 4)).astype(np.float32)}
    inputs = {k: batch[k] for k in faster_rcnn.GT_INPUTS}
    plain = faster_rcnn.targets(arrays, inputs, hp, StepRandomState(5, 2, "targets/sample"))
    events = []
    make = faster_rcnn.rpn_targets
    monkeypatch.setattr(faster_rcnn, "rpn_targets",
                        lambda *a: events.append("rpn targets") or make(*a))
    lazy = HostValues(((n, (lambda n=n, v=v: events.append("read " + n) or v))
                       for n, v in arrays.items()), ((n, v.shape) for n, v in arrays.items()))
    out = faster_rcnn.targets(lazy, inputs, hp, StepRandomState(5, 2, "targets/sample"))
    assert events[:3] == ["rpn targets", "rpn targets", "read " + faster_rcnn.RPN_LOGITS]
    assert sorted(events[2:]) == sorted("read " + n for n in arrays)  # each fetched once
    for name in plain:
        np.testing.assert_array_equal(out[name], plain[name])


# -- bad input ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def torch_model():
    require_backend("torch")
    model = build_native(NAME, "torch", config="tiny", seed=0)
    yield model
    model.close()


def test_torch_runs_the_targets_step_inside_its_forward_pass_and_trains_the_same():
    """Eager PyTorch computes the backbone and the RPN once per step, with gradients, hands the
    targets step their host copies and continues from them; the steps equal those taken after
    a separate inference pass (what every other backend runs)."""
    require_backend("torch")
    fused = build_native(NAME, "torch", config="tiny", seed=0)
    separate = build_native(NAME, "torch", config="tiny", seed=0)
    try:
        assert set(fused._frontier) == {faster_rcnn.RPN_LOGITS, faster_rcnn.RPN_DELTAS,
                                        "backbone.layer3.0.relu"}
        separate._frontier = None
        passes = []
        values = fused.native.values
        fused.native.values = lambda inputs, outputs: passes.append(tuple(outputs)) or \
            values(inputs, outputs)
        batch = fused.synthetic_batch(seed=1)
        for step in range(3):
            a, b = fused.train_step(batch), separate.train_step(batch)
            assert abs(a - b) <= 1e-6 * abs(b), (step, a, b)
        assert len(passes) == 6 and passes[0] == fused._frontier  # half, then the objective
        for name, value in separate.get_weights().items():
            np.testing.assert_allclose(fused.get_weights()[name], value, rtol=1e-5, atol=1e-7,
                                       err_msg=name)
    finally:
        fused.close()
        separate.close()


def test_the_targets_step_writes_the_same_targets_with_pytorchs_kernels_lent():
    """What the PyTorch backend lends the targets step on a GPU, run here on the CPU."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from tbdzoo.backends.torch import nms as torch_nms
    from tbdzoo.backends.torch import proposals as torch_proposals
    from tbdzoo.backends.torch import roi_align as torch_roi_align
    from tbdzoo.models.faster_rcnn.detection import kernels
    model = build_native(NAME, "torch", config="tiny", seed=0)
    try:
        batch = model.synthetic_batch(seed=2)
        expected = model.step_targets(batch)
        device = torch.device("cpu")
        with kernels.lending(nms=torch_nms.host_kernel(device),
                             proposals=torch_proposals.host_kernel(device),
                             roi_align_points=torch_roi_align.host_kernel(device)):
            got = model.step_targets(batch)
    finally:
        model.close()
    assert set(got) == set(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_gather_points_a_lent_kernel_leaves_on_the_device_reach_roi_align_without_a_round_trip(
        monkeypatch):
    """The gather points PyTorch's kernel computes stay tensors (spec.targets.DeviceArray)
    from the kernel to RoIAlign: a step with the kernels lent (as on a GPU, here on the CPU)
    never copies them to the host, and trains as the NumPy reference's points do."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    from tbdzoo.backends.torch import model as torch_model_module
    from tbdzoo.backends.torch import nms as torch_nms
    from tbdzoo.backends.torch import proposals as torch_proposals
    from tbdzoo.backends.torch import roi_align as torch_roi_align
    from tbdzoo.models.faster_rcnn.detection import kernels
    device = torch.device("cpu")

    def lent_on_the_cpu(_):
        return kernels.lending(nms=torch_nms.host_kernel(device),
                               proposals=torch_proposals.host_kernel(device),
                               roi_align_points=torch_roi_align.host_kernel(device))

    def no_host_copy(self):
        raise AssertionError("a device value was copied to the host")
    lent = build_native(NAME, "torch", config="tiny", seed=0)
    reference = build_native(NAME, "torch", config="tiny", seed=0)
    try:
        batch = lent.synthetic_batch(seed=1)
        expected = [reference.train_step(batch) for _ in range(2)]
        monkeypatch.setattr(torch_model_module, "_device_kernels", lent_on_the_cpu)
        monkeypatch.setattr(torch_roi_align.TorchDeviceArray, "_host_copy", no_host_copy)
        got = [lent.train_step(batch) for _ in range(2)]
    finally:
        lent.close()
        reference.close()
    np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("edit,message", [
    (lambda b: b["gt_count"].__setitem__(1, 0), "example 1: an image without boxes"),
    (lambda b: b["gt_boxes"].__setitem__((0, 0, 2), 70.0),
     r"example 0 gt_boxes\[0\] = .* reaches outside the image"),
    (lambda b: b["gt_labels"].__setitem__((1, 0), 4), r"example 1 gt_labels.*outside|class"),
    (lambda b: b["gt_labels"].__setitem__((0, 0), 0), r"example 0 gt_labels.*outside|class"),
    (lambda b: b["image_hw"].__setitem__(0, (65, 64)), "outside the 64 x 64 canvas"),
    (lambda b: b["gt_count"].__setitem__(0, 4), r"gt_count 4 is outside \[0, 3\]"),
])
def test_a_bad_batch_is_refused_by_example_and_box(torch_model, edit, message):
    batch = {k: np.array(v) for k, v in torch_model.synthetic_batch(seed=0).items()}
    edit(batch)
    with pytest.raises(BatchError, match=message):
        torch_model.train_step(batch)


def test_empty_images_train_when_the_config_allows_them():
    require_backend("torch")
    model = build_native(NAME, "torch", config="tiny", seed=0, allow_empty_images=True)
    batch = model.synthetic_batch(seed=0)
    batch["gt_count"][1] = 0
    batch["gt_boxes"][1] = 0
    targets = model.step_targets(batch)
    assert not targets["rpn_labels"][1].any() and targets["rpn_label_weights"][1].sum() == 16
    assert not (targets["roi_labels"][1] > 0).any()
    assert np.isfinite(model.train_step(batch))


def test_a_bf16_step_runs_roi_align_in_float32():
    """Under bf16 autocast the sparse RoIAlign product stays float32 (autocast cast its rows to
    bf16 and its backward failed)."""
    require_backend("torch")
    model = build_native(NAME, "torch", config="tiny", seed=0, device="cpu", precision="bf16")
    batch = model.synthetic_batch(seed=0)
    assert all(np.isfinite(model.train_step(batch)) for _ in range(2))


def test_predict_needs_images_and_their_sizes_only(torch_model):
    batch = torch_model.synthetic_batch(seed=0)
    out = torch_model.predict({"images": batch["images"], "image_hw": batch["image_hw"]})
    assert list(out) == ["boxes", "scores", "labels", "counts"]
    assert out["boxes"].shape == (2, 10, 4) and out["labels"].dtype == np.int32
    for i in range(2):
        n = out["counts"][i]
        scores = out["scores"][i][:n]
        assert (np.diff(scores) <= 0).all() and (scores > 0.05).all()
        assert ((out["labels"][i][:n] >= 1) & (out["labels"][i][:n] <= 3)).all()
        h, w = batch["image_hw"][i]
        boxes = out["boxes"][i][:n]
        assert (boxes[:, 0] >= 0).all() and (boxes[:, 2] <= w).all() and (boxes[:, 3] <= h).all()
        assert not out["boxes"][i][n:].any() and not out["labels"][i][n:].any()
    with pytest.raises(BatchError, match="batch lacks .image_hw."):
        torch_model.predict({"images": batch["images"]})
    empty = dict(batch, gt_count=np.zeros(2, np.int32))   # ground truth plays no part
    np.testing.assert_array_equal(torch_model.predict(empty)["labels"], out["labels"])
    with pytest.raises(BatchError, match="outside the 64 x 64 canvas"):
        torch_model.predict(dict(batch, image_hw=np.array([[64, 64], [64, 80]], np.int32)))


def test_predict_runs_the_head_on_its_proposals_in_chunks_of_the_graphs_rois(torch_model):
    """20 evaluation proposals through a graph of 8 RoIs (chunks of 8, 8 and 4 padded) give the
    detections of a graph of 20 RoIs: the RoI count is a shape, not a parameter."""
    batch = torch_model.synthetic_batch(seed=0)
    found = []
    for rois in (8, 20):
        model = build_native(NAME, "torch", config="tiny", seed=0, test_post_nms=20,
                             rois_per_image=rois)
        model.set_weights(torch_model.get_weights())
        found.append(model.predict(batch))
    values = torch_model.values(batch, [faster_rcnn.RPN_LOGITS, faster_rcnn.RPN_DELTAS])
    from tbdzoo.models.faster_rcnn.detection.proposals import proposals
    boxes, _ = proposals(*faster_rcnn._rpn_per_anchor(values, 0, torch_model.hparams),
                         anchors=faster_rcnn._anchors(torch_model.spec, torch_model.hparams),
                         valid_hw=batch["image_hw"][0], pre_nms=60, post_nms=20, threshold=0.7,
                         min_size=1.0)
    assert len(boxes) > 16   # three chunks of 8
    np.testing.assert_array_equal(found[0]["labels"], found[1]["labels"])
    np.testing.assert_array_equal(found[0]["counts"], found[1]["counts"])
    np.testing.assert_allclose(found[0]["scores"], found[1]["scores"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(found[0]["boxes"], found[1]["boxes"], rtol=1e-5, atol=1e-4)


# -- every backend against the PyTorch reference -------------------------------------------------
def _native_type(backend):
    if backend == "torch":
        import torch
        return torch.nn.Module
    if backend == "tensorflow":
        import keras
        return keras.Model
    if backend == "mxnet":
        from mxnet import gluon
        return gluon.HybridBlock
    from tbdzoo.backends.remote import WorkerHandle
    return WorkerHandle


def _sigmoid_ce(logits, labels, weight):
    bce = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
    return (weight * bce).sum() / max(weight.sum(), 1.0)


def _smooth_l1(prediction, target, weight, sigma, normalizer):
    d = np.abs(prediction - target)
    s2 = sigma ** 2
    per = np.where(d < 1.0 / s2, 0.5 * s2 * d ** 2, d - 0.5 / s2)
    return (weight * per).sum() / (normalizer * len(prediction))


def _softmax_ce(logits, labels):
    kept = labels >= 0
    shifted = logits[kept] - logits[kept].max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -logp[np.arange(kept.sum()), labels[kept]].mean()


def four_losses(model, given):
    """The program's four losses (tbdzoo/spec/losses.py's reductions, in float64) of the
    backend's own forward values on ``given``."""
    hp = model.hparams
    v = OrderedDict((k, np.asarray(a, np.float64)) for k, a in model.values(given, [
        faster_rcnn.RPN_LOGITS, faster_rcnn.RPN_DELTAS, faster_rcnn.CLASS_LOGITS,
        faster_rcnn.BOX_DELTAS]).items())
    k = hp["num_classes"]
    return np.array([
        _sigmoid_ce(v[faster_rcnn.RPN_LOGITS], given["rpn_labels"], given["rpn_label_weights"]),
        _smooth_l1(v[faster_rcnn.RPN_DELTAS], given["rpn_box_targets"], given["rpn_box_weights"],
                   hp["rpn_sigma"], hp["rpn_batch"]),
        _softmax_ce(v[faster_rcnn.CLASS_LOGITS], given["roi_labels"].reshape(-1)),
        _smooth_l1(v[faster_rcnn.BOX_DELTAS], given["roi_box_targets"].reshape(-1, 4 * k),
                   given["roi_box_weights"].reshape(-1, 4 * k), hp["head_sigma"], 1.0)])


def _protocol(model, weights, batch, given):
    """predict's detections on ``batch``; the four losses, their sum as the backend's
    objective, gradients and three steps on ``given`` (the batch with the reference's targets,
    so every backend trains on the same boxes)."""
    model.set_weights(weights)
    out = OrderedDict(("detections/" + k, np.asarray(v, np.float64))
                      for k, v in model.predict(batch).items())
    losses, grads = model.loss_and_gradients(given)
    out["forward"] = np.concatenate([four_losses(model, given), [losses]])
    for name, g in grads.items():
        out["grad/" + name] = np.asarray(g, np.float64)
    out["trajectory"] = np.array([model.train_step(given) for _ in range(3)], np.float64)
    return out


@pytest.fixture(scope="module")
def reference():
    require_backend("torch")
    model = build_native(NAME, "torch", config="tiny", seed=0)
    weights, batch = model.get_weights(), model.synthetic_batch(seed=0)
    made = model.step_targets(batch)
    record = _protocol(model, weights, batch, dict(batch, **made))
    model.close()
    four, total = record["forward"][:4], record["forward"][4]
    assert abs(four.sum() - total) < 1e-5 * total and (four > 0).all()
    return weights, batch, made, record


@pytest.mark.parametrize("backend", ["torch", "tensorflow", "mxnet", "cntk", "jax"])
def test_every_backend_matches_the_reference(reference, backend, tmp_path):
    require_backend(backend)
    weights, batch, made, record = reference
    if backend in ("cntk", "jax"):  # through its worker
        model = build(NAME, backend=backend, config="tiny", seed=0, isolate=True)
    else:
        model = build_native(NAME, backend, config="tiny", seed=0)
    try:
        assert isinstance(model.native, _native_type(backend))
        model.set_weights(weights)
        path = str(tmp_path / "w.npz")
        model.save_weights(path)
        model.set_weights(OrderedDict((k, 0.5 * v) for k, v in weights.items()))
        model.load_weights(path)
        for name, value in model.get_weights().items():
            np.testing.assert_array_equal(value, weights[name], err_msg=name)
        # the same seed draws the same boxes from the backend's own forward values; the
        # bilinear weights of the CNTK worker's NumPy 1.19 may differ in the last bit
        own = model.step_targets(batch)
        for name in faster_rcnn.WRITTEN:
            if name == "roi_weights":
                np.testing.assert_allclose(own[name], made[name], rtol=0, atol=1e-6)
            else:
                np.testing.assert_array_equal(own[name], made[name], err_msg=name)
        other = _protocol(model, weights, batch, dict(batch, **made))
    finally:
        model.close()
    assert consistency.compare(record, other) == []
    for key in ("detections/labels", "detections/counts"):
        np.testing.assert_array_equal(other[key], record[key], err_msg=key)
    for key, atol in (("detections/boxes", 1e-3), ("detections/scores", 1e-5)):
        np.testing.assert_allclose(other[key], record[key], rtol=1e-4, atol=atol, err_msg=key)
