"bench/code_failures.py: a failed code episode is named by what its first program got wrong."
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from code_failures import diagnose

Q = ("Write a Python function `def to_base(n: int) -> str`. Return the digits of the non-negative integer n written in base 9, "
     "as a string without prefix ('0' for 0). For example, `to_base(100)` returns `'121'`. Answer with the complete function.")
BODY = "    out = ''\n    while n:\n        out = str(n % {b}) + out\n        n //= {b}\n    return out\n"


def episode(program: str) -> str:
    return f"<plan> 1. Write it.</plan>\n<code> {program}</code>\n<observation>\nx\n</observation>\n<answer> y</answer>"


def test_each_cause_in_order():
    good_test = "assert to_base(100) == '121'\nprint('example passed')"
    assert diagnose(episode("def to_base(n):\n" + BODY.format(b=9) + good_test), Q, {"b": 9}, True) == "correct"
    assert diagnose("<answer> x</answer>", Q, {"b": 9}, False) == "no program"
    assert diagnose(episode("def to_base(n):\n" + BODY.format(b=7) + good_test), Q, {"b": 9}, False) == "parameter"
    assert diagnose(episode("def to_base(n):\n" + BODY.format(b=9) + "assert to_base(100) == '12'"), Q, {"b": 9}, False) == "example copy"
    assert diagnose(episode("def to_base(n):\n    return str(n % 9)\n" + good_test), Q, {"b": 9}, False) == "function"
    looping = "<code> def to_base(n):\n    b = 9\n" + "    out = 2:\n        return '0'\n" * 50      # cut by the length limit
    assert diagnose(looping, Q, {"b": 9}, False) == "function loop"
    assert diagnose(episode("def to_base(n):\n" + BODY.format(b=9)), Q, {"b": 9}, False) == "no test"
    assert diagnose("<code> def to_base(n):\n" + BODY.format(b=9) + "assert to_base(100) == '1211111111", Q, {"b": 9}, False) == "example copy"


def test_a_cued_parameter_counts_and_booleans_are_not_parameters():
    cued = 'def to_base(n):\n    b = int("written in base 9".split()[-1])\n' + BODY.format(b="b") + "assert to_base(100) == '121'"
    assert diagnose(episode(cued), Q, {"b": 9}, False) == "function"
    assert diagnose(episode("def f(s):\n    return s\nassert to_base(100) == '121'"), Q, {"loose": True}, False) == "function"
