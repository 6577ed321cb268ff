"""A fingerprint of an ``nn.Module`` and its example inputs, computed without exporting it.

The compiler's cache finds a binary by this fingerprint before ``torch.export`` runs (a hit then costs
hashing the parameters, not a trace). It must change whenever the exported program could, so it covers
everything the trace reads:

* every submodule (through ``_modules``, in order, a shared one as a reference to the first): its class and
  every instance attribute: parameters and buffers (name, dtype, shape, strides, bytes; a tied one as a
  reference), plain data (numbers, strings, dtypes, containers of them, dataclasses), hooks, the training flag;
  containers (tuples, lists, dicts) by value, as an export leaves them equal but not the same objects;
* the code of every class on the way (each method's bytecode, constants, names, file and line table, so the
  source locations the binary records stay right; defaults and closures), up to torch's and Hugging Face
  transformers' own classes, which their versions identify (a method patched into one is hashed); objects of
  those libraries' classes (a model's config, a cache layer) by their class and attributes;
* the registries transformers' code looks functions up in by a name the config holds (attention, masks,
  experts): a function registered there is hashed like any other;
* what that code reads by global name: a function (hashed the same way), a class, plain data, a module (the
  attributes the code names in it, recursively);
* the example inputs' types (tensors: dtype, shape, strides; other values: the value), ``input_shapes``;
* torch's (and transformers') version, the Python version and the torch settings a trace depends on
  (default dtype, grad mode,
  what differs from the defaults in the export, dynamo, functorch and fx configs and the environment
  variables they read, the global module hooks).

Anything it cannot account for (an arbitrary object as an attribute or a global, a C extension object, a
tensor subclass, a module other than torch's read through an attribute) makes :func:`fingerprint` return
None: the caller then exports and keys on the exported program, as before. When in doubt, fall back.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import hashlib
import importlib.util
import os
import sys
import sysconfig
import threading
import types
import typing

import torch

# Modules whose functions and classes are identified by name: their code is fixed by the Python and torch
# versions in the fingerprint.
_TRUSTED = {"torch", "builtins", "math", "operator", "functools", "itertools", "typing", "collections", "abc",
            "enum", "dataclasses", "numbers", "warnings", "contextlib", "types", "copy", "transformers"}
# Class attributes that do not change what the code does (or are covered elsewhere: dataclass fields are
# instance attributes, their defaults class attributes).
_SKIP = {"__dict__", "__weakref__", "__doc__", "__module__", "__annotations__", "__dataclass_fields__",
         "__dataclass_params__", "_abc_impl"}
# Attributes that differ from process to process and that no trace reads: a Hugging Face generation config's
# hash of itself (to tell whether it was changed; Python salts string hashes per process).
_VOLATILE = {"_original_object_hash"}
# Builtins that read names the code does not spell out.
_DYNAMIC = {"globals", "locals", "vars", "eval", "exec", "__import__"}
_PLAIN = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis), slice)
_TORCH_PLAIN = (torch.dtype, torch.device, torch.layout, torch.memory_format)
_SEQUENCES = (tuple, list, torch.Size)        # and named tuples (_sequence)
_MAPPINGS = (dict, collections.OrderedDict)
_CONFIGS = ("torch._export.config", "torch._dynamo.config", "torch._functorch.config",
            "torch.fx.experimental._config")

# The environment variables those configs read (TORCHDYNAMO_*, TORCH_COMPILE_*, AOT_*, FAKE_*, ...), but the
# directory torch itself sets when torch._dynamo is imported (inductor's cache, which a trace does not use).
_ENV = ("TORCH", "AOT_", "FAKE_", "PT2_", "PARTITIONER_")
_ENV_SKIP = {"TORCHINDUCTOR_CACHE_DIR"}


_DIGESTS = threading.local()


@contextlib.contextmanager
def digests_remembered():
    """Within the block, the sha256 of a buffer's bytes (:func:`bytes_digest`) is computed once: a compile keys
    the module, its exported program and its import, each over the same weights (a Granite-3.3-8B layer: three
    times 0.45 s). The block keeps every buffer it hashed alive, so that no other takes its address; nothing may
    write a weight within it."""
    outer = getattr(_DIGESTS, "memo", None)
    if outer is None:
        _DIGESTS.memo = {}
    try:
        yield
    finally:
        if outer is None:
            _DIGESTS.memo = None


def bytes_digest(a) -> bytes:
    """sha256 of the bytes of ``a`` (a contiguous numpy array), remembered by address and size inside
    :func:`digests_remembered`."""
    memo = getattr(_DIGESTS, "memo", None)
    if memo is None:
        return hashlib.sha256(a).digest()
    key = (a.__array_interface__["data"][0], a.nbytes)
    seen = memo.get(key)
    if seen is None:
        seen = memo[key] = (hashlib.sha256(a).digest(), a)
    return seen[0]


def _sequence(v, t) -> bool:
    return t in _SEQUENCES or (isinstance(v, tuple) and hasattr(t, "_fields"))


class Unhashable(Exception):
    """The fingerprint cannot account for this object; the reason names it."""


def fingerprint(model, example_inputs=None, input_shapes=None) -> str | None:
    """sha256 over ``model``, its example inputs (or ``input_shapes``) and torch's settings; None when some
    part of the model is not plain enough to fingerprint (see the module doc)."""
    return fingerprints(model, [example_inputs], input_shapes)[0]


def fingerprints(model, examples, input_shapes=None) -> list[str | None]:
    """:func:`fingerprint` of ``model`` with each of ``examples`` (example inputs), the model walked and its
    weights hashed once: ``generate`` keys a prefill and a decode program of one model, and hashing a 7B
    model's weights takes seconds."""
    try:
        model_part = _Hasher()
        model_part.model(model)
    except Exception:  # noqa: BLE001 - Unhashable, or an object that breaks when inspected: export instead
        return [None] * len(examples)
    out = []
    for example_inputs in examples:
        try:
            out.append(model_part.fork().inputs_part(example_inputs, input_shapes))
        except Exception:  # noqa: BLE001
            out.append(None)
    return out


