"""Flow-GRPO variants on dev (never test): each trains the run's warm-start planner on the run's Flow-GRPO pool, then the
system is evaluated greedily on `--n-dev` dev tasks per AgentFlow kind. Prints a table and writes
bench/results/flow_grpo_tune.json (merged with earlier results).

    python bench/flow_grpo_tune.py --run-dir runs/full --variant lr=1e-4 --variant lr=3e-4,steps=20
"""
import argparse, time
from dataclasses import asdict, replace
from pathlib import Path

from coa_lib.agentflow import AgentFlowConfig
from coa_lib.core import atomic_write_json, read_json
from coa_lib.flow_grpo import FlowGRPOConfig, train_flow_grpo
from coa_lib.stage_agentflow import agentflow_tasks, flow_eval, planner_warm_start
from coa_lib.stage_flow_grpo import flow_grpo_pool

OUT = Path(__file__).parent / "results" / "flow_grpo_tune.json"
CASTS = {"lr": float, "steps": int, "epsilon_high": float, "beta": float, "minibatches": int, "max_turns": int, "temperature": float}


def parse_variant(text: str) -> dict:
    "'lr=3e-4,steps=20' -> {'lr': 0.0003, 'steps': 20} (only FlowGRPOConfig's tunable fields)."
    out = {}
    for part in filter(None, text.split(",")):
        k, v = part.split("=", 1)
        if k not in CASTS: raise SystemExit(f"unknown knob {k!r}; tunable: {', '.join(CASTS)}")
        out[k] = CASTS[k](v)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--variant", action="append", default=[], help="knob=value,... (repeatable); none: the full profile as is")
    ap.add_argument("--n-dev", type=int, default=40)
    a = ap.parse_args()
    rd = Path(a.run_dir)
    acfg, base = AgentFlowConfig.for_profile("full"), FlowGRPOConfig.for_profile("full")
    warm, pool = planner_warm_start(rd, acfg), flow_grpo_pool(rd, acfg, base)
    dev = agentflow_tasks(rd, acfg, "dev", a.n_dev)
    results = read_json(OUT) if OUT.exists() else {}
    rows = {"warm_start": flow_eval(rd, "tune_dev_warm_start", warm, dev, acfg)}
    for v in a.variant or [""]:
        knobs = parse_variant(v)
        cfg = replace(base, **knobs)
        name = "flow_grpo_" + ("_".join(f"{k}{val}" for k, val in knobs.items()) or "full")
        t0 = time.perf_counter()
        path = train_flow_grpo(warm, pool, rd / "bench_flow_grpo" / name, cfg)
        rows[name] = {**flow_eval(rd, f"tune_dev_{name}", path, dev, replace(acfg, max_turns=cfg.max_turns)), "train_s": time.perf_counter() - t0,
                      "config": asdict(cfg)}
    for name, m in rows.items():
        kinds = " ".join(f"{k} {100 * v['accuracy']:.1f}" for k, v in m["by_kind"].items())
        print(f"{name:32s} category mean {100 * m['category_mean']:.1f}  all {100 * m['accuracy']:.1f}  ({kinds})  turns {m['turns']:.2f}  "
              f"tool errors {100 * m['tool_error_rate']:.1f}%")
        results[name] = {"split": "dev", "n_per_kind": a.n_dev, **{k: m[k] for k in ("accuracy", "ci95", "category_mean", "by_kind", "by_category",
                                                                                      "turns", "tool_error_rate", "tool_share")},
                         **({"config": m["config"], "train_s": m["train_s"]} if "config" in m else {})}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(OUT, results)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
