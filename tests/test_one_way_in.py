"""One way from named arrays to the op (app/inputs.py): a mistake in the inputs is one message and one exit code,
whether it reaches bnbwd through `run`, `verify --inputs`, `check` or the Python API.

The CLI prints the message with its advice on flags ("; give --epsilon") and exits 3; the API raises
bnbwd_cli.InputError (a ValueError) with the message alone.
"""

from __future__ import annotations

import numpy as np
import pytest

import bnbwd_cli
from tests.conftest import error_line, make_inputs, save_bundle

SHAPE = (2, 3, 4, 4)  # NCHW

# What is wrong with the inputs -> (a change to the good inputs, the message, the CLI's advice or None).
MISTAKES = {
    "no epsilon": ({"epsilon": None},
                   "no epsilon: spec generic has no default and the inputs hold no 'epsilon' entry", "give --epsilon"),
    "missing input": ({"variance": None},
                      "missing input variance (spec generic): no array named 'variance' or a spec's name for it",
                      "--map THEIRS=variance reads your own name for it"),
    "mean of the wrong length": ({"mean": np.zeros(5, np.float32)},
                                 "mean has shape (5,), expected (3,) = C of src (NCX)", None),
    "diff_dst of another dtype": ({"diff_dst": "float64"},
                                  "diff_dst has dtype f64, expected f32 = dtype of src", None),
}
FACES = ("run", "verify", "check", "api")


def _inputs(rng, change: dict) -> tuple[dict, dict]:
    """The op's arrays and attributes with one mistake in them (None: left out)."""
    arrays = make_inputs(rng, SHAPE)
    arrays = {name: arrays[name] for name in ("src", "diff_dst", "mean", "variance", "gamma")}
    attributes = {"epsilon": 1e-5, "data_format": "NCHW"}
    for name, value in change.items():
        target = attributes if name in attributes else arrays
        if value is None:
            target.pop(name)
        elif isinstance(value, str):
            target[name] = target[name].astype(value)
        else:
            target[name] = value
    return arrays, attributes


def _outputs(rng) -> dict:
    """A kernel's outputs for the good inputs (their values do not matter: the inputs fail first)."""
    good = make_inputs(rng, SHAPE)
    return bnbwd_cli.backward(good["src"], good["diff_dst"], good["mean"], good["variance"], good["gamma"],
                              epsilon=1e-5, data_format="NCHW")


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_one_message_and_one_exit_code_per_mistake(cli, rng, tmp_path, mistake, face):
    change, message, hint = MISTAKES[mistake]
    arrays, attributes = _inputs(rng, change)
    outputs = _outputs(rng)
    cli_line = f"{message}; {hint}" if hint else message
    if face == "api":
        with pytest.raises(bnbwd_cli.InputError) as raised:
            bnbwd_cli.check(outputs, **{**dict.fromkeys(("variance", "epsilon")), **arrays, **attributes})
        assert str(raised.value) == message and isinstance(raised.value, ValueError)
        return
    bundle = save_bundle(tmp_path / "inputs.npz", arrays, **attributes)
    if face == "run":
        result = cli("run", bundle, "-q", "-o", tmp_path / "out.npz")
        assert not (tmp_path / "out.npz").exists()
    elif face == "verify":
        kernel = save_bundle(tmp_path / "kernel.npz", outputs)
        result = cli("verify", kernel, kernel, "--inputs", bundle)
    else:
        case = save_bundle(tmp_path / "case.npz", {**arrays, **outputs}, **attributes)
        result = cli("check", case)
        assert f"ERROR {case}: {cli_line}" in result.stdout.splitlines()
    assert result.exit_code == 3, (result.exit_code, result.output)
    if face != "check":
        assert error_line(result.stderr) == f"error: {cli_line}"


def test_input_error_is_public_and_a_value_error():
    assert issubclass(bnbwd_cli.InputError, ValueError) and "InputError" in bnbwd_cli.__all__
    with pytest.raises(bnbwd_cli.InputError, match=r"^no epsilon: spec generic has no default"):
        x = np.ones((2, 3), np.float32)
        bnbwd_cli.backward(x, x, np.zeros(3, np.float32), np.ones(3, np.float32), epsilon=None, data_format="NC")


GOOD = {"src": np.ones((2, 3), np.float32), "diff_dst": np.ones((2, 3), np.float32), "mean": np.zeros(3, np.float32),
        "variance": np.ones(3, np.float32), "epsilon": 1e-5, "data_format": "NC"}


@pytest.mark.parametrize(("change", "actual", "message"), [
    ({"epsilon": "1e-5"}, None, r"^epsilon is '1e-5', expected a finite number > 0$"),
    ({"data_format": 3}, None, r"^data_format is 3, expected a layout name"),
    ({"src": [[1.0, 2.0], [3.0]]}, None, r"^src: not an array \(list: "),
    ({}, 42, r"^actual is a int, expected a mapping of output names to arrays or a sequence in the order diff_src"),
    ({}, [np.ones((2, 3))] * 4, r"^actual is a list of 4, expected 1 to 3 arrays in the order diff_src"),
    ({"data_format": None}, None, r"^data_format is required: NCHW"),
    ({"grad_ouput": np.ones((2, 3))}, None, r"^grad_ouput: not an input name"),
], ids=["epsilon-str", "format-int", "ragged-src", "actual-int", "actual-list-of-4", "no-format", "typo"])
def test_api_arguments_of_the_wrong_kind_are_input_errors(change, actual, message):
    """Never a TypeError or AttributeError from deep inside: the API's one error for a bad input."""
    with pytest.raises(bnbwd_cli.InputError, match=message):
        if actual is None:
            bnbwd_cli.backward(**{**GOOD, **change})
        else:
            bnbwd_cli.check(actual, **GOOD)
