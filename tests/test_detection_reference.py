"""The NumPy reference of Faster R-CNN's non-differentiable parts (docs/detection.md) against
torchvision's own operators, hand-computed VOC07 APs, and the samplers' promises."""
import numpy as np
import pytest

from conftest import require_backend, run_in_env
from tbdzoo.errors import DetectionInputError
from tbdzoo.models.faster_rcnn.detection import boxes as B
from tbdzoo.models.faster_rcnn.detection.anchors import anchors
from tbdzoo.models.faster_rcnn.detection.evaluation import average_precisions, mean_average_precision
from tbdzoo.models.faster_rcnn.detection.nms import nms
from tbdzoo.models.faster_rcnn.detection.postprocess import detections
from tbdzoo.models.faster_rcnn.detection.proposals import EVAL, TRAIN, proposals
from tbdzoo.models.faster_rcnn.detection.randomness import step_rng
from tbdzoo.models.faster_rcnn.detection.roi_align import roi_align_numpy, roi_align_points
from tbdzoo.models.faster_rcnn.detection.targets import anchor_targets, sample_rois

torch = pytest.importorskip("torch")
tv_ops = pytest.importorskip("torchvision.ops")


def random_boxes(rng, n, low=0.0, high=100.0, max_size=50.0):
    xy = rng.uniform(low, high, (n, 2))
    return np.concatenate([xy, xy + rng.uniform(1.0, max_size, (n, 2))], axis=1)


def t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


# --- against torchvision ----------------------------------------------------------------------

def test_iou_matches_torchvision_box_iou():
    rng = np.random.RandomState(0)
    a, b = random_boxes(rng, 60), random_boxes(rng, 40)
    np.testing.assert_allclose(B.iou(a, b), tv_ops.box_iou(t(a), t(b)).numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7])
def test_nms_matches_torchvision_with_exact_ties(threshold):
    rng = np.random.RandomState(1)
    boxes = random_boxes(rng, 400)
    boxes[20] = boxes[21] = boxes[5]  # identical boxes ...
    scores = rng.randint(0, 12, 400) / 4.0  # ... and many equal scores
    scores[20] = scores[21] = scores[5]
    kept = nms(boxes, scores, threshold)
    np.testing.assert_array_equal(kept, tv_ops.nms(t(boxes), t(scores), threshold).numpy())
    assert 5 in kept and 20 not in kept and 21 not in kept  # the lowest index of a tie wins


def test_nms_order_of_equal_scores_is_index_ascending():
    far_apart = np.array([[i * 100.0, 0, i * 100.0 + 10, 10] for i in range(6)])
    scores = np.array([1.0, 2.0, 1.0, 2.0, 1.0, 2.0])
    np.testing.assert_array_equal(nms(far_apart, scores, 0.5), [1, 3, 5, 0, 2, 4])
    np.testing.assert_array_equal(nms(far_apart, scores, 0.5, max_keep=4), [1, 3, 5, 0])


@pytest.mark.parametrize("weights", [B.RPN_WEIGHTS, B.HEAD_WEIGHTS])
def test_box_coding_matches_torchvision_box_coder(weights):
    from torchvision.models.detection._utils import BoxCoder
    rng = np.random.RandomState(2)
    coder = BoxCoder(weights)
    reference, props = random_boxes(rng, 100), random_boxes(rng, 100)
    np.testing.assert_allclose(B.encode(reference, props, weights),
                               coder.encode_single(t(reference), t(props)).numpy(), atol=1e-12)
    deltas = rng.randn(100, 4 * 21) * 3
    deltas[0, 2] = deltas[1, 3] = 50.0  # clamped at log(1000 / 16)
    np.testing.assert_allclose(B.decode(deltas, props, weights),
                               coder.decode_single(t(deltas), t(props)).numpy(),
                               rtol=1e-12, atol=1e-9)


