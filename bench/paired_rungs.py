"""Finished ladder rungs, greedy on the same dev tasks, compared task by task (dev only).

Two ways. By default this evaluates both final models again, keeps every episode's record, and writes the paired difference
(mean per-task difference, its 95% interval, wins/losses and the exact sign test) overall and by kind:

    python bench/paired_rungs.py --a runs/ladder2:mix_tiny_relplan_5M --b runs/ladder3:mix_tiny_subq_5M --out subq_paired

With --stored, it reads the per-task rewards the rung JSONs keep (`final.greedy.reward_by_task`, rungs evaluated since
they were recorded) and evaluates nothing. Several rungs per side are seeds of one recipe: each task's reward is averaged
over a side's rungs before pairing (what differs between the recipes, with the seed noise averaged), and the i-th rungs
of both sides are also paired on their own:

    python bench/paired_rungs.py --stored --a mix_nano_cue_5M mix_nano_cue_5M_s1 mix_nano_cue_5M_s2 \
        --b mix_nano_quote_5M mix_nano_quote_5M_s1 mix_nano_quote_5M_s2 --out cue_paired

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
    from sft_ladder import final_phase
    run_dir, _, label = spec.partition(":")
    rd = resolve_run_dir(run_dir)
    model = final_phase(rd, label)
    dev = eval_tasks(build_task_splits(rd, TaskConfig.for_profile("full"))["dev"], n_dev)
    metrics, records = evaluate(load_policy(str(model), student_tokenizer(rd, "full")), dev, fmt="coa", progress=False)
    return metrics, records


def stored_rewards(labels: list[str], key: str = "greedy") -> dict[str, float]:
    "Each task's stored reward averaged over the rungs `labels` (bench/results/ladder/<label>.json), on the tasks all of them cover."
    tables = []
    for label in labels:
        path = OUT / "ladder" / f"{label}.json"
        if not path.exists(): raise SystemExit(f"no rung {label!r}: {path} is missing")
        final = (json.loads(path.read_text()).get("final") or {}).get(key) or {}
        if "reward_by_task" not in final: raise SystemExit(f"{path} keeps no per-task rewards for {key!r} (evaluated before they were recorded)")
        tables.append(final["reward_by_task"])
    shared = set.intersection(*(set(t) for t in tables))
    if not shared: raise SystemExit(f"the rungs {labels} share no task")
    return {t: sum(tab[t] for tab in tables) / len(tables) for t in sorted(shared)}


def task_kind(task_id: str) -> str: return task_id.partition("-")[0]   # every task id starts with its kind (coa_lib.tasks, problems)


def paired_by_kind(a: dict[str, float], b: dict[str, float]) -> dict:
    "`paired_difference` of a − b on the tasks both cover, overall and by kind."
    from coa_lib.evaluate import paired_difference
    shared = sorted(set(a) & set(b))
    if not shared: raise SystemExit("the two sides share no task")
    pair = lambda ids: paired_difference([a[t] for t in ids], [b[t] for t in ids])
    return {"all": pair(shared), "by_kind": {k: pair([t for t in shared if task_kind(t) == k]) for k in sorted({task_kind(t) for t in shared})}}


def seed_spread(labels: list[str], key: str = "greedy") -> dict:
    "How much a recipe's seeds differ: their accuracies' mean and sd, and the share of tasks on which two seeds' rewards differ (mean over pairs)."
    import itertools, statistics
    tables = [stored_rewards([x], key) for x in labels]
    acc = [sum(t.values()) / len(t) for t in tables]
    differ = [sum(s[k] != t[k] for k in set(s) & set(t)) / len(set(s) & set(t)) for s, t in itertools.combinations(tables, 2)]
    return {"accuracy": acc, "mean": statistics.mean(acc), "sd": statistics.stdev(acc) if len(acc) > 1 else None,
            "tasks_differing": statistics.mean(differ) if differ else None}


def stored_comparison(a_labels: list[str], b_labels: list[str], key: str = "greedy") -> dict:
    "Sides `a` and `b` (rungs of one recipe each, seeds) paired from their stored rewards: pooled over seeds, rung by rung, and each side's seed spread."
    pooled = paired_by_kind(stored_rewards(a_labels, key), stored_rewards(b_labels, key))
    pairs = [{"a": x, "b": y, **paired_by_kind(stored_rewards([x], key), stored_rewards([y], key))} for x, y in zip(a_labels, b_labels)]
    return {"a": a_labels, "b": b_labels, "key": key, "pooled": pooled, "pairs": pairs,
            "seed_spread": {"a": seed_spread(a_labels, key), "b": seed_spread(b_labels, key)}}


def code_problem_of(run_dir: str) -> dict[str, str]:
    "Each dev code task's problem, `family(variant)` (a rung's code accuracy is a few problems', each with several tasks)."
    from coa_lib.core import resolve_run_dir, task_meta
    from coa_lib.stage_tasks import build_task_splits
    from coa_lib.tasks import TaskConfig
    from code_failures import problem_name
    if not (Path(run_dir) / "tasks_dev").is_dir(): raise SystemExit(f"--run-dir {run_dir}: no dev split there (a ladder run dir has tasks_dev)")
    dev = build_task_splits(resolve_run_dir(run_dir), TaskConfig.for_profile("full"))["dev"]
    return {t["id"]: problem_name(task_meta(t)) for t in dev if t["kind"] == "code"}


def code_by_problem(labels: list[str], problem_of: dict[str, str], key: str = "greedy") -> dict[str, list[float]]:
    "Each code problem's accuracy at each rung of `labels` (rung order), over the dev tasks the rungs were evaluated on."
    out: dict[str, list[float]] = {}
    for label in labels:
        rewards, acc = stored_rewards([label], key), {}
        for t, prob in problem_of.items():
            if t in rewards: acc.setdefault(prob, []).append(rewards[t])
        for prob, r in acc.items(): out.setdefault(prob, []).append(round(sum(r) / len(r), 3))
    return dict(sorted(out.items()))


def show(name: str, p: dict) -> None:
    print(f"{name:<28} a {p['mean_a']:.3f}  b {p['mean_b']:.3f}  a-b {p['diff']:+.3f} [{p['ci95'][0]:+.3f}, {p['ci95'][1]:+.3f}]"
          f"  wins {p['wins']} losses {p['losses']}  p {p['sign_test_p']:.2g}")


def main_stored(a) -> None:
    from coa_lib.core import atomic_write_json
    res = stored_comparison(a.a, a.b, a.key)
    if a.run_dir:
        problem_of = code_problem_of(a.run_dir)
        res["code_by_problem"] = {"a": code_by_problem(a.a, problem_of, a.key), "b": code_by_problem(a.b, problem_of, a.key)}
    atomic_write_json(OUT / f"{a.out}.json", res)
    show(f"pooled over {len(a.a)} / {len(a.b)}", res["pooled"]["all"])
    for k, v in res["pooled"]["by_kind"].items(): show(f"  {k}", v)
    for p in res["pairs"]: show(f"{p['a']} - {p['b']}", p["all"])
    for side, sp in res["seed_spread"].items():
        differ = "" if sp["tasks_differing"] is None else f", seeds differ on {sp['tasks_differing']:.1%} of tasks"
        print(f"seeds of {side}: {' / '.join(f'{x:.3f}' for x in sp['accuracy'])}, mean {sp['mean']:.3f}"
              + ("" if sp["sd"] is None else f" sd {sp['sd']:.3f}") + differ)
    for prob, acc in res.get("code_by_problem", {}).get("a", {}).items():      # a whole problem at 0 is a collapse
        print(f"  code {prob:<28} a {' '.join(f'{x:.2f}' for x in acc)}   b {' '.join(f'{x:.2f}' for x in res['code_by_problem']['b'].get(prob, []))}")


def main():
    from coa_lib.core import atomic_write_json
    from coa_lib.evaluate import paired_records
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, nargs="+", help="RUN_DIR:RUNG, the first system (the difference is a - b); with --stored: rung labels")
    ap.add_argument("--b", required=True, nargs="+", help="RUN_DIR:RUNG, the second system; with --stored: rung labels")
    ap.add_argument("--stored", action="store_true", help="pair the rungs' stored per-task rewards (seeds pooled); evaluates nothing")
    ap.add_argument("--key", default="greedy", help="with --stored: the final evaluation to pair (greedy or avg@k)")
    ap.add_argument("--run-dir", default=None, help="with --stored: a ladder run dir whose dev split names each code task's problem (adds code_by_problem)")
    ap.add_argument("--n-dev", type=int, default=50, help="dev tasks per kind")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True, help="name of the JSON under bench/results/")
    a = ap.parse_args()
    if a.stored: return main_stored(a)
    if len(a.a) != 1 or len(a.b) != 1: ap.error("re-evaluating compares one rung per side (several only with --stored)")
    a.a, a.b = a.a[0], a.b[0]
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
