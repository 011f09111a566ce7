"""Seeds decide the claims: the CoA, CoA-unfiltered and ReAct students at the run's SFT recipe, trained with several seeds,
evaluated on the same test tasks as the SFT stage, with mean ± sd over seeds and paired tests for CoA − ReAct and
filtered − unfiltered.

Seed 0 is the stage's own students (`run_dir/sft/<name>`, evaluated by `09_sft`) when the recipe is the profile's; other
seeds train into `run_dir/seeds/seed<k>/<name>`, all in one batch of lanes, from the stage's base model (seed 0's: the
base is shared, so the spread measured here is the students' own). The per-task accuracy averaged over seeds is what the paired tests compare, task by task.

    python bench/student_seeds.py --run-dir runs/full --seeds 0 1 2

Writes `run_dir/student_seeds.json` (read by the report's claims 5 and 6 while its seed-0 students are the run's) and, at the full profile only, a copy in
bench/results/ (a smoke run's numbers are not findings: they never replace the full run's there), which `make readme`
adopts into a later run whose students have the same weights (`coa_lib.report.adopt_seeds_files`). Resumable: a
trained student or a finished evaluation is found again (an evaluation under its student's training: a retrained student is evaluated anew).
"""
from __future__ import annotations
import argparse, json, shutil, statistics, time
from dataclasses import replace
from pathlib import Path

from coa_lib.core import PROFILES

OUT = Path(__file__).resolve().parent / "results" / "student_seeds.json"
COMPARED = ("coa", "coa_unfiltered", "react")
PAIRS = (("coa", "react"), ("coa", "coa_unfiltered"))


def seed_students(run_dir: Path, profile: str, seeds: list[int]) -> dict[int, dict[str, Path]]:
    "The three students of every seed: the stage's own at seed 0; the others trained in one batch of lanes, from the stage's base."
    from coa_lib.run import as_run
    from coa_lib.sft import SFTStageConfig
    from coa_lib.stage_sft import starting_model, student_named, train_plan, train_students
    cfg, students = SFTStageConfig.for_profile(profile), [student_named(n) for n in COMPARED]
    run = as_run(run_dir, profile)
    base = starting_model(run, cfg)                          # the seed-0 base: the spread measured is the students' own
    out = {0: train_students(run, cfg, students)} if 0 in seeds else {}
    plan = [(replace(cfg, seed=k), s, run.dir / "seeds" / f"seed{k}") for k in seeds if k != 0 for s in students]
    for (c, s, _), path in zip(plan, train_plan(run, plan, base, cfg.lanes, cfg.threads)):   # 3 students x seeds fill both lanes
        out.setdefault(c.seed, {})[s.name] = path
    return out


def test_tasks(run_dir: Path, profile: str) -> list[dict]:
    "The SFT stage's test tasks (what every seed's students are evaluated on)."
    from coa_lib.evaluate import eval_tasks
    from coa_lib.sft import SFTStageConfig
    from coa_lib.stage_tasks import build_task_splits
    from coa_lib.tasks import TaskConfig
    return eval_tasks(build_task_splits(run_dir, TaskConfig.for_profile(profile))["test"], SFTStageConfig.for_profile(profile).n_eval)


def evaluations(run_dir: Path, profile: str, seed: int, paths: dict[str, Path]) -> dict[str, dict[str, float]]:
    "{student: {task id: correct}} on the SFT stage's test tasks, evaluated once (found again by name)."
    from coa_lib.evaluate import per_task_correct
    from coa_lib.sft import SFTStageConfig
    from coa_lib.stage_sft import eval_records, evaluate_students, sft_eval_name, student_named
    cfg, tasks = SFTStageConfig.for_profile(profile), test_tasks(run_dir, profile)
    name = lambda s: sft_eval_name(s) if seed == 0 else f"seeds/seed{seed}/eval/{s}_test"
    evaluate_students([(paths[s], student_named(s), tasks, name(s)) for s in COMPARED], run_dir, cfg)   # found again only under the student's key
    return {s: per_task_correct(eval_records(run_dir, name(s))) for s in COMPARED}


