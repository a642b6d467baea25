"""Every JSON document is strict JSON built from edge cases: numbers or null, never NaN/Infinity constants or
strings standing for numbers ("inf", "nan"); "tool" names the command that ran; check's document is compact."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import bnbwd_cli
from bnbwd_cli.judge import Judging, compare_sets
from bnbwd_cli.render.json import Source, document_text, report_document
from tests.conftest import save_bundle

NUMBER_WORD = re.compile(r"[+-]?(inf|infinity|nan)", re.I)


def _refuse(constant: str):
    raise ValueError(f"non-finite constant {constant} in a JSON document")


def strict(text: str) -> dict:
    """The document, refusing NaN/Infinity; and no string anywhere that stands for a number."""
    document = json.loads(text, parse_constant=_refuse)

    def walk(value, where):
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{where}.{key}")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{where}[{i}]")
        elif isinstance(value, str):
            assert not NUMBER_WORD.fullmatch(value.strip()), f"{where} = {value!r}"
        elif isinstance(value, float):
            assert np.isfinite(value), where

    walk(document, "$")
    return document


def _problem(gamma_zero: bool = False):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(4, 3, 5, 5)).astype(np.float32)
    dy = rng.normal(size=x.shape).astype(np.float32)
    gamma = np.array([0.0, 1.0, 0.5], np.float32) if gamma_zero else rng.normal(size=3).astype(np.float32)
    inputs = dict(src=x, diff_dst=dy, mean=x.mean((0, 2, 3)), variance=x.var((0, 2, 3)), gamma=gamma, epsilon=1e-5,
                  data_format="NCHW")
    return inputs, bnbwd_cli.backward(**inputs)


def _edge_outputs(grads):
    """Kernel outputs that make every statistic hit its edge: NaN, Inf, a channel whose scale is 0 off."""
    src = grads["diff_src"].copy()
    src[0, 0, 0, 0], src[0, 1, 0, 0], src[1, 0, 1, 1] = np.nan, np.inf, -np.inf
    src[:, 0] += np.float32(1e-3)  # gamma 0 there: a correct kernel's error scale is 0, the error unbounded in units
    beta = grads["diff_beta"].copy()
    beta[1] = np.nan
    return {"diff_src": src, "diff_gamma": grads["diff_gamma"] * np.float32(-1), "diff_beta": beta}


def test_gamma_zero_is_units_unbounded_not_the_string_inf():
    inputs, grads = _problem(gamma_zero=True)
    wrong = dict(grads, diff_src=grads["diff_src"] + np.float32(1e-3))
    document = strict(bnbwd_cli.check(wrong, **inputs).to_json())
    diff_src = document["outputs"][0]["comparison"]
    assert diff_src["units_unbounded"] is True and diff_src["max_units"]["value"] is None
    assert diff_src["min_units"] is None
    passing = strict(bnbwd_cli.check(grads, **inputs).to_json())
    assert not any(o["comparison"]["units_unbounded"] for o in passing["outputs"])


def test_documents_from_edge_cases_are_strict_json(tmp_path, cli):
    inputs, grads = _problem(gamma_zero=True)
    edge = _edge_outputs(grads)
    documents = [bnbwd_cli.check(edge, **inputs).to_json(), bnbwd_cli.check(grads, **inputs).to_json()]
    # the fixed rule: a zero reference (relative error unbounded), NaN and Inf on either side
    reference = {"x": np.array([0.0, 1.0, np.inf, np.nan, 2.0]), "y": np.zeros(3, np.float32)}
    actual = {"x": np.array([1e-3, np.nan, np.inf, 1.0, -np.inf]), "y": np.full(3, np.inf, np.float32)}
    documents.append(document_text(report_document(compare_sets(actual, reference, Judging()), Source("t", "a", "r"))))
    bundle = save_bundle(tmp_path / "in.npz", inputs)
    kernel = save_bundle(tmp_path / "k.npz", edge)
    case = save_bundle(tmp_path / "case.npz", {**inputs, **edge})
    for args in (["run", bundle, "-q", "--reference", kernel, "--json", "-"],
                 ["run", bundle, "-o", tmp_path / "out.npz", "--json", "-"],
                 ["verify", kernel, kernel, "--json", "-"],
                 ["verify", kernel, save_bundle(tmp_path / "g.npz", grads), "--inputs", bundle, "--json", "-"],
                 ["check", case, tmp_path / "absent.npz", "--json", "-"]):
        result = cli(*map(str, args))
        assert result.exit_code in (0, 1, 3), result.output
        documents.append(result.stdout)
    for text in documents:
        strict(text)


def test_tool_names_the_command_that_ran(tmp_path, cli):
    inputs, grads = _problem()
    bundle, kernel = save_bundle(tmp_path / "in.npz", inputs), save_bundle(tmp_path / "k.npz", grads)
    case = save_bundle(tmp_path / "case.npz", {**inputs, **grads})
    tools = {
        "bnbwd run": cli("run", bundle, "-q", "--reference", kernel, "--json", "-").stdout,
        "bnbwd verify": cli("verify", kernel, kernel, "--json", "-").stdout,
        "bnbwd check": cli("check", case, "--json", "-").stdout,
        "bnbwd_cli.check": bnbwd_cli.check(grads, **inputs).to_json(),
    }
    for tool, text in tools.items():
        document = strict(text)
        assert (document["tool"], document["schema_version"]) == (tool, 4)
        assert document["default_max_units"] == {"diff_src": 16.0, "diff_gamma": 5.0, "diff_beta": 5.0}


@pytest.mark.parametrize("broken", [False, True], ids=["passing", "failing"])
def test_check_json_is_compact_details_only_for_failures(tmp_path, cli, broken):
    inputs, grads = _problem()
    outputs = dict(grads, diff_beta=grads["diff_beta"] * np.float32(1.5)) if broken else grads
    cases = [save_bundle(tmp_path / f"c{i}.npz", {**inputs, **(outputs if i == 0 else grads)}) for i in range(4)]
    document = strict(cli("check", *cases, "--json", "-").stdout)
    for case in document["cases"]:
        for output in case["outputs"]:
            assert output["criteria"] and (output["comparison"] is None) == (output["status"] == "pass")
            assert isinstance(output["max_units"], float)
    failing = [c for c in document["cases"] if c["status"] != "pass"]
    assert len(failing) == int(broken)
    if broken:
        beta = failing[0]["outputs"][2]
        assert beta["name"] == "diff_beta" and beta["comparison"]["worst"]
        assert all(set(h) == {"cause", "evidence", "channels"} for h in beta["hints"])
        assert failing[0]["hint"] == beta["hints"][0]["evidence"]
