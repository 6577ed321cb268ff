"""A small convolutional network: strided and depthwise convolutions, batch norm, pooling.

Run as a script to write ``cnn.pt`` (a ``torch.export.save`` archive) for ``spyre-compile``::

    python examples/cnn.py [OUT.pt]
"""

import sys

import torch
from torch import nn


class CNN(nn.Module):
    """A MobileNet-like stem: conv, depthwise-separable block, max pool, global average pool, classifier."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, kernel_size=3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        # Depthwise (groups == channels) then pointwise: the separable block of MobileNet.
        self.depthwise = nn.Conv2d(16, 16, kernel_size=3, padding=1, groups=16)
        self.pointwise = nn.Conv2d(16, 32, kernel_size=1)
        self.pool = nn.MaxPool2d(2)
        self.conv = nn.Conv2d(32, 32, kernel_size=3, padding=1)
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.stem(x)))
        x = torch.relu(self.pointwise(self.depthwise(x)))
        x = self.pool(x)
        x = torch.relu(self.conv(x))
        x = nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


def build(seed: int = 0):
    """Return ``(model, example_inputs)``; weights, batch-norm statistics and inputs depend only on ``seed``."""
    gen = torch.manual_seed(seed)
    model = CNN()
    with torch.no_grad():
        # Non-trivial running statistics, so batch norm is not an identity in eval mode.
        model.bn.running_mean.copy_(torch.randn(16, generator=gen) * 0.1)
        model.bn.running_var.copy_(torch.rand(16, generator=gen) + 0.5)
    model.eval()
    example_inputs = (torch.randn(1, 3, 32, 32, generator=gen),)
    return model, example_inputs


def save(path: str, seed: int = 0) -> None:
    """Export the model and write it with ``torch.export.save``."""
    model, example_inputs = build(seed)
    torch.export.save(torch.export.export(model, example_inputs), path)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "cnn.pt"
    save(out)
    print(f"wrote {out}")
