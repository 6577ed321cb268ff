"""The emitter: an annotated spyre module -> a ProgramBuilder holding the whole program.

Walks ``@main`` in order and follows the decisions the IR holds; it decides none itself. Where each op runs
is spyre-select-kernels': an op with a ``spyre.kernel`` runs that kernel on the device (its plan: grid, tiles,
scratchpad offsets, from the kernel passes), and ``spyre.on_host`` ops and ``spyre.host`` regions run on the
host. What could be computed while compiling was, by spyre-fold-constants: it left constants
(``arith.constant dense_resource``) and quantized weights (a ``spyre.cast`` of int8/fp8 codes with a scale
operand, which the matmul kernel reads as codes and per-column scales). A ``spyre.const_fold`` op still here
reads a parameter without a value (a binary input) and runs on the host. A device op without a kernel the
emitter has is an error at its location. Every value gets one of four homes:

* **known**: a numpy value given in the IR: parameters with values, constants and quantized weights. A known
  value that a device op or the host reads becomes a **constant** buffer, encoded in its device format.
* **device tensor**: inputs and outputs by name; intermediates in scratch memory. Intermediates only device
  kernels touch share "slot" buffers with liveness-based reuse (a slot is free again after the barrier that
  follows its last reader); tensors a host op reads or writes get buffers of their own shape.
* **alias**: a reshape whose kernel is ``alias`` (it keeps the innermost dim) is the same bytes (canonical
  layout), and a slice whose kernel is ``alias`` (contiguous whole rows, ``move.slice_rows``) the bytes from its
  first row on, so both are free; when a reshape is an output or a host op reads it, the host copies it into
  its own buffer (such a slice gets a DMA kernel instead). A transpose whose kernel is ``alias`` is a *row
  view* (``DevTensor.rowmap``): its operand's rows in another order, which the kernels reading it gather by
  strided DMA; any other reader of a view is an error (``move.views_ok`` keeps them from one). Liveness counts a
  view's readers as its storage's.

Host ops run through the runtime's own ``gather``/``copy`` when they compute it, else through its ``jit`` or
``eval`` host ops (:mod:`.hostcode`, :mod:`.hostprog`). With more than one core, a barrier follows an op whose
result crosses cores (spyre-schedule's ``spyre.barrier``; the loader proves that enough) and fences every host
op.

This module holds the walk: values and names, memory slots, barriers, outputs and state updates. Each op goes
to :func:`.host.emit_host` (the host) or the kernel emitter of its family
(:mod:`.kernels`, ``EMITTERS``).
"""

from __future__ import annotations

import contextlib

import numpy as np

from spyre_mlir.passes.analysis import KERNEL, ON_HOST, ROUND_TRIP, is_const_fold, producer, reads, single_use, user
from spyre_mlir.runtime.assembler import ProgramBuilder
from spyre_mlir.runtime.binary import Buffer, buffer_layout
from spyre_mlir.runtime.formats import Format
from spyre_mlir.runtime.isa import Op

from . import hostprog
from .common import EmitError, TileError, _attr, _loc, _same_dims, _tensor_type
from .host import emit_host, materialize_for_host
from .hostcode import HostModule
from .kernels import EMITTERS, KERNELS
from .kernels.matmul import chain_applier, prologue_applier, prologue_of, sibling_applier
from .kernels.move import row_sources, slice_rows
from .kernels.rows import repeated_rows
from .memory import DevTensor, NoFormat, format_of, io_dtype, supported_types
from .plan import PlanError

__all__ = ["Emitter", "EmitError", "TileError"]


def _quantized_weight(op) -> bool:
    """A weight spyre-fold-constants quantized: a ``const_fold`` cast of constant codes with a constant scale."""
    return (op.name == "spyre.cast" and len(op.operands) == 2 and is_const_fold(op)
            and all(producer(v) is not None and producer(v).name == "arith.constant" for v in op.operands))


def _io_unsigned(attrs) -> bool:
    """An input/result the frontend marked ``spyre.dtype = "uint8"`` (linalg's i8 does not say unsigned)."""
    from torch_mlir import ir

    return "spyre.dtype" in attrs and ir.StringAttr(attrs["spyre.dtype"]).value == "uint8"


