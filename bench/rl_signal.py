"""How much signal agentic RL would get from an SFT student: pass rates over k samples on training tasks.

AFM trains RL on the tasks where the SFT model is unreliable (pass rate low but not zero) and DAPO drops groups whose
rewards all agree (no advantage). This samples `k` episodes per training task at temperature 1.0 with the KV-cache
engine and the real tools, and reports per kind: the pass-rate histogram, the share of groups with mixed outcomes
(what DAPO keeps), greedy accuracy for comparison, invalid episodes and tokens. Training tasks only (never dev or test).

    python bench/rl_signal.py [--run-dir runs/full] [--student coa] [--per-kind 20] [--k 8]
Writes bench/results/rl_signal.json.
"""
from __future__ import annotations
import argparse, json, os, time
from collections import Counter
from pathlib import Path

import torch

from coa_lib.core import TASK_KINDS, atomic_write_json, built_record
from coa_lib.evaluate import eval_tasks
from coa_lib.llm import load_policy
from coa_lib.episode import Limits
from coa_lib.rollout import rollout
from coa_lib.stage_tasks import build_task_splits
from coa_lib.stage_sft import student_named
from coa_lib.tasks import TaskConfig

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", default="runs/full", help="a finished run (its SFT students and task splits)")
    ap.add_argument("--profile", default="full")
    ap.add_argument("--student", default="coa")
    ap.add_argument("--per-kind", type=int, default=20)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rd = Path(a.run_dir)
    student = student_named(a.student)
    if built_record(rd / "sft" / student.name) is None: raise SystemExit(f"no trained {student.name} student in {rd}/sft")
    policy = load_policy(rd / "sft" / student.name)
    train = build_task_splits(rd, TaskConfig.for_profile(a.profile))["train"].shuffle(seed=1)
    tasks = eval_tasks(train, a.per_kind, TASK_KINDS)
    budget = Limits(max_turns=8, max_new_tokens=256)
    t0 = time.perf_counter()
    greedy = rollout(policy, tasks, fmt=student.fmt, progress=False, limits=budget)
    sampled = rollout(policy, tasks, fmt=student.fmt, n=a.k, temperature=1.0, seed=0, progress=False, limits=budget)
    wall = time.perf_counter() - t0
    by_task: dict[str, list] = {}
    for e in sampled: by_task.setdefault(e.task_id, []).append(e)
    kind_of = {t["id"]: t["kind"] for t in tasks}
    out = {"run_dir": str(rd), "student": student.name, "k": a.k, "tasks": len(tasks), "wall_s": round(wall, 1),
           "load_avg": os.getloadavg(), "by_kind": {}}
    for kind in TASK_KINDS + ("all",):
        ids = [t["id"] for t in tasks if kind == "all" or t["kind"] == kind]
        if not ids: continue
        rates = [sum(e.reward >= 1.0 for e in by_task[i]) / a.k for i in ids]
        eps = [e for i in ids for e in by_task[i]]
        g = [e for e in greedy if e.task_id in set(ids)]
        out["by_kind"][kind] = {
            "tasks": len(ids), "greedy_accuracy": round(sum(e.reward >= 1.0 for e in g) / len(g), 3),
            "sampled_accuracy": round(sum(rates) / len(rates), 3),
            "pass_rate_histogram": dict(sorted(Counter(round(r * a.k) for r in rates).items())),   # successes out of k -> tasks
            "mixed_groups": round(sum(0 < r < 1 for r in rates) / len(rates), 3),                # what DAPO keeps
            "all_fail": round(sum(r == 0 for r in rates) / len(rates), 3), "all_pass": round(sum(r == 1 for r in rates) / len(rates), 3),
            "invalid_rate": round(sum(not e.valid for e in eps) / len(eps), 3),
            "mean_generated_tokens": round(sum(e.generated_tokens for e in eps) / len(eps), 1)}
        print(kind, out["by_kind"][kind])
    atomic_write_json(HERE / "results" / "rl_signal.json", out)


if __name__ == "__main__":
    main()