class _Plain:
    pass


def _layout(t):
    return t.__basicsize__, t.__dictoffset__, t.__weakrefoffset__


def _trusted(module_name) -> bool:
    return isinstance(module_name, str) and module_name.split(".", 1)[0] in _TRUSTED


def _package_dir(name: str) -> tuple[str, ...]:
    """Where package ``name`` is installed (found, not imported), as a trusted directory; () when it is not."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):       # a broken install, or a module without a spec
        return ()
    return tuple(os.path.join(str(d), "") for d in spec.submodule_search_locations) \
        if spec and spec.submodule_search_locations else ()


_TRUSTED_DIRS = (os.path.dirname(torch.__file__) + os.sep, sysconfig.get_path("stdlib") + os.sep, "<frozen ",
                 *_package_dir("transformers"))


def _trusted_function(f) -> bool:
    """A function of torch or the standard library by its file too: a wrapper made with functools.wraps
    takes the wrapped function's module and name, not its code."""
    return _trusted(f.__module__) and f.__code__.co_filename.startswith(_TRUSTED_DIRS)


class _Hasher:
    def __init__(self):
        self.h = hashlib.sha256()
        self.seen = {}           # id -> index of objects already hashed: a second visit is a reference
        self.open = set()        # ids of the containers being hashed (hashed by value: see value())
        self.failed = set()      # ids of objects that could not be hashed
        self.storages = {}       # storage address -> index: tensors sharing memory (a tied weight's view)
        self.alive = []          # keeps them alive, so that an id is not reused during the walk

    def put(self, *parts):
        self.h.update(repr(parts).encode() + b"\0")

    def fork(self) -> "_Hasher":
        """A hasher in this one's state, to go on with other inputs (objects seen are references in both)."""
        other = _Hasher.__new__(_Hasher)
        other.h, other.seen, other.failed, other.open = self.h.copy(), dict(self.seen), set(self.failed), set()
        other.storages, other.alive = dict(self.storages), list(self.alive)
        return other

    def model(self, model):
        self.put("spyre-fingerprint-2", torch.__version__, sys.version, str(torch.get_default_dtype()),
                 torch.is_grad_enabled(), torch.are_deterministic_algorithms_enabled())
        for name in _CONFIGS:
            # The settings that differ from their defaults; a config not imported yet has none (importing
            # torch._dynamo takes a second) but what the environment sets, hashed below.
            mod = sys.modules.get(name)
            self.put(name)
            self.value({k: v for k, v in mod.get_config_copy().items() if v != mod._config[k].default}
                       if mod else {})
        self.value(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV) and k not in _ENV_SKIP))
        self.transformers()
        hooks = vars(torch.nn.modules.module)
        for name in sorted(n for n in hooks if n.startswith("_global_")):
            self.put(name)
            self.value(hooks[name])
        self.value(model)

    def inputs_part(self, example_inputs, input_shapes) -> str:
        self.put("inputs")
        self.inputs(example_inputs)
        self.put("input_shapes")
        self.value(input_shapes)
        return self.h.hexdigest()

    def transformers(self):
        """Hugging Face's version (its code is identified by it, as torch's) and the registries its code looks
        functions up in by a name the config holds (attention, masks, experts: ``AttentionInterface.register``):
        a function registered there changes the program and not the model. Nothing when it is not imported: no
        model then runs its code."""
        tf = sys.modules.get("transformers")
        generic = sys.modules.get("transformers.utils.generic")
        if tf is None or generic is None:
            return
        self.put("transformers", tf.__version__)
        interfaces, todo = [], [generic.GeneralInterface]
        while todo:
            c = todo.pop()
            interfaces.append(c)
            todo += c.__subclasses__()
        for c in sorted(interfaces, key=lambda c: (c.__module__, c.__qualname__)):
            self.put("registry", c.__module__, c.__qualname__)
            self.registry(c._global_mapping)
        for name, mod in sorted((n, m) for n, m in list(sys.modules.items()) if n.startswith("transformers.") and m):
            for key, obj in sorted((k, o) for k, o in vars(mod).items() if isinstance(o, generic.GeneralInterface)):
                self.put("local registry", name, key)
                self.registry(obj._local_mapping)

    def registry(self, mapping):
        """A registry's entries; one that is no function (a tensor-parallel style object, which a trace on one
        device does not use) by its type."""
        self.put(len(mapping))
        for k in sorted(mapping, key=repr):
            self.value(k)
            if isinstance(mapping[k], types.FunctionType):
                self.value(mapping[k])
            else:
                self.put("entry", type(mapping[k]).__module__, type(mapping[k]).__qualname__)

    def inputs(self, v):
        """An example input by its type: a trace sees a tensor's dtype and shape, not its values."""
        if isinstance(v, torch.Tensor):
            if type(v) is not torch.Tensor:
                raise Unhashable(f"an input of type {type(v).__qualname__}")
            self.put("tensor", str(v.dtype), tuple(v.shape), v.stride(), str(v.device), v.requires_grad)
        elif type(v) in (tuple, list, dict):
            self.put(type(v).__name__, len(v))
            for k, x in (v.items() if isinstance(v, dict) else enumerate(v)):
                self.value(k)
                self.inputs(x)
        else:
            self.value(v)

    def value(self, v):
        t = type(v)
        if t in _PLAIN or t in _TORCH_PLAIN:
            return self.put(t.__name__, repr(v))
        if isinstance(v, type):
            return self.cls(v)
        if t in _MAPPINGS or _sequence(v, t):
            # By value, never as a reference to an earlier visit: torch.export rebuilds every container a
            # module holds (a pytree map of its attributes, put back after the trace), so which of them were
            # one object (a plan dict's tuples shared with the config's) does not survive an export, and the
            # same model compiled again would miss.
            if id(v) in self.open:
                raise Unhashable(f"a {t.__qualname__} that holds itself")
            self.open.add(id(v))
            try:
                return self.dispatch(v, t)
            finally:
                self.open.discard(id(v))
        if self.visited(v):
            return
        try:
            self.dispatch(v, t)
        except Unhashable:
            self.failed.add(id(v))       # torch's module attributes tolerate one; a reference to it must not
            raise

    def visited(self, v) -> bool:
        """Whether ``v`` was hashed already (then a reference to it is); else it is marked as hashed now."""
        if id(v) in self.failed:
            raise Unhashable(f"a {type(v).__qualname__} seen before")
        if id(v) in self.seen:
            self.put("ref", self.seen[id(v)])
            return True
        self.seen[id(v)] = len(self.seen)
        self.alive.append(v)
        return False

    def dispatch(self, v, t):
        if _sequence(v, t):
            self.put(t.__module__, t.__qualname__, len(v))
            for x in v:
                self.value(x)
        elif t in _MAPPINGS:
            # In order: the order of parameters and submodules is the order of the program's arguments.
            self.put(t.__qualname__, len(v))
            for k, x in v.items():
                self.value(k)
                self.value(x)
        elif t in (set, frozenset):
            self.put(t.__name__, len(v))
            for x in sorted(v, key=repr):
                self.value(x)
        elif isinstance(v, torch.Tensor):
            self.tensor(v)
        elif isinstance(v, types.FunctionType):
            self.function(v)
        elif isinstance(v, types.BuiltinFunctionType) and (v.__self__ is None or
                                                           isinstance(v.__self__, types.ModuleType)):
            self.put("builtin", v.__module__, v.__qualname__)
        elif isinstance(v, (types.MethodDescriptorType, types.WrapperDescriptorType,
                            types.ClassMethodDescriptorType)):
            self.put("descriptor", v.__objclass__.__module__, v.__objclass__.__qualname__, v.__name__)
        elif t in (staticmethod, classmethod):
            self.put(t.__name__)
            self.value(v.__func__)
        elif t is property:
            self.put("property")
            for f in (v.fget, v.fset, v.fdel):
                self.value(f)
        elif t is types.MethodType:
            self.put("method")
            self.value(v.__func__)
            self.value(v.__self__)
        elif isinstance(v, types.ModuleType):
            # A module held as a value: what is read from it is not known here, so only torch's and the
            # standard library's, identified by name.
            if not _trusted(v.__name__):
                raise Unhashable(f"module {v.__name__} held as a value")
            self.put("module", v.__name__)
        elif isinstance(v, enum.Enum):
            self.cls(t)
            self.put("enum", v.name)
        elif t is typing.TypeVar:
            self.put("typevar", repr(v))
        elif (isinstance(v, torch.nn.Module) or dataclasses.is_dataclass(v)
              or any(_trusted(k.__module__) for k in t.__mro__[:-1])) and _layout(t) == _layout(_Plain):
            # A module, a dataclass, an object of a trusted library's class or of a subclass of one (a no_grad
            # decorator, a Hugging Face config or cache layer): its class and its attributes, when they are all
            # its state (its layout is a plain Python object's: no slots, no C fields, as a functools.partial
            # has).
            self.cls(t)
            self.put("object")
            self.value({k: x for k, x in vars(v).items() if k not in _VOLATILE})
        else:
            raise Unhashable(f"a {t.__module__}.{t.__qualname__}")

    def tensor(self, t):
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided or t.is_meta:
            raise Unhashable(f"a tensor of type {type(t).__qualname__} ({t.layout})")
        self.put("tensor", type(t).__name__, str(t.dtype), tuple(t.shape), t.stride(), t.storage_offset(),
                 str(t.device), t.requires_grad,
                 self.storages.setdefault(t.untyped_storage().data_ptr(), len(self.storages)))
        self.h.update(bytes_digest(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()))

    def cls(self, c):
        self.put("class", c.__module__, c.__qualname__)
        if self.visited(c):
            return
        try:
            self.class_body(c)
        except Unhashable:
            self.failed.add(id(c))
            raise

    def class_body(self, c):
        if type(c) is not type:
            self.value(type(c))          # a metaclass can change what attribute reads do
        for k in c.__mro__:
            if k is object:
                continue
            self.put("base", k.__module__, k.__qualname__)
            trusted = _trusted(k.__module__)
            for name, v in vars(k).items():
                # torch's own classes are fixed by its version; a function patched into one is not.
                if name in _SKIP or (trusted and not (isinstance(v, types.FunctionType) and
                                                      not _trusted_function(v))):
                    continue
                self.put(name)
                self.value(v)

    def function(self, f):
        self.put("function", f.__module__, f.__qualname__)
        if not _trusted_function(f):
            names = set()
            self.code(f.__code__, names)
            self.value(f.__defaults__)
            self.value(f.__kwdefaults__)
            self.value(vars(f))          # __wrapped__ of a decorated function
            dynamic = (names & _DYNAMIC) - f.__globals__.keys()
            if dynamic:
                raise Unhashable(f"{f.__qualname__} looks names up at run time ({', '.join(sorted(dynamic))})")
            for name in sorted(names & f.__globals__.keys()):
                self.put("global", name)
                self.global_value(f.__globals__[name], names, set(), "getattr" in names)
        # Even a torch function's closure: a decorator's (torch.no_grad's) holds the decorated function.
        for cell in f.__closure__ or ():
            try:
                self.value(cell.cell_contents)
            except ValueError:           # an empty cell
                self.put("empty")

    def code(self, co, names):
        """Bytecode, constants (nested code objects too), names, signature, file and line table; ``names``
        collects every name the code reads (globals and attributes alike: co_names does not tell them apart;
        string constants too)."""
        names.update(co.co_names)
        lines = co.co_linetable if hasattr(co, "co_linetable") else co.co_lnotab
        self.put("code", co.co_name, co.co_filename, co.co_firstlineno, co.co_argcount, co.co_posonlyargcount,
                 co.co_kwonlyargcount, co.co_flags, co.co_names, co.co_varnames, co.co_freevars, co.co_cellvars,
                 co.co_code, lines, getattr(co, "co_exceptiontable", b""))
        for c in co.co_consts:
            if isinstance(c, types.CodeType):
                self.code(c, names)
            else:
                if isinstance(c, str):
                    names.add(c)         # getattr(mod, "name") reads mod.name too
                self.value(c)

    def global_value(self, v, names, modules, getattr_):
        """A global read by name. A module: the attributes the code names in it (``F.gelu``, ``torch.nn``),
        recursively; in torch's own modules an attribute that is no plain value is identified by its type.
        Code that calls getattr may read any attribute of a module but torch's."""
        if not isinstance(v, types.ModuleType):
            return self.value(v)
        self.put("module", v.__name__)
        if id(v) in modules:
            return
        modules.add(id(v))
        trusted = _trusted(v.__name__)
        if getattr_ and not trusted:
            raise Unhashable(f"getattr on module {v.__name__}")
        attrs = vars(v)                  # not getattr: a module's __getattr__ may import lazily
        for name in sorted(names & attrs.keys()):
            self.put("attr", name)
            try:
                self.global_value(attrs[name], names, modules, getattr_)
            except Unhashable:
                if not trusted:
                    raise
                self.put("opaque", type(attrs[name]).__qualname__)
