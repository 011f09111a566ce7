"""Seeds decide the Flow-GRPO claim: the run's Flow-GRPO planner retrained from the same warm start with other seeds
(pool order, sampling), every planner evaluated on the Flow-GRPO stage's test tasks, greedy and avg@k at the training
temperature, with mean ± sd over seeds of Flow-GRPO − warm start (mean of categories) and a paired test on the per-task
accuracy averaged over seeds.

Seed 0 is the stage's own planner (`run_dir/agentflow/planner_flow_grpo`, evaluated by `12_flow_grpo`); seed k trains
into `run_dir/agentflow/seeds/seed<k>/planner_flow_grpo` from the stage's warm start (shared: the spread measured is
Flow-GRPO's own) and is evaluated as `flow_grpo_seed<k>` (and `flow_grpo_seed<k>_avg<k>`).

    python bench/flow_grpo_seeds.py --run-dir runs/full --seeds 0 1 2

Writes `run_dir/flow_grpo_seeds.json` (read by the report's Flow-GRPO claim while its warm start and seed-0 planner
are the run's) and, at the full profile only, a copy in bench/results/ (`make readme` adopts it into a later run
whose warm start and planner have the same weights). Resumable: a trained planner and a finished
evaluation are found again under their training's key.
"""
from __future__ import annotations
import argparse, json, shutil, statistics, time
from dataclasses import replace
from pathlib import Path

from coa_lib.core import PROFILES

OUT = Path(__file__).resolve().parent / "results" / "flow_grpo_seeds.json"


def seed_planners(run_dir: Path, profile: str, seeds: list[int]) -> dict[int, Path]:
    "The Flow-GRPO planner of every seed: the stage's own at seed 0, the others trained from the stage's warm start."
    from coa_lib.agentflow import AgentFlowConfig
    from coa_lib.flow_grpo import FlowGRPOConfig, train_flow_grpo
    from coa_lib.stage_agentflow import _af_dir, planner_warm_start
    from coa_lib.stage_flow_grpo import flow_grpo_planner, flow_grpo_pool
    acfg, gcfg = AgentFlowConfig.for_profile(profile), FlowGRPOConfig.for_profile(profile)
    warm, pool = planner_warm_start(run_dir, acfg), flow_grpo_pool(run_dir, acfg, gcfg)
    return {k: flow_grpo_planner(run_dir, acfg, gcfg) if k == 0 else
            train_flow_grpo(warm, pool, _af_dir(run_dir) / "seeds" / f"seed{k}" / "planner_flow_grpo", replace(gcfg, seed=k))
            for k in seeds}


def eval_name(seed: int | None, samples: int = 1) -> str:
    "The evaluation name of seed `seed`'s planner (None: the warm start's), as the stage names its own at seed 0."
    from coa_lib.evaluate import EvalName
    return str(EvalName("warm_start", samples=samples) if seed is None else EvalName("flow_grpo", seed=seed or None, samples=samples))


def sample_counts(k: int) -> list[int]:
    "Flows per task of the evaluations: greedy (1), and avg@k beside it when k > 1."
    return [1, k] if k > 1 else [1]


def evaluations(run_dir: Path, profile: str, planners: dict[int, Path], test: list[dict]) -> tuple[dict[str, dict], dict[str, dict]]:
    "({evaluation name: {task id: mean correctness over its flows}}, {evaluation name: its metrics}) for the warm start and every seed's planner on `test`, greedy and avg@k."
    from coa_lib.agentflow import AgentFlowConfig
    from coa_lib.flow_grpo import FlowGRPOConfig
    from coa_lib.report import per_task_mean
    from coa_lib.stage_agentflow import flow_eval, flow_eval_records, planner_warm_start
    acfg, gcfg = AgentFlowConfig.for_profile(profile), FlowGRPOConfig.for_profile(profile)
    warm = planner_warm_start(run_dir, acfg)
    runs = [(eval_name(s, n), warm if s is None else planners[s], n) for n in sample_counts(gcfg.test_samples) for s in (None, *planners)]
    out, metrics = {}, {}
    for name, path, n in runs:
        metrics[name] = flow_eval(run_dir, name, path, test, acfg, temperature=gcfg.temperature if n > 1 else 0.0, samples=n)
        out[name] = per_task_mean(flow_eval_records(run_dir, name))
    return out, metrics


