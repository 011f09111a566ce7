"Property, adversarial and cross-module tests of coa_lib.rewards: it scores untrusted model output."
import itertools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import coa_lib.rewards as R
from coa_lib.rewards import (SCORERS, Scorer, check_24, eval_24, exact_match, extract_code, f1_score, gold_answers, math_equal,
                             normalize_answer, parse_number, score, task_hand, unit_test_reward)
from coa_lib.problems import solvable_hands, solve24

GAMEOF24 = Path("/work/shared/data/benchmarks/agentflow/gameof24.json")
if not GAMEOF24.exists():  # the copy shipped in the repo, wherever the shared folder is not mounted
    GAMEOF24 = Path(__file__).resolve().parents[1] / "data/benchmarks/agentflow/gameof24.json"

# text made mostly of the pieces an arithmetic parser trips on
EXPR_PIECES = list("0123456789+-*/()×÷x= .$") + ["\\times", "\\div", "\\boxed{", "}", "24", "13", "= 24", "(((", ")))",
                                               "__import__('os')", "1e9", "**", "\u2212", "\x00", "\n"]
expr_soup = st.lists(st.one_of(st.sampled_from(EXPR_PIECES), st.text(max_size=4)), max_size=40).map("".join)
any_text = st.one_of(st.text(max_size=200), expr_soup)


# --- Game of 24 -------------------------------------------------------------------------------------------------
@settings(max_examples=500, deadline=None)
@given(any_text, st.lists(st.integers(1, 13), min_size=0, max_size=5))
def test_check_24_never_raises(expr, hand):
    ok, value = check_24(expr, hand), eval_24(expr, hand)
    assert ok in (True, False) and ok == (value == 24)


def test_check_24_never_raises_on_deep_or_long_input():
    hand = [4, 7, 8, 8]
    for expr in ["(" * 10_000 + "4" + ")" * 10_000, "(" * 50 + "(7-8/8)*4" + ")" * 50, "4+" * 100_000 + "4",
                 "8/" * 5000 + "0", "1" * 10_000, "\\boxed{" * 300]:
        assert check_24(expr, hand) is False
    assert check_24("(" * 40 + "(7-8/8)*4" + ")" * 40, hand) is True   # nesting up to the limit is fine


@pytest.mark.parametrize("expr, hand, ok", [
    ("(7-8/8)*4", [4, 7, 8, 8], True),
    ("4 × (7 − 8 ÷ 8)", [4, 7, 8, 8], True),
    ("4x(7-8/8)", [8, 8, 7, 4], True),
    ("4 \\cdot (7 - 8 \\div 8) = 24", [4, 7, 8, 8], True),
    ("\\boxed{8/(3-8/3)}", [3, 3, 8, 8], True),
    ("(7-8/8)*4 = 25", [4, 7, 8, 8], False),    # a wrong claim is not stripped
    ("(7-8/8)*4 = 24 = 24", [4, 7, 8, 8], False),
    ("8*3", [8, 3], True),                      # any hand size
    ("8*3*1", [8, 3], False),                   # an extra number
    ("8*3", [8, 3, 1], False),                  # a missing number
    ("(8+8)+(8)", [8, 8, 8], True),
    ("6*4", [4, 6, 6, 6], False),
    ("12+12", [12, 12, 1, 1], False),
    ("(1+1)*(11+1)", [1, 1, 1, 11], True),
    ("(1+1)*(11+1", [1, 1, 1, 11], False),
    ("(1+1)*()(11+1)", [1, 1, 1, 11], False),
    ("1+1)*(11+1", [1, 1, 1, 11], False),
    ("(1+1)(11+1)", [1, 1, 1, 11], False),      # no implicit multiplication
    ("2*12", [1, 2, 12, 1], False),
    ("4 ** 2 + 8", [4, 2, 8], False),           # no exponents
    ("4^2+8", [4, 2, 8], False),
    ("+24", [24], False),                       # no unary signs
    ("-(-24)", [24], False),
    ("24.0", [24], False),                      # no decimals
    ("6/(1-3/4)", [6, 1, 3, 4], True),          # exact fractions
    ("6/(1-3/4)", [6, 1, 3, 4, 0], False),
    ("(5-5)/0+24", [5, 5, 0, 24], False),       # division by zero anywhere
    ("24+0/(5-5)", [5, 5, 0, 24], False),
    ("__import__('os').system('echo 24')", [4, 7, 8, 8], False),
    ("eval('24')", [24], False),
    ("24 # (7-8/8)*4", [24], False),
    ("", [4, 7, 8, 8], False),
])
def test_check_24_cases(expr, hand, ok):
    assert check_24(expr, hand) is ok


