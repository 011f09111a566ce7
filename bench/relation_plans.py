"""Experiment: does a plan that names each hop's relation teach the student to read the right sentence?

The scripted teacher plans a multi-hop question as "1. Look up X. 2. Look up the entity found in step 1." — the plan says
which entity to look up but not what to read on its page, so the student must map the question's relations to hops and
find the matching sentence on its own (LOG.md 2026-12-05: it picks "population" for "founded", the wrong hop's relation).
AFM's planner writes sub-questions. The scripted teacher now writes them for every lookup of every kind
(`coa_lib.teacher.plan_steps`, from the relation each gold-path step records); this script
reproduces the experiment that measured it on a run built before that: it copies a run dir whose SFT sets are built (symlinks, nothing rewritten
there) and rewrites only the multihop CoA rows' plans so that every step also asks its sub-question, e.g.
"2. Look up the entity found in step 1: when was it founded?". Then train a ladder rung on it:

    python bench/relation_plans.py --src runs/ladder --dst runs/ladder_relplan
    python bench/sft_ladder.py --run-dir runs/ladder_relplan --label mh_tiny_relplan_3M --size tiny \
        --base runs/ladder/ladder/base_quote_tiny_2500 --phase multihop:3000000 --schedule warmup_stable_decay

Writes bench/results/relation_plans.json (rows rewritten, examples). Dev and test tasks are not touched.
"""
from __future__ import annotations
import argparse, json, re
from pathlib import Path

from coa_lib.teacher import hop_question

STEP_RE = re.compile(r"(\d+)\. Look up ([^.:]+)\.")


def hop_relations(template: str) -> list[tuple[str, str]]:
    "(entity type, relation) of each hop of a multihop template such as 'person.born_in.city.founded'."
    parts = template.split(".")
    if len(parts) % 2: raise ValueError(f"a multihop template has type.relation pairs: {template!r}")
    return list(zip(parts[0::2], parts[1::2]))


def rewrite_plans(completion: str, template: str) -> str:
    "`completion` with every plan step 'k. Look up T.' turned into 'k. Look up T: <sub-question of hop k>'."
    hops = hop_relations(template)
    def step(m: re.Match) -> str:
        k, target = int(m.group(1)), m.group(2)
        if not 1 <= k <= len(hops): return m.group(0)
        return f"{k}. Look up {target}: {hop_question(*hops[k - 1], target)}"
    def plan(m: re.Match) -> str: return m.group(1) + STEP_RE.sub(step, m.group(2)) + m.group(3)
    return re.sub(r"(<plan>)(.*?)(</plan>)", plan, completion, flags=re.S)


assert rewrite_plans("<plan> 1. Look up Ann Bo. 2. Look up the entity found in step 1.</plan>\n<web_search> Ann Bo",
                     "person.born_in.city.founded") == ("<plan> 1. Look up Ann Bo: where was Ann Bo born? 2. Look up the entity "
                                                        "found in step 1: when was it founded?</plan>\n<web_search> Ann Bo")


def main(a: argparse.Namespace) -> None:
    from datasets import load_from_disk
    from coa_lib.core import save_dataset, atomic_write_json
    src, dst = Path(a.src).resolve(), Path(a.dst)
    if not (src / "coa_sft.done").exists(): raise SystemExit(f"{src}: no coa_sft set (build it first: bench/sft_ladder.py builds it)")
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():                                   # everything but the CoA SFT set and the ladder's own models
        if p.name in ("coa_sft", "coa_sft.done", "ladder") or (dst / p.name).exists(): continue
        (dst / p.name).symlink_to(p)
    rows = load_from_disk(str(src / "coa_sft"))
    changed = []
    def fix(r: dict) -> dict:
        if r["kind"] != "multihop": return r
        new = rewrite_plans(r["completion"], json.loads(r["meta"])["template"])
        if new != r["completion"] and len(changed) < 3: changed.append({"before": r["completion"][:300], "after": new[:400]})
        return {**r, "completion": new}
    out = rows.map(fix)
    n = sum(a != b for a, b in zip(rows["completion"], out["completion"]))
    save_dataset(out, dst / "coa_sft")
    (dst / "coa_sft.done").write_text("relation plans\n")
    res = {"src": str(src), "dst": str(dst), "rows": rows.num_rows, "multihop_rows": sum(k == "multihop" for k in rows["kind"]),
           "rewritten": n, "examples": changed}
    atomic_write_json(Path(__file__).parent / "results" / "relation_plans.json", res)
    print(json.dumps({k: v for k, v in res.items() if k != "examples"}), "\n" + changed[0]["after"] if changed else "")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", required=True, help="a run dir with its SFT sets built")
    ap.add_argument("--dst", required=True, help="the new run dir (symlinks to --src, rewritten coa_sft)")
    main(ap.parse_args())
