"""Model adapters: mathematically equivalent rewrites of ops the Torch-MLIR -> linalg path cannot handle.

Each adapter is a decomposition (a Python function over torch ops) for one or more ATen overloads. Adapters
are merged into Torch-MLIR's own decomposition table and applied by ``ep.run_decompositions(table)``
(:func:`run_decompositions`) before import, so they see the exported graph at the ATen level and their output
is traced like any other decomposition. The ops adapted here were found by importing models and small probes
with this torch-mlir version (20261001):

* ``aten.cumsum`` lowers to ``tm_tensor.scan``, a sequential scan outside linalg that later Spyre stages
  cannot map; Hugging Face models use it to build position ids from the attention mask.
* ``aten.cummax``, ``aten.cummin`` and ``aten.median.dim`` fail in the torch backend pipeline ("failed to legalize
  operation 'torch.operator'").
* ``aten.as_strided`` (from ``unfold``-style views and group norm's decomposition) breaks Torch-MLIR's FX
  importer ("rewrite needs an owning GraphModule").
* ``aten.maximum`` / ``aten.minimum`` lower to ``cmpf ogt`` + ``select``, which drops a NaN in the first operand
  (PyTorch propagates NaN from either side).
* ``aten.hardtanh`` and ``aten.relu6`` lower to ``cmpf ogt`` / ``olt`` + ``select``, which turns a NaN into a
  bound; PyTorch computes them as ``clamp``, which keeps it (:func:`hardtanh_as_clamp`).
* ``aten.eq.Tensor`` of a float tensor with itself (``x == x``, a not-NaN test) is folded to true by
  Torch-MLIR; it is ``~isnan(x)`` (:func:`self_equal_as_not_nan`).
* ``aten.neg`` of an integer tensor lowers through f32 (``sitofp``, ``negf``, ``fptosi``), wrong beyond 2^24; it
  is ``x * -1`` (:func:`neg_of_integers`).
* ``aten.bitwise_or`` / ``bitwise_xor`` / ``fmod`` with a Python number fail to legalize; with a 0-d tensor of
  it they lower (:func:`scalar_as_tensor`).
* ``aten.rms_norm`` without ``eps`` lowers with no epsilon at all; PyTorch's default is the dtype's machine epsilon
  (:func:`rms_norm_default_eps`).
* ``aten.dist``, ``aten.cdist`` and ``aten.pdist`` fail to legalize; they are p-norms of differences
  (:func:`dist_as_norm`, :func:`cdist_as_norm`, :func:`pdist_as_norm`).
* The ``*_copy`` forms of views (``view_copy``, ``permute_copy``, ``narrow_copy``, ``unbind_copy``, ...) fail to
  legalize; each is its view, cloned (:func:`copy_of_view`).
* ``aten.fft_fftshift`` / ``fft_ifftshift`` fail to legalize; they are rolls by half of each dim
  (:func:`fftshift_as_roll`).
* ``aten.addmv`` fails to legalize; it is ``beta * input + alpha * (mat @ vec)`` (:func:`addmv_as_matmul`).
* ``aten.argmax`` / ``argmin`` of a 0-d tensor fail to legalize; the answer is 0 (:func:`arg_extreme_of_scalar`).
* ``aten.linalg_vector_norm`` of float16 / bfloat16 lowers in that type, so the powers overflow (a 4-norm of
  values near 15 is inf); PyTorch accumulates in float32 (:func:`half_norm_in_float`).
* ``aten.isfinite`` fails to legalize; it is ``abs(x) < inf`` (:func:`isfinite_as_compare`).
* ``aten.index_copy`` (Hugging Face's static KV cache) becomes a scatter; it is a selection matmul and a select
  (:func:`index_copy_as_selection`).
* ``aten.view`` of a value a decomposition made non-contiguous (GPT-2's attention output after the math form
  of SDPA) fails to re-trace; it copies first (:func:`view_of_contiguous`).
* ``aten.embedding_bag`` lowers ignoring ``per_sample_weights`` (a silently wrong sum) and fails to legalize in
  mean and max modes; it is a gather and an assignment matrix (:func:`embedding_bag_by_assignment`).
* ``aten.sort.stable`` fails to legalize; the plain sort it becomes is stable already.
* ``aten.scatter_reduce`` in mean mode divides integers rounding toward zero (PyTorch rounds down):
  :func:`scatter_mean_floor`.
* Arithmetic, comparisons and reductions on int8/uint8 tensors **crash the process** (a segfault in
  TorchToLinalg building 8-bit scalar ops, e.g. ``uint8 * 7``, ``// 3``, ``.max()``). They are computed in int32
  and converted back (:func:`widen_narrow_integers`): exact, since 8-bit wrap-around is int32 arithmetic
  truncated, and comparisons, division and extrema do not depend on the width.

To add an adapter: write the decomposition, add an :class:`Adapter` to ``ADAPTERS`` with its reason, and a
test in ``test/unit/test_adapters.py`` comparing the adapted program with eager PyTorch.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch

aten = torch.ops.aten

# A scan over more elements than this would build an n x n triangular matrix too large to be worth it.
MAX_TRIANGULAR_SCAN = 4096


@dataclasses.dataclass(frozen=True)
class Adapter:
    """A named rewrite: ``decompositions`` maps ATen overloads to equivalent torch code.

    ``applies(node)`` may veto the rewrite for one occurrence (e.g. a scan too long for the triangular
    form); the adapter is used only when every occurrence in the program accepts it, and ``needed(node)`` holds
    for one (a rewrite that leaves some occurrences as they are).
    """

    name: str
    why: str
    decompositions: dict
    applies: Callable[[torch.fx.Node], bool] = lambda node: True
    needed: Callable[[torch.fx.Node], bool] = lambda node: True
    # In-place forms in the exported graph that functionalization turns into the decomposed ops.
    inplace: tuple = ()
    # The op stays in the graph with its arguments spelled out (``needed`` no longer holds for it).
    respells: bool = False


def _scan_length(node: torch.fx.Node) -> int:
    x = node.args[0].meta["val"]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs["dim"]
    return int(x.shape[dim]) if x.dim() else 1


def cumsum_as_triangular_matmul(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``cumsum(x, dim)`` as ``x @ U`` along ``dim``, with ``U`` the upper-triangular ones matrix
    (``U[j, i] = 1`` for ``j <= i``, so ``out[i] = sum_{j<=i} x[j]``). Exact for integers; for floats the
    summation order differs from a sequential scan only by rounding. A matmul maps onto the PT array.
    An infinity or NaN would reach the earlier sums too (times 0 is NaN): real floats sum their finite parts,
    and a prefix holding a NaN, or both infinities, is NaN, else one infinity is it, as a running sum gives."""
    if dtype is None:
        # cumsum promotes integer and bool inputs to int64.
        dtype = x.dtype if x.dtype.is_floating_point or x.dtype.is_complex else torch.int64
    x = x.to(dtype)
    if x.dim() == 0:
        return x.clone()
    n = x.shape[dim]
    upper = torch.ones(n, n, dtype=dtype, device=x.device).triu()
    xt = x.movedim(dim, -1)
    if not dtype.is_floating_point:
        return torch.matmul(xt, upper).movedim(-1, dim)
    zero = torch.zeros((), dtype=dtype, device=x.device)

    def seen(mask):         # whether x[j] for some j <= i is special in this way
        return torch.matmul(mask.to(dtype), upper) > 0

    out = torch.matmul(torch.where(xt.abs() < float("inf"), xt, zero), upper)    # (isfinite does not lower)
    pos, neg = seen(xt == float("inf")), seen(xt == float("-inf"))
    out = torch.where(pos, torch.full((), float("inf"), dtype=dtype, device=x.device), out)
    out = torch.where(neg, torch.full((), float("-inf"), dtype=dtype, device=x.device), out)
    out = torch.where(seen(xt.isnan()) | (pos & neg), torch.full((), float("nan"), dtype=dtype, device=x.device), out)
    return out.movedim(-1, dim)


