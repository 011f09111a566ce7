"""Where a ladder rung's code episodes go wrong (dev only): the first program against the question it had to copy from.

A code task is solved when the student's first program passes the question's example; no student has recovered from a
failed test. So each failed episode is named by what its first program got wrong, in this order: no program at all
("no program"); a parameter of the problem (`to_base`'s base, `caesar`'s shift: every integer of the variant) not written
anywhere in it ("parameter"); no test of the example, because the function never ended (the student repeated a piece of
it until the length limit: "function loop") or it wrote none ("no test"); the example's call and value not copied
exactly into its test ("example copy": the question's random strings, mostly, often repeated until the limit); else the
function itself ("function").

    python bench/code_failures.py --run-dir runs/ladder_code --rung mix_nano_codecue_read_5M --out code_failures_codecue

Writes bench/results/<out>.json with the counts (overall and by problem) and every failed episode's cause.
"""
from __future__ import annotations
import re, time
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results"
_CODE = re.compile(r"<code>(.*?)(</code>|\Z)", re.S)     # a program cut by the length limit runs to the end


def diagnose(trajectory: str, question: str, variant: dict, correct: bool) -> str:
    "What the first program of a code episode got wrong: 'no program', 'parameter', 'function loop', 'no test', 'example copy', 'function'; or 'correct'."
    if correct: return "correct"
    first = _CODE.search(trajectory)
    if first is None: return "no program"
    program, closed = first.group(1), bool(first.group(2))
    numbers = {int(x) for x in re.findall(r"(?<![\w.])\d+(?![\w.])", program)}
    if any(isinstance(v, int) and not isinstance(v, bool) and v not in numbers for v in variant.values()): return "parameter"
    if "\nassert " not in program: return "no test" if closed else "function loop"
    from coa_lib.teacher import example_test                    # the test the teacher wrote: its assert line, exactly
    test = example_test({"question": question})
    if test and test.split("\n", 1)[0] not in program: return "example copy"
    return "function"


def problem_name(meta: dict) -> str: return f"{meta['family']}({', '.join(f'{k}={v}' for k, v in meta['variant'].items())})"


def main():
    from coa_lib.core import atomic_write_json, task_meta
    from sft_ladder import episode_args, rung_episodes
    a = episode_args(__doc__, "code").parse_args()
    t0 = time.perf_counter()
    rd, model, tasks, metrics, records = rung_episodes(a, "code")
    causes, by_problem, failed = Counter(), {}, []
    for r in records:
        task = tasks[r["task_id"]]; meta = task_meta(task)
        cause = diagnose(r["trajectory"], task["question"], meta["variant"], bool(r["correct"]))
        causes[cause] += 1
        by_problem.setdefault(problem_name(meta), Counter())[cause] += 1
        if cause != "correct": failed.append({"id": r["task_id"], "problem": problem_name(meta), "cause": cause})
    res = {"run_dir": str(rd), "rung": a.rung, "model": str(model), "accuracy": metrics["accuracy"], "n": len(records),
           "causes": dict(causes), "by_problem": {k: dict(v) for k, v in sorted(by_problem.items())}, "failed": failed,
           "wall_s": time.perf_counter() - t0}
    atomic_write_json(OUT / f"{a.out}.json", res)
    print(f"{a.rung}: {metrics['accuracy']:.3f} on {len(records)} code dev tasks; causes {dict(causes)}")
    for k, v in res["by_problem"].items(): print(f"  {k:<40} {v}")


if __name__ == "__main__":
    main()
