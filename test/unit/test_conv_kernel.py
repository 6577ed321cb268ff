"""conv2d kernel regressions found by random conv stacks (shapes, strides, dilations, groups, pools, core counts and
precisions, checked against PyTorch)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import spyre_mlir  # noqa: E402


class DilatedThenDepthwise(torch.nn.Module):
    """A dilated conv and an avg pool to 5 x 7, then a depthwise 5 x 5 conv: on 8 cores the depthwise plan gives
    each filter block one core (gn x goh = 1), whose shared filters have nobody to be multicast to."""

    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(3, 16, 3, padding=1, dilation=2, bias=False)
        self.d = torch.nn.Conv2d(16, 16, 5, padding=2, groups=16, bias=False)

    def forward(self, x):
        return self.d(torch.nn.functional.avg_pool2d(self.c(x), 2))


@pytest.mark.parametrize("precision", ["dlf16", "fp8"])
def test_shared_filters_of_a_one_core_block_are_not_sent(precision):
    """Used to emit a RING_SEND with no destination, which the loader rejects (an internal error for the user)."""
    torch.manual_seed(0)
    model, x = DilatedThenDepthwise().eval(), torch.randn(1, 3, 12, 16)
    exe = spyre_mlir.compile(model, (x,), precision=precision, cores=8, cache_dir=False)
    (y,) = exe(x)
    with torch.no_grad():
        ref = model(x).numpy()
    np.testing.assert_allclose(y, ref, rtol=0.1, atol=0.1 * float(np.abs(ref).max()))
