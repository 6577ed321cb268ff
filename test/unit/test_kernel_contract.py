"""The binary follows the IR: every device op's instructions obey its kernel plan.

For each kernel kind, a small model is compiled through the real pipeline, emitted and loaded, and each device
op's instructions (found by the op's name and location in the binary's debug info) are checked against the
plan the kernel passes wrote on it:

* the cores that run its instructions are exactly its grid's (``spyre.grid``: cores 0..prod(grid)-1);
* its tile loop is the plan's: one result store per planned tile on every core (row-wise ops: the rows of the
  core's block in ``spyre.tile`` rows; matmuls: the output tiles of the core's block, the last one possibly
  stored in pieces of whole PT row blocks; conv2d: the core's images x filter tiles x output-row tiles, one
  tile possibly in pieces of output rows);
* every scratchpad byte it touches lies in one of its planned buffers (``spyre.scratchpad`` offsets, sizes
  from the kernel's one buffer description), or, for a conv whose rows go over the ring (spyre-chain-convs), in
  its consumer's input buffer (a conv's patches ``a0``, a flatten's ``in0``; a flatten's rows sent on to a matmul's
  A tile ``a0``), and then it stores nothing and every core sends;
* the loaded program's scratchpad peak is the module's ``spyre.scratchpad_peak``.
"""

import collections
import math

import pytest

torch = pytest.importorskip("torch")

from torch_mlir import ir  # noqa: E402

from spyre_mlir.codegen.plan import KernelPlan  # noqa: E402
from spyre_mlir.compiler import emit, prepare_module, run_stage  # noqa: E402
from spyre_mlir.context import make_context  # noqa: E402
from spyre_mlir.frontend import import_model  # noqa: E402
from spyre_mlir.passes.analysis import device_ops  # noqa: E402
from spyre_mlir.pipeline import graph_pipeline, kernel_pipeline  # noqa: E402
from spyre_mlir.runtime.binary import program_to_bytes  # noqa: E402
from spyre_mlir.runtime.formats import STICK_BYTES  # noqa: E402
from spyre_mlir.runtime.isa import Op  # noqa: E402
from spyre_mlir.runtime.loader import load_bytes  # noqa: E402
from spyre_mlir.target import load_target  # noqa: E402


def _key(op) -> str:
    s = str(op.location)
    if s.startswith("loc(") and s.endswith(")"):
        s = s[4:-1]
    return f"{op.name} {s}"[:200]


