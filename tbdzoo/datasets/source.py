"""The small interface every reader of real data implements, so an input pipeline and
``tbd run --data`` can take any of them: ImageNet's folders today; text, speech and detection
readers later (docs/pipelines.md says what each adds). Valid Python 3.6."""


class ExampleSource:
    """Random access to the examples of one split.

    ``task`` names the kind of example (``"image_classification"``); a pipeline refuses a
    source whose task it does not build batches for. ``example(i)`` returns a dict of NumPy
    values (for image classification: ``image`` uint8 (H, W, 3) RGB and ``label`` int), and
    ``describe(i)`` the file it comes from, which every error about that example names.
    """

    task = None

    def __len__(self):
        raise NotImplementedError

    def example(self, index):
        raise NotImplementedError

    def describe(self, index):
        return "example {}".format(index)
