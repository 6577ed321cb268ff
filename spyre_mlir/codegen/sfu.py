"""spyre.map bodies -> SFU micro-ops on tiles.

The body is scalar arith/math; applied to a [rows, C] tile each op becomes one or a few SFU instructions.
Translation happens in two steps so the kernel can size its tiles first: :func:`translate` turns the body
into micro-ops over virtual registers (counting how many fp32 temporaries are live at once), then the kernel
binds registers to scratchpad tiles and emits. Values are:

* ``("in", i)``: the i-th input tile, full [rows, C] or broadcast ([rows,1] ROW, [1,C] COL, [1,1] SCALAR),
* ``("t", k)``: a full fp32 temporary,
* a Python float: a constant folded at compile time (becomes an SFU immediate).

The SFU computes in fp32 whatever the tile formats are, and rounds once on write: temporaries are fp32, so a
fused chain rounds only when the result is written in the output format (what the contract promises).
Ops the SFU has no instruction for are rewritten: ``erf(y) = 2 * gelu_erf(z) / z - 1`` with ``z = sqrt(2) y``
(exact at z = 0 through a select), ``select`` with two tile values as two selects and an add, ``cmpf`` as the
comparison functions (NaN ordering is not modelled). ReLU's select form is one RELU (which treats NaN as the
select does), sigmoid's 1 / (1 + exp(-x)) one SIGMOID and x times it one SILU. Anything else raises
:class:`NotOnSfu` and the op runs on the host.
"""

from __future__ import annotations

import math

from spyre_mlir.runtime.isa import SfuFn

__all__ = ["NotOnSfu", "translate", "MicroOp", "live_temps", "writes_result"]


class NotOnSfu(Exception):
    pass


_UNARY = {"arith.negf": SfuFn.NEG, "math.absf": SfuFn.ABS, "math.exp": SfuFn.EXP, "math.log": SfuFn.LOG,
          "math.sqrt": SfuFn.SQRT, "math.rsqrt": SfuFn.RSQRT, "math.tanh": SfuFn.TANH}
_BINARY = {"arith.addf": SfuFn.ADD, "arith.subf": SfuFn.SUB, "arith.mulf": SfuFn.MUL, "arith.divf": SfuFn.DIV,
           "arith.maximumf": SfuFn.MAX, "arith.maxnumf": SfuFn.MAX, "arith.minimumf": SfuFn.MIN,
           "arith.minnumf": SfuFn.MIN, "math.powf": SfuFn.POW}
# arith.cmpf predicate -> comparison (ordered and unordered alike: the SFU does not model NaN ordering)
_CMP = {1: SfuFn.EQ, 2: SfuFn.GT, 3: SfuFn.GE, 4: SfuFn.LT, 5: SfuFn.LE, 6: SfuFn.NE, 8: SfuFn.EQ, 9: SfuFn.GT,
        10: SfuFn.GE, 11: SfuFn.LT, 12: SfuFn.LE, 13: SfuFn.NE}
_FOLD = {SfuFn.NEG: lambda a: -a, SfuFn.ABS: abs, SfuFn.EXP: math.exp, SfuFn.LOG: math.log,
         SfuFn.SQRT: math.sqrt, SfuFn.RSQRT: lambda a: 1 / math.sqrt(a), SfuFn.TANH: math.tanh,
         SfuFn.ADD: lambda a, b: a + b, SfuFn.SUB: lambda a, b: a - b, SfuFn.MUL: lambda a, b: a * b,
         SfuFn.DIV: lambda a, b: a / b, SfuFn.MAX: max, SfuFn.MIN: min, SfuFn.POW: lambda a, b: a ** b,
         SfuFn.RELU: lambda a: a if a > 0 or a != a else 0.0, SfuFn.SIGMOID: lambda a: 1 / (1 + math.exp(-a)),
         SfuFn.SILU: lambda a: a * (1 / (1 + math.exp(-a)))}


class MicroOp(tuple):
    """(fn, dst, src0, src1, imm, swap): one SFU instruction over registers."""