# Constants whose IR storage is the device's: their bits go to the binary as they are.
_BITS_AS_STORED = ("!spyre.dlf16", "f8E5M2", "f8E4M3FN")
_VIEW_READERS = frozenset({"matmul", "sibling", "chained", "prologue", "rows", "epilogue", "alias", "dma-rows",
                           "select-cols", "pool2d"})


class _Tensors(dict):
    """Values -> their DevTensor, indexed by what holds their bytes (a buffer's storage, or a place in a buffer):
    the values sharing a dead value's bytes are found without a walk over every value (a deep model has
    thousands, and values die all along it)."""

    def __init__(self):
        super().__init__()
        self._holders: dict[tuple, set] = {}

    @staticmethod
    def _keys(t: DevTensor) -> tuple:
        return (0, id(t.buffer), t.storage), (1, id(t.buffer), t.addr)

    def __setitem__(self, v, t: DevTensor) -> None:
        old = self.get(v)
        if old is not None:
            for k in self._keys(old):
                self._holders[k].discard(v)
        super().__setitem__(v, t)
        for k in self._keys(t):
            self._holders.setdefault(k, set()).add(v)

    def sharing(self, t: DevTensor) -> set:
        """The values whose tensors have ``t``'s storage, or its address, in its buffer (``t``'s own among them)."""
        a, b = (self._holders.get(k, set()) for k in self._keys(t))
        return a | b


class _Known(dict):
    """value -> numpy array, where a DLFloat16 constant's values are decoded from its bits only when something
    reads them (:meth:`defer`): most are weights, written to the binary as those bits (a real model's layer holds
    hundreds of MB of them)."""

    def __init__(self):
        super().__init__()
        self._deferred: dict = {}

    def defer(self, key, values) -> None:
        """``key``'s value is ``values()``, computed at the first read."""
        self._deferred[key] = values

    def __missing__(self, key):
        if key not in self._deferred:
            raise KeyError(key)
        value = self[key] = self._deferred.pop(key)()
        return value

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, key) or key in self._deferred

    def get(self, key, default=None):
        return self[key] if key in self else default


# Kernels of ops another matmul's kernel computes and keeps on its cores: (who applies it, what it is).
_LOADS = frozenset({Op.DMA_LOAD, Op.GATHER, Op.RESTICK})      # DMA-unit work a kernel's compute waits on
_INSIDE = {"sibling": (sibling_applier, "a sibling matmul"), "prologue": (prologue_applier, "a matmul's prologue")}


def _kernel_reads(op) -> list:
    """Every value ``op``'s kernel reads: its operands and captures, and a matmul's norm prologue's operands
    (matmul.prologue_of), which its kernel reads in the norm's place."""
    vals = reads(op)
    if op.operation.name == "spyre.matmul" and _attr(op, KERNEL) == "matmul":
        norm = prologue_of(op)
        if norm is not None:
            vals += [v for v in norm.operands if v not in vals]
    return vals


