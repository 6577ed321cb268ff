"""Loading models: every accepted source, format detection by content, and every user-facing error."""

import os
import sys
import zipfile

import pytest
import torch

from spyre_mlir.frontend import FrontendError
from spyre_mlir.frontend.load import detect_format, load_program, parse_input_shape

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
import mlp  # noqa: E402

# torch deprecates torch.jit and warns about its own internals; the files here are written on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


def _tiny():
    """An nn.Sequential: its classes are importable anywhere, so a pickle of it loads in any process."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """One file per format, written once for the module."""
    d = tmp_path_factory.mktemp("models")
    model, (x,) = mlp.build()
    ep = torch.export.export(model, (x,))
    paths = {name: str(d / name) for name in
             ["m.pt2", "m_export.pt", "traced.pt", "scripted.pt", "pickle.pt", "legacy.pt", "sd.pt",
              "truncated.pt2", "notes.txt", "odd.zip", "empty.pt", "fake_export.pt2"]}
    torch.export.save(ep, paths["m.pt2"])
    torch.export.save(ep, paths["m_export.pt"])  # same archive, the extension users often pick
    torch.jit.save(torch.jit.trace(model, (x,)), paths["traced.pt"])
    torch.jit.save(torch.jit.script(model), paths["scripted.pt"])
    torch.save(_tiny(), paths["pickle.pt"])
    torch.save(_tiny(), paths["legacy.pt"], _use_new_zipfile_serialization=False)
    torch.save(model.state_dict(), paths["sd.pt"])
    with open(paths["m.pt2"], "rb") as f:
        head = f.read(2000)
    with open(paths["truncated.pt2"], "wb") as f:
        f.write(head)
    with open(paths["notes.txt"], "w") as f:
        f.write("not a model\n")
    with zipfile.ZipFile(paths["odd.zip"], "w") as zf:
        zf.writestr("odd/readme.txt", "hello")
    open(paths["empty.pt"], "wb").close()
    with zipfile.ZipFile(paths["fake_export.pt2"], "w") as zf:  # looks like an export archive, is not one
        zf.writestr("fake_export/archive_format", "pt2")
    return model, x, paths


def _same(ep, model, x):
    torch.testing.assert_close(ep.module()(x), model(x))


def test_nn_module(files):
    model, x, _ = files
    _same(load_program(model, (x,)), model, x)


def test_nn_module_from_input_shapes(files):
    model, x, _ = files
    ep = load_program(model, input_shapes=["4x64xf32"])
    assert tuple(ep.graph_signature.user_inputs) == ("x",)
    _same(ep, model, x)


def test_exported_program_passes_through(files):
    model, x, _ = files
    ep = torch.export.export(model, (x,))
    assert load_program(ep) is ep


@pytest.mark.parametrize("name", ["m.pt2", "m_export.pt"])
def test_export_archive_detected_by_content(files, name):
    model, x, paths = files
    assert detect_format(paths[name]) == "export"
    _same(load_program(paths[name]), model, x)


def test_export_archive_with_matching_input_shape(files):
    _, _, paths = files
    assert load_program(paths["m.pt2"], input_shapes=["4x64xf32"]) is not None
    with pytest.raises(FrontendError, match="exported for inputs 4x64xfloat32"):
        load_program(paths["m.pt2"], input_shapes=["8x64xf32"])


def test_torchscript_traced_uses_recorded_shapes(files):
    model, x, paths = files
    assert detect_format(paths["traced.pt"]) == "torchscript"
    _same(load_program(paths["traced.pt"]), model, x)


def test_torchscript_scripted_needs_input_shape(files):
    model, x, paths = files
    with pytest.raises(FrontendError, match="--input-shape") as e:
        load_program(paths["scripted.pt"])
    assert "scripted.pt" in str(e.value)
    ep = load_program(paths["scripted.pt"], input_shapes=["4x64xf32"])
    # Static shapes even though TS2EPConverter marks inputs dynamic.
    placeholder = [n for n in ep.graph.nodes if n.op == "placeholder"][-1]
    assert all(isinstance(d, int) for d in placeholder.meta["val"].shape)
    _same(ep, model, x)


@pytest.mark.parametrize("name", ["pickle.pt", "legacy.pt"])
def test_pickle_refused_without_opt_in(files, name):
    _, _, paths = files
    assert detect_format(paths[name]) == "pickle"
    with pytest.raises(FrontendError, match="--trust-pickle") as e:
        load_program(paths[name], input_shapes=["2x8xf32"])
    assert name in str(e.value) and "arbitrary code" in str(e.value)


def test_pickle_with_opt_in(files):
    _, _, paths = files
    ep = load_program(paths["pickle.pt"], input_shapes=["2x8xf32"], trust_pickle=True)
    x = torch.randn(2, 8)
    torch.testing.assert_close(ep.module()(x), _tiny()(x))


def test_pickle_with_opt_in_still_needs_shapes(files):
    _, _, paths = files
    with pytest.raises(FrontendError, match="--input-shape"):
        load_program(paths["pickle.pt"], trust_pickle=True)


def test_state_dict_explained(files):
    _, _, paths = files
    with pytest.raises(FrontendError, match="state dict"):
        load_program(paths["sd.pt"])


@pytest.mark.parametrize(
    "name, reason",
    [
        ("missing.pt2", "does not exist"),
        ("truncated.pt2", "corrupt or truncated"),
        ("notes.txt", "not a format"),
        ("odd.zip", "not one PyTorch writes"),
        ("empty.pt", "not a format"),
        ("fake_export.pt2", "could not be loaded"),
    ],
)
def test_bad_files(files, name, reason):
    _, _, paths = files
    path = paths.get(name, os.path.join(os.path.dirname(paths["m.pt2"]), name))
    with pytest.raises(FrontendError) as e:
        load_program(path)
    message = str(e.value)
    assert reason in message and name in message
    assert "torch.export.save" in message  # names the accepted formats
    assert "\n" not in message  # one paragraph


def test_not_a_model():
    with pytest.raises(FrontendError, match="cannot load a model from a int"):
        load_program(3)


def test_nn_module_needs_inputs(files):
    model, _, _ = files
    with pytest.raises(FrontendError, match="--input-shape"):
        load_program(model)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1x3x224x224xf32", ((1, 3, 224, 224), torch.float32)),
        ("1x16xi64", ((1, 16), torch.int64)),
        ("4x8", ((4, 8), torch.float32)),
        ("2xbf16", ((2,), torch.bfloat16)),
        ("f32", ((), torch.float32)),
    ],
)
def test_parse_input_shape(text, expected):
    assert parse_input_shape(text) == expected


@pytest.mark.parametrize("text", ["1x3xfoo", "axb", "1x-3xf32"])
def test_parse_input_shape_errors(text):
    with pytest.raises(FrontendError, match="cannot parse input shape"):
        parse_input_shape(text)


def test_keyword_example_inputs_trace_by_name():
    """A dict of example inputs is passed as keyword arguments (how Hugging Face models take attention_mask)."""

    class TwoInputs(torch.nn.Module):
        def forward(self, past=None, mask=None, ids=None):
            return ids * 2 + mask

    ep = load_program(TwoInputs(), {"ids": torch.ones(2, 3), "mask": torch.zeros(2, 3)})
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    assert user == ["ids", "mask"]          # in the order given
    out = ep.module()(mask=torch.zeros(2, 3), ids=torch.ones(2, 3))
    assert torch.equal(out, torch.full((2, 3), 2.0))
