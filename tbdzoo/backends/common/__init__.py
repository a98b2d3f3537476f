"""What the four backends share, written once in NumPy and plain Python (no framework import,
valid Python 3.6): constant tables the ops add to their graphs, the optimizer definitions and
the argument transforms that map them onto fused kernels, the NumPy reference optimizers, and
which ops each backend implements, and the one check of a batch (batches.py)."""
