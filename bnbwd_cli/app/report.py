"""`bnbwd report`: the JSON documents of `check` (its shards, or any suites) merged into one suite's document.

Pure apart from reading the documents (files/documents.py): each must be a `bnbwd check --json` document of
this schema; their cases are taken in argument order, and the verdict, counts and summary follow from them
(render/cases.suite_document), so the shards 1/N..N/N of a suite merge into the unsharded run's document (but
each case's seconds). A case in two documents, or shards of one N with some missing, is an error: a merged
report that silently lacks cases would pass a nightly that never ran them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bnbwd_cli.errors import InputError
from bnbwd_cli.files.documents import read_document
from bnbwd_cli.literal import literal
from bnbwd_cli.render.cases import suite_document
from bnbwd_cli.render.json import CHECK_SCHEMA_VERSION

CHECK_TOOL = "bnbwd check"


def _checked(source: str, document: Any) -> dict[str, Any]:
    if not isinstance(document, dict) or document.get("tool") != CHECK_TOOL or not isinstance(document.get("cases"), list):
        raise InputError(f"{literal(source)}: not a `bnbwd check --json` document")
    version = document.get("schema_version")
    if version != CHECK_SCHEMA_VERSION:
        raise InputError(f"{literal(source)}: schema_version {literal(str(version))}, expected "
                         f"{CHECK_SCHEMA_VERSION} (write it again with this bnbwd's check --json)")
    return document


def _shards_complete(sources: Sequence[str], documents: Sequence[dict[str, Any]]) -> None:
    """Documents that are shards of N (all of them, each saying so) must be the N shards, each once."""
    shards = [document.get("shard") for document in documents]
    if not shards or any(not isinstance(shard, dict) for shard in shards):
        return
    counts = {shard.get("count") for shard in shards}
    if len(counts) != 1:
        named = ", ".join(f"{shard.get('index')}/{shard.get('count')}" for shard in shards)
        raise InputError(f"shards of different counts ({literal(named)}): merge the shards of one run")
    count = counts.pop()
    indexes = [shard.get("index") for shard in shards]
    twice = sorted({k for k in indexes if indexes.count(k) > 1})
    if twice:
        which = [source for source, k in zip(sources, indexes) if k == twice[0]]
        raise InputError(f"shard {twice[0]}/{count} given twice ({', '.join(map(literal, which))})")
    missing = [f"{k}/{count}" for k in range(1, count + 1) if k not in indexes] if isinstance(count, int) else []
    if missing:
        raise InputError(f"shard {', '.join(missing)} missing: merge every shard's document")


def merge(sources: Sequence[str]) -> dict[str, Any]:
    """The merged document of the documents at `sources` (paths, or "-" once for stdin)."""
    documents = [_checked(source, read_document(source)) for source in sources]
    _shards_complete(sources, documents)
    cases: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for source, document in zip(sources, documents):
        for case in document["cases"]:
            name = case.get("case") if isinstance(case, dict) else None
            if not isinstance(name, str):
                raise InputError(f"{literal(source)}: a case without its name: not a `bnbwd check --json` document")
            if name in seen:
                raise InputError(f"case {literal(name)} is in both {literal(seen[name])} and {literal(source)}")
            seen[name] = source
            cases.append(case)
    return suite_document(cases)