def _checked(model, example_inputs, cores=8, precision="dlf16"):
    """Compile, emit and load; returns ({op name: plans checked}, problems)."""
    imported = import_model(model, example_inputs)
    target = load_target(None, cores=cores)
    with make_context():
        module = prepare_module(imported)
        run_stage(module, graph_pipeline(), "graph pipeline")
        run_stage(module, kernel_pipeline(precision, cores), "kernel pipeline")
        program = emit(module, target).b.program()
        ops = device_ops(module.operation)
        keys = collections.Counter(_key(o) for o in ops)
        plans = [(_key(o), KernelPlan.of(o, target), _store_tiles(o), _ring_patch(o, target)) for o in ops
                 if keys[_key(o)] == 1]
        peak = ir.IntegerAttr(module.operation.attributes["spyre.scratchpad_peak"]).value
    exe = load_bytes(program_to_bytes(program))
    by_key = collections.defaultdict(list)
    for s in exe.steps:
        if hasattr(s, "loc") and s.op not in (Op.BARRIER, Op.END):
            by_key[s.loc].append(s)
    checked, problems = collections.Counter(), []
    for key, plan, tiles, patch in plans:
        ins = by_key.get(key, [])
        if not ins:
            continue                     # folded at compile time or an alias: no kernel ran
        checked[plan.op_name] += 1
        where = f"{key}: grid {list(plan.grid)} tile {list(plan.tile)}"
        used = sorted({s.core for s in ins})
        if used != list(range(plan.cores)):
            problems.append(f"{where}: runs on cores {used}, its grid has {plan.cores}")
        spans = [(off // STICK_BYTES, -(-(off + size) // STICK_BYTES))
                 for off, size in [*plan.buffers.values(), *([patch] if patch else [])]]
        outside = next(((s, stick) for s in ins for stick in set(s.sp_reads.tolist()) | set(s.sp_writes.tolist())
                        | (set(s.peer_sticks.tolist()) if s.op is Op.RING_SEND else set())
                        if not any(lo <= stick < hi for lo, hi in spans)), None)
        if outside is not None:
            s, stick = outside
            problems.append(f"{where}: core {s.core} {s.name} touches scratchpad byte {stick * STICK_BYTES}, "
                            f"outside its planned buffers {plan.buffers}")
        if patch is not None:
            stores = collections.Counter(s.core for s in ins if s.op is Op.DMA_STORE)
            lo, hi = patch[0] // STICK_BYTES, -(-sum(patch) // STICK_BYTES)
            sends = collections.Counter(s.core for s in ins if s.op is Op.RING_SEND and
                                        ((s.peer_sticks >= lo) & (s.peer_sticks < hi)).all() or
                                        s.op is Op.SFU and ((s.sp_writes >= lo) & (s.sp_writes < hi)).all())
            if stores or any(not sends[c] for c in range(plan.cores)):
                problems.append(f"{where}: its rows go over the ring, yet stores per core "
                                f"{[stores[c] for c in range(plan.cores)]}, "
                                f"sends {[sends[c] for c in range(plan.cores)]}")
        elif tiles is not None and tiles(plan) is not None:       # (a K-split matmul: stores on its roots)
            stores = collections.Counter(s.core for s in ins if s.op is Op.DMA_STORE)
            want = tiles(plan)
            pieces = (-(-plan.tile[-3] // target.pt_rows) - 1 if plan.op_name == "spyre.matmul" else
                      plan.tile[-1] - 1 if plan.op_name == "spyre.conv2d" else 0)
            if any(not want <= stores[c] <= want + pieces for c in range(plan.cores)):
                problems.append(f"{where}: stores per core {[stores[c] for c in range(plan.cores)]}, the plan "
                                f"has {want} tiles per core")
    if exe.static_profile.scratchpad_peak_bytes != peak:
        problems.append(f"the program's scratchpad peak is {exe.static_profile.scratchpad_peak_bytes} B, the "
                        f"module's spyre.scratchpad_peak {peak} B")
    return checked, problems


def _ring_patch(op, target):
    """(offset, bytes) of the buffer (a conv's input patches, a flatten's ``in0``, a matmul's A tile) this conv's or
    flatten's kernel sends its rows to, or None."""
    from spyre_mlir.codegen.kernels import conv, move

    to = (conv.ring_consumer(op) if op.name == "spyre.conv2d" else
          move.ring_consumer(op) if op.name == "spyre.reshape" else None)
    return None if to is None else KernelPlan.of(to, target).buffers[conv.ring_buffer(to)]


def _store_tiles(op):
    """The number of result stores per core the plan implies, as a function of the plan (None: not checked)."""
    name = op.name
    shape = list(ir.RankedTensorType(op.results[0].type).shape)
    if name in ("spyre.softmax", "spyre.layernorm", "spyre.rmsnorm", "spyre.cast", "spyre.map"):
        rows = math.prod(shape[:-1])
        return lambda p: -(-(rows // p.grid[0]) // p.tile[0])
    if name == "spyre.matmul":
        M, N = shape[-2], shape[-1]
        return lambda p: (-(-(M // p.grid[0]) // p.tile[0]) * -(-(N // p.grid[1]) // p.tile[1])
                          if p.grid[2] == 1 else None)
    if name == "spyre.conv2d":
        n, f, oh = shape[0], shape[1], shape[2]
        return lambda p: n // p.grid[0] * (f // p.grid[1] // p.tile[1]) * (oh // p.grid[2] // p.tile[2])
    return None


class Rows(torch.nn.Module):
    """Row-wise kernels: layernorm, softmax, maps (one with a broadcast operand), reduce, casts; nn.RMSNorm
    decomposes into maps and a reduce at dlf16."""

    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(256)
        self.rms = torch.nn.RMSNorm(256)
        self.scale = torch.nn.Parameter(torch.randn(256))

    def forward(self, x):
        # One op a line: the binary's debug info tells ops apart by their source location.
        y = self.ln(x)
        p = torch.softmax(y, -1)
        g = torch.sigmoid(p)
        z = g + self.scale
        r = self.rms(z)
        return r, z.sum(-1, keepdim=True)


class Matmuls(torch.nn.Module):
    """matmul (a Linear, M/N split), batch_matmul, and the transposes that feed them."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(256, 512)

    def forward(self, x, q):
        return self.fc(x), q @ q.transpose(-1, -2)


class TinyBatch(torch.nn.Module):
    """Nine batches of a batch_matmul on eight cores run on the cores of its grid, not on as many cores as there
    are. (A float cumsum, which was this batch_matmul, is now several: the check needs one op per location.)"""

    def forward(self, x):
        return x @ x.transpose(1, 2)


class Movement(torch.nn.Module):
    """Data movement: concats (along the innermost dim: selection matmuls; along rows: DMA), slice, transpose of
    activations."""

    def forward(self, x):
        rows = torch.cat([x, x * 2])
        head = x[:, :96]
        cols = torch.cat([head, head * 2], -1)
        return cols, rows, x[:, 64:192] + 1, x.t() * 3


class Pool(torch.nn.Module):
    """max and average pooling."""

    def forward(self, img):
        m = torch.nn.functional.max_pool2d(img, 2)
        return torch.nn.functional.avg_pool2d(m, 2)


class Conv(torch.nn.Module):
    """conv2d, groups 1 and depthwise, then ReLU, a pool, a flatten and a classifier (the flatten may take its rows
    over the ring, and send its result so to the classifier's A tiles)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 16, 3)
        self.dw = torch.nn.Conv2d(16, 16, 3, groups=16)
        self.fc = torch.nn.Linear(4096, 10)

    def forward(self, img):
        return self.fc(torch.nn.functional.max_pool2d(torch.relu(self.dw(self.conv(img))), 2).flatten(1))


CASES = {
    "rows": (Rows, (torch.randn(64, 256),), {"spyre.layernorm", "spyre.softmax", "spyre.map", "spyre.reduce"}),
    "matmuls": (Matmuls, (torch.randn(64, 256), torch.randn(4, 64, 64)), {"spyre.matmul", "spyre.batch_matmul"}),
    "movement": (Movement, (torch.randn(64, 256),), {"spyre.concat", "spyre.slice", "spyre.transpose"}),
    "tiny-batch": (TinyBatch, (torch.randn(9, 5, 5),), {"spyre.batch_matmul"}),
    "pool": (Pool, (torch.randn(2, 8, 32, 32),), {"spyre.pool2d"}),
    "conv": (Conv, (torch.randn(2, 4, 36, 36),), {"spyre.conv2d", "spyre.reshape", "spyre.matmul"}),
}

@pytest.mark.parametrize("cores", [1, 8])
@pytest.mark.parametrize("case", sorted(CASES))
def test_binary_follows_the_kernel_plan(case, cores):
    torch.manual_seed(0)
    cls, inputs, kinds = CASES[case]
    checked, problems = _checked(cls().eval(), inputs, cores=cores)
    assert kinds <= set(checked), f"kinds not exercised: {kinds - set(checked)} (checked {dict(checked)})"
    assert not problems, "\n".join(problems)
