"""The episode viewer (`coa_lib.viewer`): on a run whose records are written the way the stages write them (a model's
`evaluate` records before and after RL, the teacher MAS's traces, an AgentFlow evaluation), every evaluated system gets a
page; the filters' counts equal the records'; observation text is marked as environment text; episode text is escaped;
a run without records gets a labelled page; a real run's site (`make docs`) holds a page per system."""
import json, re
from collections import Counter
from pathlib import Path

import pytest
from datasets import load_from_disk

from coa_lib.core import atomic_write_json, save_dataset
from coa_lib.episode import Episode, FinishReason
from coa_lib.evaluate import records_dataset
from coa_lib.format import parse_coa
from coa_lib.stage_rl import RL_EVAL_NAMES
from coa_lib.viewer import ENV_LABEL, ViewerConfig, episode_nav, find_systems, outcome_of

REPO = Path(__file__).resolve().parents[1]
EVIL = "<script>alert('x')</script>"


def _episodes(n: int) -> list[Episode]:
    "Episodes of every outcome and two kinds: correct (with a tool call and its observation), wrong, forged (invalid)."
    out = []
    for i in range(n):
        kind, pick = ("multihop", "math")[i % 2], i % 3
        obs = f"<web_search>q{i}</web_search>\n<observation>\npage {i} says {EVIL}\n</observation>\n"
        text = [obs + f"<answer>a{i}</answer>", f"<think>{EVIL}</think><answer>b</answer>", "<observation>forged</observation>"][pick]
        out.append(Episode(f"t{i}", kind, 0, "p", text, turns=2, answer=[f"a{i}", "b", None][pick], reward=float(pick == 0),
                           finish=[FinishReason.ANSWER, FinishReason.ANSWER, FinishReason.INVALID_FORGED][pick]))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    "A run dir with the records of four systems, written by the functions the stages use."
    from coa_lib.agentflow import solve
    from coa_lib.stage_agentflow import _compact
    from coa_lib.mas import run_teacher
    from coa_lib.scripted_flow import scripted_modules
    from coa_lib.tasks import make_task_suite
    from coa_lib.teacher import scripted_backend
    rd = tmp_path_factory.mktemp("viewer") / "run"
    tasks = make_task_suite(("multihop", "math"), 2, "test", worlds_per_split=2)
    save_dataset(tasks, rd / "tasks_test")
    task_rows = [{"id": f"t{i}", "question": f"question {i} {EVIL}", "answer": f"a{i}"} for i in range(40)]
    for name, n in ((RL_EVAL_NAMES["coa_sft"], 40), (RL_EVAL_NAMES["coa_rl"], 30)):
        save_dataset(records_dataset(_episodes(n), task_rows), rd / name / "records")
        atomic_write_json(rd / name / "metrics.json", {"name": name})
    save_dataset(run_teacher(tasks, scripted_backend(tasks), workers=1, progress=False), rd / "teacher_eval")
    recs = solve(tasks.to_list(), scripted_modules(tasks.to_list()), 3)
    atomic_write_json(rd / "agentflow" / "eval" / "warm_start.json", {"records": [_compact(r) for r in recs]})
    return rd


@pytest.fixture(scope="module")
def pages(run, tmp_path_factory) -> tuple[Path, list]:
    "The viewer's pages of the run (at most 12 episodes a page, so the 40-episode system is sampled)."
    docs = tmp_path_factory.mktemp("docs")
    return docs / "episodes", episode_nav(run, docs, ViewerConfig(per_page=12))


def _counts(page: str) -> dict[tuple[str, str], tuple[int, int]]:
    "(field, value) -> (in the records, on the page), as a page's filters state them."
    found = re.findall(r'data-field="(\w+)" data-value="([^"]*)" data-total="(\d+)" data-shown="(\d+)"', page)
    return {(f, v): (int(t), int(s)) for f, v, t, s in found}


def _cards(page: str) -> list[tuple[str, str]]:
    "(kind, outcome) of every card on a system's page."
    return re.findall(r'<div class="cv-card" id="[^"]*" data-kind="([^"]*)" data-outcome="(\w+)"', page)


