"""Each model adapter computes what eager PyTorch computes, removes its op, and lets the model import."""

import re

import pytest
import torch
import torch.nn.functional as F

from spyre_mlir.frontend import import_model
from spyre_mlir.frontend.adapters import ADAPTERS, MAX_TRIANGULAR_SCAN, adapt, select_adapters

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

aten = torch.ops.aten
BY_NAME = {a.name: a for a in ADAPTERS}


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def position_ids(mask):
    """Hugging Face's position ids from a (left-padded) attention mask."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)


def median(dim, keepdim=False, op=torch.median):
    fn = lambda x: op(x, dim, keepdim=keepdim)  # noqa: E731
    fn.dim = dim
    return fn


torch.manual_seed(0)  # the random inputs below are fixed
CASES = {
    # adapter name: (function, example inputs for export, further inputs to compare on)
    "cumsum-as-triangular-matmul": [
        (position_ids, (torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]),),
         [(torch.tensor([[0, 1, 1, 1, 1], [0, 0, 0, 0, 1]]),)]),
        (lambda x: x.cumsum(1), (torch.randn(2, 7, 3),), [(torch.randn(2, 7, 3) * 100,)]),
        (lambda x: x.cumsum(0, dtype=torch.float64), (torch.randn(5),), []),
        (lambda b: b.cumsum(-1), (torch.rand(3, 6) > 0.5,), [(torch.rand(3, 6) > 0.2,)]),
        # Infinities and NaN reach only the later sums; both infinities make NaN.
        (lambda x: x.cumsum(-1), (torch.tensor([[1.0, float("inf"), 2.0, 3.0, float("-inf"), 1.0],
                                                [float("nan"), 1.0, 2.0, 3.0, 4.0, 5.0],
                                                [1.0, 2.0, float("-inf"), 3.0, float("nan"), 1.0]]),),
         [(torch.randn(3, 6),)]),
    ],
    "cummax-as-masked-max": [
        (lambda x: torch.cummax(x, -1), (torch.randn(3, 9),),
         [(torch.tensor([[1.0, 3.0, 3.0, 2.0, 5.0, 5.0, 0.0, 5.0, -1.0]] * 3),),  # ties: last index
          (torch.tensor([[1.0, float("nan"), 2.0, float("nan"), 9.0, 0.0, 1.0, 2.0, 3.0]] * 3),)]),
        (lambda x: torch.cummax(x, 0), (torch.randint(-5, 5, (6, 2)),), [(torch.randint(-5, 5, (6, 2)),)]),
    ],
    "cummin-as-masked-min": [
        (lambda x: torch.cummin(x, 1), (torch.randn(2, 8),),
         [(torch.tensor([[4.0, 2.0, 2.0, 3.0, 1.0, 1.0, 5.0, 1.0]] * 2),),  # ties: last index
          (torch.tensor([[3.0, 2.0, float("nan"), 1.0, float("nan"), 0.0, 1.0, 2.0]] * 2),)]),
        (lambda x: torch.cummin(x, -1), (torch.randint(-9, 9, (3, 5), dtype=torch.int32),),
         [(torch.full((3, 5), 7, dtype=torch.int32),)]),
    ],
    "maximum-propagating-nan": [
        (torch.maximum, (torch.tensor([1.0, float("nan"), -2.0, 0.5]), torch.tensor([0.0, 0.0, float("nan"), 1.0])),
         [(torch.randn(4), torch.randn(4))]),
        (torch.minimum, (torch.tensor([1.0, float("nan"), -2.0]), torch.tensor([0.0, 0.0, float("nan")])), []),
        (torch.maximum, (torch.arange(6), torch.full((6,), 2, dtype=torch.int32)), []),   # int: promotion kept
    ],
    "hardtanh-as-clamp": [
        (F.hardtanh, (torch.tensor([-3.0, float("nan"), -0.5, 0.25, 2.0, float("inf")]),), [(torch.randn(6) * 2,)]),
        (lambda x: F.hardtanh(x, -2.0, 3.0), (torch.tensor([[-9.0, float("nan"), 2.5], [4.0, -1.0, 0.0]]),), []),
        (F.relu6, (torch.tensor([-1.0, float("nan"), 3.0, 7.0, -float("inf")]),), [(torch.randn(5) * 5,)]),
        (lambda x: torch.nn.ReLU6(inplace=True)(x.clone()), (torch.tensor([float("nan"), 8.0, -2.0, 1.5]),), []),
    ],
    "neg-of-integers": [
        (torch.neg, (torch.tensor([-123456789, 123456789, 2**40 + 3, 16777217, 0]),), [(torch.arange(-2, 3),)]),
        (lambda x: -x, (torch.tensor([[2**31 - 1, -(2**31), 16777217]], dtype=torch.int32),), []),
    ],
    "scalar-as-tensor": [
        (lambda x: (x | 3, x ^ 6, torch.bitwise_or(x, 8)), (torch.arange(-8, 8),), [(torch.arange(16) * 7,)]),
        (lambda x: (torch.fmod(x, 3), torch.fmod(x.float() * 1.3, 0.7), torch.fmod(x, 2.5)), (torch.arange(-8, 8),), []),
        (lambda b: b | True, (torch.tensor([True, False]),), []),
    ],
    "rms-norm-default-eps": [
        (lambda x: F.rms_norm(x, (16,)), (torch.randn(4, 16) * 1e-5,), [(torch.randn(4, 16),)]),
        (torch.nn.RMSNorm(16), (torch.randn(2, 3, 16) * 1e-4,), []),
    ],
    "distances-as-norms": [
        (lambda x, y: (torch.dist(x, y), torch.dist(x, y, 3), torch.dist(x, y, float("inf"))),
         (torch.randn(3, 5), torch.randn(3, 5)), [(torch.randn(3, 5), torch.randn(3, 5))]),
        (lambda x, y: (torch.cdist(x, y), torch.cdist(x, y, 1.0)), (torch.randn(2, 4, 6), torch.randn(2, 3, 6)), []),
        (lambda x: (F.pdist(x), F.pdist(x, 1.5)), (torch.randn(5, 3),), [(torch.randn(5, 3),)]),
    ],
    "view-copies-as-clones": [
        (lambda x: (torch.view_copy(x, (25, 5)), torch.permute_copy(x, (2, 0, 1)), torch.narrow_copy(x, 1, 2, 2),
                    torch.unbind_copy(x, 0)[1], torch.transpose_copy(x, 0, 2)), (torch.randn(5, 5, 5),), []),
    ],
    "fftshift-as-roll": [
        (lambda x: (torch.fft.fftshift(x), torch.fft.ifftshift(x), torch.fft.fftshift(x, dim=1)),
         (torch.arange(63.).reshape(7, 9),), []),
    ],
    "addmv-as-matmul": [
        (lambda b, m, v: torch.addmv(b, m, v), (torch.randn(5), torch.randn(5, 10), torch.randn(10)), []),
        (lambda b, m, v: torch.addmv(b, m, v, beta=0.2, alpha=0.6), (torch.randn(5), torch.randn(5, 10), torch.randn(10)),
         []),
        (lambda b, m, v: torch.addmv(b, m, v, beta=0), (torch.full((5,), float("nan")), torch.randn(5, 3), torch.randn(3)),
         []),
    ],
    "arg-extreme-of-scalar": [
        (lambda x: (x.argmax(), x.argmin(0, keepdim=True)), (torch.tensor(3.0),), []),
    ],
    "half-norm-in-float": [
        (lambda x: (torch.linalg.vector_norm(x, 4), x.norm(dim=-1)), (torch.randn(5, 5).half() * 15,), []),
        (lambda x: torch.linalg.vector_norm(x, 3, dim=0), (torch.randn(4, 6).bfloat16() * 100,), []),
    ],
    "isfinite-as-compare": [
        (torch.isfinite, (torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -0.0, 3e38]),),
         [(torch.randn(6),)]),
        (lambda x: torch.where(torch.isfinite(x), x, torch.zeros_like(x)), (torch.tensor([[float("inf"), 2.0]]),), []),
        (torch.isfinite, (torch.arange(4),), []),
    ],
    "self-equal-as-not-nan": [
        (lambda x: x == x, (torch.tensor([1.0, float("nan"), -float("inf"), 0.0]),), [(torch.randn(4),)]),
        (lambda x: torch.where(x == x, x, torch.zeros_like(x)), (torch.tensor([[float("nan"), 2.0], [3.0, 4.0]]),),
         []),
    ],
    "index-copy-as-selection": [
        (lambda c, x, i: c.index_copy(2, i, x), (torch.zeros(2, 3, 8, 4), torch.randn(2, 3, 2, 4),
                                                 torch.tensor([5, 1])),
         [(torch.randn(2, 3, 8, 4), torch.randn(2, 3, 2, 4), torch.tensor([7, 0]))]),
        (lambda c, x, i: c.index_copy(0, i, x), (torch.randn(6, 5), torch.randn(1, 5), torch.tensor([3])),
         [(torch.randn(6, 5), torch.randn(1, 5), torch.tensor([0]))]),
    ],
    "reciprocal-as-division": [
        (torch.reciprocal, (torch.tensor([0.0, -0.0, 2.0, -4.0, float("nan")]),), [(torch.randn(5),)]),
        (torch.reciprocal, (torch.tensor([0, 1, -2, 3]),), [(torch.tensor([5, 0, 0, -1]),)]),
        (lambda b: torch.reciprocal(b), (torch.tensor([True, False]),), []),
    ],
    "gelu-tanh": [
        (lambda x: torch.nn.functional.gelu(x, approximate="tanh"), (torch.linspace(-6, 6, 50),),
         [(torch.randn(50) * 3,)]),
    ],
    "logcumsumexp-by-mask": [
        (lambda x: torch.logcumsumexp(x, 0), (torch.randn(5, 5, 5) * 9,), [(torch.randn(5, 5, 5) + 100,)]),
        (lambda x: torch.logcumsumexp(x, -1), (torch.tensor([[0.0, float("-inf"), 2.0, -50.0]]),),
         [(torch.randn(1, 4),)]),
    ],
    "embedding-bag-by-assignment": [
        # per_sample_weights and a padding index; bag 2 empty
        (lambda i, w, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p, padding_idx=4),
         (torch.tensor([1, 2, 4, 5, 4, 4, 7]), torch.randn(10, 5), torch.tensor([0, 3, 5, 5]), torch.randn(7)),
         [(torch.tensor([0, 9, 9, 3, 4, 1, 2]), torch.randn(10, 5), torch.tensor([0, 0, 2, 6]), torch.randn(7))]),
        (lambda i, w, o: F.embedding_bag(i, w, o, mode="mean", include_last_offset=True),
         (torch.tensor([1, 2, 4, 5, 4, 4, 7]), torch.randn(10, 5), torch.tensor([0, 3, 5, 5, 7])),
         [(torch.tensor([3, 3, 3, 0, 1, 2, 9]), torch.randn(10, 5), torch.tensor([0, 1, 1, 6, 7]))]),
        (lambda i, w, o: F.embedding_bag(i, w, o, mode="max", padding_idx=2),
         (torch.tensor([1, 2, 4, 5, 4, 2, 7]), torch.randn(10, 5), torch.tensor([0, 3, 5, 6])),
         [(torch.tensor([2, 2, 2, 0, 1, 2, 9]), torch.randn(10, 5), torch.tensor([0, 3, 5, 7]))]),
    ],
    "scatter-mean-floor": [
        (lambda a, i, s: (a.scatter_reduce(0, i, s, "mean"), a.scatter_reduce(0, i, s, "mean", include_self=False)),
         (torch.tensor([[-7, 5, 3], [1, 1, 1], [4, 4, 4]]), torch.tensor([[0, 0, 0], [0, 1, 0]]),
          torch.tensor([[2, -4, 0], [1, 1, -9]])),
         [(torch.randint(-50, 50, (3, 3)), torch.randint(0, 3, (2, 3)), torch.randint(-50, 50, (2, 3)))]),
    ],
    "sort-stable-as-sort": [
        (lambda x: (torch.sort(x, stable=True), torch.argsort(x, dim=0, stable=True, descending=True)),
         (torch.randn(4, 6),), [(torch.randn(4, 6),)]),
    ],
    "group-norm-by-layer-norm": [
        (lambda x, w, b: F.group_norm(x, 4, w, b, eps=1e-3), (torch.randn(2, 8, 5, 3) * 3 + 1, torch.randn(8),
                                                               torch.randn(8)),
         [(torch.randn(2, 8, 5, 3), torch.randn(8), torch.randn(8))]),
        (lambda x: F.group_norm(x, 3), (torch.randn(4, 6, 10),), [(torch.randn(4, 6, 10) * 100,)]),
        (lambda x: F.group_norm(x, 1), (torch.randn(3, 5),), [(torch.randn(3, 5),)]),
    ],
    "median-by-sort": [
        (median(-1), (torch.randn(4, 7),), [(torch.randn(4, 7),)]),
        (median(0, keepdim=True), (torch.randn(6, 3),), [(torch.randn(6, 3),)]),
        (torch.median, (torch.randn(3, 5),), [(torch.arange(15.0).reshape(3, 5),),
                                                (torch.full((3, 5), float("nan")),)]),
        (median(1), (torch.randn(2, 5),),
         [(torch.tensor([[1.0, float("nan"), 2.0, 3.0, 4.0], [5.0, 1.0, 1.0, 1.0, 2.0]]),)]),
    ],
    "linalg-norm-by-vector-norm": [
        (lambda x: torch.linalg.norm(x), (torch.randn(3, 4, 5),), [(torch.randn(3, 4, 5) * 1e3,)]),
        (lambda x: (torch.linalg.norm(x, 1), torch.linalg.norm(x, float("inf")), torch.linalg.norm(x, "fro")),
         (torch.randn(5, 6),), [(torch.randn(5, 6),)]),
        (lambda x: (torch.linalg.norm(x, -float("inf"), (2, 0), keepdim=True), torch.linalg.norm(x, -1, (0, 1)),
                    torch.linalg.norm(x, "fro", (0, 2)), torch.linalg.norm(x, 3, 1)),
         (torch.randn(5, 6, 3),), [(torch.randn(5, 6, 3),)]),
        (lambda x: torch.linalg.norm(x, dim=-1), (torch.randn(4, 300).half() * 100,), []),   # sums in float32
    ],
    "addbmm-by-matmuls": [
        (lambda i, a, b: torch.addbmm(i, a, b, beta=2, alpha=3),
         (torch.randint(-5, 5, (3, 5), dtype=torch.int32), torch.randint(-5, 5, (4, 3, 6), dtype=torch.int32),
          torch.randint(-5, 5, (4, 6, 5), dtype=torch.int32)), []),
        (lambda i, a, b: torch.addbmm(i, a, b, beta=0),         # the NaN in the input is not read
         (torch.full((3, 5), float("nan"), dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64),
          torch.randn(2, 4, 5, dtype=torch.float64)), []),
        (lambda i, a, b: torch.addbmm(i, a, b), (torch.randn(5).half(), torch.randn(3, 2, 4).half(),
                                                 torch.randn(3, 4, 5).half()), []),
    ],
    "diagonal-scatter-by-index-put": [
        (lambda a, b: torch.diagonal_scatter(a, b, 1), (torch.randn(4, 5), torch.randn(4)), []),
        (lambda a, b: torch.diagonal_scatter(a, b, -1, 2, 0), (torch.randn(4, 3, 5), torch.randn(3, 4)), []),
    ],
    "erfc-by-erf": [
        (torch.erfc, (torch.linspace(-6, 10, 300),), [(torch.randn(300) * 4,)]),
        (torch.erfc, (torch.arange(-3, 4),), []),
    ],
    "hypot-scaled": [
        (torch.hypot, (torch.tensor([3.0, 0.0, 1e30, float("inf"), float("nan"), -2.0, 1e-30, float("nan")]),
                       torch.tensor([4.0, 0.0, 1e30, float("nan"), 1.0, 0.0, 1e-30, float("-inf")])),
         [(torch.randn(8), torch.randn(8))]),
        (torch.hypot, (torch.randn(8).half(), torch.randn(8).half()), []),
    ],
    "integer-powers-by-multiplication": [
        (lambda x: (x ** 5, torch.square(x), x ** 0, x ** 1), (torch.arange(-4, 60),),
         [(torch.randint(-2**40, 2**40, (64,)),)]),          # wraps as eager does
        (lambda x, y: (torch.square(x), x ** 3, x.int() ** 3, y ** 2.5), (torch.tensor([True, False]), torch.rand(4)),
         []),
    ],
    "isclose-of-integers": [
        (lambda a, b: (torch.isclose(a, b), torch.isclose(a, b, rtol=0.01, atol=0.5)),
         (torch.tensor([5, -3, 100, 7]), torch.tensor([6, -3, 101, 9])), []),
        (lambda a, b, x: (torch.isclose(a, b, rtol=0, atol=1), torch.isclose(x, x + 1e-9)),
         (torch.tensor([True, False, True]), torch.tensor([True, True, False]), torch.randn(3)), []),
    ],
    "angle-of-reals": [
        (torch.angle, (torch.tensor([1.0, -2.0, 0.0, float("nan"), -0.0, float("-inf")]),), []),
        (torch.angle, (torch.tensor([1, -2, 0]),), []),
    ],
    "erfcx-and-log-ndtr-by-fit": [
        (lambda x: (torch.special.erfcx(x), torch.special.log_ndtr(x)), (torch.linspace(-9, 30, 300),),
         [(torch.randn(300) * 5,)]),
        (torch.special.erfcx, (torch.arange(-3, 4),), []),
    ],
    "searchsorted-by-count": [
        (lambda s, v: (torch.searchsorted(s, v), torch.searchsorted(s, v, right=True, out_int32=True)),
         (torch.tensor([0.0, 1.0, 1.0, 2.0, 4.0]), torch.tensor([float("nan"), 1.0, -1.0, 7.0, 3.5, 4.0])),
         [(torch.sort(torch.randn(5))[0], torch.randn(6))]),
        (lambda s, v, o: torch.searchsorted(s, v, sorter=o, side="right"),
         (torch.tensor([3.0, 1.0, 2.0, 0.0]), torch.randn(2, 6), torch.tensor([3, 1, 2, 0])), []),
        (lambda s, v: torch.searchsorted(s, v), (torch.sort(torch.randn(2, 3, 5), -1)[0], torch.randn(2, 3, 4)), []),
        (lambda s: torch.searchsorted(s, 2.5), (torch.arange(5),), []),
    ],
    "put-by-index-put": [
        (lambda x, i, s: (torch.put(x, i, s), torch.put(x, i, s, accumulate=True)),
         (torch.randn(3, 4), torch.tensor([0, -1, 5, 7]), torch.randn(4)), []),
        (lambda x, i, s: torch.put(x, i, s, accumulate=True),
         (torch.zeros(2, 3, dtype=torch.int64), torch.tensor([[1, 1], [-6, 2]]), torch.tensor([[1, 2], [3, 4]])), []),
    ],
    "nanmedian-by-sort": [
        (median(1, op=torch.nanmedian),         # a slice of NaNs only: eager's index varies with its length
         (torch.tensor([[float("nan")] * 4, [1.0, float("nan"), 0.0, 5.0], [3.0, 2.0, 1.0, 0.5],
                        [4.0, float("inf"), float("nan"), 1.0]]),), []),
        (lambda x: (torch.nanmedian(x), torch.nanmedian(x, 0, keepdim=True)[0]),
         (torch.tensor([[1.0, float("nan"), 3.0], [2.0, 5.0, float("nan")]]),), [(torch.randn(2, 3),)]),
        (lambda x: torch.nanmedian(x, -1)[0], (torch.randint(-9, 9, (3, 5)),), []),
    ],
    "im2col-by-slices": [
        (lambda x: F.unfold(x, (2, 3), dilation=(1, 2), padding=1, stride=(2, 1)), (torch.randn(2, 3, 6, 7),),
         [(torch.randn(2, 3, 6, 7),)]),
        (lambda x: F.unfold(x, 2), (torch.randn(3, 6, 7),), []),
    ],
    "gamma-functions-by-series": [
        (lambda x: (torch.lgamma(x), torch.digamma(x)),
         (torch.cat([torch.linspace(-9.5, 20, 400), torch.tensor([0.0, -0.0, -1.0, -3.0, 1.0, 2.0, 1e-6, 1e5])]),),
         [(torch.randn(408) * 30,)]),
        (lambda x: (torch.lgamma(x), torch.digamma(x)), (torch.arange(-3, 5),), []),
        (lambda x: (torch.mvlgamma(x, 3), torch.polygamma(0, x), torch.special.polygamma(0, x)),
         (torch.rand(50) * 9 + 1.01,), []),
        (torch.erfinv, (torch.cat([torch.linspace(-1, 1, 401), torch.tensor([1.5, 0.999999, -0.9999999, 1e-30])]),),
         [(torch.rand(405) * 2 - 1,)]),
    ],
}


def test_every_adapter_is_documented_and_tested():
    assert len(BY_NAME) == len(ADAPTERS)
    for adapter in ADAPTERS:
        assert adapter.name and len(adapter.why) > 20 and adapter.decompositions
    assert set(CASES) == set(BY_NAME)


def _check_median(expected, actual, x, dim):
    """Values must match; among equal values (and NaNs) the index is unspecified, so check it points at the
    value."""
    (ev, _), (av, ai) = expected, actual
    torch.testing.assert_close(av, ev, equal_nan=True)
    picked = x.gather(dim % x.dim(), ai if ai.dim() == x.dim() else ai.unsqueeze(dim))
    torch.testing.assert_close(picked.reshape(av.shape), av, equal_nan=True)


@pytest.mark.parametrize("name, case", [(n, c) for n, cs in CASES.items() for c in cs],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_adapter_matches_eager(name, case):
    fn, example, more = case
    adapter = BY_NAME[name]
    ep = torch.export.export(Fn(fn), example)
    assert select_adapters(ep) == [adapter]
    adapted, applied = adapt(ep, [adapter])
    assert applied == [name]
    targets = set(adapter.decompositions)
    left = [n for n in adapted.graph.nodes if n.target in targets]
    assert not (left if not adapter.respells else [n for n in left if adapter.needed(n)]), "op still in the graph"
    run = adapted.module()
    for args in [example, *more]:
        expected, actual = fn(*args), run(*args)
        if name in ("median-by-sort", "nanmedian-by-sort") and hasattr(fn, "dim"):
            _check_median(expected, actual, args[0], fn.dim)
        else:
            torch.testing.assert_close(actual, expected, equal_nan=True, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_adapted_model_imports_to_linalg(name):
    fn, example, _ = CASES[name][0]
    result = import_model(Fn(fn), example)
    assert result.adapters == [name]
    assert "tm_tensor.scan" not in result.linalg_ir
    # Fully lowered: no Torch dialect op is left (data movement may lower to tensor ops alone).
    assert not re.search(r"\btorch\.(aten|operator|constant|prim|vtensor)", result.linalg_ir)
    assert re.search(r"\b(linalg|tensor|arith)\.", result.linalg_ir)


def test_long_scans_are_left_alone():
    ep = torch.export.export(Fn(lambda x: x.cumsum(-1)), (torch.randn(1, MAX_TRIANGULAR_SCAN + 1),))
    assert select_adapters(ep) == []


def test_large_max_bags_are_left_alone():
    fn = lambda i, w, o: F.embedding_bag(i, w, o, mode="max")  # noqa: E731
    n = 4096
    args = (torch.zeros(n, dtype=torch.long), torch.randn(2, 1024), torch.arange(0, n, 64))
    assert select_adapters(torch.export.export(Fn(fn), args)) == []


def test_histc_with_bounds_counts_like_eager():
    """torch.histc (mixture-of-experts token counts) has no Torch-MLIR lowering: it is always decomposed."""
    fn = lambda x: torch.histc(x, bins=5, min=0, max=4)  # noqa: E731
    x = torch.tensor([0.0, 4.0, 2.0, 2.0, 3.5, -1.0, 5.0, 1.0])
    adapted, _ = adapt(torch.export.export(Fn(fn), (x,)), [])
    assert not [n for n in adapted.graph.nodes if n.target == aten.histc.default]
    for args in [(x,), (torch.randint(-1, 6, (8,)).float(),)]:
        torch.testing.assert_close(adapted.module()(*args), fn(*args))


def _decomposed(ep):
    return str(ep.graph_module.code), str(ep.graph_signature)


@pytest.mark.parametrize("fn, example", [
    (torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), (torch.randn(2, 8),)),
    (torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.MaxPool2d(2), torch.nn.Flatten()),
     (torch.randn(1, 1, 8, 8),)),
    (Fn(lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True)), (torch.randn(1, 2, 4, 8),)),
    (Fn(lambda x: x.cumsum(-1) + F.gelu(x).matmul(x.T).mean()), (torch.randn(4, 4),)),
    (Fn(lambda x: (x > 0).cumsum(-1)), (torch.randn(3, 5),)),
], ids=["linear", "conv-pool", "sdpa", "cumsum-adapter", "bool-data"])
def test_decompositions_are_torchs(fn, example):
    """run_decompositions keeps torch's set of keepable CIA ops between calls; the program it gives is the one
    torch's own ep.run_decompositions gives for the same table (adapters, their entries for CIA ops included)."""
    from spyre_mlir.frontend import adapters

    ep = torch.export.export(fn, example)
    table = adapters.decomposition_table()
    for adapter in select_adapters(ep):
        table.update(adapter.decompositions)
    adapters.bool_data_in_int32(ep, table)
    # An entry of the table for a CIA op.
    table[torch.ops.aten.linear.default] = lambda x, w, b=None: x @ w.t() + (0 if b is None else b)
    for _ in range(2):           # the second call uses the kept set
        assert _decomposed(adapters.run_decompositions(ep, dict(table))) == \
            _decomposed(ep.run_decompositions(dict(table)))


def test_keepable_cia_ops_follow_new_registrations():
    """An op registered after the set was found (a custom op with a CompositeImplicitAutograd kernel) is in it,
    as torch would find it, and a program using it decomposes as torch's run_decompositions does."""
    from torch._export.utils import _collect_all_valid_cia_ops

    from spyre_mlir.frontend import adapters

    assert adapters._keepable_cia_ops() == frozenset(_collect_all_valid_cia_ops())
    lib = torch.library.Library("spyre_test_cia", "DEF")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")
    twice = torch.ops.spyre_test_cia.twice.default
    kept = adapters._keepable_cia_ops()
    assert twice in kept and kept == frozenset(_collect_all_valid_cia_ops())
    ep = torch.export.export(Fn(lambda x: torch.ops.spyre_test_cia.twice(x) + 1), (torch.randn(3),))
    for table in ({}, {twice: lambda x: x + x}):
        assert _decomposed(adapters.run_decompositions(ep, dict(table))) == \
            _decomposed(ep.run_decompositions(dict(table)))
