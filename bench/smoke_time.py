"""Wall time of the smoke reproduction (`make reproduce PROFILE=smoke`), per notebook and in all, on this machine.

Runs `python -m coa_lib.reproduce --profile smoke` into a fresh temporary run dir (removed afterwards unless --keep),
then reads the run's `summary.json` (wall seconds per notebook) and the executed notebooks (papermill's per-cell
durations: every cell over --slow seconds is listed). The CPU seconds of the whole run (this process's children: the
runner, the kernels and their lanes) and the load average before and after say how far a busy machine stretched the
wall times (the goal, issue 27: the whole run <= 5 min on an idle 2-core machine).

    python bench/smoke_time.py                 # writes bench/results/smoke_time.json
    python bench/smoke_time.py --keep runs/smoke_timed

The run is heavy (every numbered notebook): run it on an idle machine, once.
"""
import argparse, json, os, platform, resource, shutil, subprocess, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def slow_cells(nb_dir: Path, slow: float) -> list[dict]:
    "Cells of the executed notebooks in `nb_dir` that ran longer than `slow` seconds (papermill's durations)."
    out = []
    for nb in sorted(nb_dir.glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        for i, c in enumerate(cells):
            d = c.get("metadata", {}).get("papermill", {}).get("duration")
            if d is not None and d > slow:
                src = "".join(c["source"]).strip().splitlines()
                out.append({"notebook": nb.stem, "cell": i, "wall_s": round(d, 1), "first_line": src[0][:80] if src else ""})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", default=None, metavar="RUN_DIR", help="run into this (new) run dir and keep it")
    ap.add_argument("--slow", type=float, default=30.0, help="list cells slower than this many seconds (default 30)")
    ap.add_argument("--out", default=str(HERE / "results" / "smoke_time.json"))
    a = ap.parse_args()
    run_dir = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="coa-smoke-time-"))
    if a.keep and run_dir.exists() and any(run_dir.iterdir()):
        raise SystemExit(f"{run_dir} is not empty: a timed run starts from nothing")
    load_before = os.getloadavg()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    try:
        proc = subprocess.run([sys.executable, "-m", "coa_lib.reproduce", "--profile", "smoke", "--run-dir", str(run_dir)], cwd=REPO)
        wall = time.time() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").exists() else {}
        notebooks = {r["name"]: {"status": r["status"], "wall_s": round(r["seconds"], 1)} for r in summary.get("notebooks", [])}
        result = {"command": "python -m coa_lib.reproduce --profile smoke", "returncode": proc.returncode,
                  "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "commit": summary.get("commit", ""),
                  "machine": summary.get("machine") or {"cpu": platform.processor(), "cores": os.cpu_count()},
                  "load_average_before": [round(x, 2) for x in load_before], "load_average_after": [round(x, 2) for x in os.getloadavg()],
                  "wall_s": round(wall, 1), "notebooks_wall_s": round(sum(n["wall_s"] for n in notebooks.values()), 1),
                  "cpu_s": round((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime), 1),
                  "notebooks": notebooks, f"cells_over_{a.slow:g}s": slow_cells(run_dir / "notebooks", a.slow)}
    finally:
        if not a.keep: shutil.rmtree(run_dir, ignore_errors=True)
    out = Path(a.out); out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for name, n in notebooks.items(): print(f"{name:<16} {n['status']:<8} {n['wall_s']:>7.1f} s")
    print(f"total wall {result['wall_s']:.1f} s (notebooks {result['notebooks_wall_s']:.1f} s), CPU {result['cpu_s']:.1f} s, "
          f"load {result['load_average_before']} -> {result['load_average_after']}; written {out}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
