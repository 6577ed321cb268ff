"""A small multi-layer perceptron: the simplest model the frontend must import.

Run as a script to write ``mlp.pt`` (a ``torch.export.save`` archive) for ``spyre-compile``::

    python examples/mlp.py [OUT.pt]
"""

import sys

import torch
from torch import nn


class MLP(nn.Module):
    """Linear -> GELU -> Linear -> ReLU -> Linear, with a LayerNorm on the input."""

    def __init__(self, d_in: int = 64, d_hidden: int = 128, d_out: int = 10):
        super().__init__()
        self.norm = nn.LayerNorm(d_in)
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.fc3 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        x = nn.functional.gelu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def build(seed: int = 0):
    """Return ``(model, example_inputs)``; weights and inputs depend only on ``seed``."""
    gen = torch.manual_seed(seed)
    model = MLP().eval()
    example_inputs = (torch.randn(4, 64, generator=gen),)
    return model, example_inputs


def save(path: str, seed: int = 0) -> None:
    """Export the model and write it with ``torch.export.save``."""
    model, example_inputs = build(seed)
    torch.export.save(torch.export.export(model, example_inputs), path)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "mlp.pt"
    save(out)
    print(f"wrote {out}")
