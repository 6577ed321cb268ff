"""Run the Hugging Face model matrix: every family of :mod:`zoo` x attention x mask x entry point x precision x
cores, each checked against eager PyTorch. Entry points: ``compile`` (spyre_mlir.compile), ``torch.compile``
(backend "spyre") and, for causal LMs, ``generate`` (spyre_mlir.generate against Hugging Face's greedy
generate, 32 new tokens, on the padded batch). One JSON line per case; ``report.py`` turns them into docs/models.md.

    python test/models/matrix.py --out build/models/all.jsonl                 # everything
    python test/models/matrix.py --families llama,bert --precisions dlf16 --cores 32 --shard 0/4 --out f.jsonl

Bars (issue #9): ``fp32-reference`` within 1e-4 of eager (max |difference| over max |eager|); ``dlf16`` cosine
>= 0.999 and the same next token on >= 99% of positions; ``fp8`` and ``int8-weights`` are reported. The
"same token" check counts a position as agreeing when the device's pick is eager's pick, or an eager logit within
``TIE`` x the row's largest |logit| of it (tiny random-weight models have near-ties that any rounding reorders;
the raw agreement is reported beside it). For causal LMs with a padding mask, padded positions are not compared.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import json
import os
import re
import sys
import time
import traceback
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo  # noqa: E402

PRECISIONS = ("fp32-reference", "dlf16", "fp8", "int8-weights")
ENTRIES = ("compile", "torch.compile", "generate")
GEN_TOKENS = 32
REL_BAR = 1e-4
COS_BAR = 0.999
ARGMAX_BAR = 0.99
# Statuses: pass / fail (against the bar), reported (fp8, int8-weights: no bar), fallback (torch.compile ran a
# captured graph eagerly: PyTorch's answer, but not from Spyre), error (an exception; the message is kept).
TIE = 1e-3
# A host op runs "inside a layer" when its source location passes through one of these classes' methods.
LAYER_CLASS = re.compile(r"(DecoderLayer|EncoderLayer|Layer|Block|Attention|MLP|SparseMoeBlock|Experts|Router)$")


@dataclasses.dataclass(frozen=True)
class Case:
    family: str
    attn: str
    mask: bool
    entry: str
    precision: str
    cores: int

    @property
    def name(self) -> str:
        return (f"{self.family}-{self.attn}{'-mask' if self.mask else ''}-{self.entry}-{self.precision}"
                f"-c{self.cores}")


def cases(families=None, precisions=PRECISIONS, cores=(1, 32), entries=ENTRIES, attns=None, masks=(False, True)):
    for fam in families or zoo.FAMILIES:
        f = zoo.FAMILIES[fam]
        for attn in f.attn:
            if attns and attn not in attns:
                continue
            for mask in masks:
                if mask and f.kind == "vision":
                    continue
                for entry in entries:
                    for p in precisions:
                        for c in cores:
                            # Generation: causal LMs, the padded batch, the two bars, all cores given.
                            if entry == "generate" and (not f.causal or not mask or c != max(cores) or
                                                        p not in ("fp32-reference", "dlf16")):
                                continue
                            yield Case(fam, attn, mask, entry, p, c)


# ---- where a host op comes from ---------------------------------------------------------------------------

_FRAME = re.compile(r'"([^"]+\.py)":(\d+):\d+')


@functools.lru_cache(maxsize=None)
def _functions(path: str) -> list[tuple[int, int, str]]:
    """(first line, last line, "Class.method") of every function in a source file."""
    try:
        tree = ast.parse(open(path).read())
    except (OSError, SyntaxError):
        return []
    out = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, prefix + [child.name])
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((child.lineno, child.end_lineno, ".".join(prefix + [child.name])))
                walk(child, prefix + [child.name])

    walk(tree, [])
    return out


def frames(location: str) -> list[tuple[str, int, str]]:
    """The source frames of an MLIR location, innermost first: (file, line, enclosing "Class.function")."""
    res = []
    for path, line in _FRAME.findall(location):
        line = int(line)
        fn = ""
        for a, b, name in _functions(path):
            if a <= line <= b:
                fn = name          # the innermost (last) enclosing definition wins
        res.append((path, line, fn))
    return res


def describe(location: str) -> tuple[str, bool]:
    """("modeling_llama.py:372 LlamaModel.forward", inside a layer?) for a host op's location."""
    fr = [f for f in frames(location) if "/torch/" not in f[0]]
    if not fr:
        return "", False
    path, line, fn = fr[0]
    in_layer = any(LAYER_CLASS.search(name.split(".")[0]) for _, _, name in fr if "." in name)
    return f"{os.path.basename(path)}:{line} {fn}", in_layer


