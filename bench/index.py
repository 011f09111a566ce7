"""The benchmarks of bench/: `make bench` lists them (what each measures, how to run it); `make bench B=<name> ARGS="..."` runs one.

Most need a run dir or a ladder and take minutes to hours, so none runs by default.

    python bench/index.py                          # the list
    python bench/index.py tools_bench              # run bench/tools_bench.py
    python bench/index.py rl_update --run-dir runs/ladder --model <dir>
"""
from __future__ import annotations
import ast, subprocess, sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def benchmarks() -> dict[str, Path]:
    "Every benchmark script of bench/ by name (this index left out)."
    return {p.stem: p for p in sorted(HERE.glob("*.py")) if p.name != Path(__file__).name}


def summary(path: Path) -> tuple[str, str]:
    "A script's first docstring sentence and its example command (the docstring's first line starting with `python `)."
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".")
    usage = next((ln.strip() for ln in doc.splitlines() if ln.strip().startswith("python ")), f"python bench/{path.name}")
    return first, usage


def main(argv: list[str]) -> int:
    scripts = benchmarks()
    if not argv:
        for name, path in scripts.items():
            what, usage = summary(path)
            print(f"{name}\n    {what}\n    {usage}")
        print(f"\n{len(scripts)} benchmarks; run one: make bench B=<name> ARGS=\"...\" (results in bench/results/)")
        return 0
    name, args = argv[0].removesuffix(".py"), argv[1:]
    if name not in scripts:
        print(f"no benchmark {name!r} in bench/; there are: {', '.join(scripts)}", file=sys.stderr)
        return 2
    return subprocess.run([sys.executable, str(scripts[name]), *args]).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