def tool_shares(metrics: dict[str, dict], seeds: list[int]) -> dict[str, dict[str, float]]:
    "Each greedy planner's share of planner turns per tool on the test tasks: the warm start's, then every seed's (the direction of the shift can differ by seed)."
    return {"warm_start": metrics[eval_name(None)]["tool_share"], **{str(s): metrics[eval_name(s)]["tool_share"] for s in seeds}}


def summarize(per_task: dict[str, dict[str, float]], seeds: list[int], category_of: dict[str, str], samples: int) -> dict:
    "Per seed, Flow-GRPO − warm start (mean of categories, paired); over seeds, its mean ± sd and the paired test of the per-task mean over seeds."
    from coa_lib.evaluate import paired_group_mean
    out = {}
    for k in sample_counts(samples):
        warm = per_task[eval_name(None, k)]
        by_seed = {s: per_task[eval_name(s, k)] for s in seeds}
        tasks = sorted(set(warm).intersection(*map(set, by_seed.values())))
        mean_task = {t: statistics.fmean(by_seed[s][t] for s in seeds) for t in tasks}
        per_seed = {str(s): paired_group_mean(by_seed[s], warm, category_of) for s in seeds}
        diffs = [c["diff"] for c in per_seed.values()]
        out["greedy" if k == 1 else f"avg{k}"] = {
            "samples": k, "n_tasks": len(tasks), "per_seed": per_seed,
            "flow_grpo_by_seed": [c["mean_a"] for c in per_seed.values()], "warm_start": per_seed[str(seeds[0])]["mean_b"],
            "diff_mean": statistics.fmean(diffs), "diff_sd": statistics.stdev(diffs) if len(diffs) > 1 else None,
            "pooled": paired_group_mean(mean_task, warm, category_of)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", default="runs/full")
    ap.add_argument("--profile", default="full", choices=PROFILES)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    a = ap.parse_args()
    if len(set(a.seeds)) < 2 or 0 not in a.seeds: raise SystemExit("--seeds: seed 0 (the stage's planner) and at least one other")
    from coa_lib.agentflow import CATEGORY_OF, AgentFlowConfig
    from coa_lib.core import atomic_write_json, resolve_run_dir
    from coa_lib.flow_grpo import FlowGRPOConfig
    from coa_lib.report import seeds_record
    from coa_lib.stage_agentflow import agentflow_tasks, planner_warm_start
    rd, t0, seeds = resolve_run_dir(a.run_dir), time.perf_counter(), sorted(set(a.seeds))
    acfg, gcfg = AgentFlowConfig.for_profile(a.profile), FlowGRPOConfig.for_profile(a.profile)
    test = agentflow_tasks(rd, acfg, "test", acfg.n_test)
    planners = seed_planners(rd, a.profile, seeds)
    per_task, metrics = evaluations(rd, a.profile, planners, test)
    category_of = {t["id"]: CATEGORY_OF[t["kind"]] for t in test}
    measured = {s: {"flow_grpo": p, **({"warm_start": planner_warm_start(rd, acfg)} if s == 0 else {})} for s, p in planners.items()}   # seed 0 holds the warm start too
    res = {"seeds": seeds, **summarize(per_task, seeds, category_of, gcfg.test_samples), "tool_share": tool_shares(metrics, seeds),
           "trained": seeds_record(rd, measured), "profile": a.profile, "wall_s": time.perf_counter() - t0}
    for mode in ("greedy", f"avg{gcfg.test_samples}"):
        if mode not in res: continue
        r, p = res[mode], res[mode]["pooled"]
        print(f"{mode}: warm start {100 * r['warm_start']:.1f}, Flow-GRPO by seed " + ", ".join(f"{100 * x:.1f}" for x in r["flow_grpo_by_seed"]) +
              f"; difference {100 * r['diff_mean']:+.1f} ± {100 * (r['diff_sd'] or 0):.1f} over seeds; pooled {100 * p['diff']:+.1f} "
              f"[{100 * p['ci95'][0]:+.1f}, {100 * p['ci95'][1]:+.1f}], sign {p['sign']:+d}", flush=True)
    atomic_write_json(rd / "flow_grpo_seeds.json", res)
    if a.profile == "full": OUT.parent.mkdir(parents=True, exist_ok=True); shutil.copyfile(rd / "flow_grpo_seeds.json", OUT)
    print(json.dumps({m: round(res[m]["diff_mean"], 3) for m in res if isinstance(res[m], dict) and "diff_mean" in res[m]}))


if __name__ == "__main__":
    main()