def summarize(per_seed: dict[int, dict[str, dict[str, float]]], kind_of: dict[str, str]) -> dict:
    "Mean ± sd of each student's accuracy over seeds (and each kind's accuracy per seed), and paired tests on the per-task accuracy averaged over seeds."
    from coa_lib.evaluate import paired_difference
    seeds = sorted(per_seed)
    tasks = sorted(set.intersection(*(set(per_seed[k][s]) for k in seeds for s in COMPARED)))
    acc = {s: [sum(per_seed[k][s][t] for t in tasks) / len(tasks) for k in seeds] for s in COMPARED}
    kinds = sorted({kind_of[t] for t in tasks})
    by_kind = {s: {kind: [statistics.fmean(per_seed[k][s][t] for t in tasks if kind_of[t] == kind) for k in seeds] for kind in kinds}
               for s in COMPARED}                                     # the seeds' spread is often one kind collapsing
    mean_task = {s: [statistics.fmean(per_seed[k][s][t] for k in seeds) for t in tasks] for s in COMPARED}
    return {"seeds": seeds, "n_tasks": len(tasks),
            "students": {s: {"accuracy_by_seed": a, "mean": statistics.fmean(a), "sd": statistics.stdev(a) if len(a) > 1 else None,
                             "by_kind": by_kind[s]} for s, a in acc.items()},
            "comparisons": {f"{a}-{b}": paired_difference(mean_task[a], mean_task[b]) for a, b in PAIRS},
            "per_seed_differences": {f"{a}-{b}": [x - y for x, y in zip(acc[a], acc[b])] for a, b in PAIRS}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", default="runs/full")
    ap.add_argument("--profile", default="full", choices=PROFILES)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    a = ap.parse_args()
    if len(a.seeds) < 2: raise SystemExit("at least two seeds: a spread needs more than one")
    from coa_lib.core import atomic_write_json, resolve_run_dir
    from coa_lib.report import seeds_record
    rd = resolve_run_dir(a.run_dir)
    per_seed, t0 = {}, time.perf_counter()
    trained = seed_students(rd, a.profile, a.seeds)
    for seed in a.seeds:
        per_seed[seed] = evaluations(rd, a.profile, seed, trained[seed])
        print(f"seed {seed}: " + ", ".join(f"{s} {sum(v.values()) / len(v):.3f}" for s, v in per_seed[seed].items()), flush=True)
    kind_of = {t["id"]: t["kind"] for t in test_tasks(rd, a.profile)}
    # "trained": which students it measured; the report uses the file only while seed 0's are the run's
    res = {**summarize(per_seed, kind_of), "trained": seeds_record(rd, trained), "profile": a.profile, "wall_s": time.perf_counter() - t0}
    for k, c in res["comparisons"].items():
        print(f"{k}: {100 * c['diff']:+.1f} points [{100 * c['ci95'][0]:+.1f}, {100 * c['ci95'][1]:+.1f}] over {c['n']} tasks, "
              f"sign {c['sign']:+d}, sign test p = {c['sign_test_p']:.2g}")
    atomic_write_json(rd / "student_seeds.json", res)
    if a.profile == "full": OUT.parent.mkdir(parents=True, exist_ok=True); shutil.copyfile(rd / "student_seeds.json", OUT)
    print(json.dumps({s: (round(v["mean"], 3), v["sd"] and round(v["sd"], 3)) for s, v in res["students"].items()}))
    for s, v in res["students"].items():
        print(f"{s} by kind (seeds {', '.join(map(str, res['seeds']))}): " +
              "; ".join(f"{kind} " + " / ".join(f"{100 * x:.0f}" for x in accs) for kind, accs in v["by_kind"].items()))


if __name__ == "__main__":
    main()