def test_gameof24_file_every_hand_solved_and_checked():
    data = json.loads(GAMEOF24.read_text())
    assert len(data) == 300
    for row in data:
        hand = row["question"]
        sol = solve24(hand)
        assert sol is not None, f"pid {row['pid']}: solve_24 found nothing for the solvable hand {hand}"
        assert check_24(sol, hand), f"pid {row['pid']}: check_24 rejected solve_24's {sol!r} for {hand}"
        for ans in row["answer"]:                  # the file's own solutions, written with ×
            assert check_24(ans, hand), f"pid {row['pid']}: check_24 rejected the reference {ans!r} for {hand}"
        assert not check_24(sol, [n + 1 if i == 0 else n for i, n in enumerate(hand)])   # another hand: no


def test_checker_accepts_every_solution_of_the_task_generator():
    hands = list(itertools.combinations_with_replacement(range(1, 14), 4))
    solved = {h: solve24(h) for h in hands}
    assert len(hands) == 1820 and sum(s is not None for s in solved.values()) == 1362
    assert {h for h, s in solved.items() if s is not None} == set(solvable_hands())
    assert all(check_24(s, h) for h, s in solved.items() if s is not None)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 13), min_size=1, max_size=4), st.integers(-30, 30))
def test_solve_24_solutions_check(hand, target):
    sol = solve24(hand, target)
    if sol is not None: assert check_24(sol, hand, target)


# --- EM / F1 ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("s, norm", [("The Eiffel Tower!", "eiffel tower"), ("  a  b  ", "b"), ("An Apple", "apple"),
                                     ("U.S.A.", "usa"), ("the theatre", "theatre"), ("", ""), ("A", "")])
def test_normalize_answer(s, norm):
    assert normalize_answer(s) == norm


def test_exact_match_and_f1_known_cases():
    assert exact_match("The Eiffel Tower.", "eiffel tower") == 1.0
    assert exact_match("Eiffel Towers", "Eiffel Tower") == 0.0
    assert exact_match("NYC", ["New York City", "nyc"]) == 1.0
    assert exact_match("", "") == 1.0 and exact_match("", "x") == 0.0
    assert f1_score("Eiffel Tower", "Eiffel Tower") == 1.0
    assert f1_score("the Eiffel", "Eiffel Tower") == pytest.approx(2 / 3)
    assert f1_score("Eiffel Tower Paris France", "Eiffel Tower") == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert f1_score("Paris", ["Lyon", "Paris, France"]) == pytest.approx(2 / 3)      # max over aliases
    assert f1_score("yes", "yes") == 1.0
    assert f1_score("yes", "no") == 0.0 and f1_score("no", "no way") == 0.0 and f1_score("noanswer", "no answer") == 0.0
    assert f1_score("", "Paris") == 0.0 and f1_score("Paris", "") == 0.0
    assert f1_score("a a a", "a") == 0.0           # only articles: nothing left to compare


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60), st.text(max_size=60))
def test_em_f1_bounds(p, g):
    em, f1 = exact_match(p, g), f1_score(p, g)
    assert em in (0.0, 1.0) and 0.0 <= f1 <= 1.0
    if em == 1.0 and normalize_answer(g): assert f1 == 1.0


# --- math -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pred, gold, ok", [
    ("1,234", "1234", True), ("3.50", "3.5", True), ("\\boxed{12}", "12", True), ("12 apples", "12", True),
    ("The answer is $\\frac{3}{4}$.", "0.75", True), ("0.75", "3/4", True), ("$2^{10}$", "1024", True),
    ("(12)", "12", True), ("[1,234]", 1234, True), ("12", 12, True), (24, "24.0", True),
    ("12", "13", False), ("-12", "12", False), ("1/3", "0.33", False), ("twelve", "12", False), ("", "12", False),
    ("12", "", False), (None, "12", False), ("12", None, False), ("between 3 and 4", "3", False), ("Paris", "Paris", False),
])
def test_math_equal_cases(pred, gold, ok):
    assert math_equal(pred, gold) is ok


