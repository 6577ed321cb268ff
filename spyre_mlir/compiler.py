"""The Python API: compile a PyTorch model for Spyre and get back something to call.

    import spyre_mlir
    exe = spyre_mlir.compile(model, example_inputs, precision="dlf16", cores=32)
    (y,) = exe(x)                 # numpy or torch inputs; numpy outputs; runs on the emulator
    exe.profile                   # modeled cycles, utilization, ... of the last call
    exe.compile_info              # precision, cores, cache hit, compile seconds, what runs on the host

``compile_to_file(..., output="model.spyre")`` writes the binary instead (atomically) and returns its path.

Stages (each a function of ``spyre_mlir.pipeline``): frontend -> linalg -> graph pipeline -> kernel pipeline
-> ``spyre-emit``, on one module in one context (:func:`prepare_module` parses the linalg IR once). Parameter
values travel in the IR as resources holding the arrays themselves (:mod:`spyre_mlir.params`).

Binaries are cached by content: the key is the sha256 of the linalg IR, every parameter's bytes, the options,
the target's fingerprint and the spyre_mlir version (with a hash of the compiler's sources), so a cache hit is
exactly the binary a fresh compile would write. A model (not an already imported one) is also looked up before
Torch-MLIR runs, by a key that maps to that binary key (``<key>.program.json``, written on a miss):

* a model file by its bytes and the input types (:func:`file_key`): a hit does not even load it;
* an ``nn.Module`` by its fingerprint (:func:`module_key`, :mod:`spyre_mlir.frontend.fingerprint`): its
  classes' code and what that code reads by global name, every attribute (parameters and buffers with their
  bytes, plain data), the example inputs' types, torch's version and settings. A hit does not export it. A
  module holding something the fingerprint cannot account for (an arbitrary object, a C extension object,
  code that looks names up at run time) has no such key, and is looked up as an exported program;
* an exported program by its graph, signature and tensors (:func:`program_key`), known without Torch-MLIR.

A hit then costs the key (hashing the parameters, a few milliseconds for the examples) and loading the binary.
The cache lives in ``cache_dir``, else ``$SPYRE_MLIR_CACHE_DIR``, else ``~/.cache/spyre-mlir``;
``cache_dir=False`` disables it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import threading
import time

from spyre_mlir.errors import InternalError, SpyreError
from spyre_mlir.frontend.errors import mlir_error_detail
from spyre_mlir.pipeline import PRECISIONS

__all__ = ["compile", "compile_to_file", "CompileError", "PRECISIONS"]


class CompileError(SpyreError):
    """A request the compiler cannot satisfy (bad option, impossible core count, a tile that cannot fit, a
    pipeline failure); the message says which."""


@dataclasses.dataclass
class CompileInfo:
    precision: str
    cores: int
    cache_hit: bool
    seconds: float
    path: str | None            # the binary on disk; None when it was built only to be loaded (no cache or output)
    host_ops: list
    key: str | None             # the compile cache's key of the binary; None without a cache
    device_ops: list = dataclasses.field(default_factory=list)   # kernels run on the device
    # In-place updates as data flow: (kind "buffer" | "input", target name, input index, output index).
    state: list = dataclasses.field(default_factory=list)
    host_locations: list = dataclasses.field(default_factory=list)   # MLIR location of each host op


_VERSION = None


def _version() -> str:
    """The spyre_mlir version plus a hash of the compiler's own sources (the package with its frontend, codegen,
    cost model and targets; the dialect, the passes and the runtime, whose assembler writes the binary):
    an editable install keeps its version number while the code changes, and a cache must not outlive that."""
    global _VERSION
    if _VERSION is None:
        from importlib.metadata import PackageNotFoundError, version

        import spyre_mlir
        from spyre_mlir import dialects, passes, runtime

        try:
            v = version("spyre-mlir")
        except PackageNotFoundError:
            v = "0"
        h = hashlib.sha256()
        files = []
        for pkg in (spyre_mlir, dialects, passes, runtime):
            for d, subdirs, names in os.walk(os.path.dirname(os.path.abspath(pkg.__file__))):
                subdirs.sort()               # subpackages (codegen/kernels/) too, in a fixed order
                files += [os.path.join(d, f) for f in sorted(names) if f.endswith((".py", ".toml"))]
        for f in files:
            with open(f, "rb") as fh:
                h.update(fh.read())
        _VERSION = f"{v}+{h.hexdigest()[:16]}"
    return _VERSION


def _check_options(precision, cores, target, cards=None):
    from spyre_mlir.target import TargetError, load_target

    if precision not in PRECISIONS:
        raise CompileError(f"unknown precision {precision!r} (choose from {', '.join(PRECISIONS)})")
    try:
        tgt = load_target(target)
    except TargetError as e:
        raise CompileError(str(e)) from None
    if cores is None:
        cores = tgt.max_cores
    if not isinstance(cores, int) or not 1 <= cores <= tgt.max_cores:
        raise CompileError(f"cannot use {cores} cores: the target ({tgt.name}) has 1..{tgt.max_cores}")
    cards = tgt.num_cards if cards is None else cards
    if isinstance(cards, bool) or not isinstance(cards, int) or not 1 <= cards <= tgt.cards_per_host:
        raise CompileError(f"cannot use {cards} cards: the target ({tgt.name}) has 1..{tgt.cards_per_host}")
    return tgt.with_cores(cores).with_cards(cards), cores


def cache_key(imported, precision, cores, target, persistent_state=False) -> str:
    """sha256 over everything that determines the binary."""
    import numpy as np

    from spyre_mlir.frontend.fingerprint import bytes_digest

    h = hashlib.sha256()
    h.update(imported.linalg_ir.encode())
    for name in sorted(imported.params):
        a = np.ascontiguousarray(imported.params[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(bytes_digest(a.reshape(-1).view(np.uint8)))   # the bytes in place (a copy of the weights costs)
    opts = {"precision": precision, "cores": cores, "inputs": [s.name for s in imported.inputs],
            "outputs": [s.name for s in imported.outputs], "persistent_state": bool(persistent_state)}
    h.update(json.dumps(opts, sort_keys=True).encode())
    h.update(target.fingerprint().encode())
    h.update(_version().encode())
    return h.hexdigest()


def program_key(ep, precision, cores, target, persistent_state=False) -> str:
    """sha256 over everything that determines the binary, known before Torch-MLIR runs: the exported program
    (graph, signature, every node's type and source line, the bytes of every parameter, buffer and constant),
    the options, the target's fingerprint and the compiler's version (which covers the frontend)."""
    import torch

    from spyre_mlir.frontend.fingerprint import bytes_digest

    h = hashlib.sha256()
    h.update(ep.graph_module.code.encode())
    h.update(str(ep.graph_signature).encode())
    for n in ep.graph.nodes:
        v = n.meta.get("val")
        h.update(f"{n.name}:{getattr(v, 'shape', None)}:{getattr(v, 'dtype', None)}:"
                 f"{n.meta.get('stack_trace') or ''}".encode())
    tensors = {**ep.state_dict, **ep.constants}
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}:{getattr(t, 'dtype', type(t).__name__)}:{tuple(getattr(t, 'shape', ()))}".encode())
        if isinstance(t, torch.Tensor):
            h.update(bytes_digest(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()))
    opts = {"precision": precision, "cores": cores, "persistent_state": bool(persistent_state)}
    h.update(json.dumps(opts, sort_keys=True).encode())
    h.update(target.fingerprint().encode())
    h.update(_version().encode())
    return h.hexdigest()


def file_key(path, example_inputs, input_shapes, precision, cores, target, persistent_state=False) -> str:
    """sha256 over a model file's bytes, the types of the inputs it is loaded with (example inputs' shapes and
    dtypes, or ``input_shapes``), the options, the target and the compiler's version: a cached compile of the
    same file is found without loading it."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return ""          # the loader reports the file; nothing to look up
    if isinstance(example_inputs, dict):
        example_inputs = [example_inputs[k] for k in sorted(example_inputs)]
    types = [(tuple(getattr(t, "shape", ())), str(getattr(t, "dtype", type(t).__name__)))
             for t in example_inputs or ()]
    opts = {"inputs": types, "input_shapes": [str(x) for x in input_shapes or ()], "precision": precision,
            "cores": cores, "persistent_state": bool(persistent_state)}
    h.update(json.dumps(opts, sort_keys=True).encode())
    h.update(target.fingerprint().encode())
    h.update(_version().encode())
    return "file-" + h.hexdigest()