class _Body:
    def __init__(self, kinds):
        self.kinds = kinds        # per input: "full" | "row" | "col" | "scalar"
        self.ops: list = []
        self.ntemps = 0

    def full(self, v) -> bool:
        return isinstance(v, tuple) and (v[0] == "t" or self.kinds[v[1]] == "full")

    def temp(self):
        self.ntemps += 1
        return ("t", self.ntemps - 1)

    def emit(self, fn, src0=None, src1=None, imm=None, swap=False):
        d = self.temp()
        self.ops.append(MicroOp((fn, d, src0, src1, imm, swap)))
        return d

    def materialize(self, v):
        """A full tile holding v (a broadcast tile or a constant)."""
        if self.full(v):
            return v
        z = self.emit(SfuFn.FILL, imm=0.0 if not isinstance(v, float) else v)
        return z if isinstance(v, float) else self.emit(SfuFn.ADD, z, v)

    def unary(self, fn, a, imm=None):
        if isinstance(a, float):
            return float(_FOLD[fn](a))
        return self.emit(fn, self.materialize(a), imm=imm)

    def ipow(self, a, n: int):
        """x ** n for an integer n the way PyTorch's CPU kernel computes it: products for |n| <= 3 (so
        ``x ** 3`` is ``x * x * x``, bit for bit), a reciprocal for negative n, the POW function otherwise."""
        if abs(n) > 3:
            return self.unary(SfuFn.POWS, a, imm=float(n))
        r = 1.0
        for _ in range(abs(n)):
            r = a if isinstance(r, float) and r == 1.0 else self.binary(SfuFn.MUL, r, a)
        return self.binary(SfuFn.DIV, 1.0, r) if n < 0 else r

    def binary(self, fn, a, b):
        if isinstance(a, float) and isinstance(b, float):
            return float(_FOLD[fn](a, b)) if fn in _FOLD else float(_cmp_fold(fn, a, b))
        if self.full(a):
            return self.emit(fn, a, b)
        if self.full(b):
            return self.emit(fn, b, a, swap=True)
        return self.emit(fn, self.materialize(a), b)

    def select(self, c, x, y):
        c = self.materialize(c)
        if isinstance(x, float) and isinstance(y, float):
            x = self.materialize(x)
        if not isinstance(x, float) and isinstance(y, float):
            return self.emit(SfuFn.SELECT, c, x, imm=y)
        notc = self.emit(SfuFn.EQ, c, 0.0)
        if isinstance(x, float):
            return self.emit(SfuFn.SELECT, notc, y, imm=x)
        t1 = self.emit(SfuFn.SELECT, c, x, imm=0.0)
        t2 = self.emit(SfuFn.SELECT, notc, y, imm=0.0)
        return self.emit(SfuFn.ADD, t1, t2)

    def erf(self, y):
        if isinstance(y, float):
            return math.erf(y)
        z = self.binary(SfuFn.MUL, y, math.sqrt(2.0))
        g = self.emit(SfuFn.GELU_ERF, self.materialize(z))
        phi = self.binary(SfuFn.DIV, g, z)                 # Phi(z) = gelu(z) / z, NaN at z = 0
        nz = self.binary(SfuFn.NE, z, 0.0)
        phi = self.emit(SfuFn.SELECT, nz, phi, imm=0.5)    # Phi(0) = 1/2
        t = self.binary(SfuFn.MUL, phi, 2.0)
        return self.binary(SfuFn.SUB, t, 1.0)


# i1 logic on 0/1 values
_BOOL = {"arith.andi": SfuFn.MUL, "arith.ori": SfuFn.MAX, "arith.xori": SfuFn.NE}


def _cmp_fold(fn, a, b):
    return {SfuFn.EQ: a == b, SfuFn.NE: a != b, SfuFn.LT: a < b, SfuFn.LE: a <= b, SfuFn.GT: a > b,
            SfuFn.GE: a >= b}[fn] * 1.0


