"""A fast slice of the Hugging Face model matrix (the whole matrix: `make models`, docs/models.md).

Every family once at each bar: ``fp32-reference`` on 1 core and ``dlf16`` on 32, with a left-padded attention mask
for text models, through ``spyre_mlir.compile``; a few families through ``torch.compile(backend="spyre")``.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
import matrix  # noqa: E402
import zoo  # noqa: E402

# Mixture-of-experts routing (top-k, the expert weight gather) still runs on the host; every other family's
# layers run wholly on the device.
HOST_IN_LAYERS_OK = {"qwen3-moe"}


def _case(family, precision, cores, entry="compile"):
    f = zoo.FAMILIES[family]
    return matrix.Case(family, f.attn[0], f.kind != "vision", entry, precision, cores)


@pytest.mark.parametrize("family", list(zoo.FAMILIES))
@pytest.mark.parametrize("precision,cores", [("fp32-reference", 1), ("dlf16", 32)])
def test_family(family, precision, cores):
    rec = matrix.run_case(_case(family, precision, cores))
    assert rec["status"] == "pass", rec.get("traceback") or rec
    if precision == "dlf16" and zoo.FAMILIES[family].causal and family not in HOST_IN_LAYERS_OK:
        in_layers = [h for h in rec["host_ops"] if h["in_layer"]]
        assert not in_layers, in_layers


@pytest.mark.parametrize("family", ["gpt2", "llama", "bert", "qwen3-moe"])
def test_family_torch_compile(family):
    rec = matrix.run_case(_case(family, "dlf16", 4, entry="torch.compile"))
    assert rec["status"] == "pass", rec.get("traceback") or rec


def test_host_op_source_lines():
    """Host work is attributed to the model's source: the function and whether it is inside a layer."""
    loc = ('loc(callsite("{f}":{a}:0 at "{f}":{b}:0))'
           .format(f=os.path.abspath(matrix.__file__), a=_line_of("def _compare"), b=_line_of("def main")))
    where, in_layer = matrix.describe(loc)
    assert where.startswith("matrix.py:") and where.endswith("_compare")
    assert not in_layer


def _line_of(text):
    with open(matrix.__file__) as f:
        for i, line in enumerate(f, 1):
            if line.startswith(text):
                return i + 1
    raise AssertionError(text)