def module_key(model, example_inputs, input_shapes, precision, cores, target, persistent_state=False) -> str:
    """sha256 over an ``nn.Module`` as ``torch.export`` would trace it, found without tracing it (its classes'
    code, its attributes, parameters and buffers, the example inputs' types, torch's settings:
    :mod:`spyre_mlir.frontend.fingerprint`), the options, the target and the compiler's version. "" when the
    module holds something the fingerprint cannot account for: the caller keys on the exported program."""
    return module_keys(model, [example_inputs], input_shapes, precision, cores, target, persistent_state)[0]


def module_keys(model, examples, input_shapes, precision, cores, target, persistent_state=False) -> list[str]:
    """:func:`module_key` of ``model`` with each of ``examples``, its weights hashed once."""
    from spyre_mlir.frontend.fingerprint import fingerprints

    keys = []
    for fp in fingerprints(model, examples, input_shapes):
        if fp is None:
            keys.append("")
            continue
        h = hashlib.sha256(fp.encode())
        opts = {"precision": precision, "cores": cores, "persistent_state": bool(persistent_state)}
        h.update(json.dumps(opts, sort_keys=True).encode())
        h.update(target.fingerprint().encode())
        h.update(_version().encode())
        keys.append("module-" + h.hexdigest())
    return keys