def _cumulative_extreme(x: torch.Tensor, dim: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Running max (or min) over a lower-triangular mask: ``values[i] = max_{j<=i} x[j]`` and ``indices[i]``
    = the last ``j <= i`` holding that value (PyTorch's tie rule). A NaN, once seen, is the running value
    and its index is the last NaN so far, as in eager."""
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    xt = x.movedim(dim, -1)
    n = xt.shape[-1]
    seen = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()  # seen[i, j] = j <= i
    grid = xt.unsqueeze(-2).expand(*xt.shape[:-1], n, n)  # grid[..., i, j] = x[..., j]
    # The identity of the reduction fills the unseen positions. torch.full, not torch.tensor: a tensor
    # literal in a decomposition is an unfunctional lift_fresh_copy.
    if x.dtype.is_floating_point:
        identity = float("-inf") if largest else float("inf")
    elif x.dtype == torch.bool:
        identity = not largest
    else:
        identity = torch.iinfo(x.dtype).min if largest else torch.iinfo(x.dtype).max
    fill = torch.full((), identity, dtype=x.dtype, device=x.device)
    masked = torch.where(seen, grid, fill)
    values = masked.amax(-1) if largest else masked.amin(-1)  # both propagate NaN, like eager
    hit = grid == values.unsqueeze(-1)
    if x.dtype.is_floating_point:
        hit = hit | (grid.isnan() & values.isnan().unsqueeze(-1))
    positions = torch.arange(n, device=x.device)
    indices = torch.where(seen & hit, positions, -1).amax(-1)
    return values.movedim(-1, dim), indices.movedim(-1, dim)


def cummax_as_masked_max(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``cummax(x, dim)`` as a max over a lower-triangular mask (see ``_cumulative_extreme``)."""
    return _cumulative_extreme(x, dim, largest=True)


def cummin_as_masked_min(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``cummin(x, dim)`` as a min over a lower-triangular mask (see ``_cumulative_extreme``)."""
    return _cumulative_extreme(x, dim, largest=False)


def logcumsumexp_by_mask(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``logcumsumexp(x, dim)``: element i is the logsumexp of elements 0..i, over a lower-triangular mask (the
    others -inf). logsumexp subtracts its max first, as PyTorch's running log-add-exp does in effect; the
    table's log(cumsum(exp(x))) overflows above x = 88 and loses the small terms. Complex: the table's."""
    if x.dtype.is_complex:
        return NotImplemented
    if x.dim() == 0:
        return x.clone()
    n = x.shape[dim]
    keep = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()        # [i, j]: j <= i
    rows = x.movedim(dim, -1).unsqueeze(-2).expand(*x.movedim(dim, -1).shape[:-1], n, n)
    masked = rows.masked_fill(~keep, float("-inf"))
    return torch.logsumexp(masked, dim=-1).movedim(-1, dim)


def median_by_sort(x: torch.Tensor, dim: int, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``median(x, dim)``: the lower median, element ``(n - 1) // 2`` of the sorted slice, with its index.
    A slice holding a NaN has median NaN (PyTorch's rule), reported at the first NaN's index. Among equal
    values the index may differ from eager's (PyTorch does not specify it); ``x[index] == value`` holds."""
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    n = x.shape[dim]
    ordered, order = torch.sort(x, dim=dim)  # aten.sort.stable does not lower in this torch-mlir
    values = ordered.narrow(dim, (n - 1) // 2, 1)
    indices = order.narrow(dim, (n - 1) // 2, 1)
    if x.dtype.is_floating_point:
        nan = x.isnan()
        has_nan = nan.any(dim, keepdim=True)
        values = torch.where(has_nan, torch.full_like(values, float("nan")), values)
        indices = torch.where(has_nan, nan.to(torch.int64).argmax(dim, keepdim=True), indices)
    if not keepdim:
        values, indices = values.squeeze(dim), indices.squeeze(dim)
    return values, indices


def median_of_all(x: torch.Tensor) -> torch.Tensor:
    """``median(x)`` without a dim: the median of all elements (:func:`median_by_sort` of the flat tensor)."""
    return median_by_sort(x.reshape(-1), 0)[0]


MAX_INDEX_COPY_TABLE = 1 << 22


def _index_copy_fits(x, dim, index, source) -> bool:
    """Tensors with the dimension (0-d ones are left to Torch-MLIR) and a selection table of bounded size."""
    return (x.dim() >= 1 and source.dim() == x.dim() and index.dim() <= 1
            and x.shape[dim % x.dim()] * max(1, index.numel()) <= MAX_INDEX_COPY_TABLE)


def index_copy_as_selection(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``index_copy(x, dim, index, source)`` (a KV cache written at run-time positions) as data flow: a 0/1
    selection matrix ``S[l, t] = (index[t] == l)`` built from the positions, the new rows gathered to their
    places with a matmul over ``t`` and selected where some ``t`` hits. No scatter: the device runs it, and the
    positions stay an input (no recompile per step)."""
    dim = dim % x.dim()
    length = x.shape[dim]
    slots = torch.arange(length, device=x.device, dtype=index.dtype)
    # hit[l, t]: new row t lands on slot l (index math on the positions alone, with the rest of it on the host).
    hit = slots.reshape(-1, 1) == index.reshape(1, -1)
    # The rows placed by a [L, T] @ [..., T, D] product over x's other dims: a KV cache's rows [B, H, T, D] are
    # multiplied as they are, and the result is already in the cache's layout (no transpose either way).
    if x.dim() == 1:
        placed = torch.matmul(hit.to(source.dtype), source)
    else:
        placed = torch.matmul(hit.to(source.dtype), source.movedim(dim, -2)).movedim(-2, dim)
    shape = [1] * x.dim()
    shape[dim] = length
    # Which slots a new row lands on, as [L, 1] when dim is not the last: reshaped to x's rank it keeps its
    # innermost dim, a view of the same bytes.
    covered = hit.any(-1, keepdim=dim != x.dim() - 1)
    return torch.where(covered.reshape(shape), placed, x)


def histc_as_counts(x: torch.Tensor, bins: int = 100, min: float = 0, max: float = 0) -> torch.Tensor:
    """``histc`` with explicit bounds as a compare-and-sum over the bins (a static shape; Torch-MLIR has no
    lowering). Mixture-of-experts layers count tokens per expert with it."""
    width = (max - min) / bins
    idx = ((x.reshape(-1) - min) / width).floor().clamp(0, bins - 1)
    inside = (x.reshape(-1) >= min) & (x.reshape(-1) <= max)
    hit = (idx.reshape(-1, 1) == torch.arange(bins, device=x.device, dtype=idx.dtype)) & inside.reshape(-1, 1)
    return hit.to(x.dtype).sum(0)


def grouped_mm_by_gather(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Hugging Face's ``grouped_mm_fallback`` (rows sorted by expert, ``offs`` the running row counts; a Python
    loop over data-dependent slices) as a static computation: each row's expert is the number of offsets at or
    below it, its weight is gathered and the rows multiplied at once; rows past the last offset are zero."""
    rows = torch.arange(input.shape[0], device=input.device, dtype=offs.dtype)
    expert = (offs.reshape(1, -1) <= rows.reshape(-1, 1)).to(torch.int64).sum(1).clamp(max=weight.shape[0] - 1)
    out = torch.bmm(input.unsqueeze(1), weight[expert]).squeeze(1)
    return torch.where((rows < offs[-1]).reshape(-1, 1), out, torch.zeros_like(out))


def view_of_contiguous(x: torch.Tensor, size) -> torch.Tensor:
    """``view`` that copies a non-contiguous input first. A decomposition can change the strides of a value
    the exported graph viewed: the math form of ``scaled_dot_product_attention`` returns a transposed layout
    where the fused kernel returned a contiguous one, and GPT-2's ``x.view(-1, d)`` after
    ``transpose(1, 2).reshape(...)`` then no longer traces. Values have no aliasing after functionalization,
    so the copy changes nothing but the layout."""
    if x.is_contiguous():
        return NotImplemented          # the plain view
    return aten.view.default(x.contiguous(), size)


def as_strided_by_gather(x: torch.Tensor, size, stride, storage_offset=None) -> torch.Tensor:
    """``as_strided`` of a (functional, hence contiguous) tensor as a gather from its flattened elements: the
    element at index ``i`` is ``flat[offset + sum(i_k * stride_k)]``, with the index table built at trace time."""
    index = torch.full(tuple(size), int(storage_offset or 0), dtype=torch.int64, device=x.device)
    for k, (n, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[k] = n
        index = index + torch.arange(n, device=x.device).reshape(shape) * int(st)
    return x.reshape(-1)[index]


def _nan_propagating(x: torch.Tensor, y: torch.Tensor, take_x: torch.Tensor) -> torch.Tensor:
    dtype = torch.result_type(x, y)
    x, y = x.to(dtype), y.to(dtype)
    if dtype.is_floating_point:
        take_x = take_x | x.isnan()
    return torch.where(take_x, x, y)


def maximum_propagating_nan(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``maximum(x, y)`` with PyTorch's NaN rule (a NaN on either side is the result)."""
    return _nan_propagating(x, y, x > y)


def minimum_propagating_nan(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``minimum(x, y)`` with PyTorch's NaN rule."""
    return _nan_propagating(x, y, x < y)


def hardtanh_as_clamp(x: torch.Tensor, min_val: float = -1.0, max_val: float = 1.0) -> torch.Tensor:
    """``hardtanh(x, min_val, max_val)`` as ``clamp(x, min_val, max_val)``, PyTorch's own definition of it (a NaN
    stays NaN). Integers (no NaN) keep the table's lowering: Torch-MLIR's clamp of integers by float bounds
    fails."""
    if not x.dtype.is_floating_point:
        return NotImplemented
    return torch.clamp(x, min_val, max_val)


def relu6_as_clamp(x: torch.Tensor) -> torch.Tensor:
    """``relu6(x)`` as ``clamp(x, 0, 6)`` (floats, as :func:`hardtanh_as_clamp`)."""
    if not x.dtype.is_floating_point:
        return NotImplemented
    return torch.clamp(x, 0.0, 6.0)


def _self_compare(node: torch.fx.Node) -> bool:
    return len(node.args) > 1 and node.args[0] is node.args[1]


def self_equal_as_not_nan(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x == x`` of a float tensor as ``~isnan(x)``: what it is, where Torch-MLIR's folding makes it all true."""
    if x is not y or not x.dtype.is_floating_point:
        return NotImplemented
    return ~torch.isnan(x)


def neg_of_integers(x: torch.Tensor) -> torch.Tensor:
    """``-x`` of an integer tensor as ``x * -1``: exact, wrapping like PyTorch's at the type's minimum. Floats:
    the table's."""
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        return NotImplemented
    return torch.mul(x, -1)


def _input(node: torch.fx.Node):
    """The example value (FakeTensor) of an op's first argument, or None."""
    return node.args[0].meta.get("val") if node.args and isinstance(node.args[0], torch.fx.Node) else None


def _integer_input(node: torch.fx.Node) -> bool:
    val = _input(node)
    return val is not None and not (val.dtype.is_floating_point or val.dtype.is_complex)


def scalar_as_tensor(tensor_op):
    """``op.Scalar(x, s)`` as ``op.Tensor(x, tensor(s))``, the 0-d tensor in the scalar's promoted type (a 0-d
    tensor promotes like a Python number)."""
    def decomposition(x: torch.Tensor, other) -> torch.Tensor:
        return tensor_op(x, torch.full((), other, dtype=torch.result_type(x, other), device=x.device))
    decomposition.__doc__ = f"``{tensor_op}`` of a tensor and a Python number, as of two tensors."
    return decomposition


def _no_eps(node: torch.fx.Node) -> bool:
    eps = node.args[3] if len(node.args) > 3 else node.kwargs.get("eps")
    return eps is None


def rms_norm_default_eps(x: torch.Tensor, normalized_shape, weight=None, eps=None) -> torch.Tensor:
    """``rms_norm`` with its default epsilon spelled out: ``torch.finfo(x.dtype).eps`` (PyTorch's rule)."""
    if eps is not None:
        return NotImplemented
    return aten.rms_norm.default(x, normalized_shape, weight, torch.finfo(x.dtype).eps)


def _norm(d: torch.Tensor, p, dim=None) -> torch.Tensor:
    """``vector_norm(d, p, dim)``, a float16 / bfloat16 ``d`` accumulated in float32 (:func:`half_norm_in_float`)."""
    if d.dtype in (torch.float16, torch.bfloat16):
        return torch.linalg.vector_norm(d.float(), p, dim=dim).to(d.dtype)
    return torch.linalg.vector_norm(d, p, dim=dim)


def dist_as_norm(x: torch.Tensor, y: torch.Tensor, p=2) -> torch.Tensor:
    """``dist(x, y, p)``: the p-norm of ``x - y`` over all elements, its definition."""
    return _norm(x - y, p)


def cdist_as_norm(x1: torch.Tensor, x2: torch.Tensor, p: float = 2.0, compute_mode=None) -> torch.Tensor:
    """``cdist(x1, x2, p)``: the p-norm of every row difference, [..., P, M] x [..., R, M] -> [..., P, R], by its
    definition (PyTorch's matmul form for large Euclidean inputs differs from it by rounding only)."""
    return _norm(x1.unsqueeze(-2) - x2.unsqueeze(-3), p, dim=-1)


def pdist_as_norm(x: torch.Tensor, p: float = 2.0) -> torch.Tensor:
    """``pdist(x, p)``: the p-norm distance of rows i < j of [N, M] ``x``, in row-major order of the pairs."""
    i, j = torch.triu_indices(x.shape[0], x.shape[0], 1, device=x.device)
    return _norm(x.index_select(0, i) - x.index_select(0, j), p, dim=-1)


def copy_of_view(view_op):
    """``<view>_copy(x, ...)`` as ``<view>(x, ...)`` cloned (each result of a multi-result view)."""
    def decomposition(x: torch.Tensor, *args, **kwargs):
        out = view_op(x, *args, **kwargs)
        return [o.clone() for o in out] if isinstance(out, (tuple, list)) else out.clone()
    decomposition.__doc__ = f"``{view_op}`` cloned."
    return decomposition


def fftshift_as_roll(inverse: bool):
    """``fft.fftshift(x, dim)`` as ``roll`` by ``n // 2`` along each dim (all by default); ``ifftshift`` by
    ``-(n // 2)``."""
    def decomposition(x: torch.Tensor, dim=None) -> torch.Tensor:
        dims = list(range(x.dim())) if dim is None else [dim] if isinstance(dim, int) else list(dim)
        shifts = [(-(x.shape[d] // 2) if inverse else x.shape[d] // 2) for d in dims]
        return torch.roll(x, shifts, dims) if dims else x.clone()
    return decomposition


def addmv_as_matmul(input: torch.Tensor, mat: torch.Tensor, vec: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    """``addmv``: ``beta * input + alpha * (mat @ vec)``; with ``beta`` 0 the input is not read (a NaN there does
    not propagate), PyTorch's rule."""
    out = torch.matmul(mat, vec)
    if not out.dtype.is_floating_point:         # integer tensors take the factors as integers (truncated)
        alpha, beta = int(alpha), int(beta)
    if alpha != 1:
        out = out * alpha
    if beta == 0:
        return out.expand(torch.broadcast_shapes(input.shape, out.shape)).clone()
    return out + (input if beta == 1 else input * beta)


def _scalar_input(node: torch.fx.Node) -> bool:
    val = _input(node)
    return val is not None and val.dim() == 0


def arg_extreme_of_scalar(x: torch.Tensor, dim=None, keepdim: bool = False) -> torch.Tensor:
    """``argmax`` / ``argmin`` of a 0-d tensor: 0 (the only index), 0-d whatever ``dim`` and ``keepdim``."""
    if x.dim() != 0:
        return NotImplemented
    return torch.zeros((), dtype=torch.int64, device=x.device)


_VIEW_COPIES = {aten.view_copy.default: aten.view.default, aten.permute_copy.default: aten.permute.default,
                aten.unbind_copy.int: aten.unbind.int, aten.narrow_copy.default: aten.narrow.default,
                aten.transpose_copy.int: aten.transpose.int, aten.expand_copy.default: aten.expand.default,
                aten.select_copy.int: aten.select.int, aten.slice_copy.Tensor: aten.slice.Tensor,
                aten.diagonal_copy.default: aten.diagonal.default, aten.t_copy.default: aten.t.default,
                aten.squeeze_copy.default: aten.squeeze.default, aten.squeeze_copy.dim: aten.squeeze.dim,
                aten.squeeze_copy.dims: aten.squeeze.dims, aten.unsqueeze_copy.default: aten.unsqueeze.default,
                aten.detach_copy.default: aten.detach.default, aten.alias_copy.default: aten.alias.default}


def _half_input(node: torch.fx.Node) -> bool:
    val = _input(node)
    return val is not None and val.dtype in (torch.float16, torch.bfloat16)


def half_norm_in_float(x: torch.Tensor, ord=2, dim=None, keepdim: bool = False, *, dtype=None) -> torch.Tensor:
    """``vector_norm`` of a float16 / bfloat16 tensor computed in float32 and rounded once to the result type, as
    PyTorch's kernel accumulates it."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        return NotImplemented
    out = aten.linalg_vector_norm.default(x.float(), ord, dim, keepdim)
    return out.to(dtype or x.dtype)


def isfinite_as_compare(x: torch.Tensor) -> torch.Tensor:
    """``isfinite(x)`` as ``abs(x) < inf`` (False for NaN and both infinities); integers and bools are finite.
    Complex: the table's."""
    if x.dtype.is_complex:
        return NotImplemented
    if not x.dtype.is_floating_point:
        return torch.ones_like(x, dtype=torch.bool)
    return x.abs() < float("inf")


def reciprocal_as_division(x: torch.Tensor) -> torch.Tensor:
    """``reciprocal(x)`` as ``1 / x`` in x's float type (integers and bools in the default float type), which
    gives PyTorch's infinity for 0; complex tensors keep the table's lowering."""
    if x.dtype.is_complex:
        return NotImplemented
    xf = x if x.dtype.is_floating_point else x.to(torch.result_type(x, 1.0))
    return torch.div(torch.ones_like(xf), xf)


def _approximate(node: torch.fx.Node) -> str:
    return node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")


def gelu_tanh(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """``gelu(x, approximate="tanh")`` as PyTorch's CPU kernel computes it, with the constant sqrt(2/pi) to
    float precision; ``approximate="none"`` keeps the table's lowering (erf)."""
    if approximate != "tanh":
        return NotImplemented
    inner = (math.sqrt(2.0) * (2.0 / math.sqrt(math.pi)) * 0.5) * (x + 0.044715 * (x * x * x))
    return 0.5 * x * (1.0 + torch.tanh(inner))


def _integer_mean(node: torch.fx.Node) -> bool:
    reduce = node.kwargs.get("reduce", node.args[4] if len(node.args) > 4 else None)
    dtype = node.args[0].meta["val"].dtype
    return reduce == "mean" and not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def scatter_mean_floor(x, dim, index, src, reduce, include_self=True):
    """``scatter_reduce(..., "mean")`` of integers as PyTorch computes it: the sum over the count, rounded down
    (Torch-MLIR divides rounding toward zero); a position nothing is scattered to keeps its value. Other reductions
    and dtypes keep the table's lowering."""
    if reduce != "mean" or x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        return NotImplemented
    total = torch.zeros_like(x).scatter_add(dim, index, src)
    count = torch.zeros_like(x).scatter_add(dim, index, torch.ones_like(src))
    if include_self:
        total, count = total + x, count + 1
    mean = torch.div(total, count.clamp(min=1), rounding_mode="floor")
    return torch.where(count > 0, mean, x)


def sort_stable_as_sort(x, *, stable=None, dim=-1, descending=False):
    """``sort(stable=...)`` as ``sort``: its lowering (tm_tensor.sort, an exchange sort that swaps only elements
    strictly out of order) keeps equal elements in index order, which is what ``stable=True`` asks."""
    return aten.sort.default(x, dim, descending)


def argsort_stable_as_sort(x, *, stable=None, dim=-1, descending=False):
    return aten.sort.default(x, dim, descending)[1]


# embedding_bag's max mode compares every bag with every position: [bags, positions, dim] elements at most.
MAX_BAG_COMPARE = 1 << 22


def _bag_args(node: torch.fx.Node) -> tuple:
    """(weight, indices, offsets, mode, per_sample_weights, include_last_offset) of an embedding_bag node, as
    meta tensors or values."""
    a = [x.meta["val"] if isinstance(x, torch.fx.Node) else x for x in node.args]
    names = ("weight", "indices", "offsets", "scale_grad_by_freq", "mode", "sparse", "per_sample_weights",
             "include_last_offset")
    v = dict(zip(names, a)) | {k: (x.meta["val"] if isinstance(x, torch.fx.Node) else x)
                                for k, x in node.kwargs.items()}
    return (v["weight"], v["indices"], v["offsets"], v.get("mode", 0), v.get("per_sample_weights"),
            v.get("include_last_offset", False))


def _bag_fits(node: torch.fx.Node) -> bool:
    weight, indices, offsets, mode, _, last = _bag_args(node)
    if indices.dim() != 1 or offsets is None or offsets.dim() != 1:
        return False
    bags = offsets.shape[0] - (1 if last else 0)
    return mode != 2 or bags * indices.shape[0] * weight.shape[1] <= MAX_BAG_COMPARE


def embedding_bag_by_assignment(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                                per_sample_weights=None, include_last_offset=False, padding_idx=None):
    """``embedding_bag`` (sum, mean or max of the rows of ``weight`` each bag of ``indices`` selects, bag b
    starting at ``offsets[b]``) as a gather of the rows and a [bags, positions] assignment matrix: sum and mean
    multiply by it (a matmul), max reduces the rows masked by it. Positions equal to ``padding_idx`` belong to
    no bag; an empty bag gives zeros. The other three results are PyTorch's CPU values (offset2bag, bag sizes,
    max indices), which only backward reads. ``scale_grad_by_freq`` and ``sparse`` concern gradients only."""
    n = indices.shape[0]
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    pos = torch.arange(n, device=indices.device)
    bag = (offsets[:bags].unsqueeze(0) <= pos.unsqueeze(1)).sum(1) - 1
    valid = bag >= 0
    if include_last_offset:
        valid = valid & (pos < offsets[bags])
    if padding_idx is not None:
        valid = valid & (indices != padding_idx)
    assign = (bag.unsqueeze(0) == torch.arange(bags, device=indices.device).unsqueeze(1)) & valid.unsqueeze(0)
    rows = weight[indices]
    count = assign.sum(1)
    if mode == 2:
        masked = torch.where(assign.unsqueeze(2), rows.unsqueeze(0), torch.full((), float("-inf"), dtype=weight.dtype))
        best, at = masked.max(1)
        out = torch.where(count.unsqueeze(1) > 0, best, torch.zeros((), dtype=weight.dtype))
        max_indices = torch.where(count.unsqueeze(1) > 0, indices[at], torch.full((), -1, dtype=indices.dtype))
    else:
        if per_sample_weights is not None:
            rows = rows * per_sample_weights.unsqueeze(1)
        out = assign.to(weight.dtype) @ rows
        if mode == 1:
            out = out / count.clamp(min=1).unsqueeze(1).to(weight.dtype)
        max_indices = count if mode == 1 else torch.zeros(bags, dtype=torch.int64)
    offset2bag = bag if mode else torch.zeros(0, dtype=torch.int64)
    bag_size = count if mode else torch.zeros(bags, dtype=torch.int64)
    return out, offset2bag, bag_size, max_indices


def _float_group_norm(node: torch.fx.Node) -> bool:
    return node.args[0].meta["val"].dtype in (torch.float32, torch.float16, torch.bfloat16)


def group_norm_by_layer_norm(x: torch.Tensor, num_groups: int, weight=None, bias=None, eps: float = 1e-5,
                             cudnn_enabled: bool = True) -> torch.Tensor:
    """``group_norm`` as a layer norm over each group's values (the same biased variance, in float as PyTorch's
    kernel computes half inputs), then the per-channel affine."""
    n, c = x.shape[0], x.shape[1]
    xg = x.reshape(n, num_groups, -1).float()
    y = torch.nn.functional.layer_norm(xg, xg.shape[-1:], eps=eps).reshape(n, c, -1)
    if weight is not None:
        y = y * weight.float().reshape(c, 1)
    if bias is not None:
        y = y + bias.float().reshape(c, 1)
    return y.reshape(x.shape).to(x.dtype)


_HALF = (torch.float16, torch.bfloat16)


def _norm_dims(x: torch.Tensor, dim) -> list[int] | None:
    return None if dim is None else [d % max(x.dim(), 1) for d in ([dim] if isinstance(dim, int) else dim)]


def _matrix_norm_ord(node: torch.fx.Node):
    """The ord of a ``linalg_norm`` that is a matrix norm (two dims given, or a 2-D input with an ord and no
    dims), else None (a vector norm)."""
    x = node.args[0].meta["val"]
    ord = node.args[1] if len(node.args) > 1 else node.kwargs.get("ord")
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
    dims = [dim] if isinstance(dim, int) else dim
    if ord is None or (dims is None and x.dim() != 2) or (dims is not None and len(dims) != 2):
        return None
    return ord


def linalg_norm_by_vector_norm(x: torch.Tensor, ord=None, dim=None, keepdim: bool = False, *,
                               dtype=None) -> torch.Tensor:
    """``linalg.norm``: a vector norm (no ord: the 2-norm of all elements; one dim) as ``vector_norm``; a matrix
    norm ('fro', 1, -1, inf, -inf) as the vector norm of its elements, or the extreme of its column (1) or row
    (inf) sums of absolute values, summed in float32 for float16 / bfloat16 as PyTorch's kernel does. The
    norms that need singular values ('nuc', 2, -2) are not adapted (see ``applies``)."""
    if dtype is not None:
        x = x.to(dtype)
    dims = _norm_dims(x, dim)
    if ord is None or ord == "fro" or (dims is not None and len(dims) == 1) or (dims is None and x.dim() == 1):
        p = 2 if ord in (None, "fro") else ord
        return half_norm_in_float(x, p, dims, keepdim) if x.dtype in _HALF else \
            aten.linalg_vector_norm.default(x, p, dims, keepdim)
    d0, d1 = dims if dims is not None else (0, 1)
    if ord in (math.inf, -math.inf):
        d0, d1 = d1, d0                 # the extreme over rows of the row sums
    sums = (x.float() if x.dtype in _HALF else x).abs().sum(d0, keepdim=True)
    out = sums.amax(d1, keepdim=True) if ord > 0 else sums.amin(d1, keepdim=True)
    if not keepdim:
        out = out.squeeze(max(d0, d1)).squeeze(min(d0, d1))
    return out.to(x.dtype)


def addbmm_by_matmuls(input: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta=1,
                      alpha=1) -> torch.Tensor:
    """``addbmm`` as PyTorch's CPU kernel computes it: one ``addmm`` a batch into the result, each rounded to the
    result type (``beta`` on the input first). With ``beta`` 0 the input is not read (a NaN there does not
    propagate)."""
    dt = input.dtype
    if not dt.is_floating_point:
        alpha, beta = int(alpha), int(beta)
    shape = (batch1.shape[1], batch2.shape[2])
    out = (input if beta == 1 else input * beta) if beta != 0 else torch.zeros(shape, dtype=dt)
    out = out.expand(shape)
    for b in range(batch1.shape[0]):
        out = torch.addmm(out, batch1[b], batch2[b], alpha=alpha)
    return out.clone()


def diagonal_scatter_by_index_put(input: torch.Tensor, src: torch.Tensor, offset: int = 0, dim1: int = 0,
                                  dim2: int = 1) -> torch.Tensor:
    """``diagonal_scatter``: ``src`` written on the diagonal (``offset``, over ``dim1`` and ``dim2``) of a copy of
    ``input``, as an ``index_put`` at the diagonal's positions."""
    n = max(input.dim(), 1)
    dim1, dim2 = dim1 % n, dim2 % n
    x = input.movedim((dim1, dim2), (0, 1))
    length = src.shape[-1]
    rows = torch.arange(length, device=input.device) + max(-offset, 0)
    cols = torch.arange(length, device=input.device) + max(offset, 0)
    out = torch.index_put(x, (rows, cols), src.movedim(-1, 0).to(input.dtype))
    return out.movedim((0, 1), (dim1, dim2))


def _erfc_fit(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For ``z >= 0``: ``(t, P(t))`` with ``erfc(z) = t exp(-z^2 + P(t))``, ``t = 1 / (1 + z/2)`` (Numerical
    Recipes' Chebyshev fit, relative error < 1.2e-7 for every z >= 0)."""
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806 + t * (
        0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))))
    return t, poly


def _float_of(x: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
    """``x`` in the type a special function computes it in (float32 for halves, integers and bools), and the
    result type PyTorch gives (the default float type for integers and bools)."""
    dt = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    return (x.float() if dt in _HALF or not x.dtype.is_floating_point else x), dt


def erfc_by_erf(x: torch.Tensor) -> torch.Tensor:
    """``erfc(x)``: ``1 - erf(x)`` below 0.5, where nothing cancels; above, :func:`_erfc_fit`, which keeps the
    small values ``1 - erf`` rounds to 0 (erfc(5) = 1.5e-12). Integers and bools give float32, as PyTorch."""
    if x.dtype.is_complex:
        return NotImplemented
    xf, dt = _float_of(x)
    t, poly = _erfc_fit(xf.abs())
    return torch.where(xf < 0.5, 1.0 - torch.erf(xf), t * torch.exp(-xf * xf + poly)).to(dt)


def erfcx_by_fit(x: torch.Tensor) -> torch.Tensor:
    """``erfcx(x) = exp(x^2) erfc(x)``: ``t exp(P(t))`` for ``x >= 0`` (:func:`_erfc_fit`; no overflow of
    ``exp(x^2)``), ``2 exp(x^2) - erfcx(-x)`` below (inf where PyTorch's overflows too)."""
    xf, dt = _float_of(x)
    t, poly = _erfc_fit(xf.abs())
    pos = t * torch.exp(poly)
    return torch.where(xf >= 0, pos, 2.0 * torch.exp(xf * xf) - pos).to(dt)


def log_ndtr_by_fit(x: torch.Tensor) -> torch.Tensor:
    """``log(ndtr(x))`` with ``ndtr(x) = erfc(-x / sqrt 2) / 2``: for ``x < 0`` the log of
    :func:`_erfc_fit` written out (``log(t / 2) - z^2 + P(t)``: no underflow in the far tail); for ``x >= 0``
    ``log1p(-erfc(x / sqrt 2) / 2)``, exact for the values near 0 there."""
    xf, dt = _float_of(x)
    z = xf.abs() * (1.0 / math.sqrt(2.0))
    t, poly = _erfc_fit(z)
    neg = torch.log(0.5 * t) - z * z + poly
    pos = torch.log1p(-0.5 * t * torch.exp(-z * z + poly))
    return torch.where(xf < 0, neg, pos).to(dt)


def hypot_scaled(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``hypot(x, y)`` as ``m sqrt(1 + (n/m)^2)`` with ``m``, ``n`` the larger and smaller magnitude (no overflow
    of the squares), 0 where both are 0, inf where either is infinite (even with a NaN), as C's hypot."""
    dt = torch.promote_types(x.dtype, y.dtype)
    a, b = x.to(dt).abs(), y.to(dt).abs()
    if dt in _HALF:
        a, b = a.float(), b.float()
    big, small = torch.maximum(a, b), torch.minimum(a, b)
    q = small / torch.where(big == 0, torch.ones_like(big), big)
    out = big * torch.sqrt(1.0 + q * q)
    # NaN and inf by hand: Torch-MLIR's maximum and minimum drop a NaN.
    out = torch.where((a != a) | (b != b), torch.full_like(out, math.nan), out)
    out = torch.where((a == math.inf) | (b == math.inf), torch.full_like(out, math.inf), out)
    return out.to(dt)


def power_of_integers(x: torch.Tensor, exponent) -> torch.Tensor:
    """``x ** n`` of an integer tensor and a non-negative integer ``n`` by repeated squaring, wrapping as
    PyTorch's integer kernel does (Torch-MLIR lowers integer powers only for floats). Other powers: the table's."""
    if x.dtype.is_floating_point or x.dtype.is_complex or not isinstance(exponent, (int, bool)) or exponent < 0:
        return NotImplemented
    n = int(exponent)
    if x.dtype == torch.bool:                   # powers of bools are int64
        x = x.to(torch.int64)
    out = torch.ones_like(x)
    base = x
    while n:
        if n & 1:
            out = out * base
        n >>= 1
        if n:
            base = base * base
    return out


def square_of_integers(x: torch.Tensor) -> torch.Tensor:
    """``square`` of integers as ``x * x`` (bools: ``square`` gives int64). Floats: the table's."""
    if x.dtype.is_floating_point or x.dtype.is_complex:
        return NotImplemented
    if x.dtype == torch.bool:
        x = x.to(torch.int64)
    return x * x


def _integer_power(node: torch.fx.Node) -> bool:
    e = node.args[1]
    return _integer_input(node) and isinstance(e, (int, bool)) and e >= 0


def isclose_of_integers(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-8,
                        equal_nan: bool = False) -> torch.Tensor:
    """``isclose`` of integers or bools, as PyTorch computes it: equal, or ``|a - b| <= atol + |rtol * b|``
    with the bound in the default float type; bools compare as the integers 0 and 1. Floats: the table's."""
    if a.dtype.is_floating_point or a.dtype.is_complex:
        return NotImplemented
    if a.dtype == torch.bool or b.dtype == torch.bool:
        a, b = a.to(torch.int64), b.to(torch.int64)
    close = a == b
    if rtol == 0 and atol == 0:
        return close
    allowed = atol + (b * rtol).abs()
    return close | ((a - b).abs().to(allowed.dtype) <= allowed)


def angle_of_reals(x: torch.Tensor) -> torch.Tensor:
    """``angle`` of a real tensor: pi where negative, else 0, NaN kept (integers give float32)."""
    if x.dtype.is_complex:
        return NotImplemented
    dt = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    xf = x.to(dt)
    out = torch.where(xf < 0, torch.full_like(xf, math.pi), torch.zeros_like(xf))
    return torch.where(xf != xf, xf, out)


MAX_SEARCH_COMPARISONS = 1 << 24


def searchsorted_by_count(sorted_sequence: torch.Tensor, self, *, out_int32: bool = False, right: bool = False,
                          side=None, sorter=None) -> torch.Tensor:
    """``searchsorted``: the number of sequence elements before each value, counted as a comparison of every
    value with every element (``seq < v`` for the left side, ``seq <= v`` for the right), written ``not (seq >=
    v)`` so that a NaN value lands at the end, where PyTorch's binary search puts it."""
    seq = sorted_sequence if sorter is None else sorted_sequence.gather(-1, sorter)
    values = self if isinstance(self, torch.Tensor) else torch.full((), self)
    upper = right or side == "right"
    s = seq if seq.dim() == 1 else seq.unsqueeze(-2)
    v = values.unsqueeze(-1)
    before = ~(s > v) if upper else ~(s >= v)
    return before.sum(-1).to(torch.int32 if out_int32 else torch.int64)


def _search_fits(node: torch.fx.Node) -> bool:
    seq, values = node.args[0].meta["val"], node.args[1]
    count = values.meta["val"].numel() if isinstance(values, torch.fx.Node) else 1
    return seq.shape[-1] * max(count, 1) <= MAX_SEARCH_COMPARISONS


def put_by_index_put(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor,
                     accumulate: bool = False) -> torch.Tensor:
    """``put``: an ``index_put`` into the flattened tensor (negative indices count from the end)."""
    flat = x.reshape(-1)
    idx = index.reshape(-1)
    idx = torch.where(idx < 0, idx + flat.numel(), idx)
    return torch.index_put(flat, (idx,), source.reshape(-1).to(x.dtype), accumulate).reshape(x.shape)


def nanmedian_by_sort(x: torch.Tensor, dim: int | None = None, keepdim: bool = False):
    """``nanmedian``: the lower median of each slice's non-NaN values (element ``(k - 1) // 2`` of them
    sorted, ``k`` of them), NaN at index 0 for a slice of NaNs only. NaNs sort as +inf (this torch-mlir's sort
    does not move a NaN); integers: :func:`median_by_sort`. Without ``dim``, the value over all elements."""
    if dim is None:
        return nanmedian_by_sort(x.reshape(-1), 0)[0]
    if not x.dtype.is_floating_point:
        return median_by_sort(x, dim, keepdim)
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64, device=x.device)
    nan = x.isnan()
    ordered, order = torch.sort(torch.where(nan, torch.full_like(x, math.inf), x), dim=dim)
    count = (~nan).sum(dim, keepdim=True)
    k = torch.div((count - 1).clamp(min=0), 2, rounding_mode="floor")
    values = torch.where(count == 0, torch.full_like(ordered.narrow(dim, 0, 1), math.nan), ordered.gather(dim, k))
    indices = torch.where(count == 0, torch.zeros_like(k), order.gather(dim, k))
    if not keepdim:
        values, indices = values.squeeze(dim), indices.squeeze(dim)
    return values, indices


MAX_KERNEL_POSITIONS = 1024


def im2col_by_slices(x: torch.Tensor, kernel_size, dilation, padding, stride) -> torch.Tensor:
    """``unfold`` (im2col): the padded input sliced once per kernel position (strided slices), stacked as
    ``[N, C, kh * kw, out_h, out_w]`` and flattened to ``[N, C * kh * kw, out_h * out_w]`` (channel-major,
    then kernel row, then column, as PyTorch orders them)."""
    batched = x.dim() == 4
    if not batched:
        x = x.unsqueeze(0)
    n, c, h, w = x.shape
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel_size, dilation, padding, stride
    xp = torch.nn.functional.pad(x, (pw, pw, ph, ph)) if ph or pw else x
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    cols = [xp[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
            for i in range(kh) for j in range(kw)]
    out = torch.stack(cols, 2).reshape(n, c * kh * kw, oh * ow)
    return out if batched else out.squeeze(0)


def _float64_of(x: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
    """``x`` in float64 and the result type PyTorch gives. The series below cancel (lgamma(3) = lgamma(11) -
    log(3 ... 10)): in float64 they run on the host, where reduced precision does not round their steps."""
    return x.to(torch.float64), (x.dtype if x.dtype.is_floating_point else torch.get_default_dtype())


def erfinv_by_fit(x: torch.Tensor) -> torch.Tensor:
    """``erfinv(x)``: Giles' single-precision polynomials in ``w = -log(1 - x^2)`` ("Approximating the erfinv
    function", GPU Computing Gems, 2011), then one Newton step on ``erf(y) = x`` (the error squares), in
    float64 (:func:`_float64_of`); +-inf at +-1, NaN beyond."""
    xf, dt = _float64_of(x)
    w = -torch.log((1.0 - xf) * (1.0 + xf))
    a = w - 2.5
    p = 2.81022636e-08
    for c in (3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503, -0.00417768164,
              0.246640727, 1.50140941):
        p = c + p * a
    b = torch.sqrt(w) - 3.0
    q = -0.000200214257
    for c in (0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613, 0.00943887047,
              1.00167406, 2.83297682):
        q = c + q * b
    y = torch.where(w < 5.0, p, q) * xf
    y = y - (torch.erf(y) - xf) / ((2.0 / math.sqrt(math.pi)) * torch.exp(-y * y))
    edge = xf.abs() == 1.0
    y = torch.where(edge, xf * math.inf, y)
    return torch.where(xf.abs() > 1.0, torch.full_like(y, math.nan), y).to(dt)


_SHIFT = 8      # lgamma and digamma move x below this up by recurrence, where their asymptotic series is exact


def _shifted(x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``x + 8`` where ``x < 8`` (else ``x``), and the recurrence's terms ``x + k`` (k < 8; 1 where there is no
    shift)."""
    low = x < _SHIFT
    terms = [torch.where(low, x + k, torch.ones_like(x)) for k in range(_SHIFT)]
    return torch.where(low, x + _SHIFT, x), terms


def _nonpositive_integer(x: torch.Tensor) -> torch.Tensor:
    return (x <= 0) & (x == torch.floor(x))


def lgamma_by_stirling(x: torch.Tensor) -> torch.Tensor:
    """``lgamma(x) = log|Gamma(x)|``: Stirling's series at ``z >= 8`` (to 1/z^7: relative error below 1e-12
    there), reached by ``lgamma(x) = lgamma(x + 8) - sum_k log|x + k|``; below 1/2 the reflection
    ``log(pi / |sin(pi x)|) - lgamma(1 - x)``; +inf at the poles (0, -1, ...), as PyTorch."""
    xf, dt = _float64_of(x)
    neg = xf < 0.5
    r = torch.where(neg, 1.0 - xf, xf)
    z, terms = _shifted(r)
    inv = 1.0 / z
    inv2 = inv * inv
    series = (z - 0.5) * torch.log(z) - z + 0.5 * math.log(2 * math.pi) + inv * (
        1.0 / 12 + inv2 * (-1.0 / 360 + inv2 * (1.0 / 1260 - inv2 / 1680)))
    out = series - sum(torch.log(t.abs()) for t in terms)
    # sin and tan of pi x taken at x's distance to the nearest integer (exact), not at pi x rounded.
    reflected = math.log(math.pi) - torch.log(torch.sin(math.pi * (xf - torch.round(xf))).abs()) - out
    out = torch.where(neg, reflected, out)
    out = torch.where(_nonpositive_integer(xf) | (xf.abs() == math.inf), torch.full_like(out, math.inf), out)
    return out.to(dt)


def digamma_by_series(x: torch.Tensor) -> torch.Tensor:
    """``digamma(x)``: the asymptotic series at ``z >= 8`` reached by ``psi(x) = psi(x + 8) - sum_k 1 / (x + k)``;
    below 1/2 the reflection ``psi(1 - x) - pi / tan(pi x)``; -inf at +0 and +inf at -0 (PyTorch's), NaN at the
    negative integers."""
    xf, dt = _float64_of(x)
    neg = xf < 0.5
    r = torch.where(neg, 1.0 - xf, xf)
    z, terms = _shifted(r)
    inv = 1.0 / z
    inv2 = inv * inv
    series = torch.log(z) - 0.5 * inv - inv2 * (1.0 / 12 - inv2 * (1.0 / 120 - inv2 * (1.0 / 252 - inv2 / 240)))
    # torch.div, not 1 / t: aten.reciprocal lowers with an assertion that no element is 0 (t is at a pole).
    one = torch.ones_like(xf)
    out = series - sum(torch.where(r < _SHIFT, torch.div(one, t), torch.zeros_like(t)) for t in terms)
    out = torch.where(neg, out - torch.div(math.pi * one, torch.tan(math.pi * (xf - torch.round(xf)))), out)
    zero = xf == 0
    out = torch.where(zero, torch.where(torch.div(one, xf) < 0, math.inf, -math.inf) * one, out)
    out = torch.where(_nonpositive_integer(xf) & ~zero, torch.full_like(out, math.nan), out)
    return out.to(dt)


def mvlgamma_by_lgamma(x: torch.Tensor, p: int) -> torch.Tensor:
    """``mvlgamma(x, p) = p (p - 1) / 4 log(pi) + sum_j lgamma(x - j / 2)`` (:func:`lgamma_by_stirling`)."""
    dt = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    xf = x.to(torch.float64)
    out = sum(lgamma_by_stirling(xf - j / 2) for j in range(p)) + p * (p - 1) / 4 * math.log(math.pi)
    return out.to(dt)


def polygamma_zero_by_digamma(n: int, x: torch.Tensor) -> torch.Tensor:
    """``polygamma(0, x)`` is ``digamma(x)`` (:func:`digamma_by_series`); other orders: the table's."""
    return digamma_by_series(x) if n == 0 else NotImplemented


ADAPTERS: list[Adapter] = [

    Adapter(
        name="maximum-propagating-nan",
        why="aten.maximum lowers to cmpf ogt + select, which loses a NaN first operand",
        decompositions={aten.maximum.default: maximum_propagating_nan, aten.minimum.default: minimum_propagating_nan},
    ),
    Adapter(
        name="hardtanh-as-clamp",
        why="aten.hardtanh and aten.relu6 lower to cmpf ogt/olt + select, which turns a NaN into a bound",
        decompositions={aten.hardtanh.default: hardtanh_as_clamp, aten.relu6.default: relu6_as_clamp},
        inplace=(aten.hardtanh_.default, aten.relu6_.default),
    ),
    Adapter(
        name="self-equal-as-not-nan",
        why="aten.eq.Tensor(x, x) folds to true in Torch-MLIR, wrong where x is NaN",
        decompositions={aten.eq.Tensor: self_equal_as_not_nan},
        needed=_self_compare,
    ),
    Adapter(
        name="neg-of-integers",
        why="aten.neg of integers lowers through f32 (sitofp, negf, fptosi), wrong beyond 2^24",
        decompositions={aten.neg.default: neg_of_integers},
        needed=_integer_input,
        inplace=(aten.neg_.default,),
    ),
    Adapter(
        name="scalar-as-tensor",
        why="aten.bitwise_or, bitwise_xor and fmod with a Python number fail to legalize in Torch-MLIR",
        decompositions={op: scalar_as_tensor(tensor_op) for op, tensor_op in (
            (aten.bitwise_or.Scalar, aten.bitwise_or.Tensor), (aten.__or__.Scalar, aten.bitwise_or.Tensor),
            (aten.bitwise_xor.Scalar, aten.bitwise_xor.Tensor), (aten.__xor__.Scalar, aten.bitwise_xor.Tensor),
            (aten.fmod.Scalar, aten.fmod.Tensor))},
    ),
    Adapter(
        name="rms-norm-default-eps",
        why="aten.rms_norm without eps lowers with no epsilon; PyTorch adds the dtype's machine epsilon",
        decompositions={aten.rms_norm.default: rms_norm_default_eps},
        needed=_no_eps,
        respells=True,
    ),
    Adapter(
        name="distances-as-norms",
        why="aten.dist, aten.cdist and aten.pdist fail to legalize in Torch-MLIR",
        decompositions={aten.dist.default: dist_as_norm, aten.cdist.default: cdist_as_norm,
                        aten._cdist_forward.default: cdist_as_norm, aten.pdist.default: pdist_as_norm,
                        aten._pdist_forward.default: pdist_as_norm},
    ),
    Adapter(
        name="view-copies-as-clones",
        why="the *_copy forms of views (view_copy, permute_copy, narrow_copy, unbind_copy, ...) fail to legalize",
        decompositions={**{op: copy_of_view(view) for op, view in _VIEW_COPIES.items()},
                        aten.as_strided_copy.default: lambda x, size, stride, storage_offset=None:
                            as_strided_by_gather(x, size, stride, storage_offset).clone()},
    ),
    Adapter(
        name="fftshift-as-roll",
        why="aten.fft_fftshift and fft_ifftshift fail to legalize in Torch-MLIR",
        decompositions={aten.fft_fftshift.default: fftshift_as_roll(False),
                        aten.fft_ifftshift.default: fftshift_as_roll(True)},
    ),
    Adapter(
        name="addmv-as-matmul",
        why="aten.addmv fails to legalize in Torch-MLIR",
        decompositions={aten.addmv.default: addmv_as_matmul},
    ),
    Adapter(
        name="arg-extreme-of-scalar",
        why="aten.argmax / argmin of a 0-d tensor fail to legalize in Torch-MLIR",
        decompositions={aten.argmax.default: arg_extreme_of_scalar, aten.argmin.default: arg_extreme_of_scalar},
        needed=_scalar_input,
    ),
    Adapter(
        name="half-norm-in-float",
        why="aten.linalg_vector_norm of float16/bfloat16 lowers in that type and overflows; PyTorch accumulates "
        "in float32",
        decompositions={aten.linalg_vector_norm.default: half_norm_in_float},
        needed=_half_input,
        respells=True,
    ),
    Adapter(
        name="isfinite-as-compare",
        why="aten.isfinite fails to legalize in Torch-MLIR",
        decompositions={aten.isfinite.default: isfinite_as_compare},
    ),
    Adapter(
        name="cumsum-as-triangular-matmul",
        why="aten.cumsum lowers to tm_tensor.scan (a sequential scan outside linalg); Hugging Face models "
        "use it for position ids from the attention mask",
        decompositions={aten.cumsum.default: cumsum_as_triangular_matmul},
        applies=lambda node: _scan_length(node) <= MAX_TRIANGULAR_SCAN,
    ),
    Adapter(
        name="cummax-as-masked-max",
        why="aten.cummax fails to legalize in the torch backend pipeline",
        decompositions={aten.cummax.default: cummax_as_masked_max},
        applies=lambda node: _scan_length(node) <= MAX_TRIANGULAR_SCAN,
    ),
    Adapter(
        name="cummin-as-masked-min",
        why="aten.cummin fails to legalize in the torch backend pipeline",
        decompositions={aten.cummin.default: cummin_as_masked_min},
        applies=lambda node: _scan_length(node) <= MAX_TRIANGULAR_SCAN,
    ),
    Adapter(
        name="index-copy-as-selection",
        why="aten.index_copy (a static KV cache written at run-time positions) lowers to a scatter the device "
        "cannot run; a selection matmul and a select keep the cache update on the device",
        decompositions={aten.index_copy.default: index_copy_as_selection},
        inplace=(aten.index_copy_.default,),
        applies=lambda node: _index_copy_fits(*(a.meta["val"] if hasattr(a, "meta") else a for a in node.args[:4])),
    ),
    Adapter(
        name="reciprocal-as-division",
        why="aten.reciprocal lowers with an assertion that no element is 0 (PyTorch gives inf), which also keeps "
        "it off the device",
        decompositions={aten.reciprocal.default: reciprocal_as_division},
        needed=lambda node: not node.args[0].meta["val"].dtype.is_complex,
    ),
    Adapter(
        name="gelu-tanh",
        why="aten.gelu(approximate='tanh') lowers with 0.797724 for sqrt(2/pi) (0.7978846): results off by 1e-4",
        decompositions={aten.gelu.default: gelu_tanh},
        needed=lambda node: _approximate(node) == "tanh",
    ),
    Adapter(
        name="logcumsumexp-by-mask",
        why="aten.logcumsumexp lowers to log(cumsum(exp(x))), a tm_tensor.scan on the host that overflows "
        "above 88 and loses small terms",
        decompositions={aten.logcumsumexp.default: logcumsumexp_by_mask},
        applies=lambda node: _scan_length(node) <= MAX_TRIANGULAR_SCAN,
        needed=lambda node: not node.args[0].meta["val"].dtype.is_complex,
    ),
    Adapter(
        name="embedding-bag-by-assignment",
        why="aten.embedding_bag lowers ignoring per_sample_weights (a wrong sum) and fails to legalize in "
        "mean and max modes",
        decompositions={aten.embedding_bag.padding_idx: embedding_bag_by_assignment,
                        aten.embedding_bag.default: embedding_bag_by_assignment},
        applies=_bag_fits,
    ),
    Adapter(
        name="scatter-mean-floor",
        why="aten.scatter_reduce(reduce='mean') of integers lowers dividing toward zero; PyTorch rounds down",
        decompositions={aten.scatter_reduce.two: scatter_mean_floor},
        needed=_integer_mean,
    ),
    Adapter(
        name="sort-stable-as-sort",
        why="aten.sort.stable (sort or argsort with stable=True) fails to legalize in the torch backend pipeline",
        decompositions={aten.sort.stable: sort_stable_as_sort, aten.argsort.stable: argsort_stable_as_sort},
    ),
    Adapter(
        name="group-norm-by-layer-norm",
        why="aten.group_norm decomposes to statistics gathered by computed indices and float64 steps: all on the "
        "host",
        decompositions={aten.group_norm.default: group_norm_by_layer_norm},
        applies=_float_group_norm,
    ),
    Adapter(
        name="median-by-sort",
        why="aten.median (with or without dim) fails to legalize in the torch backend pipeline",
        decompositions={aten.median.dim: median_by_sort, aten.median.default: median_of_all},
    ),
    Adapter(
        name="linalg-norm-by-vector-norm",
        why="aten.linalg_norm fails to legalize in Torch-MLIR (linalg_vector_norm lowers)",
        decompositions={aten.linalg_norm.default: linalg_norm_by_vector_norm,
                        aten.linalg_norm.ord_str: linalg_norm_by_vector_norm},
        applies=lambda node: _matrix_norm_ord(node) in (None, "fro", 1, -1, math.inf, -math.inf),
    ),
    Adapter(
        name="addbmm-by-matmuls",
        why="aten.addbmm fails to legalize in Torch-MLIR but for float32",
        decompositions={aten.addbmm.default: addbmm_by_matmuls},
        needed=lambda node: node.args[0].meta["val"].dtype != torch.float32,
    ),
    Adapter(
        name="diagonal-scatter-by-index-put",
        why="aten.diagonal_scatter fails to legalize in Torch-MLIR",
        decompositions={aten.diagonal_scatter.default: diagonal_scatter_by_index_put},
    ),
    Adapter(
        name="erfc-by-erf",
        why="aten.erfc fails to legalize in Torch-MLIR",
        decompositions={aten.erfc.default: erfc_by_erf},
        needed=lambda node: not node.args[0].meta["val"].dtype.is_complex,
    ),
    Adapter(
        name="hypot-scaled",
        why="aten.hypot fails to legalize in Torch-MLIR",
        decompositions={aten.hypot.default: hypot_scaled},
    ),
    Adapter(
        name="integer-powers-by-multiplication",
        why="aten.pow and aten.square of integers fail in Torch-MLIR (it lowers powers of floats only)",
        decompositions={aten.pow.Tensor_Scalar: power_of_integers, aten.square.default: square_of_integers},
        needed=lambda node: _integer_input(node) and (node.target == aten.square.default or _integer_power(node)),
        respells=True,
    ),
    Adapter(
        name="isclose-of-integers",
        why="aten.isclose of integers or bools fails in Torch-MLIR (floats only)",
        decompositions={aten.isclose.default: isclose_of_integers},
        needed=_integer_input,
        respells=True,
    ),
    Adapter(
        name="angle-of-reals",
        why="aten.angle fails to legalize in Torch-MLIR",
        decompositions={aten.angle.default: angle_of_reals},
        needed=lambda node: not node.args[0].meta["val"].dtype.is_complex,
    ),
    Adapter(
        name="erfcx-and-log-ndtr-by-fit",
        why="aten.special_erfcx (and special_log_ndtr, which PyTorch writes with it) fail to legalize in "
        "Torch-MLIR",
        decompositions={aten.special_erfcx.default: erfcx_by_fit, aten.special_log_ndtr.default: log_ndtr_by_fit},
    ),
    Adapter(
        name="searchsorted-by-count",
        why="aten.searchsorted fails to legalize in Torch-MLIR",
        decompositions={aten.searchsorted.Tensor: searchsorted_by_count, aten.searchsorted.Scalar: searchsorted_by_count},
        applies=_search_fits,
    ),
    Adapter(
        name="put-by-index-put",
        why="aten.put fails to legalize in Torch-MLIR",
        decompositions={aten.put.default: put_by_index_put},
    ),
    Adapter(
        name="nanmedian-by-sort",
        why="aten.nanmedian fails to legalize in Torch-MLIR",
        decompositions={aten.nanmedian.default: nanmedian_by_sort, aten.nanmedian.dim: nanmedian_by_sort},
    ),
    Adapter(
        name="im2col-by-slices",
        why="aten.im2col (nn.functional.unfold) crashes Torch-MLIR's lowering",
        decompositions={aten.im2col.default: im2col_by_slices},
        applies=lambda node: math.prod(node.args[1]) <= MAX_KERNEL_POSITIONS,
    ),
    Adapter(
        name="gamma-functions-by-series",
        why="aten.lgamma, digamma, mvlgamma and polygamma fail to legalize in Torch-MLIR; aten.erfinv has no "
        "lowering to linalg",
        decompositions={aten.lgamma.default: lgamma_by_stirling, aten.digamma.default: digamma_by_series,
                        aten.erfinv.default: erfinv_by_fit, aten.mvlgamma.default: mvlgamma_by_lgamma,
                        aten.polygamma.default: polygamma_zero_by_digamma,
                        aten.special_polygamma.default: polygamma_zero_by_digamma},
        needed=lambda node: "polygamma" not in str(node.target) or node.args[0] == 0,
        respells=True,
    ),
]


def decomposition_table() -> dict:
    """Torch-MLIR's decomposition table (what ``torch_mlir.fx.export_and_import`` uses)."""
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table

    return dict(get_decomposition_table())


def select_adapters(ep: torch.export.ExportedProgram, adapters: list[Adapter] | None = None) -> list[Adapter]:
    """The adapters whose ops occur in ``ep``'s graph (or its subgraphs), accept every occurrence and are needed by
    one."""
    adapters = ADAPTERS if adapters is None else adapters
    nodes = [n for gm in ep.graph_module.modules() if isinstance(gm, torch.fx.GraphModule) for n in gm.graph.nodes]
    chosen = []
    for adapter in adapters:
        hits = [n for n in nodes if n.op == "call_function"
                and (n.target in adapter.decompositions or n.target in adapter.inplace)]
        if hits and all(adapter.applies(n) for n in hits) and any(adapter.needed(n) for n in hits):
            chosen.append(adapter)
    return chosen


NARROW_INTEGERS = (torch.int8, torch.uint8)
# Ops that only move or relabel 8-bit data (and the conversion the widening itself uses): left as they are.
_MOVES_ONLY = {"_to_copy", "to", "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand",
               "slice", "select", "cat", "stack", "clone", "copy", "alias", "lift_fresh_copy", "detach",
               "squeeze", "unsqueeze", "flatten", "unflatten", "contiguous", "index", "gather", "index_select",
               "_assert_tensor_metadata", "split", "split_with_sizes", "chunk", "narrow", "empty", "zeros_like",
               "ones_like", "full_like", "empty_like", "sym_size", "sym_numel", "sym_stride", "constant_pad_nd",
               "flip", "roll", "repeat", "unbind", "as_strided", "diagonal", "movedim", "tensor_split", "_local_scalar_dense"}
_ARITH = ("add", "sub", "mul", "div", "floor_divide", "remainder", "fmod", "neg", "abs", "sign", "pow", "clamp",
          "clamp_min", "clamp_max", "maximum", "minimum", "max", "min", "amax", "amin", "sum", "prod", "mean",
          "argmax", "argmin", "eq", "ne", "lt", "le", "gt", "ge", "where", "bitwise_and", "bitwise_or",
          "bitwise_xor", "bitwise_not", "bitwise_left_shift", "bitwise_right_shift", "__lshift__", "__rshift__",
          "cumsum", "cumprod", "sort", "topk", "mm", "bmm", "matmul", "addmm", "square")


def _narrow_int(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in NARROW_INTEGERS


def _widened(target, fallback):
    """``target`` computed in int32 when an int8/uint8 tensor is among its arguments, then converted to the
    dtypes PyTorch's meta kernel gives (else promotion's); otherwise ``fallback`` (the table's own decomposition, if any)."""
    from torch.utils import _pytree as pytree

    def decomposition(*args, **kwargs):
        flat, spec = pytree.tree_flatten((args, kwargs))
        narrow = [a for a in flat if _narrow_int(a)]
        if not narrow:
            return fallback(*args, **kwargs) if fallback is not None else NotImplemented
        dtypes = _result_dtypes(target, flat, spec)
        wide_args, wide_kwargs = pytree.tree_unflatten(
            [a.to(torch.int32) if _narrow_int(a) else a for a in flat], spec)
        result = target(*wide_args, **wide_kwargs)
        if dtypes is None or len(dtypes) != len(pytree.tree_leaves(result)):
            # Promotion narrows only what was widened.
            dtypes = [_promoted(flat) if isinstance(r, torch.Tensor) and r.dtype == torch.int32 else None
                      for r in pytree.tree_leaves(result)]
        return _converted(result, dtypes)

    return decomposition


def _result_dtypes(target, flat, spec) -> list | None:
    """The dtypes of ``target``'s flattened results on arguments ``flat``, from its meta kernel (None for a
    non-tensor result), or None when it has none. PyTorch's own answer: an ``index_put`` of int8 by int64
    indices is int8, which promoting over all tensor arguments would make int64."""
    from torch.utils import _pytree as pytree
    from torch.utils._python_dispatch import _disable_current_modes

    try:
        with _disable_current_modes():
            args, kwargs = pytree.tree_unflatten(
                [torch.empty(tuple(a.shape), dtype=a.dtype, device="meta") if isinstance(a, torch.Tensor) else a
                 for a in flat], spec)
            out = target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - no meta kernel, or symbolic shapes: promote instead
        return None
    return [r.dtype if isinstance(r, torch.Tensor) else None for r in pytree.tree_leaves(out)]


def _converted(result, dtypes):
    """``result``'s tensors converted to ``dtypes`` (by flattened position; None: left as it is)."""
    from torch.utils import _pytree as pytree

    leaves, spec = pytree.tree_flatten(result)
    return pytree.tree_unflatten([r.to(d) if isinstance(r, torch.Tensor) and d is not None and r.dtype != d else r
                                  for r, d in zip(leaves, dtypes)], spec)


def _promoted(flat) -> torch.dtype:
    """The dtype PyTorch's type promotion gives over ``flat``'s tensors and scalars."""
    narrow = [a for a in flat if _narrow_int(a)]
    promoted = narrow[0].dtype
    for a in flat:
        if isinstance(a, torch.Tensor):
            promoted = torch.promote_types(promoted, a.dtype)
        elif isinstance(a, (bool, int, float)):
            promoted = torch.result_type(torch.empty((), dtype=promoted), a)
    return promoted


def widen_narrow_integers(ep: torch.export.ExportedProgram, table: dict) -> bool:
    """Wrap, in ``table``, every op of ``ep`` (and the common arithmetic overloads decompositions produce) so
    that it computes in int32 when given int8/uint8 tensors. Returns False (nothing done) when the program holds
    no 8-bit integer tensor."""
    nodes = [n for gm in ep.graph_module.modules() if isinstance(gm, torch.fx.GraphModule) for n in gm.graph.nodes]
    if not any(_narrow_int(n.meta.get("val")) for n in nodes):
        return False
    targets = {n.target for n in nodes if isinstance(n.target, torch._ops.OpOverload)}
    for name in _ARITH:
        packet = getattr(aten, name, None)
        if packet is not None:
            targets.update(getattr(packet, o) for o in packet.overloads())
    for t in targets:
        if t.__name__.split(".")[0] not in _MOVES_ONLY:
            table[t] = _widened(t, table.get(t))
    return True


# Ops whose lowering is wrong for bool data, with the argument slots holding it: accumulation adds i1 values,
# which is xor (PyTorch's is or), and sort compares i1 as signed (True < False).
BOOL_SLOTS = {aten.scatter_add.default: (0, 3), aten.index_add.default: (0, 3), aten.index_put.default: (0, 2),
              aten._unsafe_masked_index_put_accumulate.default: (0, 3), aten.sort.default: (0,),
              aten.sort.stable: (0,), aten.argsort.default: (0,), aten.argsort.stable: (0,), aten.msort.default: (0,),
              aten.scatter_reduce.two: (0, 3)}


def _bool_in_int32(target, slots, fallback):
    """``target`` with its bool data (``slots``) computed in int32 and converted back to bool (nonzero is True:
    accumulation is or); otherwise ``fallback`` (the table's own decomposition, if any)."""
    from torch.utils import _pytree as pytree

    def decomposition(*args, **kwargs):
        if not any(i < len(args) and isinstance(args[i], torch.Tensor) and args[i].dtype == torch.bool
                   for i in slots):
            return fallback(*args, **kwargs) if fallback is not None else NotImplemented
        flat, spec = pytree.tree_flatten((args, kwargs))
        dtypes = _result_dtypes(target, flat, spec)
        wide = [a.to(torch.int32) if i in slots and isinstance(a, torch.Tensor) and a.dtype == torch.bool else a
                for i, a in enumerate(args)]
        result = target(*wide, **kwargs)
        if dtypes is None or len(dtypes) != len(pytree.tree_leaves(result)):
            raise NotImplementedError(f"{target}: no meta kernel gives the result dtypes")
        return _converted(result, dtypes)

    return decomposition


def bool_data_in_int32(ep: torch.export.ExportedProgram, table: dict) -> bool:
    """Wrap, in ``table``, the ops of :data:`BOOL_SLOTS` that ``ep`` applies to bool data. False when none."""
    nodes = [n for gm in ep.graph_module.modules() if isinstance(gm, torch.fx.GraphModule) for n in gm.graph.nodes]
    found = {n.target for n in nodes if n.target in BOOL_SLOTS
             and any(i < len(n.args) and getattr(getattr(n.args[i], "meta", {}).get("val"), "dtype", None)
                     == torch.bool for i in BOOL_SLOTS[n.target])}
    for t in found:
        table[t] = _bool_in_int32(t, BOOL_SLOTS[t], table.get(t))
    return bool(found)


def adapt(
    ep: torch.export.ExportedProgram, adapters: list[Adapter] | None = None
) -> tuple[torch.export.ExportedProgram, list[str]]:
    """Run Torch-MLIR's decompositions plus the applicable adapters on ``ep``.

    Returns the decomposed program and the names of the adapters applied. Adapters win over Torch-MLIR's
    table for the ops they cover.
    """
    chosen = select_adapters(ep, adapters)
    table = decomposition_table()
    for adapter in chosen:
        table.update(adapter.decompositions)
    names = [a.name for a in chosen]
    # Not selected by occurrence: other decompositions (group norm's) produce it.
    table[aten.as_strided.default] = as_strided_by_gather
    table[aten.view.default] = view_of_contiguous
    # Hugging Face's default (grouped_mm) experts, as torch.compile captures them (export switches models to
    # the static batched_mm form first; a captured graph cannot be switched).
    table[aten.histc.default] = histc_as_counts
    try:
        table[torch.ops.transformers.grouped_mm_fallback.default] = grouped_mm_by_gather
    except (AttributeError, RuntimeError):
        pass                 # transformers not imported: no such op in any graph
    if widen_narrow_integers(ep, table):
        names.append("int8-computes-in-int32")
    if bool_data_in_int32(ep, table):
        names.append("bool-data-in-int32")
    return run_decompositions(ep, table), names


_KEPT_CIA: dict = {}


def _keepable_cia_ops() -> frozenset:
    """torch's set of the CompositeImplicitAutograd ops that a decomposition may keep (not decompose), as
    ``run_decompositions`` finds it. torch finds it anew at every call, materializing every such op once per op
    namespace (27 times): 45-70 ms of a compile. It changes only when ops or namespaces are registered or first
    used, so it is kept until one of those counts changes."""
    from torch._export.utils import _collect_all_valid_cia_ops

    if _KEPT_CIA.get("key") != _registrations():
        ops = frozenset(_collect_all_valid_cia_ops())
        # Finding the set materializes ops (the key's counts): keyed by the state after, as the next call sees it.
        _KEPT_CIA["key"], _KEPT_CIA["ops"] = _registrations(), ops
    return _KEPT_CIA["ops"]


def _registrations() -> tuple:
    """What torch's set of keepable CIA ops depends on: the CIA kernels registered, and the ops of each op
    namespace it has seen."""
    return (len(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")),
            tuple((ns, len(getattr(getattr(torch.ops, ns, None), "_dir", ()))) for ns in torch.ops._dir))


def run_decompositions(ep: torch.export.ExportedProgram, table: dict) -> torch.export.ExportedProgram:
    """``ep.run_decompositions(table)``, with torch's set of keepable CIA ops found once (:func:`_keepable_cia_ops`)
    rather than at every call. The table is split as torch 2.13's ``_split_decomp_table_to_cia_and_python_decomp``
    splits it (the CIA ops of the table get their entry, every other keepable one is kept), and the decomposition
    is torch's own. Without those internals (another torch), the public call. test_adapters checks that both
    give the same program."""
    try:
        from torch._export.utils import _is_preservable_cia_op
        from torch.export.exported_program import (_decompose_exported_program, _disable_prexisiting_fake_mode,
                                                   _special_op_to_preserve_cia)
    except ImportError:
        return ep.run_decompositions(table)
    keep = set(_keepable_cia_ops())
    cia, rest = {}, dict(table)
    for op in list(rest):
        if op in keep or _is_preservable_cia_op(op):    # a keepable aten op, or a custom CIA op
            cia[op] = rest.pop(op)
            keep.discard(op)
    cia.update(dict.fromkeys(keep, _special_op_to_preserve_cia))
    return _disable_prexisiting_fake_mode(_decompose_exported_program)(
        ep, cia_to_decomp=cia, python_decomp_table=rest, joint_loss_index=None, decompose_custom_triton_ops=False)
