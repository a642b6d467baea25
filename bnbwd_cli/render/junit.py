"""A suite's verdicts as JUnit XML: what Jenkins, GitLab and GitHub's test reporters read.

Made from check's JSON document (render/cases.py), so `check --junit` and `bnbwd report --junit` over merged
shards write the same XML (and `run --reference --junit` / `verify --junit` that of a suite of one case, named
after their command: the document's tool). The structure every reporter reads (the common JUnit schema): <testsuites> holding
one <testsuite>, each case a <testcase name classname time>; a mismatch is a <failure>, a case that could not
be judged (exit 3) an <error>, each with its one-line verdict as message and its brief report as text; the
counts (tests, failures, errors, skipped) and times on both levels.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from typing import Any

# Characters XML 1.0 cannot hold even escaped (C0 controls but tab, newline and return; surrogates; U+FFFE/F).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text: str) -> str:
    return _NOT_XML.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def _seconds(value: float) -> str:
    return f"{value:.3f}"


def _verdict_element(case: dict[str, Any]) -> ElementTree.Element | None:
    """<failure> for a mismatch, <error> for a case that could not be judged, None for a pass."""
    if case["status"] == "pass":
        return None
    tag = "failure" if case["exit_code"] == 1 else "error"
    message = case["line"] if case["error"] is None else case["error"]
    element = ElementTree.Element(tag, message=_xml_text(message), type=case["status"])
    element.text = _xml_text(case["brief"] or message)
    return element


def junit_xml(document: dict[str, Any]) -> str:
    """The XML text of a check document (render/cases.check_document or a merge of them)."""
    cases = document["cases"]
    failures = sum(case["status"] != "pass" and case["exit_code"] == 1 for case in cases)
    errors = sum(case["exit_code"] not in (0, 1) for case in cases)
    counts = {"tests": str(len(cases)), "failures": str(failures), "errors": str(errors), "skipped": "0",
              "time": _seconds(sum(case["seconds"] for case in cases))}
    tool = document.get("tool", "bnbwd check")  # bnbwd check (report's merge too), bnbwd run or bnbwd verify
    root = ElementTree.Element("testsuites", name=tool, **counts)
    suite = ElementTree.SubElement(root, "testsuite", name=tool, **counts)
    properties = ElementTree.SubElement(suite, "properties")
    shard = document["shard"]
    for name, value in (("bnbwd_version", document["bnbwd_version"]), ("summary", document["summary"]),
                        ("shard", None if shard is None else f"{shard['index']}/{shard['count']}")):
        if value is not None:
            ElementTree.SubElement(properties, "property", name=name, value=_xml_text(value))
    for case in cases:
        testcase = ElementTree.SubElement(suite, "testcase", name=_xml_text(case["case"]), classname=tool.replace(" ", "."),
                                          time=_seconds(case["seconds"]))
        verdict = _verdict_element(case)
        if verdict is not None:
            testcase.append(verdict)
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(root, encoding="unicode") + "\n"