def _cached_program(cdir, pkey):
    """(binary key, state) of the program compiled before under ``pkey``, when its binary is still cached."""
    if not cdir or not pkey:
        return None
    try:
        with open(os.path.join(cdir, pkey + ".program.json")) as f:
            entry = json.load(f)
        key, state = entry["key"], [tuple(s) for s in entry["state"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (key, state) if os.path.exists(os.path.join(cdir, key + ".spyre")) else None


def _is_module(obj) -> bool:
    torch = sys.modules.get("torch")     # a module's caller has imported torch; a file's need not
    return torch is not None and isinstance(obj, torch.nn.Module)


def _cache_dir(cache_dir):
    if cache_dir is False:
        return None
    explicit = cache_dir is not None
    if cache_dir is None:
        cache_dir = os.environ.get("SPYRE_MLIR_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                          "spyre-mlir")
    try:
        os.makedirs(cache_dir, exist_ok=True)
    except OSError as e:
        if explicit:
            raise CompileError(f"cannot use cache directory {cache_dir}: {e}") from None
        return None          # the default location is not writable here: compile without a cache
    return cache_dir


def prepare_module(imported, device_state=()):
    """The linalg module of ``imported``, ready for the graph pipeline (call inside a context): parameter values
    attached as resources (:mod:`spyre_mlir.params`), inputs and results named (``spyre.name``), persistent
    state marked. This is the one parse of a compile; every stage after it changes this module in place."""
    from torch_mlir import ir

    from spyre_mlir import params

    module = ir.Module.parse(imported.linalg_ir)
    params.attach(module, imported.params)
    args = {i: {"spyre.name": s.name} for i, s in enumerate(imported.inputs)}
    results = {i: {"spyre.name": s.name} for i, s in enumerate(imported.outputs)}
    for name, i, o in device_state:
        args[i]["spyre.state"] = name
        results.setdefault(o, {})["spyre.state"] = name
    _mark(module, args, results)
    return module


def run_stage(module, pipeline: str, what: str) -> None:
    """Run a textual pipeline on ``module``; a failure is a CompileError naming the stage and the op."""
    from torch_mlir import ir

    from spyre_mlir.passes.manager import PipelineError, run_pipeline

    try:
        run_pipeline(module, pipeline)
    except (ir.MLIRError, PipelineError) as e:
        raise CompileError(f"{what} failed: {mlir_error_detail(str(e))}") from None


def emit(module, target=None):
    """spyre-emit on a kernel-level module; returns the emitter (its ``host_ops``, ``kernels``, ``b``, and
    ``layout()``: the binary's image as its pieces)."""
    from spyre_mlir.codegen.emitter import EmitError, TileError
    from spyre_mlir.params import ParamError
    from spyre_mlir.passes.base import PassError
    from spyre_mlir.passes.emit import emit_module

    try:
        return emit_module(module.operation, target)
    except (EmitError, TileError, ParamError, PassError) as e:
        loc = getattr(e, "location", None)
        raise CompileError(f"emission failed: {f'{loc}: ' if loc is not None else ''}{e}") from None


def _mark(module, args: dict, results: dict) -> None:
    """Add string attributes to ``@main``'s arguments and results: ``args`` maps an index among the
    *non-parameter* arguments to {name: value}, ``results`` a result index."""
    from torch_mlir import ir

    from spyre_mlir.params import PARAM_ATTR, arg_dicts, main_func, result_dicts, with_entries

    main = main_func(module)
    arg_attrs, res_attrs = arg_dicts(main), result_dicts(main)
    inputs = [i for i, d in enumerate(arg_attrs) if PARAM_ATTR not in d]

    def strings(extra):
        return {k: ir.StringAttr.get(v) for k, v in extra.items()}

    for i, extra in args.items():
        if i < len(inputs):
            arg_attrs[inputs[i]] = with_entries(arg_attrs[inputs[i]], strings(extra))
    for o, extra in results.items():
        if o < len(res_attrs):
            res_attrs[o] = with_entries(res_attrs[o], strings(extra))
    main.attributes["arg_attrs"] = ir.ArrayAttr.get(arg_attrs)
    main.attributes["res_attrs"] = ir.ArrayAttr.get(res_attrs)


# torch.export keeps its tracing state process-wide: compiles from several threads take turns (four threads
# compiling at once all failed in torch.export, "ProxyTorchDispatchMode slot already occupied"). Re-entrant: a
# generation compiles its steps inside. A forked child makes its own (a thread holding it is not in the child).
_COMPILING = threading.RLock()


def _renew_compile_lock() -> None:
    global _COMPILING
    _COMPILING = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_compile_lock)


def _build(model_or_path, example_inputs, precision, cores, target, cache_dir, input_shapes, output,
           persistent_state=False, cards=None, placement=(None, None), mkey=None, keep_image=False):
    """Compile (or take from the cache): (the binary's path, the Target, CompileInfo, its image). Only
    SpyreError subclasses leave it. ``mkey``: the module's key (:func:`module_key`) when the caller took it
    before anything exported the module (torch.export rebuilds some of a Hugging Face model's attributes, which
    the key records). ``keep_image``: the caller loads the binary, so a binary built now is also returned as
    its bytes (read back from a file it would cost as much as writing it); the path is None when no file
    (no cache, no ``output``) was asked for. The image is None on a cache hit."""
    from spyre_mlir.frontend.fingerprint import digests_remembered
    from spyre_mlir.runtime.collector import collector_paused

    try:
        # The collector paused: tracing and importing make many short-lived objects, which it would promote and
        # then rescan with every object torch has (400k: 160-200 ms a full collection, one in three compiles of
        # the peers' models, none paused; the same peak memory for a 8-layer Llama).
        with _COMPILING, digests_remembered(), collector_paused():    # the keys: one hash of module, program, binary
            return _build_unchecked(model_or_path, example_inputs, precision, cores, target, cache_dir,
                                    input_shapes, output, persistent_state, cards, placement, mkey, keep_image)
    except SpyreError:
        raise
    except Exception as e:  # noqa: BLE001 - a defect: report it as one, with the original chained
        raise InternalError(f"internal error in spyre-mlir while compiling: {type(e).__name__}: {e}. This is a "
                            f"bug; please report it with the model.") from e


def _build_unchecked(model_or_path, example_inputs, precision, cores, target, cache_dir, input_shapes, output,
                     persistent_state=False, cards=None, placement=(None, None), mkey=None, keep_image=False):
    t0 = time.perf_counter()
    tgt, cores = _check_options(precision, cores, target, cards)
    plan, plan_out = placement
    # A forced plan is an input the keys do not cover, and writing one needs the placement to run: no cache.
    cdir = None if plan or plan_out else _cache_dir(cache_dir)
    found = None
    pkeys = []          # keys of the model, before Torch-MLIR runs; each will name the binary's key
    if hasattr(model_or_path, "linalg_ir") and hasattr(model_or_path, "params"):
        imported = model_or_path       # already imported (an ImportedModel): compile it for several options
    else:
        # A binary cached for this model file (by its bytes: not even loaded), this module (by its fingerprint:
        # not exported) or else this exported program is found before Torch-MLIR runs.
        if cdir and isinstance(model_or_path, (str, os.PathLike)):
            pkeys.append(file_key(model_or_path, example_inputs, input_shapes, precision, cores, tgt,
                                  persistent_state))
        elif cdir and _is_module(model_or_path):
            pkeys.append(mkey if mkey is not None else
                         module_key(model_or_path, example_inputs, input_shapes, precision, cores, tgt,
                                    persistent_state))
        found = _cached_program(cdir, pkeys[0] if pkeys else None)
        if found is None:
            # Imported only now: a hit needs neither torch.export nor Torch-MLIR (a file's, not even torch).
            from spyre_mlir.frontend.load import load_program

            ep = load_program(model_or_path, example_inputs, input_shapes)
            if cdir and not isinstance(model_or_path, (str, os.PathLike)):
                pkeys.append(program_key(ep, precision, cores, tgt, persistent_state))
                found = _cached_program(cdir, pkeys[-1])
            if found is None:
                from spyre_mlir.frontend.importer import import_program, lower_to_linalg

                imported = import_program(ep)
                imported.linalg_ir = lower_to_linalg(imported.torch_ir)
    if found is not None:
        key, state = found
    else:
        # Without a cache nothing is named by the key, and it hashes every weight (a Granite-3.3-8B layer: 0.45 s).
        key = cache_key(imported, precision, cores, tgt, persistent_state) if cdir else None
        names = [spec.name for spec in imported.inputs]
        state = [(st.kind, st.target, names.index(st.target), st.output) for st in imported.state]
    program_entry = {"key": key, "state": state}
    device_state = []
    if persistent_state:
        if any(kind != "buffer" for kind, *_ in state):
            raise CompileError("persistent_state keeps module buffers on the device; this program also updates "
                               "an input in place")
        device_state, state = [(target, i, o) for _, target, i, o in state], []
    cached = os.path.join(cdir, key + ".spyre") if cdir else None
    hit = cached is not None and os.path.exists(cached)
    host_ops, device_ops, host_locs = [], [], []
    image = None
    if hit:
        try:
            with open(cached[:-len(".spyre")] + ".json") as f:
                report = json.load(f)
            host_ops, device_ops = report.get("host_ops", []), report.get("device_ops", [])
            host_locs = report.get("host_locations", [])
        except (OSError, ValueError):
            pass
        if output and output != cached:
            _atomic_copy(cached, output)
    else:
        from spyre_mlir.context import make_context
        from spyre_mlir.pipeline import graph_pipeline, kernel_pipeline

        from spyre_mlir.runtime.binary import atomic_write, image_of

        dest = output or cached
        with make_context():
            module = prepare_module(imported, device_state)
            run_stage(module, graph_pipeline(), "graph pipeline")
            # A forced plan without `cards` brings its own card count.
            run_stage(module, kernel_pipeline(precision, cores, target, None if plan and cards is None
                                              else tgt.num_cards, plan, plan_out), "kernel pipeline")
            em = emit(module, tgt)
        layout = em.layout()
        image = image_of(layout) if keep_image else None
        if dest:
            try:
                atomic_write(dest, layout if image is None else image)
            except OSError as e:
                raise CompileError(f"cannot write {dest}: {e.strerror or e}") from None
        host_ops, device_ops, host_locs = list(em.host_ops), list(em.kernels), list(em.host_locations)
        if cached:
            if dest != cached:
                _atomic_copy(dest, cached)
            # What runs on the host (with reasons) is not in the binary: keep it beside the cached copy.
            _atomic_write(cached[:-len(".spyre")] + ".json", json.dumps({"host_ops": host_ops,
                                                                        "device_ops": device_ops,
                                                                        "host_locations": host_locs}))
    for pkey in pkeys:
        if pkey and (found is None or pkey != pkeys[-1]):     # the one found already names this binary
            _atomic_write(os.path.join(cdir, pkey + ".program.json"), json.dumps(program_entry))
    info = CompileInfo(precision, cores, hit, time.perf_counter() - t0, output or cached, host_ops, key,
                       device_ops, state, host_locs)
    return output or cached, tgt, info, image


def _atomic_write(path: str, text: str) -> None:
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _atomic_copy(src: str, dst: str) -> None:
    """Copy so that readers (and concurrent compiles of the same model) never see half a file."""
    import shutil
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(dst)), prefix=".", suffix=".tmp")
    os.close(fd)
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def compile(model_or_path, example_inputs=None, *, precision: str = "dlf16", cores: int | None = None,
            target=None, cache_dir=None, input_shapes=None, persistent_state: bool = False,
            cards: int | None = None, placement_plan: str | None = None, placement_plan_out: str | None = None):
    """Compile and load: returns the runtime's Executable (call it with inputs; ``.profile`` afterwards;
    ``.compile_info`` says how it was built). ``model_or_path`` is an ``nn.Module`` (with
    ``example_inputs``), a model file, or an ``ImportedModel`` from ``spyre_mlir.frontend.import_model``.
    ``cores`` None: every core of the target (per card). ``cards`` > 1 places the model over that many cards
    (spyre-place-cards, spyre-partition-cards) and returns a ``SystemExecutable`` that runs them;
    ``placement_plan_out`` writes the placement plan (JSON, docs/compiler.md), ``placement_plan`` forces one
    (both compile without the cache).
    ``precision`` ``fp32-reference`` runs with the emulator's
    fp32-reference numerics (no rounding anywhere). ``persistent_state``: buffers the model updates in place
    (a KV cache) live in device memory across calls instead of being passed in and returned (read them with
    ``exe.read_state(name)``)."""
    from spyre_mlir.runtime import load, load_bytes

    path, tgt, info, image = _build(model_or_path, example_inputs, precision, cores, target, cache_dir,
                                    input_shapes, None, persistent_state, cards, (placement_plan, placement_plan_out),
                                    keep_image=True)
    try:
        # The binary records the numerics its precision needs.
        exe = load(path, target=tgt) if image is None else load_bytes(image, target=tgt)
    except SpyreError:
        raise
    except Exception as e:  # noqa: BLE001
        raise InternalError(f"internal error in spyre-mlir while loading the compiled program: "
                            f"{type(e).__name__}: {e}") from e
    exe.compile_info = info
    if info.state:
        return StatefulExecutable(exe, model_or_path if hasattr(model_or_path, "get_buffer") else None)
    return exe