def translate(block, kinds):
    """Translate a map body. Returns (micro-ops, result register or float, number of temporaries).

    Every float-typed op must be on the SFU; integer/bool ops (index math, masks) raise NotOnSfu."""
    from torch_mlir import ir

    body = _Body(kinds)
    env = {}
    fused, dead = _fused(block)
    for i, a in enumerate(block.arguments):
        if not _is_float(a.type) and str(a.type) != "i1":
            raise NotOnSfu(f"map input of type {a.type}")
        env[a] = ("in", i)
    result = None
    for op in block.operations:
        o = op.operation
        name = o.name
        if name == "spyre.yield":
            result = env[o.operands[0]]
            break
        if name == "math.fpowi":
            n = _int_constant(o.operands[1])
            if n is None or env.get(o.operands[0]) is None:
                raise NotOnSfu("math.fpowi with a non-constant exponent")
            env[o.results[0]] = body.ipow(env[o.operands[0]], n)
            continue
        if o in dead:
            continue
        if o in fused:
            fn, x = fused[o]
            env[o.results[0]] = body.unary(fn, env[x])
            continue
        args = [env.get(v) for v in o.operands]
        if any(a is None for a in args):
            raise NotOnSfu(f"'{name}' reads a value from outside the map body")
        res_t = o.results[0].type if o.results else None
        if name == "arith.constant":
            a = o.attributes["value"]
            if isinstance(a, ir.FloatAttr):
                r = float(ir.FloatAttr(a).value)
            elif isinstance(a, ir.IntegerAttr) and str(res_t) == "i1":
                r = 1.0 if ir.IntegerAttr(a).value else 0.0
            elif isinstance(a, ir.IntegerAttr):
                continue       # an integer exponent of math.fpowi (read there); nothing on the SFU
            else:
                raise NotOnSfu(f"constant {a}")
        elif str(res_t) == "i1" and name in _BOOL:
            # Masks are 0.0 / 1.0 on the SFU (bool tiles decode to 0/1 and encode as x != 0).
            r = body.binary(_BOOL[name], *args)
        elif name in ("arith.uitofp", "arith.sitofp") and str(o.operands[0].type) == "i1":
            r = args[0]
        elif name in ("arith.fptoui", "arith.fptosi") and str(res_t) == "i1":
            r = body.binary(SfuFn.GE, args[0], 1.0)
        elif name == "arith.cmpf":
            p = ir.IntegerAttr(o.attributes["predicate"]).value
            if p not in _CMP:
                raise NotOnSfu(f"cmpf predicate {p}")
            r = body.binary(_CMP[p], *args)
        elif res_t is not None and not _is_float(res_t) and name != "arith.cmpf":
            raise NotOnSfu(f"'{name}' computes {res_t}")
        elif name in _UNARY:
            r = body.unary(_UNARY[name], args[0])
        elif name in _BINARY:
            fn = _BINARY[name]
            if fn is SfuFn.POW and isinstance(args[1], float) and not isinstance(args[0], float):
                r = body.unary(SfuFn.POWS, args[0], imm=args[1])
            else:
                r = body.binary(fn, *args)
        elif name == "math.erf":
            r = body.erf(args[0])
        elif name == "arith.select":
            r = body.select(*args)
        elif name in ("arith.extf", "arith.truncf"):
            r = args[0]        # the SFU computes in fp32 anyway; rounding happens on write
        else:
            raise NotOnSfu(f"'{name}' has no SFU form")
        env[o.results[0]] = r
    return body.ops, result, body.ntemps


# ReLU as Torch-MLIR writes it: x where x > 0 (unordered: NaN too), else +0.0. The RELU function (fp32 max(x, +0))
# gives exactly that for every x, -0.0 -> +0.0 and NaN included; ``x <= 0 (ordered) ? 0 : x`` is the same.
_RELU = {9: 1, 5: 2}      # cmpf predicate (ugt, ole) -> the select operand that must be x (the other is +0.0)


def _def(v, name: str):
    """The op defining ``v`` when it is a ``name`` op, else None."""
    owner = getattr(v.owner, "operation", v.owner)
    return owner if getattr(owner, "name", None) == name else None


def _relu(o):
    """x when ``o`` is ReLU of x as a select, else None; and the compare it reads."""
    cond = _def(o.operands[0], "arith.cmpf") if o.name == "arith.select" else None
    if cond is None:
        return None, ()
    from torch_mlir import ir

    which = _RELU.get(ir.IntegerAttr(cond.attributes["predicate"]).value)
    x, zero = cond.operands[0], cond.operands[1]
    if which is None or not _is_const(zero, 0.0) or not _is_const(o.operands[3 - which], 0.0) \
            or o.operands[which] != x:
        return None, ()
    return x, (cond,)


