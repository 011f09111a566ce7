"""The run's report (issue 27 items 2 and 3): a smoke run's report says it checks plumbing only and gives no verdict; every
claim's "ours" cell says something; figures are captioned by what they show; the README's hand-written results prose
states no number (numbers about results come only from the generated block)."""
import re
from pathlib import Path

import pytest

from datasets import Dataset
from coa_lib.core import atomic_write_json, atomic_write_text, mark_built, model_fingerprint, save_dataset
from coa_lib.report import CLAIMS, RESULTS_BEGIN, RESULTS_END, SEEDS_FILE, build_report, update_readme
from coa_lib.stage_rl import RL_EVAL_NAMES

REPO = Path(__file__).resolve().parents[1]
VERDICT = re.compile(r"\*\*(yes|no|undecided|n/a)\*\*")
FIGURES = ["sft/base/loss.png", "sft/coa/loss.png", "sft/coa_unfiltered/loss.png", "sft/direct/loss.png", "sft/react/loss.png",
           "agentflow/planner_warm/loss.png", "agentflow/planner_offline_sft/loss.png", "figures/sft_loss.png"]


def _system(acc, tokens, tools):
    return {"accuracy": acc, "tokens": tokens, "tool_calls": tools, "prompt_tokens_cached": tokens // 2, "generated_tokens": 10,
            "vs_reference": {"tokens": tokens / 1000 - 1, "tool_calls": tools / 2 - 1}}


def _planner(mean, shares):
    return {"category_mean": mean, "tool_share": shares}


def _run(rd: Path, profile: str) -> Path:
    "A run dir shaped like a smoke run's: every student at 0%, untrained planners whose every turn names no tool."
    atomic_write_json(rd / "efficiency_results.json", {"n_tasks": 10, "reference": "MAS", "single_model": "CoA",
                                                       "systems": {"MAS": _system(1.0, 1000, 2), "CoA": _system(0.0, 300, 1)}})
    atomic_write_json(rd / "rl_results.json", {"metrics": {"coa_sft": {"accuracy": 0.0}, "coa_rl": {"accuracy": 0.0}}})
    for name in RL_EVAL_NAMES.values():     # claim 4 pairs the two evaluations' records task by task
        save_dataset(Dataset.from_list([{"task_id": f"t{i}", "correct": False} for i in range(10)]), rd / name / "records")
    flat = {"n": 10, "diff": 0.0, "ci95": [0.0, 0.0], "sign": 0, "sign_test_p": 1.0}
    students = ("coa", "react", "coa_unfiltered")
    for s in students: mark_built(rd / "sft" / s, {"steps": 1})           # the run's students, which the seeds file measured
    trained = {"0": {s: {"path": f"sft/{s}", "fingerprint": model_fingerprint(rd / "sft" / s)} for s in students}}
    atomic_write_json(rd / SEEDS_FILE, {"seeds": [0], "students": {s: {"mean": 0.0, "sd": 0.0} for s in students}, "trained": trained,
                                        "comparisons": {"coa-react": flat, "coa-coa_unfiltered": flat}})
    for planner in ("warm_start", "flow_grpo", "offline_sft"):   # claims 7 and 8 pair the planners' records task by task
        atomic_write_json(rd / "agentflow" / "eval" / f"{planner}.json",
                          {"records": [{"id": f"t{i}", "kind": "math", "outcome": {"correct": False}} for i in range(10)]})
    invalid = {"invalid": 1.0}
    atomic_write_json(rd / "flow_grpo_results.json", {
        "planners": {"warm_start": _planner(0.0, invalid), "flow_grpo": _planner(0.0, invalid), "offline_sft": _planner(0.0, invalid)},
        "turn_budget": {"2": {"accuracy": 0.0}, "3": {"accuracy": 0.1}}, "gameof24": {"paper": 53.0, "n": 4, "metrics": {"flow_grpo": {"accuracy": 0.0}}}})
    atomic_write_json(rd / ".done" / "13_efficiency.json", {"notebook": "13_efficiency.ipynb", "profile": profile, "seconds": 6.0,
                                                           "finished": "2026-12-05T10:00:00", "commit": "abc1234"})
    atomic_write_text(rd / "report" / "13_efficiency.md", "#### Efficiency\n")
    for f in FIGURES: atomic_write_text(rd / f, "png")
    return rd


