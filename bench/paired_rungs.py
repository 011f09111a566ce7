"""Two finished ladder rungs, greedy on the same dev tasks, compared task by task (dev only).

The rung JSONs keep aggregates only; this evaluates both final models again, keeps every episode's record, and writes the
paired difference (mean per-task difference, its 95% interval, wins/losses and the exact sign test) overall and by kind:

    python bench/paired_rungs.py --a runs/ladder2:mix_tiny_relplan_5M --b runs/ladder3:mix_tiny_subq_5M --out subq_paired

Writes bench/results/<out>.json. The test split is never touched.
"""
from __future__ import annotations
import argparse, json, time
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent / "results"


def rung_records(spec: str, n_dev: int):
    "Greedy records of rung `run_dir:label`'s final model on `n_dev` dev tasks per kind (its run's split and tokenizer)."
    from coa_lib.core import resolve_run_dir
    from coa_lib.evaluate import eval_tasks, evaluate
    from coa_lib.llm import load_policy
    from coa_lib.stage_tasks import build_task_splits, student_tokenizer
    from coa_lib.tasks import TaskConfig
    run_dir, _, label = spec.partition(":")
    rd = resolve_run_dir(run_dir)
    phases = sorted((rd / "ladder" / label).glob("phase*"))
    if not phases: raise SystemExit(f"no trained phase of rung {label!r} under {rd / 'ladder'}")
    dev = eval_tasks(build_task_splits(rd, TaskConfig.for_profile("full"))["dev"], n_dev)
    metrics, records = evaluate(load_policy(str(phases[-1]), student_tokenizer(rd, "full")), dev, fmt="coa", progress=False)
    return metrics, records


def main():
    from coa_lib.core import atomic_write_json
    from coa_lib.evaluate import paired_records
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="RUN_DIR:RUNG, the first system (the difference is a - b)")
    ap.add_argument("--b", required=True, help="RUN_DIR:RUNG, the second system")
    ap.add_argument("--n-dev", type=int, default=50, help="dev tasks per kind")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, help="name of the JSON under bench/results/")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    (ma, ra), (mb, rb) = rung_records(a.a, a.n_dev), rung_records(a.b, a.n_dev)
    res = {"a": a.a, "b": a.b, "accuracy_a": ma["accuracy"], "ci95_a": ma["accuracy_ci95"], "accuracy_b": mb["accuracy"],
           "ci95_b": mb["accuracy_ci95"], "paired_a_minus_b": paired_records(ra, rb), "by_kind": {}}
    for kind in sorted(set(ra["kind"])):
        res["by_kind"][kind] = paired_records(ra.filter(lambda r: r["kind"] == kind), rb.filter(lambda r: r["kind"] == kind))
    res["wall_s"] = time.perf_counter() - t0
    atomic_write_json(OUT / f"{a.out}.json", res)
    p = res["paired_a_minus_b"]
    print(f"a {ma['accuracy']:.3f}  b {mb['accuracy']:.3f}  a-b {p['diff']:+.3f} {p['ci95']}  wins {p['wins']} losses {p['losses']}  p {p['sign_test_p']:.2g}")
    for k, v in res["by_kind"].items(): print(f"  {k:<11} a-b {v['diff']:+.2f}  wins {v['wins']} losses {v['losses']}")


if __name__ == "__main__":
    main()