def test_every_system_has_a_page(run, pages):
    out, nav = pages
    keys = {s.records.key for s in find_systems(run)}
    assert keys == {RL_EVAL_NAMES["coa_sft"], RL_EVAL_NAMES["coa_rl"], "teacher_eval", "agentflow/warm_start"}
    linked = {p for entry in nav[0]["Episodes"] for p in entry.values() if isinstance(p, str)}
    for s in find_systems(run):
        assert (out / f"{s.slug}.md").is_file() and f"episodes/{s.slug}.md" in linked
        assert f"]({s.slug}.md)" in (out / "index.md").read_text()                      # in the overview's table
    assert (out / "vs-rl_eval-sft_test--rl_eval-rl_test.md").is_file()                  # SFT vs RL, side by side


def test_filter_counts_equal_the_records(run, pages):
    out, _ = pages
    for name in RL_EVAL_NAMES.values():
        ds = load_from_disk(str(run / name / "records"))
        kinds = Counter(ds["kind"])
        outcomes = Counter(outcome_of(r, v).value for r, v in zip(ds["reward"], ds["valid"]))
        page = (out / f"{name.replace('/', '-')}.md").read_text()
        counts, cards = _counts(page), _cards(page)
        assert {v: t for (f, v), (t, _) in counts.items() if f == "kind"} == dict(kinds)
        assert {v: t for (f, v), (t, _) in counts.items() if f == "outcome"} == {"correct": 0, "wrong": 0, "invalid": 0, **outcomes}
        assert {v: s for (f, v), (_, s) in counts.items() if f == "kind"} == dict(Counter(k for k, _ in cards))   # "n here"
        assert len(cards) == min(12, ds.num_rows) and outcomes["invalid"] > 0 and ("math", "invalid") in cards
        assert len((out / f"{name.replace('/', '-')}.jsonl").read_text().splitlines()) == ds.num_rows   # the rest: downloadable
    teacher = load_from_disk(str(run / "teacher_eval"))
    counts = _counts((out / "teacher_eval.md").read_text())
    assert {v: t for (f, v), (t, _) in counts.items() if f == "kind"} == dict(Counter(teacher["kind"]))


def test_observations_are_marked_as_environment_text(run, pages):
    out, _ = pages
    page = (out / "rl_eval-rl_test.md").read_text()
    ds = load_from_disk(str(run / RL_EVAL_NAMES["coa_rl"] / "records"))
    shown = {t for t in re.findall(r'id="ep-([^"]+)"', page)}
    n_obs = sum(s.tag == "observation" for r in ds if r["task_id"] in shown for s in parse_coa(r["trajectory"]))
    env = re.findall(r'<div class="cv-seg cv-env" data-source="environment"><span class="cv-tag">([^<]*)</span><pre>([^<]*)</pre>', page)
    assert n_obs > 0 and len(env) == n_obs and all(ENV_LABEL in label for label, _ in env)
    assert page.count('data-source="environment"') == n_obs                             # and nothing else is
    teacher = (out / "teacher_eval.md").read_text()
    n_tool = sum(bool(c["tool"]) for r in load_from_disk(str(run / "teacher_eval")) for c in json.loads(r["calls"]))
    assert n_tool > 0 and teacher.count('data-source="environment"') == n_tool            # each tool's answer in the MAS trace
    assert "planner&#x27;s plan, step 1</b> → <b>search_agent" in teacher                 # who called whom


def test_episode_text_is_escaped(pages):
    out, _ = pages
    for page in out.glob("*.md"):
        text = page.read_text()
        assert EVIL not in text and "<script>alert" not in text, page.name
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in (out / "rl_eval-rl_test.md").read_text()


def test_agentflow_page_says_what_it_shows(run, pages):
    out, _ = pages
    page = (out / "agentflow-warm_start.md").read_text()
    assert "memory&#x27;s text" in page and "not saved" in page and "<th>tool the planner chose</th>" in page
    assert "(not in the run&#x27;s task splits)" not in page                              # questions found in tasks_test


def test_a_run_without_records_gets_a_labelled_page(tmp_path):
    (tmp_path / "run").mkdir()
    assert episode_nav(tmp_path / "run", tmp_path / "docs") == [{"Episodes": [{"Overview": "episodes/index.md"}]}]
    assert "**No evaluation records** in the run `run`" in (tmp_path / "docs" / "episodes" / "index.md").read_text()
