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
import re, time
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
    from coa_lib.core import atomic_write_json, task_meta
    from sft_ladder import episode_args, rung_episodes
    a = episode_args(__doc__, "comparison").parse_args()
    t0 = time.perf_counter()
    rd, model, tasks, metrics, records = rung_episodes(a, "comparison")
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