def test_anchors_match_torchvision_anchor_generator():
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.image_list import ImageList
    height, width = 6, 9
    generator = AnchorGenerator(sizes=((128, 256, 512),), aspect_ratios=((0.5, 1.0, 2.0),))
    images = ImageList(torch.zeros(1, 3, height * 16, width * 16), [(height * 16, width * 16)])
    expected = generator(images, [torch.zeros(1, 9 * 4, height, width)])[0].numpy()
    got = anchors(height, width, 16)
    assert got.shape == (height * width * 9, 4)
    np.testing.assert_array_equal(got, expected)
    # position-major: rows 9..17 are the anchors of (y 0, x 1), shifted 16 pixels right
    np.testing.assert_array_equal(got[9:18], got[:9] + [16, 0, 16, 0])


def test_clip_and_remove_small_match_torchvision():
    rng = np.random.RandomState(6)
    boxes = random_boxes(rng, 200, low=-50.0, high=150.0, max_size=60.0)
    clipped = B.clip(boxes, 90, 120)
    np.testing.assert_array_equal(clipped, tv_ops.clip_boxes_to_image(t(boxes), (90, 120)).numpy())
    np.testing.assert_array_equal(B.remove_small(clipped, 16.0),
                                  tv_ops.remove_small_boxes(t(clipped), 16.0).numpy())


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [1, 2, 3])
@pytest.mark.parametrize("output_size", [(7, 7), (2, 3)])
def test_roi_align_gather_matches_torchvision(aligned, sampling_ratio, output_size):
    rng = np.random.RandomState(3)
    features = rng.randn(3, 11, 13).astype(np.float32)
    rois = random_boxes(rng, 40, low=-60.0, high=240.0, max_size=120.0)  # partly outside the map
    rois[0] = [-100.0, -100.0, -30.0, -30.0]  # wholly outside: every sample contributes 0
    rois[1] = [30.0, 40.0, 30.5, 40.2]  # smaller than one cell
    rois = rois.astype(np.float32)
    indices, weights = roi_align_points(rois, (11, 13), 1 / 16.0, output_size, sampling_ratio,
                                        aligned)
    samples = output_size[0] * output_size[1] * sampling_ratio ** 2
    assert indices.shape == weights.shape == (40, samples, 4)
    assert indices.dtype == np.int32 and weights.dtype == np.float32
    assert indices.min() >= 0 and indices.max() < 11 * 13
    assert not weights[0].any() and not indices[0].any()
    expected = tv_ops.roi_align(t(features)[None], [t(rois)], output_size, 1 / 16.0,
                                sampling_ratio, aligned).numpy()
    got = roi_align_numpy(features, indices, weights, output_size, sampling_ratio)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_roi_align_sample_order_is_out_h_out_w_sr_y_sr_x():
    # RoI 16 wide, 32 high, 2 x 2 bins, 2 x 2 samples per bin, not aligned: samples fall on the
    # integer x = 8 j + 2 + 4 sx and y = 16 i + 4 + 8 sy, so the first corner alone has weight 1
    indices, weights = roi_align_points([[0.0, 0.0, 16.0, 32.0]], (40, 40), 1.0, (2, 2), 2,
                                        aligned=False)
    expected = [(16 * i + 4 + 8 * sy) * 40 + 8 * j + 2 + 4 * sx
                for i in range(2) for j in range(2) for sy in range(2) for sx in range(2)]
    np.testing.assert_array_equal(indices[0, :, 0], expected)
    np.testing.assert_array_equal(weights[0], np.tile([1.0, 0.0, 0.0, 0.0], (16, 1)))


