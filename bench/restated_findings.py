"""Restated findings of a ladder rung's multihop episodes (dev only): does a finding open with the hop's own words, and
does it then state the hop's fact?

A rung trained in a restating data style (`DataStyle.restate_question`: 'Which country is Dakrai in? Dakrai is a city
in Mounia.'; `DataStyle.restate_plan_line`: '2. Look up the entity found in step 1: which country is it in? Dakrai is
...') writes, in each `<think>` after a search, first what it is looking for, then the sentence it picked. This script
tells the two choices apart, hop by hop along the gold path: the opening is right when it is what the teacher writes
for that hop (the hop's question about its page, or the teacher plan's line of that step), the finding is right when it
holds the hop's fact. An episode's hops are counted until the first hop where both are wrong (after it the episode
reads another entity's pages). Each failed episode is also put down to one cause: its plan has fewer (or more) steps
than the question's hops, it stopped before its plan's last step, a finding misread, or it read every hop and still
answered wrong. A rung trained with `DataStyle.next_step_cue` ends each finding with what comes next ('Next: 3. Look up
...' / 'Next: the answer.'): every such cue is counted by whether it is right against the student's own plan and
whether the student then did what it says (a tool call after a step's line, none after the answer).

    python bench/restated_findings.py --run-dir runs/ladder_restate --rung mix_nano_restate_5M --style question --out restated_question

Writes bench/results/<out>.json with the counts per hop and overall.
"""
from __future__ import annotations
import re, time
from collections import Counter
from pathlib import Path

from multihop_failures import _FINDING   # a finding: the <think> right after an observation

OUT = Path(__file__).resolve().parent / "results"


def opening(style: str, task: dict, k: int, phrases: bool = False) -> str:
    "What the teacher's finding of hop `k` (0-based) of a multihop `task` (with `_meta`) opens with in `style` (`phrases`: its plan lines end with the question's words, `DataStyle.plan_phrases`)."
    from coa_lib.teacher import hop_question, plan_steps
    hop = task["_meta"]["path"][k]
    if style == "question":
        ask = hop_question(hop["type"], hop["relation"], hop["page"])
        return ask[0].upper() + ask[1:]
    return f"{k + 1}. {plan_steps(task, phrases=phrases)[k][1]}"


def failure(trajectory: str, hops: int, facts: list[str]) -> str:
    "Why a failed multihop episode failed, by its plan's step count against the hops and the searches it made."
    plan = re.search(r"<plan>(.*?)</plan>", trajectory, re.S)
    steps = len(re.findall(r"(?:^|\s)\d+\. ", plan.group(1))) if plan else 0
    findings = _FINDING.findall(trajectory)
    if steps < hops: return "plan has fewer steps than hops"
    if steps > hops: return "plan has more steps than hops"
    if len(findings) < steps: return "stopped before the plan's last step"
    if not all(any(f in t for t in findings) for f in facts): return "a finding misread"
    return "read every hop, answered wrong (ran on past the plan)" if len(findings) > steps else "read every hop, answered wrong"


_CUED = re.compile(r"</observation>\s*<think>(.*?)</think>\s*(?:<(\w+)>)?", re.S)
_TOOLS = ("web_search", "crawl_page", "code")


def plan_lines(plan: str) -> dict[int, str]:
    "The numbered lines of a student's plan body ('1. Look up A: ...? 2. Look up ...'), by step number."
    return {int(n): f"{n}. {t.strip()}" for n, t in re.findall(r"(?:^|\s)(\d+)\. (.*?)(?=\s\d+\. |$)", plan.strip(), re.S)}


def next_step_cues(trajectory: str) -> Counter:
    "Each finding's closing cue ('Next: ...'): (what it names, 'right'/'wrong' against the plan written before it, 'followed'/'not followed')."
    out = Counter()
    for m in _CUED.finditer(trajectory):
        cue = re.search(r"\bNext: (.*)$", m.group(1).strip(), re.S)
        if not cue: continue
        plans = re.findall(r"<plan>(.*?)</plan>", trajectory[:m.start()], re.S)
        lines, step = plan_lines(plans[-1]) if plans else {}, re.match(r"\s*(\d+)\. ", m.group(1))
        k = int(step.group(1)) if step else None
        names, acted = ("the answer", m.group(2) not in _TOOLS) if cue.group(1) == "the answer." else ("a step", m.group(2) in _TOOLS)
        later = sorted(n for n in lines if k is not None and n > k)
        right = (not later and k in lines) if names == "the answer" else bool(later) and cue.group(1).strip() == lines[later[0]]
        out[(names, "right" if right else "wrong", "followed" if acted else "not followed")] += 1
    return out


def main():
    from coa_lib.core import atomic_write_json, task_meta
    from sft_ladder import episode_args, rung_episodes
    ap = episode_args(__doc__, "multihop")
    ap.add_argument("--style", required=True, choices=("question", "plan_line"), help="the rung's restating data style")
    ap.add_argument("--plan-phrases", action="store_true", help="the rung's plan lines end with the question's words for what they find")
    a = ap.parse_args()
    t0 = time.perf_counter()
    rd, model, tasks, metrics, records = rung_episodes(a, "multihop")
    counts, failures, cues = Counter(), Counter(), Counter()
    for r in records:
        cues.update(next_step_cues(r["trajectory"]))
        task = {**tasks[r["task_id"]], "_meta": task_meta(tasks[r["task_id"]])}
        if not r["correct"]: failures[failure(r["trajectory"], task["_meta"]["hops"], [h["fact"] for h in task["_meta"]["path"]])] += 1
        for k, (hop, think) in enumerate(zip(task["_meta"]["path"], (t.strip() for t in _FINDING.findall(r["trajectory"])))):
            opened, stated = think.startswith(opening(a.style, task, k, a.plan_phrases)), hop["fact"] in think
            counts[(k + 1, opened, stated)] += 1
            if not (opened or stated): break
    rows = [{"hop": h, "opening_right": o, "fact_right": s, "findings": n} for (h, o, s), n in sorted(counts.items())]
    total = lambda o=None, s=None: sum(n for (h, oo, ss), n in counts.items() if (o is None or oo == o) and (s is None or ss == s))
    res = {"run_dir": str(rd), "rung": a.rung, "style": a.style, "model": str(model), "accuracy": metrics["accuracy"], "n": len(records),
           "findings": total(), "opening_right": total(o=True), "fact_right_when_opening_right": total(o=True, s=True),
           "fact_right_when_opening_wrong": total(o=False, s=True), "opening_wrong": total(o=False), "by_hop": rows, "failures": dict(failures.most_common()),
           "next_step_cues": [{"names": n, "against_plan": r, "student": f, "findings": c} for (n, r, f), c in sorted(cues.items())],
           "wall_s": time.perf_counter() - t0}
    atomic_write_json(OUT / f"{a.out}.json", res)
    print(f"{a.rung}: {metrics['accuracy']:.3f} on {len(records)} multihop dev tasks; openings right {res['opening_right']} of "
          f"{res['findings']} findings; fact right {res['fact_right_when_opening_right']} of those, "
          f"{res['fact_right_when_opening_wrong']} of the {res['opening_wrong']} others")
    print(f"  failed episodes: {dict(failures.most_common())}")
    for (n, r, f), c in sorted(cues.items()): print(f"  cue names {n}, {r} against its plan, {f}: {c}")
    for row in rows: print(f"  hop {row['hop']}: opening {'right' if row['opening_right'] else 'wrong'}, fact "
                           f"{'right' if row['fact_right'] else 'wrong'}: {row['findings']}")


if __name__ == "__main__":
    main()