class Emitter:
    """Emit ``module``'s ``@main`` for ``target``. ``params``: parameter name -> numpy array (None: the
    parameters become binary inputs named after them). ``input_names``/``output_names`` name the buffers."""

    def __init__(self, module, target, params=None, input_names=None, output_names=None,
                 producer="spyre_mlir.codegen"):
        self.module = module
        self.target = target
        self.cores = target.num_cores
        self.params = params
        self.input_names = input_names
        self.output_names = output_names
        self.b = ProgramBuilder(target, producer=producer)
        if "spyre.precision" in module.operation.attributes and \
                str(module.operation.attributes["spyre.precision"]) == '"fp32-reference"':
            self.b.numerics = "fp32-reference"   # compiled without rounding: run it without rounding
        self.known = _Known()        # value -> numpy array
        self.qscale: dict = {}       # value -> (scales array, axis or None) of a quantized weight
        self.qfmt: dict = {}         # value -> storage Format of a quantized weight's codes (int8 / fp8)
        # value -> its stored bits, for a dlf16 or fp8 constant: written as they are, never decoded and encoded
        # again (an fp8 -inf would saturate)
        self.stored_bits: dict = {}
        self.dev = _Tensors()        # value -> DevTensor
        self.in_kernel: set = set()  # values only inside another op's kernel (a sibling matmul's, its views)
        self.consts: dict = {}       # (id(known array), format) -> (DevTensor, array): one constant per value
        self.host_ops: list[str] = []   # what ran on the host, for the report
        self.host_locations: list[str] = []   # the MLIR location of each (the model's source lines)
        self.kernels: list[str] = []
        self._spans: list = []       # (first, end) record index per core of each kernel emitted, in order
        self._kernel_start: list[int] = []   # where the kernel being emitted starts, per core
        self._names: set = set()
        self._slots: list = []       # [addr, nbytes, free, buffer]
        self._pending_free: list = []
        self._next_storage = 0
        self.hostmod = HostModule(module.context if hasattr(module, "context") else module.operation.context)

    def layout(self) -> tuple[int, list]:
        """The program's .spyre image as its pieces (runtime.binary.program_layout)."""
        return self.b.layout()

    def prefetched(self, op, prefetchable) -> bool:
        """Whether spyre-prefetch planned ``op``'s once-loaded constants (``spyre.prefetch``) to load during an earlier
        kernel; a plan naming other buffers than its kernel's ``prefetchable(op, target)`` is an error at the op."""
        from torch_mlir import ir

        attrs = op.operation.attributes
        if "spyre.prefetch" not in attrs:
            return False
        planned = tuple(ir.StringAttr(a).value for a in ir.ArrayAttr(attrs["spyre.prefetch"]))
        loads = prefetchable(op, self.target)[0]
        if planned != loads:
            raise PlanError(f"'{op.operation.name}': spyre.prefetch {list(planned)}: its kernel loads {list(loads)} "
                            f"before its work", op.operation.location)
        return True

    @contextlib.contextmanager
    def prefetching(self, op):
        """Emit the block's instructions where spyre-prefetch planned them (``spyre.prefetch`` on ``op``, the kernel
        being emitted, ``spyre.prefetch_distance`` kernels back): in that kernel's last segment, on each core after
        its last load there (so they run while it computes, behind its own loads), else at the segment's start."""
        d = _attr(op, "spyre.prefetch_distance", 1)
        name, where = op.operation.name, op.operation.location
        if not 1 <= d <= len(self._spans):
            raise PlanError(f"'{name}': spyre.prefetch {d} kernel(s) back, but {len(self._spans)} ran before it",
                            where)
        spans = self._spans[-d:]
        points = {}
        for c in range(self.cores):
            first, end = spans[0][0][c], spans[0][1][c]
            ops = self.b.opcodes(c, first)          # that kernel's, then what followed it
            # Between the kernels from there on and this one, nothing but barriers.
            gaps = [(e[c], f[c]) for (_, e), (f, _) in zip(spans, spans[1:])]
            gaps.append((spans[-1][1][c], self._kernel_start[c]))
            if any(o != Op.BARRIER for lo, hi in gaps for o in ops[lo - first:hi - first]):
                raise PlanError(f"'{name}': spyre.prefetch, but instructions other than the kernels' and barriers "
                                f"run between the kernel it loads in and it", where)
            n = end - first
            seg = next((i + 1 for i in range(n - 1, -1, -1) if ops[i] == Op.BARRIER), 0)
            points[c] = first + next((i + 1 for i in range(n - 1, seg - 1, -1) if ops[i] in _LOADS), seg)
        before = [self.b.stream_length(c) for c in range(self.cores)]
        with self.b.inserting(points):
            yield
        # What went in belongs to that kernel's span now (a later call inserts after it); the kernels after it, and
        # this one, start that much later in each stream.
        moved = [self.b.stream_length(c) - n for c, n in enumerate(before)]

        def shift(at):
            return [x + m for x, m in zip(at, moved)]

        host = len(self._spans) - d
        for i in range(host, len(self._spans)):
            f, e = self._spans[i]
            self._spans[i] = (f if i == host else shift(f), shift(e))
        self._kernel_start = shift(self._kernel_start)

    # ---- names and memory ---------------------------------------------------------------------------------

    def _name(self, base: str) -> str:
        base = "".join(c if c.isalnum() or c in "._-" else "_" for c in base) or "t"
        name, i = base, 1
        while name in self._names:
            name, i = f"{base}.{i}", i + 1
        self._names.add(name)
        return name

    def _buffer_tensor(self, buf: Buffer) -> DevTensor:
        self._next_storage += 1
        return DevTensor(tuple(buf.shape), buf.fmt, buf.addr, buf, self._next_storage)

    def _slot_tensor(self, shape, fmt) -> DevTensor:
        """Scratch memory for a device-only intermediate: first fit among free slots, else a new slot."""
        nbytes = buffer_layout(tuple(shape) or (1,), fmt)[1]
        for s in self._slots:
            if s[2] and s[1] >= nbytes:
                s[2] = False
                self._next_storage += 1
                return DevTensor(tuple(shape), fmt, s[0], s[3], self._next_storage)
        rows = -(-nbytes // 128)
        buf = self.b.scratch(self._name(f"slot{len(self._slots)}"), (rows, 128), "int8")
        self._slots.append([buf.addr, buf.nbytes, False, buf])
        self._next_storage += 1
        return DevTensor(tuple(shape), fmt, buf.addr, buf, self._next_storage)

    def _release(self, t: DevTensor) -> None:
        for s in self._slots:
            if s[3] is t.buffer:           # the slot's own buffer (a row view starts inside it)
                self._pending_free.append(s)

    def barrier(self, loc=None) -> None:
        if self.cores > 1:
            self.b.barrier(loc=loc)
        for s in self._pending_free:
            s[2] = True
        self._pending_free = []

    # ---- values ---------------------------------------------------------------------------------------------

    def constant(self, v, fmt=None) -> DevTensor:
        """The device constant of known value v (encoded once in its device format)."""
        shape, elt = _tensor_type(v)
        fmt = fmt or format_of(elt)
        if v in self.qscale:
            raise EmitError("a quantized weight (codes and scales) is read by something else than a matmul's rhs: "
                            "spyre-fold-constants folds such a weight to its real values")
        # A dlf16 or fp8 constant is written as its bits, never decoded.
        arr = self.stored_bits[v] if v in self.stored_bits and fmt is format_of(elt) else self.known[v]
        key = (id(arr), fmt)
        if key not in self.consts:
            name = self._name(self._const_names.get(v, "const"))
            buf = self.stored_constant(v, name, fmt)
            if buf is None:
                vals = np.asarray(arr).reshape(shape or (1,))
                if fmt is Format.INT8:
                    vals = vals.astype(np.int8)
                elif fmt is Format.BOOL:
                    vals = vals.astype(bool)
                elif fmt in (Format.INT32, Format.INT64):
                    vals = vals.astype(fmt.value_dtype)
                else:
                    vals = vals.astype(np.float32)
                buf = self.b.constant(name, vals, fmt)
            self.consts[key] = (self._buffer_tensor(buf), arr)
        return self.consts[key][0]

    def stored_constant(self, v, name, fmt):
        """The constant buffer of a dlf16 or fp8 constant stored as it is in the IR (its bits), or None."""
        shape, elt = _tensor_type(v)
        if v not in self.stored_bits or fmt is not format_of(elt):
            return None
        bits = self.stored_bits[v]
        return self.b.constant(name, (bits if fmt is Format.DLF16 else bits.view(np.uint8)).reshape(shape or (1,)),
                               fmt, encoded=True)

    def tensor(self, v) -> DevTensor:
        """Where value v is in device memory (a known value becomes a constant)."""
        if v in self.dev:
            return self.dev[v]
        if v in self.known:
            return self.constant(v)
        raise EmitError(f"value {v.get_name() if hasattr(v, 'get_name') else v} has no device home")

    def result(self, op, idx=0, host=False) -> DevTensor:
        """Allocate the home of op's result: the output buffer when it is returned, a buffer of its own shape
        when a host op touches it, else a reusable slot."""
        v = op.operation.results[idx]
        shape, elt = _tensor_type(v)
        if any(d < 0 for d in shape):
            raise EmitError(f"{op.operation.name} has a result of dynamic shape {v.type}: the program needs static "
                            f"shapes", op.operation.location)
        fmt = format_of(elt)
        # A host op writes a buffer of its result's own shape: only a device kernel stores into a reshaped output.
        out = self._returned_as(v) if not host else v if v in self._out_name else None
        if out is not None and out not in self._out_taken:
            self._out_taken.add(out)
            oshape, oelt = _tensor_type(out)
            t = self._buffer_tensor(self.b.output(self._out_name[out], oshape, self._out_fmt.get(out, fmt),
                                                  dtype=io_dtype(oelt))).reshaped(shape)
        elif not host and (state := self._in_place_state(op, v)) is not None:
            t = self._buffer_tensor(state)
        elif host or v in self._host_read:
            t = self._buffer_tensor(self.b.scratch(self._name(f"t{self._op_index}"), shape or (1,), fmt))
        else:
            t = self._slot_tensor(shape, fmt)
        self.dev[v] = t
        return t

    def _in_place_state(self, op, v):
        """The state buffer whose new value ``v`` is computed into in place, or None: ``op`` is an elementwise map
        (kernel rows) that is the only reader of the state's old value, of ``v``'s type (a KV cache's
        ``where(slot_is_new, new_rows, cache)``). Its kernel loads each tile of the old value before it stores
        that tile of the new one, on the same core, so no byte is read after it is overwritten, and the copy into
        the state buffer at the end is nothing."""
        name = next((n for w, n in self._state_out if w == v), None)
        old = self._state_arg.get(name)
        o = op.operation
        if old is None or o.name != "spyre.map" or _attr(op, KERNEL) != "rows" or old.type != v.type \
                or v in self._out_name or v in self._host_read:
            return None
        use = single_use(old)
        return self._state_in[name] if use is not None and user(use) == o else None

    def _returned_as(self, v):
        """The returned value whose bytes ``v``'s are: ``v`` itself, or the result of reshapes chosen as ``alias``
        (the same bytes), each the only reader of the value before it (a Linear's [B*S, N] result returned as
        [B, S, N]): ``v``'s producer writes that output buffer itself. None when ``v`` is not returned so."""
        while v not in self._out_name:
            uses = list(v.uses)
            user = uses[0].owner if len(uses) == 1 else None
            user = getattr(user, "operation", user)
            if user is None or user.name != "spyre.reshape" or _attr(user, KERNEL) != "alias" or \
                    v in self._host_read:
                return None
            v = user.results[0]
        return v

    # ---- the walk ---------------------------------------------------------------------------------------

    def run(self) -> ProgramBuilder:
        from torch_mlir import ir

        main = None
        mod = self.module.operation if hasattr(self.module, "operation") else self.module
        for op in mod.regions[0].blocks[0].operations:
            if op.operation.name == "func.func" and ir.StringAttr(op.operation.attributes["sym_name"]).value == "main":
                main = op
        if main is None:
            raise EmitError("the module has no func.func @main")
        block = main.operation.regions[0].blocks[0]
        ops = list(block.operations)
        ret = ops[-1]
        outs = list(ret.operation.operands)
        self._out_name = {}
        self._out_taken = set()
        # Unsigned results (linalg types them as signless i8): their output buffers hold uint8.
        self._out_fmt = {}
        res_attrs = main.operation.attributes["res_attrs"] if "res_attrs" in main.operation.attributes else None
        # Results marked spyre.state are the new value of a persistent state buffer: copied there at the end.
        self._state_out = []
        for i, v in enumerate(outs):
            if res_attrs is not None and "spyre.state" in ir.DictAttr(res_attrs[i]):
                self._state_out.append((v, ir.StringAttr(ir.DictAttr(res_attrs[i])["spyre.state"]).value))
                continue
            if res_attrs is not None and _io_unsigned(ir.DictAttr(res_attrs[i])):
                self._out_fmt[v] = Format.UINT8
            if v not in self._out_name:
                name = self.output_names[i] if self.output_names and i < len(self.output_names) else f"out{i}"
                self._out_name[v] = self._name(name)
        self._const_names = {}
        self._state_in, self._state_arg = {}, {}
        # Inputs and parameters.
        n_in = 0
        arg_attrs = main.operation.attributes["arg_attrs"] if "arg_attrs" in main.operation.attributes else None
        for i, a in enumerate(block.arguments):
            pname = None
            if arg_attrs is not None:
                d = ir.DictAttr(arg_attrs[i])
                if "spyre.param" in d:
                    pname = ir.StringAttr(d["spyre.param"]).value
            shape, elt = _tensor_type(a)
            if pname is not None and next(iter(a.uses), None) is None:
                continue      # folded away (spyre-fold-constants) or never read: no constant, no input
            if pname is not None and self.params is not None:
                if pname not in self.params:
                    raise EmitError(f"no value given for parameter '{pname}'")
                val = np.asarray(self.params[pname])
                if tuple(val.shape) != tuple(shape):
                    raise EmitError(f"parameter '{pname}' has shape {val.shape}, the IR says {shape}")
                self.known[a] = val
                self._const_names[a] = pname
                continue
            if pname is None:
                name = self.input_names[n_in] if self.input_names and n_in < len(self.input_names) else f"in{n_in}"
                n_in += 1
            else:
                name = pname
            try:
                fmt = (Format.UINT8 if arg_attrs is not None and _io_unsigned(ir.DictAttr(arg_attrs[i]))
                       else format_of(elt))
            except NoFormat as e:
                raise EmitError(f"input '{name}': {e} (a binary's buffers hold {', '.join(supported_types())})",
                                main.operation.location) from None
            if arg_attrs is not None and "spyre.state" in ir.DictAttr(arg_attrs[i]):
                sname = ir.StringAttr(ir.DictAttr(arg_attrs[i])["spyre.state"]).value
                self._state_in[sname] = self.b.state(sname, shape, fmt)
                self._state_arg[sname] = a
                self.dev[a] = self._buffer_tensor(self._state_in[sname])
                continue
            self.dev[a] = self._buffer_tensor(self.b.input(self._name(name), shape, fmt, dtype=io_dtype(elt)))
        # Liveness: the last op index reading each value; which values a host op reads.
        body = ops[:-1]
        self._last_use = {}
        self._host_read = set()
        placement = {}
        for i, op in enumerate(body):
            placement[i] = self._placement(op)
            for v in _kernel_reads(op):
                self._last_use[v] = i
                if placement[i] == "host":
                    self._host_read.add(v)
        for v in outs:
            self._last_use[v] = len(body)
        # Literals and constants are values before any instruction runs (a later pass may place one after a
        # host op of a round trip that reads it); host ops of one round trip (spyre-round-trips) run in one host
        # call, at the first of them.
        trips: dict[int, list] = {}
        for i, op in enumerate(body):
            if placement[i] == "known":
                self._known(op)
            elif ROUND_TRIP in op.operation.attributes:
                trips.setdefault(_attr(op, ROUND_TRIP), []).append(op)
        for i, op in enumerate(body):
            self._op_index = i
            trip = trips.get(_attr(op, ROUND_TRIP))
            if placement[i] != "known" and (trip is None or trip[0].operation == op.operation):
                try:
                    self._emit_op(op, placement[i], trip[1:] if trip else ())
                except NoFormat as e:
                    raise EmitError(f"{op.operation.name}: {e} (a binary's buffers hold "
                                    f"{', '.join(supported_types())})", op.operation.location) from None
            self._free_dead(i, op)
        self._emit_outputs(outs, ret)
        try:
            self.b.host_code = self.hostmod.lower()
        except hostprog.Unsupported as e:
            raise EmitError(str(e)) from None
        return self.b

    def _free_dead(self, i, op):
        for v in _kernel_reads(op):
            if self._last_use.get(v) == i and v in self.dev:
                t = self.dev[v]
                # Views (aliases) of the same bytes keep them: the same storage, or the same place.
                if not any(self._last_use.get(w, -1) > i for w in self.dev.sharing(t)):
                    self._release(t)

    def _check_views(self, op, where):
        """A row view (a transpose read in place) reaches only kernels that read rows by DMA gathers, as
        ``move.views_ok`` chose it: anything else reading one would address its bytes, so it is a defect to
        report, never a wrong answer to compute."""
        kernel = _attr(op, KERNEL) if where == "device" else None
        res = op.operation.results[0] if len(op.operation.results) else None
        leaves = res is not None and (res in self._out_name or res in self._host_read)
        if kernel in _VIEW_READERS and not (kernel == "alias" and leaves):
            return
        for v in op.operation.operands:
            t = self.dev.get(v)
            if t is not None and t.rowmap is not None:
                raise EmitError(f"{op.operation.name} ({'kernel ' + kernel if kernel else 'on the host'}) reads a "
                                f"row view of a transpose, which only row-gathering kernels can",
                                op.operation.location)

    def _placement(self, op) -> str:
        """'known', 'device' or 'host', as the IR says (read before emission, so buffers can be chosen):
        literals, constants and quantized weights are known; an op with a ``spyre.kernel`` runs on the device;
        ``spyre.on_host`` ops, host regions and ``const_fold`` ops spyre-fold-constants left (they read a
        parameter given at run time) run on the host."""
        o = op.operation
        if o.name in ("arith.constant", "tensor.empty") or _quantized_weight(o):
            return "known"
        if is_const_fold(o):
            return "host"
        if o.name.startswith("spyre.") and o.name != "spyre.host" and ON_HOST not in o.attributes:
            if KERNEL not in o.attributes or _attr(op, KERNEL) not in KERNELS.get(o.name, ()):
                raise EmitError(f"{o.name} has no device kernel it can run (spyre.kernel = "
                                f"{_attr(op, KERNEL)!r}): run spyre-select-kernels", o.location)
            return "device"
        return "host"

    def _known(self, op):
        """The value of a literal or constant; the codes, scales and storage format of a quantized weight."""
        from torch_mlir import ir

        from spyre_mlir import params

        o = op.operation
        r = o.results[0]
        if o.name == "spyre.cast":
            codes, scale = o.operands
            if codes not in self.known or scale not in self.known:
                raise EmitError("the codes and scales of a quantized weight must be constants", o.location)
            self.known[r] = self.known[codes]
            self.qscale[r] = (np.asarray(self.known[scale], np.float32).reshape(-1), _attr(op, "axis"))
            self.qfmt[r] = format_of(_tensor_type(codes)[1])
            self._const_names[r] = self._const_names.get(codes, "w")
            return
        value = o.attributes["value"] if "value" in o.attributes else None
        if value is not None and params.is_resource(value) and str(_tensor_type(r)[1]) in _BITS_AS_STORED:
            self.stored_bits[r] = params.constant_storage(value, o.context)
            self.known.defer(r, lambda: hostprog.literal_value(op))
        else:
            try:
                self.known[r] = hostprog.literal_value(op)
            except hostprog.Unsupported:
                return    # a literal numpy cannot hold is cloned into the host code that reads it
        if "spyre.name" in o.attributes:
            self._const_names[r] = ir.StringAttr(o.attributes["spyre.name"]).value

    def _emit_op(self, op, where, round_trip=()):
        name = op.operation.name
        loc = _loc(op)
        self._check_views(op, where)
        if where == "host":
            emit_host(self, op, loc, round_trip)
            return
        if _attr(op, KERNEL) == "alias":
            src = op.operation.operands[0]
            shape, _ = _tensor_type(op.operation.results[0])
            res = op.operation.results[0]
            if src in self.in_kernel:               # a view of a sibling matmul's tile, read by the same kernel
                self.in_kernel.add(res)
                return
            t = self.dev.get(src)
            if res in self._out_name and res not in self._host_read and t is not None and t.rowmap is None \
                    and t.buffer.kind == "output" and t.buffer.name == self._out_name[res]:
                self.dev[res] = t.reshaped(shape)         # its producer wrote the output buffer (_returned_as)
            elif res in self._out_name or res in self._host_read:
                # The output (or a host op) needs a buffer of this shape: copy on the host.
                emit_host(self, op, loc)
                return
            elif name == "spyre.slice":
                self.dev[res] = self.tensor(src).rows_from(slice_rows(op), shape)
            elif name == "spyre.transpose":         # read in place: a row view (move.views_ok)
                ((_, rows, _),) = row_sources(op)
                self.dev[res] = self.tensor(src).row_view(rows, shape)
            elif name == "spyre.map":               # its input's rows repeated (rows.repeated_rows)
                self.dev[res] = self.tensor(src).row_view(repeated_rows(op), shape)
            else:
                self.dev[res] = self.tensor(src).reshaped(shape)
            # No instructions, but the plan's barrier stands: the consumer may divide the work otherwise.
            if _attr(op, "spyre.barrier"):
                self.barrier(loc)
            return
        inside = _INSIDE.get(_attr(op, KERNEL))
        if inside is not None:
            # Computed by the kernel of the matmul that reads it (its epilogue, or each A tile), emitted with it.
            applier, what = inside
            if applier(op) is None:
                raise EmitError(f"{name} is {what}, but no matmul's kernel computes it", op.operation.location)
            self.in_kernel.add(op.operation.results[0])
            return
        if _attr(op, KERNEL) == "chained":
            # Computed by the kernel of the matmul whose softmax result it reads, which stored its result.
            if chain_applier(op) is None or op.operation.results[0] not in self.dev:
                raise EmitError(f"{name} is chained to a softmax, but no matmul's kernel computed it",
                                op.operation.location)
            if _attr(op, "spyre.barrier"):
                self.barrier(loc)
            return
        if _attr(op, KERNEL) == "epilogue":
            # Applied by the kernel of the op producing its input, which made this result that op's output.
            if op.operation.results[0] not in self.dev and op.operation.results[0] not in self.in_kernel:
                raise EmitError(f"{name} is an epilogue, but its producer's kernel did not apply it",
                                op.operation.location)
            if _attr(op, "spyre.barrier"):
                self.barrier(loc)
            return
        if _attr(op, "spyre.double_buffer") is None:
            raise EmitError(f"{name} has no spyre.double_buffer: run spyre-schedule (the kernel pipeline) before "
                            f"spyre-emit", op.operation.location)
        self.kernels.append(name)
        self._kernel_start = [self.b.stream_length(c) for c in range(self.cores)]
        try:
            EMITTERS[name](self, op, loc)
        except (TileError, PlanError, ValueError) as e:
            raise EmitError(str(e), op.operation.location) from None
        self._spans.append((self._kernel_start, [self.b.stream_length(c) for c in range(self.cores)]))
        # spyre-schedule's barrier: the result is read on other cores than those that wrote it.
        if _attr(op, "spyre.barrier"):
            self.barrier(loc)

    def _emit_outputs(self, outs, ret):
        """Every returned value must end in its output buffer; values that are not there yet (inputs,
        constants, aliases, a value returned twice) are copied there on the host. The program's outputs are
        listed in return order."""
        done = set()
        order = []
        loc = _loc(ret)
        state_vals = {v for v, _ in self._state_out}
        for i, v in enumerate(outs):
            if v in state_vals:
                continue
            t = self.dev.get(v)
            if (t is not None and v not in done and t.buffer.kind == "output" and t.addr == t.buffer.addr
                    and t.buffer.name == self._out_name[v] and _same_dims(t.buffer.shape, t.shape)):
                done.add(v)
                order.append(t.buffer.name)
                continue
            shape, elt = _tensor_type(v)
            src = self.tensor(v)
            if not _same_dims(src.buffer.shape, src.shape) or src.addr != src.buffer.addr:
                src = materialize_for_host(self, v, src, loc)
            if v in self._out_taken or v in done:
                name = self.output_names[i] if self.output_names and i < len(self.output_names) else f"out{i}"
                oname = self._name(name)
            else:
                oname = self._out_name[v]
                self._out_taken.add(v)
            if self.cores > 1:
                self.barrier(loc)
            out = self.b.output(oname, shape, self._out_fmt.get(v, format_of(elt)), dtype=io_dtype(elt))
            # perm is always explicit: the runtime's copy treats a missing perm as numpy's default (reverse).
            self.b.host(0, "copy", [src.buffer], [out], loc=loc, perm=list(range(len(out.shape))))
            self.host_ops.append("copy to output " + oname)
            self.host_locations.append("")
            done.add(v)
            order.append(oname)
        self.b.output_order = order
        self._emit_state_updates(loc)

    def _emit_state_updates(self, loc):
        """Copy each new state value into its state buffer, on the device: after a barrier (every reader of the
        old value has run), each core moves its share of the rows through its scratchpad."""
        if not self._state_out:
            return
        self.barrier(loc)
        usable = self.b.target.scratchpad_usable_bytes
        for v, name in self._state_out:
            dst = self._state_in.get(name)
            src = self.tensor(v)
            if dst is None:
                raise EmitError(f"result marked spyre.state = \"{name}\" has no argument with that state")
            if src.fmt is not dst.fmt or tuple(src.shape) != tuple(dst.shape):
                raise EmitError(f"state '{name}': the new value is {src.fmt.key}{list(src.shape)}, the state "
                                f"buffer {dst.fmt.key}{list(dst.shape)}")
            if src.addr == dst.addr:
                continue
            rows, pitch = src.nbytes // dst.pitch, dst.pitch
            per_core = -(-rows // self.cores)
            chunk = max(1, min(per_core, usable // pitch))
            for core in range(self.cores):
                r0, r1 = core * per_core, min(rows, (core + 1) * per_core)
                for r in range(r0, r1, chunk):
                    n = min(chunk, r1 - r)
                    self.b.dma_load(core, src.addr + r * pitch, 0, (n, pitch), (0, pitch), (0, pitch), loc=loc)
                    self.b.dma_store(core, dst.addr + r * pitch, 0, (n, pitch), (0, pitch), (0, pitch), loc=loc)
            self.kernels.append("state update")
