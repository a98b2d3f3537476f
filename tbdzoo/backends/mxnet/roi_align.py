"""The spec's roi_align on MXNet as one sparse product, registered as the custom operator
``tbdzoo_roi_align``.

A hybridized graph cannot build a CSR matrix from its inputs (no symbol makes one), and the
gather form (take, multiply, sum) keeps every weighted tap, sr^2 x 4 = 16 times the output,
for its backward pass. This operator builds the (N R oh ow, N H W) mixing matrix, each row a
bin's taps weighted by weights / sr^2, as a CSR NDArray and multiplies the batch's (N H W, C)
feature rows by it (``mx.nd.sparse.dot``); the backward pass multiplies the output gradient
by its transpose, the spec's scatter-add, and keeps only the indices and weights.
MXNet's own ``contrib.ROIAlign`` takes boxes, not the sample points the spec's op receives.
"""
from . import framework  # noqa: F401  (first: numpy.bool for mxnet 1.9.1, quiet import)

# isort: split
import mxnet as mx

OP_TYPE = "tbdzoo_roi_align"


def mixing_matrix(indices, weights, feature_hw, sampling_ratio):
    """CSR (N R S/sr^2, N H W): row b holds bin b's sr^2 x 4 taps, columns offset by n H W
    for example n (indices and weights are (N, R, S, 4) NDArrays)."""
    n, rois, samples, corners = indices.shape
    h, w = feature_hw
    taps = sampling_ratio * sampling_ratio * corners
    bins = n * rois * samples // (sampling_ratio * sampling_ratio)
    ctx = indices.context
    offsets = mx.nd.arange(n, ctx=ctx, dtype="float64").reshape((n, 1, 1, 1)) * (h * w)
    columns = mx.nd.broadcast_add(indices.astype("float64"), offsets).reshape((-1,))
    values = weights.astype("float32").reshape((-1,)) / float(sampling_ratio * sampling_ratio)
    indptr = mx.nd.arange(0, bins * taps + 1, taps, ctx=ctx, dtype="int64")
    return mx.nd.sparse.csr_matrix((values, columns.astype("int64"), indptr),
                                   shape=(bins, n * h * w), ctx=ctx)


class SparseRoIAlign(mx.operator.CustomOp):
    def __init__(self, output_size, sampling_ratio):
        super().__init__()
        self.output_size, self.sampling_ratio = output_size, sampling_ratio

    def forward(self, is_train, req, in_data, out_data, aux):
        features, indices, weights = in_data
        n, c, h, w = features.shape
        rois = indices.shape[1]
        (oh, ow) = self.output_size
        mixing = mixing_matrix(indices, weights, (h, w), self.sampling_ratio)
        rows = features.astype("float32").transpose((0, 2, 3, 1)).reshape((-1, c))
        out = mx.nd.sparse.dot(mixing, rows).reshape((n, rois, oh, ow, c))
        self.assign(out_data[0], req[0], out.transpose((0, 1, 4, 2, 3)).astype(features.dtype))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        _, indices, weights = in_data  # the features are not kept: in_grad gives their shape
        n, c, h, w = in_grad[0].shape
        mixing = mixing_matrix(indices, weights, (h, w), self.sampling_ratio)
        upstream = out_grad[0].astype("float32").transpose((0, 1, 3, 4, 2)).reshape((-1, c))
        rows = mx.nd.sparse.dot(mixing, upstream, transpose_a=True, forward_stype="default")
        grad = rows.reshape((n, h, w, c)).transpose((0, 3, 1, 2)).astype(in_grad[0].dtype)
        self.assign(in_grad[0], req[0], grad)
        for k in (1, 2):  # the sample points are data: no gradient
            self.assign(in_grad[k], req[k], mx.nd.zeros_like(in_data[k]))


@mx.operator.register(OP_TYPE)
class SparseRoIAlignProp(mx.operator.CustomOpProp):
    """Attributes arrive as strings: output_size "oh,ow", sampling_ratio "sr"."""

    def __init__(self, output_size, sampling_ratio):
        super().__init__(need_top_grad=True)
        self.output_size = tuple(int(v) for v in str(output_size).split(","))
        self.sampling_ratio = int(sampling_ratio)

    def list_arguments(self):
        return ["features", "indices", "weights"]

    def list_outputs(self):
        return ["output"]

    def infer_shape(self, in_shape):
        features, indices, weights = in_shape
        out = [features[0], indices[1], features[1]] + list(self.output_size)
        return [features, indices, weights], [out], []

    def infer_type(self, in_type):
        return in_type, [in_type[0]], []

    def declare_backward_dependency(self, out_grad, in_data, out_data):
        return [out_grad[0], in_data[1], in_data[2]]

    def create_operator(self, ctx, shapes, dtypes):
        return SparseRoIAlign(self.output_size, self.sampling_ratio)


def roi_align(F, features, indices, weights, output_size, sampling_ratio):
    """The custom operator on ``F`` (symbol or ndarray)."""
    return F.Custom(features, indices, weights, op_type=OP_TYPE,
                    output_size="{},{}".format(*output_size), sampling_ratio=str(sampling_ratio))

