"bench/flow_grpo_seeds.py: other seeds of Flow-GRPO start from the stage's warm start, pair task by task, and feed the report's claim only while they measured the run's planners."
import importlib.util, subprocess, sys
from pathlib import Path

import pytest

from coa_lib.core import done_marker, mark_built, model_fingerprint, read_json, training_record

BENCH = Path(__file__).resolve().parent.parent / "bench" / "flow_grpo_seeds.py"


def _bench():
    spec = importlib.util.spec_from_file_location("flow_grpo_seeds", BENCH)
    mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    return mod


def test_summarize_pairs_seeds_task_by_task():
    bench = _bench()
    tasks = [f"t{i}" for i in range(12)]
    category = {t: "search" if i < 6 else "math" for i, t in enumerate(tasks)}
    warm = {t: float(t in ("t0", "t1", "t6")) for t in tasks}                  # search 2/6, math 1/6: mean of categories 0.25
    per_task = {"warm_start": warm, "flow_grpo": {t: 1.0 for t in tasks}, "flow_grpo_seed1": dict(warm)}   # seed 0 solves all, seed 1 gains nothing
    s = bench.summarize(per_task, [0, 1], category, samples=1)
    g = s["greedy"]
    assert set(s) == {"greedy"} and g["n_tasks"] == 12
    assert g["warm_start"] == pytest.approx(0.25) and g["flow_grpo_by_seed"] == pytest.approx([1.0, 0.25])
    assert [g["per_seed"][k]["diff"] for k in ("0", "1")] == pytest.approx([0.75, 0.0])
    assert g["diff_mean"] == pytest.approx(0.375) and g["diff_sd"] == pytest.approx(0.75 / 2 ** 0.5)
    # pooled: each task's mean over seeds (1 where the warm start solved it, 0.5 elsewhere), then the mean of categories
    assert g["pooled"]["mean_a"] == pytest.approx((4 / 6 + 3.5 / 6) / 2) and g["pooled"]["diff"] == pytest.approx(0.375)
    assert g["pooled"]["by_group"] == pytest.approx({"search": 2 / 6, "math": 2.5 / 6})


def test_seeds_start_from_the_warm_start_and_the_report_uses_only_a_current_file(tmp_path):
    bench = _bench()
    from coa_lib.report import FLOW_SEEDS_FILE, flow_seeds_comparison
    planners = bench.seed_planners(tmp_path, "smoke", [0, 1])
    warm = tmp_path / "agentflow" / "planner_warm"
    stamp = done_marker(warm).stat().st_mtime_ns
    assert planners[0] == tmp_path / "agentflow" / "planner_flow_grpo"
    assert planners[1] == tmp_path / "agentflow" / "seeds" / "seed1" / "planner_flow_grpo"
    record = training_record(planners[1])
    assert record["start"] == model_fingerprint(warm) and record["config"]["seed"] == 1
    assert training_record(planners[0])["config"]["seed"] == 0
    assert flow_seeds_comparison(tmp_path) == (None, "")                                  # no file: the claim is one run's
    out = subprocess.run([sys.executable, str(BENCH), "--run-dir", str(tmp_path), "--profile", "smoke", "--seeds", "0", "1"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert done_marker(warm).stat().st_mtime_ns == stamp                                  # the warm start is not retrained
    res = read_json(tmp_path / FLOW_SEEDS_FILE)
    assert res["seeds"] == [0, 1] and set(res) >= {"greedy", "avg2", "trained", "tool_share"}
    assert set(res["tool_share"]) == {"warm_start", "0", "1"}                               # where each planner ends, per tool
    assert res["trained"]["1"]["flow_grpo"]["path"] == "agentflow/seeds/seed1/planner_flow_grpo"
    pooled, text = flow_seeds_comparison(tmp_path)
    assert pooled == res["greedy"]["pooled"] and "over 2 seeds from one warm start" in text and "; avg@2 over seeds " in text
    mark_built(planners[0], {**training_record(planners[0]), "steps": -1})               # trained again to the same weights (another run)
    assert flow_seeds_comparison(tmp_path)[0] == res["greedy"]["pooled"]                  # still the planner the file measured
    weights = next(Path(planners[0]).glob("*.safetensors")); data = weights.read_bytes()
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))                               # retrained to other weights: the file is stale
    pooled, text = flow_seeds_comparison(tmp_path)
    assert pooled is None and "(flow_grpo retrained since): not used" in text
    bad = subprocess.run([sys.executable, str(BENCH), "--run-dir", str(tmp_path), "--profile", "smoke", "--seeds", "1", "2"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "seed 0" in bad.stderr
