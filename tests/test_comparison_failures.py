"bench/comparison_failures.py: a comparison episode is told apart as a reading failure or a decision failure."
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from comparison_failures import diagnose

PATH = [{"fact": "Ann Bo was born in 1944."}, {"fact": "Cy Du was born in 1922."}]
NAMES = ["Ann Bo", "Cy Du"]


def episode(*findings: str) -> str:
    return "".join(f"<web_search> x</web_search>\n<observation>\n...\n</observation>\n<think> {f}</think>\n" for f in findings)


def test_both_values_read_and_the_other_name_is_a_decision_failure():
    read_both = episode("Ann Bo was born in 1944.", "Cy Du was born in 1922.")
    assert diagnose(read_both, "Cy Du", PATH, NAMES, "Ann Bo") == (True, "other name")
    assert diagnose(read_both, " Ann Bo ", PATH, NAMES, "Ann Bo") == (True, "gold")
    assert diagnose(read_both, "Ann Du", PATH, NAMES, "Ann Bo") == (True, "no name")      # a blend of the two names


def test_a_missing_fact_is_a_reading_failure_whatever_the_answer():
    assert diagnose(episode("Ann Bo was born in 1944.", "Cy Du is a painter."), "Ann Bo", PATH, NAMES, "Ann Bo") == (False, "gold")
    assert diagnose("no tool call at all", None, PATH, NAMES, "Ann Bo") == (False, "no name")


def test_a_span_counts_as_the_fact():
    spans = [{"fact": "Ann Bo was born in Orsk in 1944.", "span": "born in Orsk in 1944"}, {"fact": "x", "span": "born in 1922"}]
    assert diagnose(episode("Ann Bo, born in Orsk in 1944.", "Cy Du, born in 1922."), "Cy Du", spans, NAMES, "Ann Bo")[0]