# ---- one case -----------------------------------------------------------------------------------------------

def _compare(out: np.ndarray, ref: np.ndarray, keep) -> dict:
    out = out.astype(np.float64)
    ref = ref.astype(np.float64)
    if keep is not None:
        out, ref = out[keep], ref[keep]
    out = out.reshape(-1, out.shape[-1])
    ref = ref.reshape(-1, ref.shape[-1])
    if not np.all(np.isfinite(out)):
        return {"rel": float("inf"), "cosine": 0.0, "argmax": 0.0, "argmax_raw": 0.0}
    rel = float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
    cos = float((out * ref).sum() / max(np.linalg.norm(out) * np.linalg.norm(ref), 1e-30))
    pick = out.argmax(-1)
    best = ref.max(-1)
    picked = ref[np.arange(len(ref)), pick]
    tol = TIE * np.abs(ref).max(-1)
    return {"rel": rel, "cosine": cos, "argmax": float(np.mean(best - picked <= tol)),
            "argmax_raw": float(np.mean(pick == ref.argmax(-1)))}


def verdict(case: Case, m: dict) -> str:
    if case.entry == "generate":
        if case.precision == "fp32-reference":
            return "pass" if m["tokens_identical"] and not m["cache_host_ops"] else "fail"
        return "reported" if not m["cache_host_ops"] else "fail"
    if case.precision == "fp32-reference":
        return "pass" if m["rel"] <= REL_BAR else "fail"
    if case.precision == "dlf16":
        return "pass" if m["cosine"] >= COS_BAR and m["argmax"] >= ARGMAX_BAR else "fail"
    return "reported"


def run_case(case: Case, cache_dir=False) -> dict:
    """Compile and run one case; never raises (errors are recorded)."""
    import spyre_mlir

    rec = {"case": case.name, **dataclasses.asdict(case)}
    t0 = time.perf_counter()
    try:
        model = zoo.build(case.family, case.attn)
        x = zoo.example_inputs(case.family, mask=case.mask)
        with torch.no_grad():
            ref = model(**x)[0].numpy()
        keep = x["attention_mask"].numpy().astype(bool) if case.mask and zoo.FAMILIES[case.family].causal else None
        if case.entry == "generate":
            rec.update(_generate(case, model, x))
            rec["status"] = verdict(case, rec)
            rec["seconds"] = time.perf_counter() - t0
            return rec
        if case.entry == "compile":
            exe = spyre_mlir.compile(model, x, precision=case.precision, cores=case.cores, cache_dir=cache_dir)
            out = exe(**x)[0]
            info = exe.compile_info
            hosts = []
            for op, loc in zip(info.host_ops, info.host_locations or [""] * len(info.host_ops)):
                where, in_layer = describe(loc)
                hosts.append({"op": op, "where": where, "in_layer": in_layer})
            rec.update(host_ops=hosts, device_ops=len(info.device_ops), modeled_us=exe.profile.seconds * 1e6,
                       compile_s=info.seconds)
        else:
            import spyre_mlir.backend  # noqa: F401 - registers the "spyre" backend

            torch._dynamo.reset()
            compiled = torch.compile(model, backend="spyre",
                                     options={"precision": case.precision, "cores": case.cores,
                                              "cache_dir": cache_dir})
            with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                out = compiled(**x)[0]
            out = out.float().numpy()
            eager = [str(w.message) for w in caught if "running a captured graph eagerly" in str(w.message)]
            if eager:
                rec["eager_graphs"] = [e.splitlines()[0][:300] for e in eager]
        rec.update(_compare(np.asarray(out, np.float32), ref, keep))
        rec["status"] = "fallback" if rec.get("eager_graphs") else verdict(case, rec)
    except Exception as e:  # noqa: BLE001 - the matrix records every failure
        rec.update(status="error", error=f"{type(e).__name__}: {str(e).splitlines()[0][:400]}",
                   traceback=traceback.format_exc(limit=-6))
    rec["seconds"] = time.perf_counter() - t0
    return rec