def test_postprocess_matches_torchvision_roi_heads_defaults():
    from torchvision.models.detection.roi_heads import RoIHeads
    rng = np.random.RandomState(4)
    heads = RoIHeads(None, None, None, 0.5, 0.5, 512, 0.25, None, 0.05, 0.5, 100)
    rois = random_boxes(rng, 300, high=400.0, max_size=200.0).astype(np.float32)
    logits = (rng.randn(300, 21) * 3).astype(np.float32)
    deltas = (rng.randn(300, 84) * 0.5).astype(np.float32)
    expected = heads.postprocess_detections(t(logits), t(deltas), [t(rois)], [(480, 500)])
    boxes, scores, labels = detections(logits, deltas, rois, (480, 500))
    assert len(boxes) == 100
    np.testing.assert_allclose(boxes, expected[0][0].numpy(), atol=1e-3)
    np.testing.assert_allclose(scores, expected[1][0].numpy(), atol=1e-6)
    np.testing.assert_array_equal(labels, expected[2][0].numpy())


def test_proposals_match_a_torchvision_pipeline_in_mx_rcnn_order():
    from torchvision.models.detection._utils import BoxCoder
    rng = np.random.RandomState(5)
    grid = anchors(20, 25, 16)
    objectness = rng.randn(len(grid))
    objectness[::7] = 0.25  # ties
    deltas = rng.randn(len(grid), 4) * 0.3
    settings = dict(TRAIN, pre_nms=3000, post_nms=500)
    boxes, scores = proposals(objectness, deltas, grid, (300, 380), **settings)
    decoded = BoxCoder((1.0, 1.0, 1.0, 1.0)).decode_single(t(deltas), t(grid.astype(np.float64)))
    decoded = tv_ops.clip_boxes_to_image(decoded, (300, 380))
    big = tv_ops.remove_small_boxes(decoded, 16.0)
    order = big[torch.sort(t(objectness)[big], descending=True, stable=True)[1]][:3000]
    kept = order[tv_ops.nms(decoded[order], t(objectness)[order], 0.7)][:500]
    np.testing.assert_allclose(boxes, decoded[kept].numpy(), atol=1e-4)
    np.testing.assert_allclose(scores, objectness[kept.numpy()].astype(np.float32))
    assert len(boxes) == 500 and (np.diff(scores) <= 0).all()
    widths, heights = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    assert (widths >= 16).all() and (heights >= 16).all()
    assert boxes[:, [0, 1]].min() >= 0 and (boxes[:, 2] <= 380).all() and (boxes[:, 3] <= 300).all()
    assert EVAL["pre_nms"] == 6000 and EVAL["post_nms"] == 300


# --- samplers ---------------------------------------------------------------------------------

IMAGE_HW = (600, 800)
GT = np.array([[100.0, 120.0, 300.0, 330.0], [420.0, 60.0, 700.0, 250.0],
               [450.0, 400.0, 470.0, 420.0]])


def rpn_targets(seed, gt=GT):
    grid = anchors(38, 50, 16)
    return grid, anchor_targets(grid, gt, IMAGE_HW, np.random.RandomState(seed))


def test_anchor_targets_counts_thresholds_and_border():
    grid, (labels, targets, weights) = rpn_targets(0)
    overlaps = B.iou(grid, GT)
    best = overlaps.max(axis=1)
    positive, negative = labels == 1, labels == 0
    assert 0 < positive.sum() <= 128 and positive.sum() + negative.sum() == 256
    assert (best[negative] < 0.3).all()
    is_gt_best = (overlaps == overlaps.max(axis=0)).any(axis=1)
    assert ((best[positive] >= 0.7) | is_gt_best[positive]).all()
    crossing = ((grid[:, :2] < 0).any(axis=1) | (grid[:, 2] > 800) | (grid[:, 3] > 600))
    assert (labels[crossing] == -1).all()
    assert (weights[positive] == 1).all()
    assert not weights[~positive].any() and not targets[~positive].any()
    matched = GT[overlaps[positive].argmax(axis=1)]
    np.testing.assert_allclose(B.decode(targets[positive], grid[positive], B.RPN_WEIGHTS), matched,
                               atol=1e-3)