def test_math_equal_fallback_only_when_math_verify_finds_nothing(monkeypatch):
    import math_verify
    # math-verify parses both and says no: the plain-number check must not overrule it
    monkeypatch.setattr(math_verify, "verify", lambda *a, **k: False)
    assert math_equal("1234", "1234") is False
    # an exception inside the comparison propagates: never a silent True
    def boom(*a, **k): raise RuntimeError("verifier broke")
    monkeypatch.setattr(math_verify, "verify", boom)
    with pytest.raises(RuntimeError): math_equal("12", "12")
    # math-verify finds nothing: the fallback decides, exactly
    monkeypatch.setattr(math_verify, "parse", lambda *a, **k: [])
    assert math_equal("1,234", "1234") and math_equal("3.50", "7/2") and not math_equal("12", "13")


def test_math_equal_timeout_in_main_thread():
    t0 = time.monotonic()
    assert math_equal("9^9^9^9", "12", timeout_s=1) is False
    assert time.monotonic() - t0 < 15


def test_math_equal_from_threads():
    cases = [("\\frac{1}{2}", "0.5", True), ("1,234", "1234", True), ("13", "12", False), ("(12)", "12", True),
             ("9^9^9^9", "12", False)]
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda c: math_equal(c[0], c[1], timeout_s=1), cases))
    assert got == [c[2] for c in cases]
    assert time.monotonic() - t0 < 60


@settings(max_examples=200, deadline=None)
@given(any_text, st.one_of(st.sampled_from(["12", "0.5", "-3", "1,234", "\\frac{1}{2}", "x"]), st.text(max_size=20)))
def test_math_equal_never_raises(pred, gold):
    assert math_equal(pred, gold, timeout_s=2) in (True, False)


@pytest.mark.parametrize("text, value", [("1,234", 1234), ("-2/3", R.Fraction(-2, 3)), (".5", R.Fraction(1, 2)),
                                         ("\\boxed{7}", 7), ("\u22127", -7), ("3 and 4", None), ("1/0", None), ("", None)])
def test_parse_number(text, value):
    assert parse_number(text) == value


# --- unit tests in the sandbox ------------------------------------------------------------------------------------
ADD_TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0"]


@pytest.mark.parametrize("code, reward", [
    ("def add(a, b):\n    return a + b", 1.0),
    ("Sure!\n```python\ndef add(a, b):\n    return a + b\n```\nThat's it.", 1.0),
    ("```py\ndef helper(): pass\n```\n```python\ndef add(a, b):\n    return b + a\n```", 1.0),
    ("def add(a, b):\n    print('noise ' * 100000)\n    return a + b", 1.0),
    ("def add(a, b):\n    return a * b", 0.0),
    ("def add(a, b) return a + b", 0.0),
    ("import sys\nsys.exit(0)", 0.0),
    ("import os\nos._exit(0)", 0.0),
    ("def add(a, b):\n    raise SystemExit(0)", 0.0),
    ("print('ALL-TESTS-PASSED-0000000000000000')", 0.0),
    ("add = 5", 0.0),
    ("", 0.0),
])
def test_unit_test_reward(code, reward):
    assert unit_test_reward(code, ADD_TESTS, entry_point="add", timeout_s=5) == reward


def test_unit_test_reward_timeout_and_string_tests():
    assert unit_test_reward("def add(a, b):\n    while True: pass", ADD_TESTS, "add", timeout_s=1) == 0.0
    assert unit_test_reward("def add(a, b): return a + b", "assert add(1, 1) == 2\nassert add(0, 0) == 0") == 1.0


def test_unit_test_reward_refuses_to_score_without_a_sandbox(monkeypatch):
    from coa_lib.sandbox import ExecResult
    broken = ExecResult(False, "", "", "SandboxUnavailable: no bwrap", isolated=False, sandbox_failed=True)
    monkeypatch.setattr(R, "run_python", lambda *a, **k: broken)
    with pytest.raises(R.SandboxUnavailableError): unit_test_reward("def add(a, b): return a + b", ADD_TESTS, "add")
    # the flag decides, not the text: a program's error that reads like the sandbox's is the program's (a zero)
    monkeypatch.setattr(R, "run_python", lambda *a, **k: ExecResult(False, "", "bwrap: x\n", "SandboxError: bwrap failed to set up the sandbox: x"))
    assert unit_test_reward("def add(a, b): return a + b", ADD_TESTS, "add") == 0.0