def test_smoke_report_checks_plumbing_only(tmp_path):
    text = build_report(_run(tmp_path / "smoke", "smoke")).read_text()
    lines = text.split("\n")
    assert "plumbing only" in lines[2] and "no claim gets a verdict" in lines[2]       # said at the top, under the title
    assert not VERDICT.findall(text), VERDICT.findall(text)
    rows = [l for l in text.split("\n") if re.match(r"\| \d+ \| (AFM|AgentFlow) \|", l)]
    assert len(rows) == len(CLAIMS) and all("| —, smoke profile" in r for r in rows)
    assert "In short" not in text


def test_full_report_gives_verdicts_and_their_summary(tmp_path):
    text = build_report(_run(tmp_path / "full", "full")).read_text()
    assert "plumbing only" not in text
    assert len(VERDICT.findall(text)) == len(CLAIMS)
    assert re.search(r"^In short: .*claim", text, re.M)


def test_every_claim_says_what_ours_is(tmp_path):
    text = build_report(_run(tmp_path / "smoke", "smoke")).read_text()
    rows = [l.split(" | ") for l in text.split("\n") if re.match(r"\| \d+ \| (AFM|AgentFlow) \|", l)]
    ours = {r[0].strip("| "): r[4].strip() for r in rows}
    assert all(ours.values()), ours
    assert "no tool chosen" in ours["10"]                                  # the planners named no tool: said, not left empty
    assert "(first 4 hands)" in ours["11"]                                  # the count the run evaluated


def test_figures_are_captioned_by_what_they_show(tmp_path):
    text = build_report(_run(tmp_path / "smoke", "smoke")).read_text()
    captions = re.findall(r"!\[([^\]]*)\]\(([^)]*)\)", text)
    assert len(captions) == len(FIGURES)
    assert len({c for c, _ in captions}) == len(captions), captions        # no two figures share a caption
    assert ("sft/coa/loss", "sft/coa/loss.png") in captions and ("agentflow/planner_warm/loss", "agentflow/planner_warm/loss.png") in captions


def _results_prose(readme: str) -> str:
    "The README's `## Results` section without the generated block between the markers."
    section = readme.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    before, rest = section.split(RESULTS_BEGIN, 1)
    return before + rest.split(RESULTS_END, 1)[1]


def test_readme_results_prose_states_no_number():
    readme = (REPO / "README.md").read_text()
    assert readme.count(RESULTS_BEGIN) == 1 and readme.count(RESULTS_END) == 1
    numbers = re.findall(r"[^\n]{0,30}\d[^\n]{0,30}", _results_prose(readme))
    assert not numbers, f"hand-written numbers next to the generated results (they go stale with the next run): {numbers}"


def test_make_readme_refuses_numbers_in_the_prose(tmp_path):
    rd = _run(tmp_path / "full", "full"); build_report(rd)
    readme = tmp_path / "README.md"
    atomic_write_text(readme, f"# x\n\n## Results\n\n{RESULTS_BEGIN}\nold\n{RESULTS_END}\n\nCoA reaches 24.0% here.\n\n## Next\n")
    with pytest.raises(ValueError, match="24.0%"): update_readme(readme, rd)
    atomic_write_text(readme, f"# x\n\n## Results\n\n{RESULTS_BEGIN}\nold\n{RESULTS_END}\n\nSee the table.\n\n## Next 2\n")
    assert "In short:" in update_readme(readme, rd)                         # a number in another section is not its business
