"The layer rule of architecture.md (who may import whom in coa_lib) and two size limits, enforced."
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PKG_DIR = REPO / "coa_lib"
ARCH_MD = REPO / "architecture.md"
NBS_DIR = REPO / "nbs"
IGNORED = {"_modidx", "__init__"}
MAX_MODULE_LINES = 500
MAX_EXPORT_CELL_LINES = 60

LAYERS_BLOCK = re.compile(r"^```layers[ \t]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
EXPORT_DIRECTIVE = re.compile(r"^#\|\s?export(\s+\S+)?\s*$")


def parse_layers(md_text: str) -> list[tuple[str, list[str]]]:
    "The layers of the ```layers block of `md_text`, bottom layer first, as (layer, [module, ...])."
    blocks = LAYERS_BLOCK.findall(md_text)
    if len(blocks) != 1:
        raise ValueError(f"expected exactly one ```layers block in architecture.md, found {len(blocks)}")
    layers: list[tuple[str, list[str]]] = []
    seen: dict[str, str] = {}
    for line in blocks[0].splitlines():
        if not line.strip():
            continue
        name, sep, rest = line.partition(":")
        modules = [m.strip() for m in rest.split(",") if m.strip()]
        if not sep or not name.strip() or not modules:
            raise ValueError(f"bad line in the ```layers block (want 'name: mod1, mod2'): {line!r}")
        for mod in modules:
            if mod in seen:
                raise ValueError(f"module {mod} is listed twice: in layer {seen[mod]} and in layer {name.strip()}")
            seen[mod] = name.strip()
        layers.append((name.strip(), modules))
    if not layers:
        raise ValueError("the ```layers block in architecture.md is empty")
    return layers


def _module_files(pkg_dir: Path) -> dict[str, Path]:
    "Module name -> file for every top-level *.py of the package, minus the ignored ones."
    return {p.stem: p for p in sorted(pkg_dir.glob("*.py")) if p.stem not in IGNORED}


def _submodule(pkg_dir: Path, name: str) -> str:
    "`name` if it is a module of the package, else `__init__` (a name imported from the package itself)."
    return name if (pkg_dir / f"{name}.py").exists() or (pkg_dir / name).is_dir() else "__init__"


def _imports_in(tree: ast.AST, pkg_dir: Path, pkg_name: str) -> set[tuple[str, int]]:
    "Every (intra-package module, line) imported anywhere in `tree`."
    found: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1 or (node.level == 0 and node.module and node.module.split(".")[0] == pkg_name):
                parts = (node.module or "").split(".") if node.level == 1 else node.module.split(".")[1:]
                parts = [p for p in parts if p]
                if parts:  # from .x import y / from coa_lib.x import y
                    found.add((parts[0], node.lineno))
                else:  # from . import x / from coa_lib import x
                    found.update((_submodule(pkg_dir, a.name), node.lineno) for a in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == pkg_name:  # import coa_lib.x [as z]; a bare `import coa_lib` is __init__
                    found.add((parts[1] if len(parts) > 1 else "__init__", node.lineno))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            target = node.args[0].value
            if fname in ("import_module", "__import__") and isinstance(target, str):
                parts = target.split(".")
                if parts[0] == pkg_name and len(parts) > 1:  # importlib.import_module("coa_lib.x")
                    found.add((parts[1], node.lineno))
    return found


def package_imports(pkg_dir: Path, pkg_name: str | None = None) -> dict[str, set[tuple[str, int]]]:
    "Module name -> {(imported intra-package module, line)} for every module file, imports anywhere in the file."
    pkg_dir = Path(pkg_dir)
    pkg_name = pkg_name or pkg_dir.name
    result: dict[str, set[tuple[str, int]]] = {}
    for mod, path in _module_files(pkg_dir).items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        result[mod] = {(target, line) for target, line in _imports_in(tree, pkg_dir, pkg_name)
                       if target != mod and target not in IGNORED}
    return result


def violations(pkg_dir: Path, layers: list[tuple[str, list[str]]]) -> list[str]:
    "One readable message per breach of the layer rule, per unlisted module file and per listed module without a file."
    pkg_dir = Path(pkg_dir)
    rank = {mod: (li, mi) for li, (_, mods) in enumerate(layers) for mi, mod in enumerate(mods)}
    layer_of = {mod: name for name, mods in layers for mod in mods}
    files = _module_files(pkg_dir)
    found: list[str] = []
    for mod in files:
        if mod not in rank:
            found.append(f"{mod}.py is not listed in the layers table of architecture.md: add it to a layer")
    for name, mods in layers:
        for mod in mods:
            if mod not in files:
                found.append(f"{mod} is listed in layer {name} but {pkg_dir.name}/{mod}.py does not exist")
    for mod, imports in sorted(package_imports(pkg_dir).items()):
        if mod not in rank:
            continue  # already reported as unlisted
        for target, line in sorted(imports, key=lambda t: (t[1], t[0])):
            where = f"{mod}.py:{line} imports {target}"
            if target not in rank:
                found.append(f"{where}, which is not in the layers table of architecture.md")
            elif rank[target][0] > rank[mod][0]:
                found.append(f"{where} (layer {layer_of[target]}) but {mod} is in layer {layer_of[mod]}: "
                             "imports may only go down")
            elif rank[target][0] == rank[mod][0] and rank[target][1] > rank[mod][1]:
                found.append(f"{where}, listed after {mod} in layer {layer_of[mod]}: "
                             "within a layer a module may import only modules listed earlier")
    return found


# --- the real package --------------------------------------------------------------------------------------------

def test_real_package_follows_the_layers() -> None:
    "coa_lib/ obeys the layers table of architecture.md."
    found = violations(PKG_DIR, parse_layers(ARCH_MD.read_text(encoding="utf-8")))
    assert not found, f"{len(found)} layer violation(s):\n" + "\n".join(found)


def test_modules_are_short() -> None:
    "Every coa_lib/*.py module (except _modidx.py) has at most MAX_MODULE_LINES lines."
    too_long = [f"{p.relative_to(REPO)}: {n} lines" for p in sorted(PKG_DIR.glob("*.py")) if p.name != "_modidx.py"
                if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(too_long)


def _cell_source(cell: dict) -> str:
    "A notebook cell's source as one string (nbformat stores a string or a list of lines)."
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def test_exported_cells_are_short() -> None:
    "Every exported code cell (first line `#| export [module]`) in nbs/*.ipynb has at most MAX_EXPORT_CELL_LINES lines."
    too_long: list[str] = []
    for nb_path in sorted(NBS_DIR.glob("*.ipynb")):
        cells = json.loads(nb_path.read_text(encoding="utf-8")).get("cells", [])
        for index, cell in enumerate(cells):
            lines = _cell_source(cell).splitlines()
            if cell.get("cell_type") == "code" and lines and EXPORT_DIRECTIVE.match(lines[0].strip()):
                if len(lines) > MAX_EXPORT_CELL_LINES:
                    too_long.append(f"{nb_path.relative_to(REPO)} cell {index}: {len(lines)} lines")
    assert not too_long, (f"exported cells over {MAX_EXPORT_CELL_LINES} lines (cell index counts from 0, "
                          "all cells):\n" + "\n".join(too_long))


# --- the checker itself, on a fake package (independent of the real one) -----------------------------------------

# The table of architecture.md, fixed here so that the checker's own tests do not move when the document does.
FAKE_LAYERS: list[tuple[str, list[str]]] = parse_layers("""```layers
foundation: core, format
tasks: worlds, problems, tasks, benchmarks
environment: sandbox, tools, rewards
models: tokenizer, llm, serve
agents: mas, teacher, episode, rollout, evaluate
training: distill, filtering, sft
orchestration: stages, reproduce
```
""")


@pytest.fixture
def fake_pkg(tmp_path: Path) -> Path:
    "A package `coa_lib` in tmp_path with a one-line file for every module of the layers table, and no imports."
    pkg = tmp_path / "coa_lib"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('__version__ = "0"\n')
    (pkg / "_modidx.py").write_text("from .stages import *  # generated index: ignored\n")
    for _, mods in FAKE_LAYERS:
        for mod in mods:
            (pkg / f"{mod}.py").write_text(f'"Fake {mod}."\n')
    return pkg


def plant(pkg: Path, module: str, code: str) -> int:
    "Append `code` to pkg/module.py; the line number of its first line."
    path = pkg / f"{module}.py"
    text = path.read_text()
    path.write_text(text + code)
    return len(text.splitlines()) + 1


def test_layers_table_is_readable() -> None:
    "architecture.md has a layers table: foundation first, orchestration last, every module once."
    layers = parse_layers(ARCH_MD.read_text(encoding="utf-8"))
    names = [name for name, _ in layers]
    assert names[0] == "foundation" and names[-1] == "orchestration"
    mods = [m for _, ms in layers for m in ms]
    assert len(mods) == len(set(mods)) and {"core", "format", "stages"} <= set(mods)


def test_clean_fake_package_has_no_violations(fake_pkg: Path) -> None:
    "A package that matches the table and imports nothing is clean."
    assert violations(fake_pkg, FAKE_LAYERS) == []


def test_downward_and_earlier_imports_are_allowed(fake_pkg: Path) -> None:
    "Imports down the layers and to an earlier module of the same layer pass."
    plant(fake_pkg, "reproduce", "from .core import x\nfrom .stages import y\nimport coa_lib.sft\n")
    plant(fake_pkg, "format", "from .core import atomic\n")
    plant(fake_pkg, "serve", "def f():\n    from coa_lib.tokenizer import t\n    from coa_lib import llm\n")
    plant(fake_pkg, "core", "from . import __version__\nimport coa_lib\nfrom .core import z\n")
    assert violations(fake_pkg, FAKE_LAYERS) == []


def test_top_level_upward_import_is_caught(fake_pkg: Path) -> None:
    "A top-level `from .stages import *` in core.py is reported with file and line."
    line = plant(fake_pkg, "core", "from .stages import *\n")
    found = violations(fake_pkg, FAKE_LAYERS)
    assert found == [f"core.py:{line} imports stages (layer orchestration) but core is in layer foundation: "
                     "imports may only go down"]


def test_function_local_upward_import_is_caught(fake_pkg: Path) -> None:
    "A lazy absolute import inside a function in format.py is reported with file and line."
    line = plant(fake_pkg, "format", "def _f():\n    from coa_lib.sft import train_sft\n")
    found = violations(fake_pkg, FAKE_LAYERS)
    assert found == [f"format.py:{line + 1} imports sft (layer training) but format is in layer foundation: "
                     "imports may only go down"]


def test_same_layer_later_import_is_caught(fake_pkg: Path) -> None:
    "tokenizer.py importing serve (later in layer models) is reported; serve importing tokenizer is not."
    line = plant(fake_pkg, "tokenizer", "from .serve import X\n")
    plant(fake_pkg, "serve", "from .tokenizer import T\n")
    found = violations(fake_pkg, FAKE_LAYERS)
    assert len(found) == 1 and found[0].startswith(f"tokenizer.py:{line} imports serve, listed after tokenizer")


def test_unlisted_module_file_is_caught(fake_pkg: Path) -> None:
    "A module file missing from the table (newmod.py) is reported, and so is an import of it."
    (fake_pkg / "newmod.py").write_text('"A module nobody placed."\n')
    line = plant(fake_pkg, "stages", "import coa_lib.newmod as nm\n")
    found = violations(fake_pkg, FAKE_LAYERS)
    assert "newmod.py is not listed in the layers table of architecture.md: add it to a layer" in found
    assert f"stages.py:{line} imports newmod, which is not in the layers table of architecture.md" in found


def test_listed_module_without_file_is_caught(fake_pkg: Path) -> None:
    "A module in the table with no file is reported, so the table cannot go stale."
    (fake_pkg / "teacher.py").unlink()
    assert violations(fake_pkg, FAKE_LAYERS) == ["teacher is listed in layer agents but coa_lib/teacher.py does not exist"]


def test_every_import_form_is_found(fake_pkg: Path) -> None:
    "package_imports sees relative, absolute and lazy imports in functions, methods, classes, if and try."
    plant(fake_pkg, "stages", "\n".join([
        "from .core import a",                                   # 2
        "from . import format",                                  # 3
        "from coa_lib.worlds import b",                          # 4
        "from coa_lib import problems, tasks",                   # 5
        "import coa_lib.benchmarks",                             # 6
        "import coa_lib.sandbox as sb",                          # 7
        "def f():",                                              # 8
        "    from .tools import c",                              # 9
        "class K:",                                              # 10
        "    from .rewards import d",                            # 11
        "    def m(self):",                                      # 12
        "        import coa_lib.llm.sub as e",                   # 13
        "if True:",                                              # 14
        "    from .serve import g",                              # 15
        "try:",                                                  # 16
        "    from .mas.x import h",                              # 17
        "except ImportError:",                                   # 18
        "    import importlib; importlib.import_module('coa_lib.sft')",  # 19
        "import json, numpy",                                    # 20
        "",
    ]))
    assert package_imports(fake_pkg)["stages"] == {
        ("core", 2), ("format", 3), ("worlds", 4), ("problems", 5), ("tasks", 5), ("benchmarks", 6),
        ("sandbox", 7), ("tools", 9), ("rewards", 11), ("llm", 13), ("serve", 15), ("mas", 17), ("sft", 19)}
    assert "_modidx" not in package_imports(fake_pkg) and "__init__" not in package_imports(fake_pkg)


def test_parse_layers_without_block_raises() -> None:
    "Text with no ```layers block is an error, not an empty table."
    with pytest.raises(ValueError, match="layers block"):
        parse_layers("# Architecture\n\nNo table here.\n```python\nx = 1\n```\n")


def test_parse_layers_reads_bottom_first() -> None:
    "parse_layers keeps the order of layers and modules as written."
    text = "intro\n```layers\nbase: a, b\n\ntop: c\n```\n"
    assert parse_layers(text) == [("base", ["a", "b"]), ("top", ["c"])]


# Issue 26: the run/stage layer is the only one that resolves run directories and names the run's result files.
RUN_DIR_MODULES = {"core", "run", "reproduce"}        # core defines resolve_run_dir; a Run resolves its dir once; reproduce is the batch's entry point
RESULT_FILES = ("rl_results.json", "sft_results.json", "sft_game24.json", "sft_memorisation_gap.json", "sft_base.json",
                "agentflow_results.json", "flow_grpo_results.json", "efficiency_results.json", "filter_report.json",
                "selection.json", "teacher_flows.json", "offline_sft_rows.json")
RUN_STAGE_MODULES = {"run", "stage_tasks", "stage_teacher", "stage_distill", "stage_filter", "stage_sft", "stage_rl", "stage_agentflow", "stage_flow_grpo",   # writers of a run (one module per stage)
                     "stages", "flow_stages", "efficiency",
                     "report", "viewer", "docs"}                                                             # and its readers
# Known exceptions: the completion records earlier versions left inside a trained model's folder, read once by the training
# function to adopt such a model (`core.adopt_earlier_record`); nothing writes them any more.
DONE_MARKERS = {"sft_done.json": {"sft"}, "rl_done.json": {"rl"}, "flow_grpo_done.json": {"flow_grpo"}}


def _calls_of(tree: ast.AST, name: str) -> list[int]:
    "Lines where `name(...)` is called (as a bare name or an attribute)."
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
            and ((isinstance(n.func, ast.Name) and n.func.id == name) or (isinstance(n.func, ast.Attribute) and n.func.attr == name))]


def _string_literals(tree: ast.AST) -> list[tuple[str, int]]:
    "Every string constant of `tree` (f-string parts included), with its line."
    return [(n.value, n.lineno) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_only_the_run_layer_resolves_run_dirs():
    "`resolve_run_dir` is called by the run layer only: a stage takes a `Run` (or a path it turns into one) and never re-derives it."
    found = {f"{m}:{line}" for m, p in _module_files(PKG_DIR).items() if m not in RUN_DIR_MODULES
             for line in _calls_of(ast.parse(p.read_text(encoding="utf-8")), "resolve_run_dir")}
    assert not found, f"resolve_run_dir called outside {sorted(RUN_DIR_MODULES)}: {sorted(found)}"


def test_result_file_names_live_in_the_run_stage_layer():
    "The run's result files are named only by the modules that write or read a run; training modules name only their own done-marker."
    bad = []
    for m, p in _module_files(PKG_DIR).items():
        for s, line in _string_literals(ast.parse(p.read_text(encoding="utf-8"))):
            if m not in RUN_STAGE_MODULES and any(f in s for f in RESULT_FILES): bad.append(f"{m}:{line}: {s!r}")
            for marker, owners in DONE_MARKERS.items():
                if marker in s and m not in RUN_STAGE_MODULES | owners: bad.append(f"{m}:{line}: {s!r}")
    assert not bad, "result-file names outside the run/stage layer:\n" + "\n".join(bad)


# Issue 26, move 2: a stage notebook that exports its stage module writes no run file from an unexported cell.
STAGE_MODULE_NOTEBOOKS = {"01_tasks": "stage_tasks", "05_teacher_mas": "stage_teacher", "06_distill": "stage_distill",
                          "07_filter": "stage_filter", "09_sft": "stage_sft", "10_agentic_rl": "stage_rl", "11_agentflow": "stage_agentflow",
                          "12_flow_grpo": "stage_flow_grpo"}   # every stage notebook but 13_efficiency (library and stage in one)
WRITERS = {"atomic_write_json", "atomic_write_text", "atomic_dir", "save_dataset", "save_pretrained", "write_text", "write_bytes", "savefig"}


def unexported_writes(cells: list[dict]) -> list[str]:
    "Calls that write into the run (a writer of WRITERS, or a `plot_*` that saves a figure) in the code cells not exported, as 'cell N: name'."
    found = []
    for index, cell in enumerate(cells):
        lines = _cell_source(cell).splitlines()
        if cell.get("cell_type") != "code" or not lines or EXPORT_DIRECTIVE.match(lines[0].strip()) or lines[0].startswith("#| default_exp"):
            continue
        code = "\n".join(l for l in lines if not l.lstrip().startswith(("%", "!")))
        for call in (n for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Call)):
            name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")
            if (name in WRITERS or name.startswith("plot_")) and _into_the_run(call): found.append(f"cell {index}: {name}")
    return found


def _into_the_run(call: ast.Call) -> bool:
    "Whether a call's arguments name the run's directory (`rd`, `run_dir`, `run.dir`), not a scratch one of a check."
    return any((isinstance(n, ast.Name) and n.id in ("rd", "run_dir")) or (isinstance(n, ast.Attribute) and n.attr == "dir")
               for arg in [*call.args, *(k.value for k in call.keywords)] for n in ast.walk(arg))


@pytest.mark.parametrize("nb,module", sorted(STAGE_MODULE_NOTEBOOKS.items()))
def test_a_stage_notebook_writes_its_files_through_its_stage_module(nb: str, module: str):
    "A moved stage notebook exports its stage module, and every file the stage writes into the run is written by an exported function."
    cells = json.loads((NBS_DIR / f"{nb}.ipynb").read_text(encoding="utf-8"))["cells"]
    assert any(_cell_source(c).strip() == f"#| default_exp {module}" for c in cells), f"{nb} does not export {module}"
    assert unexported_writes(cells) == [], f"{nb} writes files from unexported cells: {unexported_writes(cells)}"


def test_unexported_writes_are_found():
    "The check sees a results file written by a notebook cell, and not one written by an exported definition."
    cells = [{"cell_type": "code", "source": "#| export\ndef f(rd): atomic_write_json(rd / 'a.json', {})"},
             {"cell_type": "code", "source": ["x = 1\n", "atomic_write_json(rd / 'sft_results.json', {})"]},
             {"cell_type": "code", "source": "Image(filename=str(plot_results(m, rd / 'f.png')))"},
             {"cell_type": "code", "source": "scratch = resolve_run_dir(None)\natomic_write_json(scratch / 'rl_done.json', {})"},
             {"cell_type": "markdown", "source": "atomic_write_text(rd / 'x.md', s)"}]
    assert unexported_writes(cells) == ["cell 1: atomic_write_json", "cell 2: plot_results"]
