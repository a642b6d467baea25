"""Runs the blind zoo (tools/blind_zoo.py) through the real CLI and measures what bnbwd's diagnosis gets right.

Each kernel's inputs and outputs are written as .npz files and judged by `python -m bnbwd_cli run INPUTS
--reference OUTPUTS --json - -q` in a subprocess, as a user runs it. Each run is then classified:

- verdict: right when a correct kernel exits 0 and a failing one exits 1 (anything else is wrong);
- cause (failing runs): `right` when a hint names one of the planted bug's causes (a cause, or an answer
  whose text says it: "no relation to these inputs") and its text holds the planted numbers' words; `coarse` when the only answer is true but less precise (e.g. "the sums are wrong", "the
  bug is in the elementwise pass" for a bug with no named cause); `wrong` when any hint names a cause the bug
  does not have (or the right family with the wrong numbers); `none` otherwise;
- place (failing runs with a planted region): the `where` of the output (or of its NaN/Inf) is turned back into
  a mask from its JSON fields; `right` when it covers >= 80% of the region's failing elements (from
  `--save-error`) and >= 80% of what it names lies in the region, `wrong` when most of what it names lies
  outside the region, `none` when there is no usable `where` (or a scattered one);
- correct kernels: `hinted` when they get any hint or `where`.

    python -m tools.blind_check                     # the whole zoo, 2 processes at once; a table and the rates
    python -m tools.blind_check --only skip_sample  # entries whose name starts so
    python -m tools.blind_check --gaps FILE.md      # also write the runs with neither cause nor place right
    python -m tools.blind_check --write DIR NAME    # write NAME's .npz files to DIR (to reproduce one run)
    python -m tools.blind_check --draws 2           # also each entry redrawn with 2 other seeds (other data and,
                                                    # for the bugs that draw them, other offsets, strides, channels)
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import importlib
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tools.blind_zoo import Entry

ROOT = Path(__file__).resolve().parent.parent
NEUTRAL = {"unexplained", "not-diagnosed", "ambiguous"}  # answers that name no cause


@dataclasses.dataclass
class Outcome:
    entry: Entry
    what: str
    exit_code: int
    verdict_right: bool
    cause: str  # right / coarse / wrong / none / - (correct kernel)
    place: str  # right / wrong / none / n.a.
    hinted: bool  # a correct kernel got a hint or a where
    said: str  # the hints and where, as bnbwd said them
    where: str
    hint_causes: list


def write_case(entry: Entry, folder: Path) -> tuple[Path, Path, object]:
    inputs, outputs, planted = entry.run()
    folder.mkdir(parents=True, exist_ok=True)
    src, out = folder / f"{entry.name}.npz", folder / f"{entry.name}.out.npz"
    np.savez(src, **inputs)
    np.savez(out, **outputs)
    return src, out, planted


def command(src: Path, out: Path, errors: Path) -> list[str]:
    return [sys.executable, "-m", "bnbwd_cli", "run", str(src), "--reference", str(out), "--json", "-", "-q",
            "--save-error", str(errors)]


def where_mask(where: dict | None, shape: tuple, axis_names: list, channel_axis: int | None) -> np.ndarray | None:
    """The elements a `where` names, as a mask over the output's stored shape (None: nothing usable)."""
    if not where:
        return None
    kind = where["kind"]
    size = int(np.prod(shape))
    flat = np.arange(size)
    if kind == "all":
        return np.ones(shape, bool)
    if kind == "axes":
        mask = np.ones(shape, bool)
        for axis, name in enumerate(axis_names):
            ranges = where["axes"].get(name)
            if not ranges:
                continue
            keep = np.zeros(shape[axis], bool)
            for lo, hi in ranges:
                keep[lo:hi + 1] = True
            mask &= keep.reshape([-1 if a == axis else 1 for a in range(len(shape))])
        return mask
    if kind == "range":
        return ((flat >= where["start"]) & (flat < where["stop"])).reshape(shape)
    if kind == "period":
        lane = flat % where["period"]
        keep = np.zeros(size, bool)
        for lo, hi in where["lanes"]:
            keep |= (lane >= lo) & (lane <= hi)
        return keep.reshape(shape)
    if kind == "reduction" and channel_axis is not None and (where.get("start") is not None or where.get("period")):
        moved = np.moveaxis(np.arange(size).reshape(shape), channel_axis, 0)
        position = np.empty(size, np.int64)
        position[moved.reshape(moved.shape[0], -1)] = np.arange(moved[0].size)[None, :]
        if where.get("period"):  # lanes of every period of each channel's positions
            lane = position % where["period"]
            keep = np.zeros(size, bool)
            for lo, hi in where["lanes"]:
                keep |= (lane >= lo) & (lane <= hi)
        else:
            keep = (position >= where["start"]) & (position < where["stop"])
        mask = keep.reshape(shape)
        chans = where["axes"].get(axis_names[channel_axis])
        if chans:
            sel = np.zeros(shape[channel_axis], bool)
            for lo, hi in chans:
                sel[lo:hi + 1] = True
            mask &= sel.reshape([-1 if a == channel_axis else 1 for a in range(len(shape))])
        return mask
    if kind == "elements":  # "2 elements: n=0 c=1 h=0 w=1; n=3 c=2 h=5 w=5"
        mask = np.zeros(shape, bool)
        for item in where["text"].split(":", 1)[1].split(";"):
            coords = dict(re.findall(r"(\w+)=(\d+)", item))
            if set(coords) == set(axis_names):
                mask[tuple(int(coords[name]) for name in axis_names)] = True
        return mask if mask.any() else None
    return None  # scattered, or a kind this tool does not read


