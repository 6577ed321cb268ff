"""The pass manager behind every textual pass pipeline: upstream MLIR passes and spyre (Python) passes in one PassManager.

A Python pass cannot be named inside a textual pipeline string, so the pipeline is parsed here: every upstream
element is handed to the PassManager as text, every spyre element as a callable, in the written order.
"""

import dataclasses
import re

from torch_mlir import ir
from torch_mlir.passmanager import PassManager

from spyre_mlir import passes

from spyre_mlir.errors import SpyreError
from spyre_mlir.passes.base import OptionError

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


class PipelineError(SpyreError, ValueError):
    pass


@dataclasses.dataclass
class Element:
    """One pipeline element: `name{options}` or `anchor(children)`; `text` is its source, for upstream passes."""

    name: str
    options: str = ""
    children: list["Element"] | None = None
    text: str = ""

    @property
    def is_spyre(self) -> bool:
        return passes.get_pass_class(self.name) is not None


def parse_pipeline(text: str) -> list[Element]:
    """Parse `builtin.module(a,b{k=v},func.func(c))` (or the bare list `a,b`) into module-level elements."""
    text = text.strip()
    if text.startswith("'") and text.endswith("'"):
        text = text[1:-1]
    elems, pos = _parse_list(text, 0)
    if pos != len(text):
        raise PipelineError(f"unexpected '{text[pos]}' at column {pos + 1} of pipeline '{text}'")
    if len(elems) == 1 and elems[0].name == "builtin.module" and elems[0].children is not None:
        return elems[0].children
    return elems


def _parse_list(text: str, pos: int) -> tuple[list[Element], int]:
    elems: list[Element] = []
    while pos < len(text):
        pos = _skip_ws(text, pos)
        start = pos
        m = _NAME.match(text, pos)
        if not m:
            raise PipelineError(f"expected a pass name at column {pos + 1} of pipeline '{text}'")
        name, pos = m.group(0), m.end()
        options, children = "", None
        if pos < len(text) and text[pos] == "{":
            end = _matching(text, pos, "{", "}")
            options, pos = text[pos + 1:end], end + 1
        if pos < len(text) and text[pos] == "(":
            children, pos = _parse_list(text, pos + 1)
            if pos >= len(text) or text[pos] != ")":
                raise PipelineError(f"missing ')' for '{name}(' in pipeline '{text}'")
            pos += 1
        elems.append(Element(name, options, children, text[start:pos]))
        pos = _skip_ws(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos += 1
            continue
        break
    return elems, pos


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _matching(text: str, pos: int, open_: str, close: str) -> int:
    depth = 0
    for i in range(pos, len(text)):
        depth += text[i] == open_
        depth -= text[i] == close
        if depth == 0:
            return i
    raise PipelineError(f"missing '{close}' in pipeline '{text}'")


def parse_options(text: str) -> dict[str, str]:
    """`a=1 b=x,y c d="x y"` -> {'a': '1', 'b': 'x,y', 'c': '', 'd': 'x y'} (MLIR separates options with
    spaces; a quoted value may hold them, a path with spaces, say)."""
    import shlex

    try:
        items = shlex.split(text)
    except ValueError as e:
        raise PipelineError(f"malformed pass options '{text}': {e}") from None
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key] = value
    return out


def _check_no_nested_spyre(elements: list[Element], anchor: str) -> None:
    for e in elements:
        if e.is_spyre:
            raise PipelineError(f"spyre pass '{e.name}' runs on builtin.module; move it out of '{anchor}(...)'")
        if e.children:
            _check_no_nested_spyre(e.children, e.name)


def build_pass_manager(elements: list[Element], context: ir.Context) -> PassManager:
    """One PassManager running the elements in order; spyre passes as Python callables."""
    with context:
        pm = PassManager("builtin.module")
        for e in elements:
            if e.is_spyre:
                if e.children is not None:
                    raise PipelineError(f"spyre pass '{e.name}' takes no nested pipeline")
                try:
                    p = passes.create_pass(e.name, parse_options(e.options))
                except OptionError as err:
                    raise PipelineError(str(err)) from None
                pm.add(p, name=e.name, argument=e.name, description=p.SUMMARY)
                continue
            if e.children:
                _check_no_nested_spyre(e.children, e.name)
            try:
                pm.add(e.text)
            except ValueError as err:
                raise PipelineError(f"unknown or malformed pass '{e.text}': {err}") from None
    return pm


def run_pipeline(module: ir.Module, pipeline: str) -> None:
    """Parse `pipeline` and run it on `module`; raises PipelineError or ir.MLIRError."""
    pm = build_pass_manager(parse_pipeline(pipeline), module.context)
    pm.run(module.operation)
