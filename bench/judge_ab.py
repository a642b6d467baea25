"""Interleaved before/after of bench/targets.py's judge rows: per round, fresh processes floor, plain and judged
for a base tree and this one (PYTHONPATH picks the tree), both layouts, f32 (32,128,56,56), 2 threads.

    git archive BASE bnbwd_cli | tar -x -C /tmp/base && python bench/judge_ab.py /tmp/base 7
"""
import os, subprocess, sys, time, tempfile, shutil
from pathlib import Path
import numpy as np
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import targets, end_to_end
TREES = {"before": sys.argv[1], "after": str(BENCH.parent)}
rounds = int(sys.argv[2])
def child(cmd, tree):
    env = {**end_to_end.child_env(), "PYTHONPATH": tree}
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", targets.RSS_WRAPPER, *cmd], env=env, cwd=tree, capture_output=True, text=True)
    s = time.perf_counter() - t
    assert done.returncode in (0, 1), done.stderr[-400:]
    peak = [l.split()[1] for l in done.stderr.splitlines() if l.startswith("VmHWM_KB")]
    return s * 1e3, int(peak[-1]) / 1024
work_root = Path(tempfile.mkdtemp())
print("load at start", os.getloadavg())
for fmt in ("NCHW", "NHWC"):
    work = work_root / fmt; work.mkdir()
    end_to_end.write_inputs(work, fmt)
    out = work / "judged"; out.mkdir()
    child(end_to_end.run_command(work, fmt, 2, ["--out-dir", str(out)])[1:], TREES["before"])
    plain = end_to_end.run_command(work, fmt, 2, [])[1:]
    judged = end_to_end.run_command(work, fmt, 2, ["--reference", str(out)])[1:]
    data = sum(np.load(work / f"{n}.npy", mmap_mode="r").nbytes for n in ("src", "diff_dst"))
    data += sum(np.load(out / f"{n}.npy", mmap_mode="r").nbytes for n in ("diff_src", "diff_gamma", "diff_beta"))
    res = {k: {"added": [], "rss": [], "judged": [], "plain": []} for k in TREES}
    for r in range(rounds + 1):
        f, _ = child(["-c", "import numpy"], TREES["after"])
        row = {}
        for name, tree in TREES.items():
            p, _ = child(plain, tree); j, rss = child(judged, tree)
            if r:
                res[name]["added"].append((j - p) / (p - f)); res[name]["rss"].append(rss * 2**20 / data)
                res[name]["judged"].append(j); res[name]["plain"].append(p)
                row[name] = f"plain {p:.0f} judged {j:.0f} floor {f:.0f} added {(j-p)/(p-f):.2f} rss {rss:.0f}MiB"
        if r: print(fmt, r, row, "load", os.getloadavg()[0], flush=True)
    for name in TREES:
        v = res[name]
        print(f"{fmt} {name}: added median {np.median(v['added']):.2f} ({min(v['added']):.2f}-{max(v['added']):.2f}); "
              f"judged ms {np.median(v['judged']):.0f} ({min(v['judged']):.0f}-{max(v['judged']):.0f}); plain ms {np.median(v['plain']):.0f}; "
              f"rss {np.median(v['rss']):.2f}x ({min(v['rss']):.2f}-{max(v['rss']):.2f}) of {data/2**20:.0f} MiB")
    ratio = [a / b for a, b in zip(res["after"]["judged"], res["before"]["judged"])]
    print(f"{fmt} judged after/before, paired: median {np.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})")
    shutil.rmtree(work)
print("load at end", os.getloadavg())
shutil.rmtree(work_root)