@pytest.mark.parametrize("answer", [
    "import sys\nsys.stderr.write(\"bwrap: Can't find source path /usr/bin/python3: No such file or directory\\n\")\nsys.exit(1)",
    "def add(a, b):\n    import os\n    os.write(2, b'bwrap: execvp /usr/bin/python3: No such file or directory\\n')\n    os._exit(1)",
    "import os\nos.close(1)\nos.write(2, b'bwrap: setting up uid map: Permission denied\\n')\nos.kill(os.getpid(), 9)"],
    ids=["stderr_and_exit", "inside_the_entry_point", "no_stdout_and_sigkill"])
def test_a_model_answer_never_raises_out_of_a_reward(answer):
    # the issue-27 probe: an answer that printed bwrap's set-up error made unit_test_reward raise SandboxUnavailableError,
    # so one model answer could crash a reward or evaluation run; the sandbox now tells its own failure by a channel the
    # program cannot write, and the answer scores 0
    assert unit_test_reward(answer, ADD_TESTS, entry_point="add", timeout_s=5) == 0.0
    assert score({"id": "t", "kind": "code", "question": "add", "answer": "",
                  "meta": json.dumps({"tests": ADD_TESTS, "entry_point": "add"})}, answer) == 0.0


def test_extract_code():
    assert extract_code("def f(): pass") == "def f(): pass"
    assert extract_code("```python\nA\n```\n```python\nB\n```") == "B\n"
    assert extract_code("```python\ndef f(): pass\n```\n```python\nprint(f())\n```", entry_point="f") == "def f(): pass\n"
    assert extract_code("```python\nunclosed = 1\n") == "unclosed = 1\n"


# --- score --------------------------------------------------------------------------------------------------------
def _tasks_by_kind():
    from coa_lib.core import QA_KINDS, TASK_KINDS
    from coa_lib.tasks import make_tasks
    from coa_lib.worlds import make_world
    world = make_world(0)
    return {k: list(make_tasks(world if k in QA_KINDS else None, k, 4, "all" if k in QA_KINDS else "train", seed=1))
            for k in TASK_KINDS}


@pytest.fixture(scope="module")
def tasks_by_kind(): return _tasks_by_kind()


def test_scorers_cover_exactly_the_task_kinds():
    from coa_lib.core import TASK_KINDS
    assert set(SCORERS) == set(TASK_KINDS)
    assert all(isinstance(s, Scorer) and s.kind == k for k, s in SCORERS.items())


def test_score_reference_answers_and_wrong_answers(tasks_by_kind):
    wrong = {"multihop": "Nowhere At All", "comparison": "Nobody", "mixed": "-1", "math": "-1", "game24": "1+1+1+1",
             "code": "def nothing(): pass"}
    for kind, rows in tasks_by_kind.items():
        for row in rows:
            assert score(row, row["answer"]) == 1.0, f"{kind} {row['id']}: its own answer {row['answer']!r} scored 0"
            assert score(row, wrong[kind]) == 0.0, f"{kind} {row['id']}"
            assert score(row, None) == 0.0 and score(row, "") == 0.0 and score(row, " \n") == 0.0


def test_score_kind_specific_rules():
    qa = {"id": "q", "kind": "comparison", "question": "Who is older?", "answer": "Ada Lin",
          "meta": json.dumps({"aliases": ["Lin Ada"]})}
    assert score(qa, "ada lin") == 1.0 and score(qa, "Lin, Ada") == 1.0 and score(qa, "Lin") == 0.0
    m = {"id": "m", "kind": "mixed", "question": "?", "answer": "393081", "meta": "{}"}
    assert score(m, "393,081") == 1.0 and score(m, "\\boxed{393081}") == 1.0 and score(m, "393082") == 0.0
    m2 = {"id": "m2", "kind": "math", "question": "?", "answer": "\\frac{1}{2}", "meta": {}}   # non-numeric gold: EM
    assert score(m2, "\\frac{1}{2}") == 1.0
    g = {"id": "g", "kind": "game24", "question": "Using the numbers [3, 3, 8, 8], make 24.", "answer": "", "meta": "{}"}
    assert score(g, "8/(3-8/3)") == 1.0 and score(g, "24") == 0.0
    g_list = {"id": "g2", "kind": "game24", "question": [3, 3, 8, 8], "answer": "", "meta": None}
    assert task_hand(g_list) == [3, 3, 8, 8] and score(g_list, "8 ÷ (3 − 8 ÷ 3) = 24") == 1.0
    c = {"id": "c", "kind": "code", "question": "add", "answer": "",
         "meta": json.dumps({"entry_point": "add", "tests": ADD_TESTS})}
    assert score(c, "```python\ndef add(a, b): return a + b\n```") == 1.0 and score(c, "def add(a, b): return 0") == 0.0


