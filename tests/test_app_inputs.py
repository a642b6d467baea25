"""app/inputs.py: a file's arrays sorted into the op's inputs, its outputs and the rest, and the one way from
named arrays to an Op, with the errors every face shares (the CLI adds the hint; the API raises the message)."""

from __future__ import annotations

import numpy as np
import pytest

from bnbwd_cli.app.inputs import Naming, OpSettings, SplitRequest, build_op, split_arrays
from bnbwd_cli.errors import InputError
from tests.conftest import make_inputs


@pytest.fixture
def arrays(rng) -> dict[str, np.ndarray]:
    return make_inputs(rng, (2, 3, 4, 4), "NCX")


def test_a_flag_wins_over_a_files_entry_in_run_and_the_case_wins_in_check():
    flags = OpSettings(epsilon=1e-3, data_format=None, training=None)
    entries = {"epsilon": 1e-5, "data_format": "NCHW", "is_training": False}
    filled = flags.filled_from(entries)
    assert (filled.epsilon, filled.data_format, filled.training) == (1e-3, "NCHW", False)
    overridden = flags.overridden_by(entries)
    assert (overridden.epsilon, overridden.data_format, overridden.training) == (1e-5, "NCHW", False)
    assert OpSettings().is_training and not OpSettings(training=False).is_training
    assert OpSettings(spec="tensorflow").format_or_default == "NHWC"


def test_build_op_needs_an_epsilon_unless_variance_holds_invstd(arrays):
    with pytest.raises(InputError) as caught:
        build_op(arrays, OpSettings(data_format="NCHW"))
    assert str(caught.value).startswith("no epsilon: spec generic has no default")
    assert caught.value.hint == "give --epsilon" and "--epsilon" not in str(caught.value)  # the API's message
    op = build_op(arrays, OpSettings(data_format="NCHW", variance_is_invstd=True))
    assert op.variance_is_invstd and op.data_format == "NCX"


def test_a_missing_input_suggests_the_unused_key_of_its_shape(arrays):
    inputs = {k: v for k, v in arrays.items() if k != "variance"}
    with pytest.raises(InputError) as caught:
        build_op(inputs, OpSettings(epsilon=1e-5, data_format="NCHW"), others={"var_c": (3,), "other": (5,)})
    assert str(caught.value).startswith("missing input variance (spec generic)")
    assert caught.value.hint == "--map var_c=variance reads var_c (3,) as it"


def test_split_sorts_inputs_outputs_and_the_rest_by_name_map_and_alias(arrays):
    file = {"x": arrays["src"], "grad_output": arrays["diff_dst"], "mean": arrays["mean"], "var": arrays["variance"],
            "gamma": arrays["gamma"], "x_backprop": arrays["src"], "step": np.int64(3), "epsilon": np.float64(1e-5)}
    request = SplitRequest(Naming(key_map={"x": "src", "var": "variance"}), OpSettings(data_format="NCHW"))
    split = split_arrays(file, request, "bundle")
    assert sorted(split.inputs) == ["diff_dst", "gamma", "mean", "src", "variance"]
    assert list(split.outputs) == ["x_backprop"] and split.unused == ("step",) and split.note() == "not used: step"
    assert split.settings.epsilon == 1e-5
    assert split.build_op().epsilon == 1e-5


def test_two_keys_giving_one_input_is_an_error(arrays):
    file = {"src": arrays["src"], "input": arrays["src"], "diff_dst": arrays["diff_dst"]}
    with pytest.raises(InputError, match=r"bundle: both 'src' and 'input' give src; keep one"):
        split_arrays(file, SplitRequest(Naming(), OpSettings()), "bundle")


def test_pytorchs_save_invstd_means_the_variance_holds_invstd(arrays):
    file = {"input": arrays["src"], "grad_output": arrays["diff_dst"], "save_mean": arrays["mean"],
            "save_invstd": 1 / np.sqrt(arrays["variance"] + 1e-5), "weight": arrays["gamma"]}
    split = split_arrays(file, SplitRequest(Naming(), OpSettings(data_format="NCHW")), "bundle")
    assert split.settings.variance_is_invstd and split.build_op().variance_is_invstd