def test_anchor_targets_subsample_positives_to_half_the_batch():
    big = np.array([[0.0, 0.0, 800.0, 600.0], [50.0, 50.0, 750.0, 550.0],
                    [10.0, 0.0, 790.0, 580.0]])
    grid = anchors(38, 50, 16)
    labels, _, _ = anchor_targets(grid, big, IMAGE_HW, np.random.RandomState(0), batch_size=16,
                                  positive_iou=0.1, negative_iou=0.05)
    assert (labels == 1).sum() == 8 and (labels == 0).sum() <= 8


def test_anchor_targets_same_seed_same_choice():
    _, first = rpn_targets(7)
    _, again = rpn_targets(7)
    _, other = rpn_targets(8)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0])


def test_a_ground_truth_that_matches_no_anchor_well_still_gets_positives():
    small = np.array([[300.0, 300.0, 318.0, 316.0]])  # best IoU with a 128 x 128 anchor ~ 0.02
    grid, (labels, _, _) = rpn_targets(0, small)
    overlaps = B.iou(grid, small)[:, 0]
    inside = (grid[:, :2] >= 0).all(axis=1) & (grid[:, 2] <= 800) & (grid[:, 3] <= 600)
    assert overlaps.max() < 0.3
    best = np.flatnonzero(inside & (overlaps == overlaps[inside].max()))
    np.testing.assert_array_equal(np.flatnonzero(labels == 1), best)


def test_an_image_without_ground_truth_gets_only_background():
    _, (labels, _, weights) = rpn_targets(0, np.zeros((0, 4)))
    assert (labels == 1).sum() == 0 and (labels == 0).sum() == 256 and not weights.any()


def test_anchors_crossing_the_border_are_kept_with_torchvision_rule():
    grid = anchors(38, 50, 16)
    crossing = ((grid[:, :2] < 0).any(axis=1) | (grid[:, 2] > 800) | (grid[:, 3] > 600))
    edge = np.array([[0.0, 0.0, 200.0, 100.0]])  # best matched by anchors that cross the border
    dropped, _, _ = anchor_targets(grid, edge, IMAGE_HW, np.random.RandomState(0))
    kept, _, _ = anchor_targets(grid, edge, IMAGE_HW, np.random.RandomState(0), allowed_border=None)
    assert (dropped[crossing] == -1).all()
    assert (kept[crossing] == 1).any() and (kept[crossing] == 0).any()


def roi_sample(seed, n=2000):
    rng = np.random.RandomState(100)
    centres = GT[rng.randint(0, 3, n)]
    props = centres + rng.randn(n, 4) * 40
    props[:, 2:] = np.maximum(props[:, 2:], props[:, :2] + 1)
    return props, sample_rois(props, GT, [3, 7, 20], np.random.RandomState(seed))


def test_sample_rois_counts_thresholds_and_class_columns():
    _, (rois, labels, targets, weights) = roi_sample(0)
    assert rois.shape == (128, 4) and labels.shape == (128,)
    assert targets.shape == weights.shape == (128, 84)
    foreground = labels > 0
    assert foreground.sum() == 32 and (labels == 0).sum() == 96
    best = B.iou(rois, GT)
    assert (best[foreground].max(axis=1) >= 0.5).all()
    assert (best[~foreground].max(axis=1) < 0.5).all()
    own = np.array([3, 7, 20])[best.argmax(axis=1)]
    np.testing.assert_array_equal(labels[foreground], own[foreground])
    for row in np.flatnonzero(foreground):
        cols = slice(4 * labels[row], 4 * labels[row] + 4)
        assert (weights[row, cols] == 1).all() and weights[row].sum() == 4
        decoded = B.decode(targets[row, cols][None], rois[row][None], B.HEAD_WEIGHTS)[0]
        np.testing.assert_allclose(decoded, GT[best[row].argmax()], atol=1e-3)
    assert not weights[~foreground].any() and not targets[~foreground].any()


def test_sample_rois_same_seed_same_choice():
    first, again, other = roi_sample(3)[1], roi_sample(3)[1], roi_sample(4)[1]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0])