class StatefulExecutable:
    """An executable whose model updates state in place (batch-norm statistics in training mode, a counter
    buffer, ``x.mul_(2)`` on an input). As under torch.compile, the compiled program returns the new values;
    a call passes the module's current buffers, writes the new values back into them (and into mutated
    inputs) and returns the user outputs only. Everything else is the wrapped Executable's."""

    def __init__(self, exe, module):
        self._exe, self._module = exe, module
        self._n_user = len(exe.output_buffers) - len(exe.compile_info.state)

    def __getattr__(self, name):
        return getattr(self._exe, name)

    def __call__(self, *args):
        with self._exe.lock:       # the buffers read, the run and the write-back: one turn among threads
            return self._call(args)

    def _call(self, args):
        state = self._exe.compile_info.state
        buffers = {target: self._module.get_buffer(target) for kind, target, _, _ in state
                   if kind == "buffer" and self._module is not None}
        n_in = len(self._exe.input_buffers)
        full = list(args) + [None] * (n_in - len(args))
        for kind, target, i, _ in state:
            if kind == "buffer" and full[i] is None:
                if target not in buffers:
                    raise CompileError(f"the program updates buffer '{target}': pass its current value as "
                                       f"input {i}")
                full[i] = buffers[target]
        outs = self._exe(*full)
        for kind, target, i, o in state:
            dst = buffers.get(target) if kind == "buffer" else args[i]
            if dst is not None:
                _write_back(dst, outs[o])
        return outs[:self._n_user]


def _write_back(dst, value) -> None:
    """Copy a program's new value of a state tensor into the caller's tensor or array, in place."""
    import numpy as np

    if hasattr(dst, "copy_"):
        import torch

        with torch.no_grad():
            dst.copy_(to_torch(value))
    else:
        np.copyto(dst, value, casting="unsafe")


def to_torch(a):
    """A numpy result as a torch tensor (bfloat16, from ml_dtypes, by its bits: torch.from_numpy lacks it)."""
    import torch

    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view("int16").copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def compile_to_file(model_or_path, example_inputs=None, *, output: str, precision: str = "dlf16",
                    cores: int | None = None, target=None, cache_dir=None, input_shapes=None,
                    persistent_state: bool = False, cards: int | None = None, placement_plan: str | None = None,
                    placement_plan_out: str | None = None) -> str:
    """Compile to a .spyre file at ``output`` (written atomically); returns the path. Options as :func:`compile`."""
    path, _, _, _ = _build(model_or_path, example_inputs, precision, cores, target, cache_dir, input_shapes, output,
                           persistent_state, cards, (placement_plan, placement_plan_out))
    return path
