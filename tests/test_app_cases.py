"""app/cases.py: the suite `bnbwd cases` writes: every target a known bug class, the same bytes for the same
settings, each case's layout the suite's, and a size cap that leaves cases out with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bnbwd_cli.app import cases as app_cases
from bnbwd_cli.app.cases import SuiteSettings, case_arrays, case_members, catalogue, targets_for, write_suite
from bnbwd_cli.errors import InputError


def test_every_case_targets_known_bug_classes_with_distinct_names():
    for preset in app_cases.PRESETS:
        specs = catalogue(preset)
        assert specs and len({s.name for s in specs}) == len(specs)
        assert all(set(s.targets) <= set(app_cases.BUG_CLASSES) for s in specs), preset
    assert all(s.elements <= app_cases.TINY_ELEMENTS for s in catalogue("tiny"))
    with pytest.raises(InputError, match="preset 'huge': expected one of"):
        catalogue("huge")


def test_a_dtype_keeps_only_the_targets_it_can_expose():
    spec = next(s for s in catalogue("default") if set(s.targets) & set(app_cases.SIXTEEN_BIT_ONLY))
    assert not set(targets_for(spec, "f32")) & set(app_cases.SIXTEEN_BIT_ONLY)
    assert not set(targets_for(spec, "bf16")) & set(app_cases.FLOAT32_ONLY)


@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_a_cases_arrays_are_laid_out_as_asked_and_described_by_case_members(data_format):
    spec = catalogue("tiny")[0]
    settings = SuiteSettings(dtype="bf16", data_format=data_format)
    arrays = case_arrays(spec, settings)
    members = case_members(spec, settings)
    assert {name: (a.shape, a.dtype) for name, a in arrays.items()} == members
    n, c, *spatial = spec.shape
    assert arrays["src"].shape == ((n, c, *spatial) if data_format == "NCX" else (n, *spatial, c))
    ncx = case_arrays(spec, SuiteSettings(dtype="bf16", data_format="NCX"))["src"]
    assert np.array_equal(np.moveaxis(arrays["src"], -1, 1) if data_format == "NXC" else arrays["src"], ncx)


def test_a_suite_is_the_same_bytes_twice_and_its_manifest_hashes_them(tmp_path: Path):
    settings = SuiteSettings(preset="tiny")
    first, second = write_suite(settings, tmp_path / "a"), write_suite(settings, tmp_path / "b")
    assert [(c.file, c.sha256) for c in first.cases] == [(c.file, c.sha256) for c in second.cases]
    manifest = json.loads((tmp_path / "a" / app_cases.MANIFEST_JSON).read_text())
    assert [c["sha256"] for c in manifest["cases"]] == [c.sha256 for c in first.cases]
    assert (tmp_path / "a" / first.cases[0].file).read_bytes() == (tmp_path / "b" / first.cases[0].file).read_bytes()


def test_max_bytes_leaves_out_what_does_not_fit_and_says_why(tmp_path: Path):
    whole = write_suite(SuiteSettings(preset="tiny"), tmp_path / "whole")
    cap = whole.cases[0].nbytes
    capped = write_suite(SuiteSettings(preset="tiny", max_bytes=cap), tmp_path / "capped")
    assert capped.nbytes <= cap and len(capped.cases) < len(whole.cases)
    assert all(why.endswith(f"over --max-bytes {cap}") for _, why in capped.left_out)
    with pytest.raises(InputError, match="no case fits"):
        write_suite(SuiteSettings(preset="tiny", max_bytes=10), tmp_path / "none")
    assert not (tmp_path / "none").exists()