def judge_place(planted, outputs: dict, saved: dict | None = None) -> tuple[str, str]:
    """`saved`: what --save-error wrote. The `where` must cover the planted region's failing (or non-finite)
    elements (a planted element whose error a correct kernel could make does not count) and name few elements
    outside the region."""
    if planted.region is None:
        return "n.a.", ""
    name, _, nonfinite = planted.region_output.partition(":")
    if name == "nonfinite":
        name, nonfinite = "diff_src", "nonfinite"
    out = outputs.get(name)
    if out is None:
        return "none", ""
    comp = out["comparison"]
    where = comp["nonfinite"]["where"] if nonfinite else comp["where"]
    text = where["text"] if where else ""
    mask = where_mask(where, tuple(comp["shape"]), comp["axis_names"], comp["channel_axis"])
    if mask is None:
        return "none", text
    failing = None
    if saved and f"{name}.failing" in saved:
        failing = saved[f"{name}.failing"] | saved[f"{name}.nonfinite"]
    target = planted.region if failing is None or not (failing & planted.region).any() else failing & planted.region
    recall = np.count_nonzero(mask & target) / np.count_nonzero(target)
    precision = np.count_nonzero(mask & planted.region) / max(np.count_nonzero(mask), 1)
    if recall >= 0.8 and precision >= 0.8:
        return "right", text
    if precision < 0.5:
        return "wrong", text
    return "none", text


def matches(spec: str, hint: dict) -> bool:
    cause, _, words = spec.partition(":")
    return hint["cause"] == cause and (not words or words in hint["evidence"])


def judge_cause(planted, hints: list[dict]) -> str:
    def fits(specs, hint):
        return any(matches(spec, hint) for spec in specs)

    exact = [h for h in hints if fits(planted.causes, h)]
    named = [h for h in hints if h["cause"] not in NEUTRAL]
    if any(not fits(planted.causes, h) and not fits(planted.coarse, h) for h in named):
        return "wrong"
    if any(not re.search(planted.words, h["evidence"]) for h in exact if h["cause"] not in NEUTRAL):
        return "wrong"  # the right family with numbers that are not the planted ones
    if exact:
        return "right"
    if any(fits(planted.coarse, h) for h in hints):
        return "coarse"
    return "none"


