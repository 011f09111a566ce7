"""Where a ladder rung's multihop episodes go wrong (dev only): each greedy episode's searches and findings against the gold path.

For every failed episode the first hop that leaves the gold path is named: its search named another page ("query"), it
stopped before that hop ("no search"), or its finding (the `<think>` after the search) does not state the hop's fact
("finding": a sentence of the page about another relation, mostly). An episode that follows the whole path and still
answers wrong took the wrong part of its last finding ("answer"). The finding of a hop is right when it holds the hop's
span (the sentence from the relation's words to the value) or, for tasks built before spans, its sentence.

Also counted, over every finding that quotes the first search result: which sentence of that result it copies (the
position bias of a reader that does not read by relation).

    python bench/multihop_failures.py --run-dir runs/ladder_cue --rung mix_nano_cue_5M --out mh_failures_cue

Writes bench/results/<out>.json with the counts and every failed episode's first wrong step.
"""
from __future__ import annotations
import re, time
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results"
_SEARCH = re.compile(r"<(web_search|crawl_page)>(.*?)</\1>", re.S)
_FINDING = re.compile(r"</observation>\s*<think>(.*?)</think>", re.S)


def first_result_sentences(observation: str) -> list[str]:
    "The sentences of the first search result of an observation ('1. Title: s1. s2. ...'); none for a page."
    line = observation.strip().split("\n", 1)[0]
    if not line.startswith("1. ") or ": " not in line: return []
    return re.split(r"(?<=\.) ", line.split(": ", 1)[1].strip())


def diagnose(trajectory: str, path: list[dict], correct: bool) -> str:
    "The first step where an episode leaves the gold `path` ('hop k: query' / 'hop k: no search' / 'hop k: finding'), 'answer' when it follows the path and answers wrong, 'correct'."
    if correct: return "correct"
    searches = [m.group(2).strip() for m in _SEARCH.finditer(trajectory)]
    findings = [m.group(1).strip() for m in _FINDING.finditer(trajectory)]
    for k, step in enumerate(path, 1):
        if k > len(searches): return f"hop {k}: no search"
        if searches[k - 1].casefold() != step["query"].casefold(): return f"hop {k}: query"
        gold = step.get("span") or step["fact"]
        if k > len(findings) or gold not in findings[k - 1]: return f"hop {k}: finding"
    return "answer"


def finding_positions(trajectory: str) -> Counter:
    "For each finding after a search result list: the index of the first result's sentence it starts with ('other': none of them)."
    out = Counter()
    for m in re.finditer(r"<observation>(.*?)</observation>\s*<think>(.*?)</think>", trajectory, re.S):
        sents, finding = first_result_sentences(m.group(1)), m.group(2).strip()
        if not sents: continue
        tail = finding.split(", ", 1)[-1].rstrip(".")                  # a span finding, 'Page, span.': its span
        at = [i for i, s in enumerate(sents) if finding.startswith(s) or s.startswith(finding) or finding in s or tail in s]
        out[str(at[0]) if at else "other"] += 1
    return out


def main():
    from coa_lib.core import atomic_write_json, task_meta
    from sft_ladder import episode_args, rung_episodes
    a = episode_args(__doc__, "multihop").parse_args()
    t0 = time.perf_counter()
    rd, model, tasks, metrics, records = rung_episodes(a, "multihop")
    causes, positions, by_hops, failed = Counter(), Counter(), {}, []
    for r in records:
        meta = task_meta(tasks[r["task_id"]])
        cause = diagnose(r["trajectory"], meta["path"], bool(r["correct"]))
        causes[cause.split(":")[-1].strip() if cause.startswith("hop") else cause] += 1
        positions.update(finding_positions(r["trajectory"]))
        h = by_hops.setdefault(str(meta["hops"]), {"tasks": 0, "correct": 0})
        h["tasks"] += 1; h["correct"] += int(bool(r["correct"]))
        if cause != "correct": failed.append({"id": r["task_id"], "hops": meta["hops"], "cause": cause, "answer": r["answer"], "gold": r["gold"]})
    res = {"run_dir": str(rd), "rung": a.rung, "model": str(model), "accuracy": metrics["accuracy"], "n": len(records),
           "causes": dict(causes), "first_wrong_hop": dict(Counter(f["cause"].split(":")[0] for f in failed if f["cause"].startswith("hop"))),
           "finding_positions": dict(positions), "by_hops": by_hops, "failed": failed, "wall_s": time.perf_counter() - t0}
    atomic_write_json(OUT / f"{a.out}.json", res)
    print(f"{a.rung}: {metrics['accuracy']:.3f} on {len(records)} multihop dev tasks; causes {dict(causes)}")
    print(f"  first wrong hop {res['first_wrong_hop']}; finding copies first-result sentence {dict(sorted(positions.items()))}; by hops {by_hops}")


if __name__ == "__main__":
    main()