def test_sample_rois_appends_ground_truth_and_pads_with_ignored_rois():
    props = np.array([[0.0, 0.0, 40.0, 40.0], [100.0, 120.0, 290.0, 330.0]])
    rois, labels, _, weights = sample_rois(props, GT, [1, 2, 3], np.random.RandomState(0))
    # 3 ground truths and 1 close proposal in the foreground, 1 background
    assert (labels[:4] > 0).all() and labels[4] == 0
    assert (labels[5:] == -1).all() and not weights[5:].any()
    for g in GT:
        assert (np.abs(rois[:5] - g).sum(axis=1) < 1e-4).any()


def test_step_rng_depends_on_every_part_of_its_seed():
    draws = {step_rng(*key).randint(1 << 30) for key in
             [(0, 0, "anchor_targets"), (1, 0, "anchor_targets"), (0, 1, "anchor_targets"),
              (0, 0, "sample_rois"), (0, 0, "anchor_targets", 1)]}
    assert len(draws) == 5
    again = step_rng(5, 9, "sample_rois").randint(1 << 30)
    assert step_rng(5, 9, "sample_rois").randint(1 << 30) == again


# --- VOC07 mAP --------------------------------------------------------------------------------

def square(x, size=50.0):
    return [x, 0.0, x + size, size]


def test_a_perfect_detector_scores_one():
    gts = [(np.array([square(0), square(100)]), [1, 2]), (np.array([square(300)]), [2])]
    dets = [(g[0], [0.9, 0.8][:len(g[1])], g[1]) for g in gts]
    assert mean_average_precision(dets, gts, num_classes=3) == pytest.approx(1.0)


def test_hand_computed_eleven_point_ap_with_duplicates_and_difficult():
    # 4 objects of class 1 (plus one difficult). By score: TP (gt0), FP (nothing there), TP (gt1),
    # TP (gt2), FP (gt0 again: a duplicate); gt3 is never found; the detection of the difficult
    # object counts as nothing. Recall .25 .25 .5 .75 .75, precision 1 .5 .667 .75 .6:
    # t = 0, .1, .2 -> 1; t = .3 ... .7 -> .75; t = .8, .9, 1 -> 0; AP = (3 + 5 * .75) / 11.
    gt_boxes = np.array([square(0), square(100), square(200), square(300), square(400)])
    gts = [(gt_boxes, [1] * 5, [False, False, False, False, True])]
    det_boxes = np.array([square(0), square(600), square(100), square(200), square(2), square(400)])
    dets = [(det_boxes, [0.9, 0.8, 0.7, 0.6, 0.5, 0.85], [1] * 6)]
    aps = average_precisions(dets, gts, num_classes=2)
    assert aps[0] == pytest.approx((3 + 5 * 0.75) / 11)
    without_difficult = [(gt_boxes[:4], [1] * 4)]
    assert average_precisions([(det_boxes[:5], [0.9, 0.8, 0.7, 0.6, 0.5], [1] * 5)],
                              without_difficult, num_classes=2)[0] == pytest.approx(aps[0])


def test_a_recall_of_exactly_three_tenths_counts_at_point_three():
    gts = [(np.array([square(100.0 * i) for i in range(10)]), [1] * 10)]
    dets = [(np.array([square(0), square(100), square(200)]), [0.9, 0.8, 0.7], [1, 1, 1])]
    assert average_precisions(dets, gts, num_classes=2)[0] == pytest.approx(4 / 11.0)


def test_a_class_without_ground_truth_is_left_out_of_the_mean():
    gts = [(np.array([square(0)]), [1])]
    dets = [(np.array([square(0), square(200)]), [0.9, 0.8], [1, 2])]
    aps = average_precisions(dets, gts, num_classes=3)
    assert aps[0] == pytest.approx(1.0) and np.isnan(aps[1])
    assert mean_average_precision(dets, gts, num_classes=3) == pytest.approx(1.0)


def test_images_without_detections_or_objects_are_accepted():
    empty = (np.zeros((0, 4)), [], [])
    gts = [(np.array([square(0)]), [1]), (np.zeros((0, 4)), [])]
    dets = [empty, (np.array([square(0)]), [0.5], [1])]  # the only detection is on the empty image
    assert average_precisions(dets, gts, num_classes=2)[0] == 0.0