def judge(entry: Entry, folder: Path) -> Outcome:
    src, out, planted = write_case(entry, folder)
    errors = folder / f"{entry.name}.errors.npz"
    proc = subprocess.run(command(src, out, errors), cwd=ROOT, capture_output=True, text=True)
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = {"outputs": []}
    outputs = {o["name"]: o for o in doc["outputs"] if o.get("comparison")}
    hints = [h for o in outputs.values() for h in (o["comparison"].get("hints") or [])]
    wheres = [o["comparison"].get("where") or (o["comparison"].get("nonfinite") or {}).get("where")
              for o in outputs.values()]
    said = "; ".join(dict.fromkeys(f"[{h['cause']}] {h['evidence']}" for h in hints))
    where_texts = "; ".join(f"{name}: {w['text']}" for name, w in zip(outputs, wheres) if w)
    if entry.correct:
        return Outcome(entry, planted.what, proc.returncode, proc.returncode == 0, "-", "n.a.",
                       bool(hints) or any(wheres), said or proc.stderr.strip()[-300:], where_texts,
                       [h["cause"] for h in hints])
    saved = None
    if errors.exists():
        with np.load(errors) as archive:
            saved = dict(archive)
    place, _ = judge_place(planted, outputs, saved)
    return Outcome(entry, planted.what, proc.returncode, proc.returncode == 1, judge_cause(planted, hints), place,
                   False, said or proc.stderr.strip()[-300:], where_texts, [h["cause"] for h in hints])


def redrawn(entries: list[Entry], draws: int) -> list[Entry]:
    """The entries, then each again with `draws` other seeds (named NAME#k: `--write DIR NAME#k` reproduces one)."""
    more = [dataclasses.replace(e, name=f"{e.name}#{k}", seed=e.seed + 1000 * k)
            for k in range(1, draws + 1) for e in entries]
    return entries + more


def run_all(entries: list[Entry], jobs: int = 2) -> list[Outcome]:
    with tempfile.TemporaryDirectory(prefix="blind-") as tmp:
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            return list(pool.map(lambda e: judge(e, Path(tmp)), entries))


@dataclasses.dataclass
class Rates:
    failing: int = 0
    cause_right: int = 0
    cause_coarse: int = 0
    place_right: int = 0
    either: int = 0
    wrong_cause: int = 0
    wrong_place: int = 0
    correct: int = 0
    correct_hinted: int = 0
    verdicts_wrong: int = 0

    def add(self, o: Outcome) -> None:
        self.verdicts_wrong += not o.verdict_right
        if o.entry.correct:
            self.correct += 1
            self.correct_hinted += o.hinted
            return
        self.failing += 1
        self.cause_right += o.cause == "right"
        self.cause_coarse += o.cause == "coarse"
        self.place_right += o.place == "right"
        self.either += o.cause == "right" or o.place == "right"
        self.wrong_cause += o.cause == "wrong"
        self.wrong_place += o.place == "wrong"

    def row(self, label: str) -> str:
        f = max(self.failing, 1)
        return (f"{label:14s} {self.failing:4d} {self.cause_right:5d} {self.place_right:5d} "
                f"{self.either:4d} ({100 * self.either / f:5.1f}%) {self.cause_coarse:6d} {self.wrong_cause:5d} "
                f"{self.wrong_place:5d} {self.verdicts_wrong:4d}")


def rates(outcomes: list[Outcome]) -> tuple[Rates, dict[str, Rates]]:
    total, per_kind = Rates(), collections.defaultdict(Rates)
    for o in outcomes:
        total.add(o)
        per_kind[o.entry.kind].add(o)
    return total, dict(per_kind)


def report(outcomes: list[Outcome]) -> str:
    lines = [f"{'kernel':30s} {'kind':12s} {'exit':4s} {'cause':6s} {'place':5s}  what bnbwd said"]
    for o in outcomes:
        flag = ("HINTED " if o.hinted else "") + ("" if o.verdict_right else "VERDICT-WRONG ")
        lines.append(f"{o.entry.name:30s} {o.entry.kind:12s} {o.exit_code:4d} {o.cause:6s} {o.place:5s}  {flag}"
                     f"{o.what} | {', '.join(o.hint_causes) or '-'} | {o.where[:110]}")
    total, per_kind = rates(outcomes)
    lines += ["", f"{'kind':14s} runs cause place either         coarse wrong wrong-place verdicts-wrong"]
    for kind, r in sorted(per_kind.items()):
        if r.failing:
            lines.append(r.row(kind))
    lines.append(total.row("ALL failing"))
    lines.append(f"correct kernels: {total.correct}, hinted or located: {total.correct_hinted}, verdicts wrong: "
                 f"{sum(1 for o in outcomes if o.entry.correct and not o.verdict_right)}")
    return "\n".join(lines)


