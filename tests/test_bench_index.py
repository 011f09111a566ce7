"`make bench`: bench/index.py lists every benchmark with what it measures and how to run it, and runs one by name."
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _index(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "index.py"), *args], capture_output=True, text=True, timeout=60)


def test_the_list_names_every_benchmark_with_a_purpose_and_a_command():
    out = _index()
    assert out.returncode == 0, out.stderr
    scripts = sorted(p.stem for p in BENCH.glob("*.py") if p.name != "index.py")
    lines = out.stdout.splitlines()
    for name in scripts:
        i = lines.index(name)                                    # a name on its own line, then purpose and command
        assert lines[i + 1].strip() and lines[i + 2].strip().startswith(f"python bench/{name}.py")
    assert f"{len(scripts)} benchmarks" in out.stdout


def test_an_unknown_benchmark_is_refused_with_the_names():
    out = _index("no_such_bench")
    assert out.returncode == 2 and "no benchmark 'no_such_bench'" in out.stderr and "tools_bench" in out.stderr


def test_a_named_benchmark_runs_with_its_arguments():
    out = _index("rl_signal", "--help")                       # argparse's help: the script ran, with the argument passed on
    assert out.returncode == 0 and "--per-kind" in out.stdout
