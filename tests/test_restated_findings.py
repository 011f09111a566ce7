"bench/restated_findings.py: the opening it expects of each hop is what the scripted teacher writes in that data style."
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from restated_findings import _FINDING, next_step_cues, opening


@pytest.mark.parametrize("style,cue,phrases", [("question", False, False), ("plan_line", False, False), ("plan_line", True, False),
                                               ("plan_line", False, True)])
def test_openings_are_the_teachers(style, cue, phrases):
    from coa_lib.core import task_meta
    from coa_lib.distill import trace_to_coa
    from coa_lib.mas import DataStyle, MistakeKnobs, run_teacher
    from coa_lib.tasks import make_task_suite
    from coa_lib.teacher import scripted_backend
    tasks = [{**t, "_meta": task_meta(t)} for t in make_task_suite(("multihop",), 6, "dev", seed=3, worlds_per_split=2)]
    data_style = DataStyle(restate_question=style == "question", restate_plan_line=style == "plan_line", next_step_cue=cue,
                           plan_phrases=phrases)
    traces = list(run_teacher(tasks, scripted_backend(tasks, MistakeKnobs.perfect(), style=data_style), workers=1))
    hops = 0
    for task, trace in zip(tasks, traces):
        thinks = [t.strip() for t in _FINDING.findall(trace_to_coa(trace))]
        assert len(thinks) == len(task["_meta"]["path"])
        for k, think in enumerate(thinks):
            assert think.startswith(opening(style, task, k, phrases)) and task["_meta"]["path"][k]["fact"] in think
            hops += 1
        if cue: assert next_step_cues(trace_to_coa(trace)) == Counter({("a step", "right", "followed"): len(thinks) - 1, ("the answer", "right", "followed"): 1})
    assert hops > len(tasks)                                   # some tasks have more than one hop
    plain = list(run_teacher(tasks, scripted_backend(tasks, MistakeKnobs.perfect()), workers=1))
    assert not any(t.strip().startswith(opening(style, tasks[0], 0)) for t in _FINDING.findall(trace_to_coa(plain[0])))   # the default style has none


def test_a_failed_episode_is_put_down_to_one_cause():
    from restated_findings import failure
    facts = ["Ann is married to Bo.", "Bo was born in Kuru."]
    found = lambda text: f"<web_search> x</web_search>\n<observation>\n1. x: ...\n</observation>\n<think> {text}</think>\n"
    two = "<plan> 1. Look up Ann: who is Ann married to? 2. Look up the entity found in step 1: where was it born?</plan>\n"
    assert failure("<plan> 1. Look up Ann: who is Ann married to?</plan>\n" + found(facts[0]), 2, facts) == "plan has fewer steps than hops"
    assert failure(two + found(facts[0]), 2, facts) == "stopped before the plan's last step"
    assert failure(two + found(facts[0]) + found("Bo is a painter."), 2, facts) == "a finding misread"
    assert failure(two + found(facts[0]) + found(facts[1]), 2, facts) == "read every hop, answered wrong"
    assert failure(two + found(facts[0]) + found(facts[1]) + found("Kuru is a city."), 2, facts).endswith("(ran on past the plan)")


def test_next_step_cues_against_the_plan_and_what_followed():
    from restated_findings import next_step_cues, plan_lines
    plan = "<plan> 1. Look up Ann: who is Ann married to? 2. Look up the entity found in step 1: where was it born?</plan>\n"
    assert plan_lines(plan[7:-8]) == {1: "1. Look up Ann: who is Ann married to?", 2: "2. Look up the entity found in step 1: where was it born?"}
    obs = "<web_search> x</web_search>\n<observation>\n1. x: ...\n</observation>\n"
    first = obs + "<think> 1. Look up Ann: who is Ann married to? Ann is married to Bo. Next: 2. Look up the entity found in step 1: where was it born?</think>\n"
    last = obs + "<think> 2. Look up the entity found in step 1: where was it born? Bo was born in Kuru. Next: the answer.</think>\n"
    assert next_step_cues(plan + first + last + "<reflection> ok</reflection>") == {("a step", "right", "followed"): 1, ("the answer", "right", "followed"): 1}
    early = obs + "<think> 1. Look up Ann: who is Ann married to? Ann is married to Bo. Next: the answer.</think>\n<answer> Bo</answer>"
    assert next_step_cues(plan + early) == {("the answer", "wrong", "followed"): 1}   # a two-step plan stopped after one step
    assert next_step_cues(plan + first + "<answer> Bo</answer>") == {("a step", "right", "not followed"): 1}
    assert next_step_cues(plan + obs + "<think> Ann is married to Bo.</think>\n") == {}   # no cue: not counted
