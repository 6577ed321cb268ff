"""Reference kernels written with ProgramBuilder: tiled (split-K) matmul, softmax, layernorm, rmsnorm.

They are the worked examples of the instruction set — how a kernel divides work across cores, tiles to
the scratchpad, double-buffers DMA against the PT array, reduces split-K partial sums over the ring — and
they feed the tests, the benchmark, and later the compiler's ``spyre-emit`` as patterns to match.
Norms and softmax upcast to fp32 on the SFU (the precision policy users of the real stack ask for) and
round once, when writing the DLFloat16 result.
"""

from __future__ import annotations

import numpy as np

from .assembler import ProgramBuilder

__all__ = ["build_matmul", "build_softmax", "build_layernorm", "build_rmsnorm"]


def _split(total: int, parts: int, what: str) -> int:
    if total % parts:
        raise ValueError(f"{what}={total} does not split evenly into {parts}")
    return total // parts


def build_matmul(target, M: int, N: int, K: int, fmt="dlf16", out_fmt="dlf16", grid=None, split_k: int = 1,
                 tile_m: int | None = None, tile_n: int | None = None, tile_k: int | None = None,
                 double_buffer: bool = True, weights=None, bias=None) -> ProgramBuilder:
    """``y[M,N] = x[M,K] @ w[K,N] (+ bias)`` on all cores of ``target``.

    Cores form a grid ``(gm, gn)`` of output blocks times ``split_k`` K-slices (core id =
    ``(bi*gn + bj)*split_k + kk``). Each core walks its block in [tile_m, tile_n] output tiles and its K-slice
    in tile_k steps, accumulating in an fp32 tile; with ``double_buffer`` the next A/B tiles load while the
    PT array works on the current ones. With split_k > 1 the partial sums meet in a ring reduce-sum on the
    group's first core, which rounds and stores. ``weights`` (an array) makes ``w`` a constant instead of
    an input; ``bias`` (an array [N]) adds a bias on write-back.
    """
    cores = target.num_cores
    if grid is None:
        grid = (cores // split_k, 1)
    gm, gn = grid
    if gm * gn * split_k != cores:
        raise ValueError(f"grid {grid} x split_k {split_k} != {cores} cores")
    mb, nb, kb = _split(M, gm, "M"), _split(N, gn, "N"), _split(K, split_k, "K")
    tm, tn, tk = tile_m or mb, tile_n or nb, tile_k or kb
    for total, tile, what in ((mb, tm, "M block"), (nb, tn, "N block"), (kb, tk, "K slice")):
        _split(total, tile, what)
    b = ProgramBuilder(target)
    x = b.input("x", (M, K), fmt)
    w = b.constant("w", weights, fmt) if weights is not None else b.input("w", (K, N), fmt)
    bias_buf = b.constant("bias", np.asarray(bias, np.float32).reshape(1, N), "fp32") if bias is not None else None
    y = b.output("y", (M, N), out_fmt)
    nbuf = 2 if double_buffer else 1
    # Every core allocates the same tiles in the same order, so a tile sits at the same address everywhere
    # (what ring_reduce expects).
    tiles = {}
    for core in range(cores):
        tiles[core] = dict(
            A=[b.alloc(core, tm, tk, fmt) for _ in range(nbuf)], B=[b.alloc(core, tk, tn, fmt) for _ in range(nbuf)],
            C=b.alloc(core, tm, tn, "fp32"), R=b.alloc(core, tm, tn, "fp32") if split_k > 1 else None,
            O=b.alloc(core, tm, tn, out_fmt), BI=b.alloc(core, 1, tn, "fp32") if bias is not None else None)
    nk = kb // tk
    for blk in range(gm * gn):
        bi, bj = divmod(blk, gn)
        group = list(range(blk * split_k, (blk + 1) * split_k))
        root = group[0]
        for i in range(mb // tm):
            for j in range(nb // tn):
                r0, c0 = bi * mb + i * tm, bj * nb + j * tn
                for kk, core in enumerate(group):
                    t = tiles[core]
                    if t["BI"] is not None and core == root:
                        b.load_tile(core, t["BI"], bias_buf, 0, c0)
                    for s in range(nk):
                        k0 = kk * kb + s * tk
                        A, B = t["A"][s % nbuf], t["B"][s % nbuf]
                        b.load_tile(core, A, x, r0, k0)
                        b.load_tile(core, B, w, k0, c0)
                        last = s == nk - 1 and split_k == 1
                        b.matmul(core, A, B, t["C"], accumulate=s > 0, out=t["O"] if last else None,
                                 bias=t["BI"] if last else None)
                t = tiles[root]
                if split_k > 1:
                    b.ring_reduce(group, t["R"], t["C"], root=root)
                    b.barrier(group)
                    if t["BI"] is not None:
                        b.sfu(root, "add", t["R"], t["R"], t["BI"])
                    b.sfu(root, "cast", t["O"], t["R"])
                b.store_tile(root, t["O"], y, r0, c0)
    return b


def _row_blocks(R: int, cores: int, tile_rows: int | None):
    """(core, first row, rows) of every row tile when R rows split evenly over the cores."""
    rb = _split(R, cores, "rows")
    tr = tile_rows or rb
    _split(rb, tr, "row block")
    for core in range(cores):
        for t in range(rb // tr):
            yield core, core * rb + t * tr, tr


def build_softmax(target, R: int, C: int, fmt="dlf16", tile_rows: int | None = None) -> ProgramBuilder:
    """Row softmax of x[R,C], rows split across cores; max-subtracted, computed in fp32 on the SFU."""
    b = ProgramBuilder(target)
    x, y = b.input("x", (R, C), fmt), b.output("y", (R, C), fmt)
    for core, r0, tr in _row_blocks(R, target.num_cores, tile_rows):
        b.reset_scratchpad(core)
        X, O = b.alloc(core, tr, C, fmt), b.alloc(core, tr, C, fmt)
        XF, M, S = b.alloc(core, tr, C, "fp32"), b.alloc(core, tr, 1, "fp32"), b.alloc(core, tr, 1, "fp32")
        b.load_tile(core, X, x, r0)
        b.sfu(core, "cast", XF, X)
        b.reduce(core, "max", M, XF)
        b.sfu(core, "sub", XF, XF, M)
        b.sfu(core, "exp", XF, XF)
        b.reduce(core, "sum", S, XF)
        b.sfu(core, "recip", S, S)
        b.sfu(core, "mul", XF, XF, S)
        b.sfu(core, "cast", O, XF)
        b.store_tile(core, O, y, r0)
    return b


def build_layernorm(target, R: int, C: int, gamma, beta, eps: float = 1e-5, fmt="dlf16",
                    tile_rows: int | None = None) -> ProgramBuilder:
    """LayerNorm over the last dim of x[R,C] with constant gamma/beta [C] (stored as DLFloat16), fp32 inside."""
    return _build_norm(target, R, C, gamma, beta, eps, fmt, tile_rows)


def build_rmsnorm(target, R: int, C: int, gamma, eps: float = 1e-6, fmt="dlf16",
                  tile_rows: int | None = None) -> ProgramBuilder:
    """RMSNorm over the last dim of x[R,C] with constant gamma [C], fp32 inside."""
    return _build_norm(target, R, C, gamma, None, eps, fmt, tile_rows)


def _build_norm(target, R, C, gamma, beta, eps, fmt, tile_rows) -> ProgramBuilder:
    """x / sqrt(mean(x^2) + eps) * gamma (+ beta), centering x first when there is a beta (LayerNorm)."""
    centered = beta is not None
    b = ProgramBuilder(target)
    x, y = b.input("x", (R, C), fmt), b.output("y", (R, C), fmt)
    g = b.constant("gamma", np.asarray(gamma).reshape(1, C), fmt)
    be = b.constant("beta", np.asarray(beta).reshape(1, C), fmt) if centered else None
    for core, r0, tr in _row_blocks(R, target.num_cores, tile_rows):
        b.reset_scratchpad(core)
        X, O, G = b.alloc(core, tr, C, fmt), b.alloc(core, tr, C, fmt), b.alloc(core, 1, C, fmt)
        XF, SQ, MS = b.alloc(core, tr, C, "fp32"), b.alloc(core, tr, C, "fp32"), b.alloc(core, tr, 1, "fp32")
        b.load_tile(core, X, x, r0)
        b.load_tile(core, G, g)
        b.sfu(core, "cast", XF, X)
        if centered:
            BE = b.alloc(core, 1, C, fmt)
            b.load_tile(core, BE, be)
            b.reduce(core, "mean", MS, XF)
            b.sfu(core, "sub", XF, XF, MS)
        b.sfu(core, "mul", SQ, XF, XF)
        b.reduce(core, "mean", MS, SQ)
        b.sfu(core, "add", MS, MS, eps)
        b.sfu(core, "rsqrt", MS, MS)
        b.sfu(core, "mul", XF, XF, MS)
        b.sfu(core, "mul", XF, XF, G)
        if centered:
            b.sfu(core, "add", XF, XF, BE)
        b.sfu(core, "cast", O, XF)
        b.store_tile(core, O, y, r0)
    return b