def _sigmoid(o):
    """x when ``o`` is 1 / (1 + exp(-x)), as Torch-MLIR writes sigmoid, else None; and the ops it reads."""
    if o.name != "arith.divf" or not _is_const(o.operands[0], 1.0):
        return None, ()
    add = _def(o.operands[1], "arith.addf")
    if add is None:
        return None, ()
    e, one = add.operands
    if _is_const(e, 1.0):
        e, one = one, e
    exp = _def(e, "math.exp")
    neg = exp and _def(exp.operands[0], "arith.negf")
    if not _is_const(one, 1.0) or neg is None:
        return None, ()
    return neg.operands[0], (add, exp, neg)


def _fused(block):
    """Ops of a body that are one SFU function of a value: {op: (function, x)}, and the ops only they read (not
    emitted). ReLU's select form is RELU; sigmoid's 1 / (1 + exp(-x)) is SIGMOID, and x times it SILU: the SFU
    computes those functions with exactly these fp32 operations, one instruction where they were several."""
    uses: dict = {}
    for op in block.operations:
        for v in op.operation.operands:
            uses[v] = uses.get(v, 0) + 1
    fused, dead = {}, set()

    def take(fn, o, x, parts) -> None:
        fused[o] = (fn, x)
        for p in parts:       # each part read once, by the next one: the whole chain goes
            if uses.get(p.results[0]) != 1:
                break
            dead.add(p)
    for op in block.operations:
        o = op.operation
        for fn, match in ((SfuFn.RELU, _relu), (SfuFn.SIGMOID, _sigmoid)):
            x, parts = match(o)
            if x is not None:
                take(fn, o, x, parts)
        if o.name == "arith.mulf":
            for x, s in (o.operands, reversed(list(o.operands))):
                sig = getattr(s.owner, "operation", s.owner)
                if fused.get(sig) == (SfuFn.SIGMOID, x):
                    take(SfuFn.SILU, o, x, (sig,) + _sigmoid(sig)[1])
                    break
    return fused, dead


def _is_const(v, value: float) -> bool:
    """Whether ``v`` is an ``arith.constant`` of exactly ``value`` (+0.0 is not -0.0), in the body or captured."""
    from torch_mlir import ir

    owner = _def(v, "arith.constant")
    a = owner.attributes["value"] if owner is not None else None
    if not isinstance(a, ir.FloatAttr):
        return False
    c = ir.FloatAttr(a).value
    return c == value and math.copysign(1.0, c) == math.copysign(1.0, value)


def _int_constant(v):
    """The value of an integer ``arith.constant`` (defined in the body or captured from above), else None."""
    from torch_mlir import ir

    owner = v.owner
    if not isinstance(owner, ir.Operation) and hasattr(owner, "operation"):
        owner = owner.operation
    if not isinstance(owner, ir.Operation) or owner.name != "arith.constant":
        return None
    a = owner.attributes["value"]
    return ir.IntegerAttr(a).value if isinstance(a, ir.IntegerAttr) else None


def _is_float(t) -> bool:
    s = str(t)
    return s in ("f32", "f16", "bf16", "f64", "!spyre.dlf16") or s.startswith("f8")


def writes_result(ops, result) -> bool:
    """Whether the last micro-op computes the result, so it writes the output tile itself, rounding on the write
    as the cast it saves would (the SFU computes in fp32 and rounds once, to the destination's format)."""
    return bool(ops) and ops[-1][1] == result


def live_temps(ops, result) -> tuple[dict, int]:
    """Linear-scan allocation of temporaries to slots; returns ({temp: slot}, number of slots). A result the last
    op computes (:func:`writes_result`) goes to the output tile and has no slot."""
    last = {}
    for i, op in enumerate(ops):
        for v in (op[2], op[3]):
            if isinstance(v, tuple) and v[0] == "t":
                last[v] = i
    if isinstance(result, tuple) and result[0] == "t":
        last[result] = len(ops)
    free, slot, nslots = [], {}, 0
    for i, op in enumerate(ops):
        d = op[1]
        if i == len(ops) - 1 and writes_result(ops, result):
            break
        # Elementwise: the destination may reuse a source dying here (in-place on the SFU).
        for v in dict.fromkeys((op[2], op[3])):   # ordered: a set of str-keyed tuples iterates by a per-process hash
            if isinstance(v, tuple) and v[0] == "t" and last.get(v) == i:
                free.append(slot[v])
        if free:
            slot[d] = free.pop()
        else:
            slot[d] = nslots
            nslots += 1
        if last.get(d, -1) <= i and d != result:
            free.append(slot[d])
    return slot, nslots
