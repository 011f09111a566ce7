"""Choosing the RL stage's full profile on dev (never test): RL variants from one run's CoA SFT student and its selection.

Each variant is the full profile's `RLConfig` with some fields changed; it is trained in its own copy of the run dir
(sharing the SFT student and the data selection, which training settings do not change) and evaluated greedily on
`--per-kind` dev tasks per kind with the SFT stage's harness. The SFT student is evaluated on the same tasks once.

    python bench/rl_tune.py --run-dir runs/full '{"lr1e-4": {"lr": 1e-4}, "lr3e-4": {"lr": 3e-4}}'
Appends to bench/results/rl_tune.json (one entry per variant; re-running a variant replaces its entry).
"""
from __future__ import annotations
import argparse, dataclasses, json, shutil, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "results" / "rl_tune.json"


def main() -> None:
    import torch
    from coa_lib.core import atomic_write_json, read_json
    from coa_lib.evaluate import eval_tasks
    from coa_lib.rl import RLConfig
    from coa_lib.sft import SFTStageConfig
    from coa_lib.stage_tasks import build_task_splits
    from coa_lib.stage_sft import evaluate_student, sft_student, student_named
    from coa_lib.stage_rl import train_rl_student
    from coa_lib.tasks import TaskConfig
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", required=True, help="a run with a CoA SFT student (its selection is made if missing)")
    ap.add_argument("variants", help='JSON {name: {RLConfig field: value}}')
    ap.add_argument("--per-kind", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    base, coa = Path(a.run_dir), student_named("coa")
    dev = eval_tasks(build_task_splits(base, TaskConfig.for_profile("full"))["dev"], a.per_kind)
    sft_cfg = SFTStageConfig.for_profile("full")
    results = read_json(OUT) if OUT.exists() else {}
    summary = lambda m: {"accuracy": m["accuracy"], "by_kind": {k: v["accuracy"] for k, v in m["by_kind"].items()},
                         "invalid": m["invalid_rate"]}
    if "sft" not in results or results["sft"]["dev_tasks"] != len(dev):
        m, _ = evaluate_student(sft_student(base, "full"), coa, dev, base, "rl_tune/sft_dev", sft_cfg)
        results["sft"] = {"dev_tasks": len(dev), **summary(m)}
        print("sft", results["sft"], flush=True)
    for name, changes in json.loads(a.variants).items():
        cfg = dataclasses.replace(RLConfig.for_profile("full"), **changes)
        rd = base.parent / f"{base.name}_rl_{name}"
        if not rd.exists(): shutil.copytree(base, rd, ignore=shutil.ignore_patterns("coa_rl", "rl_eval", "rl_tune"))
        t0 = time.perf_counter()
        path = train_rl_student(rd, cfg)
        wall = time.perf_counter() - t0
        m, _ = evaluate_student(path, coa, dev, rd, "rl_tune/rl_dev", sft_cfg)
        curves = read_json(path / "rl_curves.json")
        results[name] = {"changes": changes, "train_s": round(wall, 1), "dev_tasks": len(dev), **summary(m),
                         "dev_curve": curves["dev_accuracy"], "sampled_reward": curves["sampled_reward"]}
        print(name, json.dumps(results[name]), flush=True)
        atomic_write_json(OUT, results)


if __name__ == "__main__":
    main()