def markdown(outcomes: list[Outcome]) -> str:
    """The rates per kind as a markdown table (docs/held-out.md)."""
    total, per_kind = rates(outcomes)
    lines = ["| kind | failing runs | cause right | place right | either | coarse only | wrong cause | wrong place |",
             "|---|---|---|---|---|---|---|---|"]
    for kind, r in sorted(per_kind.items()):
        if r.failing:
            lines.append(f"| {kind} | {r.failing} | {r.cause_right} | {r.place_right} | {r.either} | "
                         f"{r.cause_coarse} | {r.wrong_cause} | {r.wrong_place} |")
    lines.append(f"| **all failing** | **{total.failing}** | **{total.cause_right}** | **{total.place_right}** | "
                 f"**{total.either} ({100 * total.either / max(total.failing, 1):.1f}%)** | {total.cause_coarse} | "
                 f"**{total.wrong_cause}** | **{total.wrong_place}** |")
    lines.append(f"\nVerdicts wrong: {total.verdicts_wrong}; correct kernels {total.correct}, hinted or located "
                 f"{total.correct_hinted}.")
    return "\n".join(lines)


def gaps(outcomes: list[Outcome], zoo_module: str = "tools.blind_zoo") -> str:
    out = []
    for o in outcomes:
        bad_verdict = not o.verdict_right
        missed = not o.entry.correct and not (o.cause == "right" or o.place == "right")
        if not (bad_verdict or missed or o.hinted or o.cause == "wrong" or o.place == "wrong"):
            continue
        e = o.entry
        out += [f"### {e.name} ({e.kind}; cause {o.cause}, place {o.place}, exit {o.exit_code}"
                f"{', VERDICT WRONG' if bad_verdict else ''}{', HINTED' if o.hinted else ''})",
                f"- kernel: `{zoo_module.replace('.', '/')}.py` {e.kernel.__name__}: {(e.kernel.__doc__ or '').strip().splitlines()[0] if e.kernel.__doc__ else o.what}; planted: {o.what}",
                f"- reproduce: `python -m tools.blind_check{'' if zoo_module == 'tools.blind_zoo' else ' --zoo ' + zoo_module}"
                f" --write /tmp/blind {e.name} && python -m bnbwd_cli run "
                f"/tmp/blind/{e.name}.npz --reference /tmp/blind/{e.name}.out.npz --brief`",
                f"- bnbwd said: {o.said or '(no hint)'}",
                f"- where: {o.where or '(none)'}", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="entries whose name starts with one of these")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--gaps", type=Path, help="write the runs where bnbwd missed (markdown) to this file")
    parser.add_argument("--json", type=Path, help="write every outcome as JSON")
    parser.add_argument("--markdown", action="store_true", help="also print the rates as a markdown table")
    parser.add_argument("--write", nargs=2, metavar=("DIR", "NAME"), help="write one entry's .npz files and stop")
    parser.add_argument("--draws", type=int, default=0, help="also run each entry with this many other seeds")
    parser.add_argument("--zoo", default="tools.blind_zoo", help="the module whose zoo() to run (another blind set)")
    args = parser.parse_args(argv)
    entries = redrawn(importlib.import_module(args.zoo).zoo(), args.draws)
    if args.write:
        folder, name = Path(args.write[0]), args.write[1]
        (entry,) = [e for e in entries if e.name == name]
        src, out, planted = write_case(entry, folder)
        print(f"{src}\n{out}\nplanted: {planted.what}")
        return 0
    if args.only:
        entries = [e for e in entries if any(e.name.startswith(p) for p in args.only)]
    cpu0, wall0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    outcomes = run_all(entries, args.jobs)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(report(outcomes))
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    print(f"{len(outcomes)} runs: {cpu:.1f} s CPU in the CLI processes, {time.perf_counter() - wall0:.1f} s wall")
    if args.markdown:
        print(markdown(outcomes))
    if args.gaps:
        args.gaps.write_text(gaps(outcomes, args.zoo))
    if args.json:
        args.json.write_text(json.dumps([{
            "name": o.entry.name, "kind": o.entry.kind, "correct": o.entry.correct, "exit_code": o.exit_code,
            "verdict_right": o.verdict_right, "cause": o.cause, "place": o.place, "hinted": o.hinted,
            "what": o.what, "said": o.said, "where": o.where} for o in outcomes], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