def test_score_bad_tasks_are_loud():
    with pytest.raises(ValueError, match="unknown kind"): score({"id": "x", "kind": "poetry", "answer": "a"}, "a")
    with pytest.raises(ValueError, match="unknown kind"): score({"id": "x", "answer": "a"}, None)
    with pytest.raises(ValueError, match="'x'.*not JSON"): score({"id": "x", "kind": "multihop", "answer": "a", "meta": "{"}, "a")
    with pytest.raises(ValueError, match="missing field 'answer'"): score({"id": "x", "kind": "multihop"}, "a")
    with pytest.raises(ValueError, match="no Game-of-24 hand"): score({"id": "x", "kind": "game24", "question": "?", "answer": ""}, "1")
    with pytest.raises(ValueError, match="without meta"): score({"id": "x", "kind": "code", "question": "?", "answer": "", "meta": "{}"}, "x")


SCORE_TASKS = [
    {"id": "q", "kind": "multihop", "question": "?", "answer": "Velmora", "meta": json.dumps({"aliases": ["V"]})},
    {"id": "c", "kind": "comparison", "question": "?", "answer": "yes", "meta": "{}"},
    {"id": "x", "kind": "mixed", "question": "?", "answer": "42", "meta": "{}"},
    {"id": "m", "kind": "math", "question": "?", "answer": "0.5", "meta": "{}"},
    {"id": "g", "kind": "game24", "question": "?", "answer": "", "meta": json.dumps({"hand": [4, 7, 8, 8]})},
]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(SCORE_TASKS), any_text)
def test_score_never_raises_on_model_text(task, text):
    assert score(task, text) in (0.0, 1.0)


def test_score_code_kind_survives_hostile_text():
    c = {"id": "c", "kind": "code", "question": "add", "answer": "", "meta": json.dumps({"entry_point": "add", "tests": ADD_TESTS})}
    for text in ["```", "```python\n", "\x00\x01", "'''", "def add(a, b):\n\treturn a+b\n  x", "import os; os.kill(os.getppid(), 9)",
                 "__import__('shutil').rmtree('/')", "\ud800", "<answer>def add(a,b): return a+b</answer>"]:
        assert score(c, text) == 0.0


def test_score_with_a_judge():
    from coa_lib.llm import ScriptedBackend, judge_with
    calls = []
    def policy(prompt):
        calls.append(prompt)
        return '{"rationale": "ok", "judgement": "correct"}'
    judge = judge_with(ScriptedBackend(policy))
    qa = {"id": "q", "kind": "multihop", "question": "Where?", "answer": "Velmora", "meta": "{}"}
    assert score(qa, "the coastal town of Velmora") == 0.0
    assert score(qa, "the coastal town of Velmora", judge=judge) == 1.0
    assert len(calls) == 1 and "Velmora" in calls[0] and "Where?" in calls[0]
    assert score({**qa, "kind": "mixed"}, "whatever", judge=judge) == 1.0
    assert score(qa, None, judge=judge) == 0.0 and len(calls) == 2      # an empty answer never reaches the judge
    g = {"id": "g", "kind": "game24", "question": "?", "answer": "", "meta": json.dumps({"hand": [4, 7, 8, 8]})}
    assert score(g, "24", judge=judge) == 0.0 and len(calls) == 2         # verifiable kinds ignore the judge
    no = judge_with(ScriptedBackend(lambda p: '{"rationale": "no", "judgement": "incorrect"}'))
    assert score(qa, "Velmora", judge=no) == 0.0


def test_loaded_gameof24_benchmark_scores_its_own_answers():
    from coa_lib.benchmarks import load_benchmark
    ds = load_benchmark(GAMEOF24, "gameof24_json")
    assert len(ds) == 300
    for row in ds:
        assert score(row, row["answer"]) == 1.0, row["id"]
        meta = json.loads(row["meta"]) if isinstance(row["meta"], str) else row["meta"]
        assert task_hand(row) == meta["hand"]


def test_gold_answers_and_registry_extension():
    t = {"id": "t", "kind": "multihop", "answer": "A", "meta": json.dumps({"aliases": ["B", "C"]})}
    assert gold_answers(t) == ["A", "B", "C"]
    R.register_scorer(Scorer("echo", lambda task, pred: float(pred == task["answer"])))
    try: assert score({"id": "e", "kind": "echo", "answer": "hi"}, "hi") == 1.0
    finally: del SCORERS["echo"]
