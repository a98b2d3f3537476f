"""Label-smoothed softmax cross-entropy that keeps only the logits for its backward pass.

``F.cross_entropy`` keeps its log-softmax output (one more tensor the size of the logits) and
its backward pass allocates up to three more (the NLL gradient, the smoothing gradient and the
log-softmax gradient). For the Transformer's 32k-word output these are 2 GB each at a batch of
16k target positions, and they sit on top of every saved activation at the start of the
backward pass, the step's peak.

This function computes the same loss, mean over counted positions of -sum_k q_k log p_k with
q = (1 - eps) onehot(y) + eps / K, row block by row block (a float32 log-softmax of one block at a
time), and keeps only the logits. Its backward pass recomputes the softmax block by block and
writes (p - q) * g / count into a new tensor or, where the caller owns the logits, over the
logits themselves. It reads and writes the logits about as often as ``F.cross_entropy`` does.
Only rounding differs.
"""
import torch

# Rows per block: a float32 block stays near 512 MiB for a 32k vocabulary (4 blocks at 16k rows):
# few launches for an eager step, a quarter of the float32 logits.
BLOCK_BYTES = 512 * 2 ** 20


def _block_rows(classes):
    return max(1, BLOCK_BYTES // (4 * max(classes, 1)))


class _SmoothedCrossEntropy(torch.autograd.Function):

    @staticmethod
    def forward(ctx, logits, labels, ignore_index, smoothing, overwrite):
        classes = logits.shape[1]
        rows = _block_rows(classes)
        counted = (labels != ignore_index if ignore_index is not None
                   else torch.ones_like(labels, dtype=torch.bool))
        safe_labels = labels.masked_fill(~counted, 0)[:, None]
        targets, totals = [], []
        for x, y in zip(logits.split(rows), safe_labels.split(rows)):
            log_p = torch.log_softmax(x, dim=1, dtype=torch.float32)
            targets.append(log_p.gather(1, y))
            totals.append(log_p.sum(dim=1))
        # -sum_k q_k log p_k = -(1 - eps) log p_y - eps/K sum_k log p_k
        per_row = torch.cat(targets)[:, 0].mul_(-(1.0 - smoothing)).sub_(torch.cat(totals),
                                                                           alpha=smoothing / classes)
        count = counted.sum()
        loss = torch.where(counted, per_row, per_row.new_zeros(())).sum() / count
        ctx.save_for_backward(logits, safe_labels, counted, count)
        ctx.smoothing, ctx.overwrite = smoothing, overwrite
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        logits, labels, counted, count = ctx.saved_tensors
        classes = logits.shape[1]
        rows = _block_rows(classes)
        grad = logits if ctx.overwrite else torch.empty_like(logits)
        scale = (counted.float() * (grad_loss / count))[:, None]  # g / count, 0 where not counted
        shift = scale * -(ctx.smoothing / classes)
        on_target = torch.full_like(scale, -(1.0 - ctx.smoothing))
        for x, y, g, s, b, t in zip(logits.split(rows), labels.split(rows), grad.split(rows),
                                    scale.split(rows), shift.split(rows), on_target.split(rows)):
            p = torch.softmax(x, dim=1, dtype=torch.float32)
            p.scatter_add_(1, y, t)
            # (p - (1 - eps) onehot) g/count - eps/K g/count, written where the gradient goes
            torch.addcmul(b, p, s, out=g)
        return grad, None, None, None, None


def smoothed_cross_entropy(logits, labels, ignore_index, smoothing, overwrite_logits=False):
    """Mean label-smoothed cross-entropy of (M, K) ``logits`` against (M,) ``labels``, positions
    labelled ``ignore_index`` not counted. ``overwrite_logits``: the backward pass may write the
    gradient over the logits (only when nothing else reads them after the loss)."""
    return _SmoothedCrossEntropy.apply(logits, labels, ignore_index, float(smoothing),
                                       bool(overwrite_logits))