def _generate(case: Case, model, x) -> dict:
    """spyre_mlir.generate against Hugging Face's greedy generate: identical tokens, agreement, the decode
    step's modeled latency and host traffic, and whether any host op touches the KV cache (it must not)."""
    import spyre_mlir
    from spyre_mlir import generation

    mask = x.get("attention_mask")
    with torch.no_grad():
        ref = model.generate(x["input_ids"], attention_mask=mask, max_new_tokens=GEN_TOKENS, do_sample=False)
    out = spyre_mlir.generate(model, x["input_ids"], max_new_tokens=GEN_TOKENS, attention_mask=mask,
                              precision=case.precision, cores=case.cores, cache_dir=False)
    gen = list(generation._GENERATORS[model].values())[-1]
    dec = gen.decode_exe
    state = {b.name for b in dec.state_buffers}
    touching = [h["op"] for e in (gen.prefill_exe, dec) for h in e.program.host_ops
                if state & set(h["inputs"] + h["outputs"])]
    n = x["input_ids"].shape[1]
    same_len = out.shape == ref.shape
    agree = float((out[:, n:] == ref[:, n:]).float().mean()) if same_len else 0.0
    return {"tokens_identical": bool(same_len and torch.equal(out, ref)), "token_agreement": agree,
            "cache_host_ops": touching, "modeled_us": dec.static_profile.seconds * 1e6,
            "prefill_modeled_us": gen.prefill_exe.static_profile.seconds * 1e6,
            "decode_host_bytes": dec.static_profile.host_bytes,
            "cache_bytes": sum(b.nbytes for b in dec.state_buffers),
            "host_ops": [{"op": h["op"], "where": "", "in_layer": False} for h in dec.program.host_ops]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", help="comma-separated (default: all)")
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--cores", default="1,32")
    ap.add_argument("--entries", default=",".join(ENTRIES))
    ap.add_argument("--attn", help="sdpa or eager (default: each the family has)")
    ap.add_argument("--masks", default="0,1", help="0 (no mask), 1 (left-padded batch with a mask) or both")
    ap.add_argument("--shard", default="0/1", help="i/n: run every n-th case starting at i")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    i, n = (int(v) for v in a.shard.split("/"))
    todo = list(cases(a.families.split(",") if a.families else None, a.precisions.split(","),
                      [int(c) for c in a.cores.split(",")], a.entries.split(","),
                      a.attn.split(",") if a.attn else None, [m == "1" for m in a.masks.split(",")]))[i::n]
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    bad = 0
    with open(a.out, "w") as f:
        for k, case in enumerate(todo):
            rec = run_case(case)
            f.write(json.dumps(rec) + "\n")
            f.flush()
            bad += rec["status"] in ("fail", "error", "fallback")
            detail = ("cos=%.6f rel=%.1e" % (rec["cosine"], rec["rel"]) if "cosine" in rec else
                      "tokens agree %.3f" % rec["token_agreement"] if "token_agreement" in rec else "")
            print(f"[{k + 1}/{len(todo)}] {case.name}: {rec['status']} {rec.get('error', '')}{detail}"
                  f" ({rec['seconds']:.1f}s)", flush=True)
    print(f"{len(todo) - bad}/{len(todo)} cases pass or report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
