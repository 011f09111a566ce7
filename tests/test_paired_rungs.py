"bench/paired_rungs.py --stored: rungs' stored per-task rewards, pooled over seeds, and a code problem's accuracy per rung."
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import paired_rungs


@pytest.fixture
def rungs(tmp_path, monkeypatch):
    "Two stored rungs: seed 0 solves problem P everywhere, seed 1 collapses on it."
    (tmp_path / "ladder").mkdir()
    monkeypatch.setattr(paired_rungs, "OUT", tmp_path)
    tables = {"r0": {"code-dev-0-0": 1.0, "code-dev-0-1": 1.0, "code-dev-0-2": 0.0, "math-dev-0-0": 1.0},
              "r1": {"code-dev-0-0": 0.0, "code-dev-0-1": 0.0, "code-dev-0-2": 1.0, "math-dev-0-0": 1.0}}
    for label, rewards in tables.items():
        (tmp_path / "ladder" / f"{label}.json").write_text(json.dumps({"final": {"greedy": {"reward_by_task": rewards}}}))
    return tables


def test_code_accuracy_is_kept_per_problem_and_per_rung(rungs):
    problem_of = {"code-dev-0-0": "to_base(b=2)", "code-dev-0-1": "to_base(b=2)", "code-dev-0-2": "caesar(k=5)"}
    assert paired_rungs.code_by_problem(["r0", "r1"], problem_of) == {"caesar(k=5)": [0.0, 1.0], "to_base(b=2)": [1.0, 0.0]}


def test_seeds_are_averaged_per_task_before_pairing(rungs):
    assert paired_rungs.stored_rewards(["r0", "r1"])["code-dev-0-0"] == 0.5
    with pytest.raises(SystemExit, match="no rung 'r9'"):
        paired_rungs.stored_rewards(["r9"])


def test_a_run_dir_without_a_dev_split_is_refused_and_not_created(tmp_path):
    with pytest.raises(SystemExit, match="no dev split there"):
        paired_rungs.code_problem_of(str(tmp_path / "nowhere"))
    assert not (tmp_path / "nowhere").exists()


def test_seed_spread_counts_the_tasks_two_seeds_disagree_on(rungs):
    sp = paired_rungs.seed_spread(["r0", "r1"])
    assert sp["accuracy"] == [0.75, 0.5] and sp["tasks_differing"] == 0.75      # three of four tasks change with the seed
    assert paired_rungs.seed_spread(["r0"])["sd"] is None
    assert paired_rungs.stored_comparison(["r0", "r1"], ["r1", "r0"])["seed_spread"]["a"]["sd"] == pytest.approx(0.1768, abs=1e-4)
