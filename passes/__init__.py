"""The registry of spyre passes, derived from the one-file-per-pass convention.

Pass `spyre-foo-bar` lives in `passes/foo_bar.py` as the class whose NAME is "spyre-foo-bar", and is tested by
`test/Transforms/foo-bar.mlir` (or `test/Conversion/...` for conversions). A module is imported only when its pass
is used or listed, so start-up stays fast and a new pass needs no edit here. The package's other modules are in
`_NOT_PASSES`: the pass base class, the pipeline runner, and the IR analyses and op model the passes share.
"""

import importlib
import pkgutil

_NOT_PASSES = {"analysis", "base", "manager", "op_model"}


def _module_name(pass_name: str) -> str | None:
    if not pass_name.startswith("spyre-"):
        return None
    return pass_name[len("spyre-"):].replace("-", "_")


def pass_names() -> list[str]:
    names = [m.name for m in pkgutil.iter_modules(__path__) if m.name not in _NOT_PASSES]
    return sorted("spyre-" + n.replace("_", "-") for n in names)


def get_pass_class(name: str):
    """The pass class registered under `name`, or None."""
    module_name = _module_name(name)
    if module_name is None or module_name in _NOT_PASSES or \
            module_name not in {m.name for m in pkgutil.iter_modules(__path__)}:
        return None
    module = importlib.import_module(f"{__name__}.{module_name}")
    for value in vars(module).values():
        if isinstance(value, type) and getattr(value, "NAME", None) == name:
            return value
    raise ImportError(f"passes/{module_name}.py defines no pass class with NAME = '{name}'")


def create_pass(name: str, options: dict[str, str] | None = None):
    cls = get_pass_class(name)
    if cls is None:
        raise KeyError(name)
    return cls.from_options(options or {})