# --- bad input --------------------------------------------------------------------------------

def test_a_box_with_x2_below_x1_is_refused_by_name_and_row():
    gt = GT.copy()
    gt[1] = [500.0, 60.0, 420.0, 250.0]
    with pytest.raises(DetectionInputError, match=r"gt_boxes\[1\].*x2 <= x1"):
        anchor_targets(anchors(4, 4, 16), gt, IMAGE_HW, np.random.RandomState(0))
    with pytest.raises(ValueError, match=r"rois\[0\].*y2 < y1"):
        roi_align_points([[0.0, 10.0, 5.0, 2.0]], (8, 8), 1.0, 2, 2, True)


def test_a_ground_truth_box_outside_the_image_is_refused():
    where = r"gt_boxes\[0\].*outside the image \[0, 800\] x \[0, 600\]"
    with pytest.raises(DetectionInputError, match=where):
        anchor_targets(anchors(4, 4, 16), [[700.0, 500.0, 820.0, 590.0]], IMAGE_HW,
                       np.random.RandomState(0))
    with pytest.raises(DetectionInputError, match=r"gt_boxes\[0\].*outside the image"):
        sample_rois(GT, [[-5.0, 0.0, 10.0, 10.0]], [1], np.random.RandomState(0), valid_hw=IMAGE_HW)


def test_a_class_id_out_of_range_is_refused():
    with pytest.raises(DetectionInputError, match=r"gt_labels\[2\] = 21 is outside 1 \.\. 20"):
        sample_rois(GT, GT, [1, 2, 21], np.random.RandomState(0))
    with pytest.raises(DetectionInputError, match=r"gt_labels\[0\] = 0 .*background"):
        sample_rois(GT, GT, [0, 2, 3], np.random.RandomState(0))
    with pytest.raises(DetectionInputError, match=r"detections\[0\] labels\[1\] = 5"):
        average_precisions([(GT[:2], [0.5, 0.4], [1, 5])], [(GT, [1, 1, 1])], num_classes=3)


def test_a_generator_instead_of_a_random_state_is_refused():
    with pytest.raises(DetectionInputError, match="RandomState"):
        sample_rois(GT, GT, [1, 2, 3], np.random.default_rng(0))


# --- one reference on both interpreters -------------------------------------------------------

SAME_DRAWS = r"""
import hashlib, numpy as np
from tbdzoo.models.faster_rcnn.detection.anchors import anchors
from tbdzoo.models.faster_rcnn.detection.targets import anchor_targets, sample_rois
from tbdzoo.models.faster_rcnn.detection.proposals import proposals, TRAIN
from tbdzoo.models.faster_rcnn.detection.randomness import step_rng
grid = anchors(20, 25, 16)
rng = np.random.RandomState(11)
gt = np.array([[10., 20., 150., 200.], [200., 50., 390., 300.]])
out = anchor_targets(grid, gt, (320, 400), step_rng(1, 2, "anchor_targets"))
props, _ = proposals(rng.randn(len(grid)), rng.randn(len(grid), 4) * 0.2, grid, (320, 400),
                     **dict(TRAIN, pre_nms=2000, post_nms=400))
out += (props,) + sample_rois(props, gt, [4, 9], step_rng(1, 2, "sample_rois"))
print(hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in out)).hexdigest())
"""


def test_the_cntk_interpreter_draws_the_same_boxes():
    require_backend("cntk")
    import subprocess
    import sys

    from tbdzoo.backends import environments
    here = subprocess.run([sys.executable, "-c", SAME_DRAWS], env=environments.worker_environment(),
                          stdout=subprocess.PIPE, text=True, check=True).stdout
    there = run_in_env(environments.python_of("cntk"), ["-c", SAME_DRAWS])
    assert there.returncode == 0, there.stderr
    assert there.stdout == here
