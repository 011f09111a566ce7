"""Where a ladder rung's comparison episodes go wrong (dev only): the reading of both values, or the decision between them.

A comparison ("Which was founded earlier, A or B?") needs each side's value read (one or two hops per side) and then a
decision: the name whose value is the smaller or larger one. For every greedy episode this records whether its findings
state every fact of the gold path (the `<think>` after each search holds the hop's span, or its sentence for tasks built
before spans), and whether its answer is the gold name, the other compared name (the decision went the other way), or no
compared name at all (a blend of names, an intermediate page). With both values
read, a student deciding at chance is right about half the time.

    python bench/comparison_failures.py --run-dir runs/ladder_cue --rung mix_nano_cue_5M --out cmp_failures_cue

Writes bench/results/<out>.json with the counts and every failed episode's cause.
"""
from __future__ import annotations
import argparse, json, re, time
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results"
_FINDING = re.compile(r"</observation>\s*<think>(.*?)</think>", re.S)


def diagnose(trajectory: str, answer: str | None, path: list[dict], names: list[str], gold: str) -> tuple[bool, str]:
    "Whether the findings state every gold fact, and what the answer is: 'gold', 'other name' (the decision went the other way), 'no name' (a blend, a page)."
    findings = [m.group(1) for m in _FINDING.finditer(trajectory)]
    read = all(any((step.get("span") or step["fact"]) in f for f in findings) for step in path)
    answer = (answer or "").strip()
    return read, "gold" if answer == gold else "other name" if answer in names else "no name"


def main():
    import torch
    from coa_lib.core import atomic_write_json, resolve_run_dir, task_meta
    from coa_lib.evaluate import eval_tasks, evaluate
    from coa_lib.llm import load_policy
    from coa_lib.sft import SFTStageConfig
    from coa_lib.stage_tasks import build_task_splits, student_tokenizer
    from coa_lib.tasks import TaskConfig
    from sft_ladder import final_phase
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, help="the rung's run dir (its dev split and tokenizer)")
    ap.add_argument("--rung", required=True, help="a finished rung: its final model is run_dir/ladder/<rung>/phase<last>")
    ap.add_argument("--n-dev", type=int, default=50, help="comparison dev tasks")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True, help="name of the JSON under bench/results/")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rd = resolve_run_dir(a.run_dir)
    model = final_phase(rd, a.rung)
    tasks = {t["id"]: t for t in eval_tasks(build_task_splits(rd, TaskConfig.for_profile("full"))["dev"], a.n_dev, ("comparison",))}
    t0 = time.perf_counter()
    metrics, records = evaluate(load_policy(str(model), student_tokenizer(rd, "full")), list(tasks.values()), fmt="coa",
                                progress=False, limits=SFTStageConfig.for_profile("full").limits)
    table, failed = Counter(), []
    for r in records:
        task = tasks[r["task_id"]]; meta = task_meta(task)
        read, outcome = diagnose(r["trajectory"], r["answer"], meta["path"], meta.get("entities") or [], task["answer"])
        outcome = "gold" if r["correct"] else outcome                    # the reward's own match decides what is right
        table[f"{'read both' if read else 'missed a fact'}: {outcome}"] += 1
        if not r["correct"]: failed.append({"id": r["task_id"], "read": read, "outcome": outcome, "answer": r["answer"], "gold": task["answer"]})
    read_both = sum(v for k, v in table.items() if k.startswith("read both"))
    res = {"run_dir": str(rd), "rung": a.rung, "model": str(model), "accuracy": metrics["accuracy"], "n": len(records),
           "outcomes": dict(sorted(table.items())), "read_both": read_both,
           "right_when_read_both": table["read both: gold"] / read_both if read_both else None, "failed": failed,
           "wall_s": time.perf_counter() - t0}
    atomic_write_json(OUT / f"{a.out}.json", res)
    print(f"{a.rung}: {metrics['accuracy']:.3f} on {len(records)} comparison dev tasks; {res['outcomes']}; "
          f"right in {table['read both: gold']} of the {read_both} that read both values")


if __name__ == "__main__":
    main()
