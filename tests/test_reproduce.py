"The papermill runner: order, resume, --force, first failure named, interruption loses no completed notebook."
import json, os, re, shlex, signal, subprocess, sys, time
from pathlib import Path

import nbformat
import pytest

from coa_lib.reproduce import StageFailed, machine_info, marker_path, reproduce, stage_notebooks

REPO = Path(__file__).resolve().parents[1]


def _nb(path: Path, *sources: str) -> Path:
    "A stage notebook: a parameters cell, then the given code cells."
    params = nbformat.v4.new_code_cell('profile = "smoke"\nrun_dir = None')
    params.metadata["tags"] = ["parameters"]
    nb = nbformat.v4.new_notebook(cells=[params, *map(nbformat.v4.new_code_cell, sources)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "python3", "language": "python"}
    nbformat.write(nb, path)
    return path


LOG = ("from pathlib import Path\n"
       "with open(Path(run_dir) / 'log.txt', 'a') as f: f.write(f'{NAME} {profile}\\n')")


@pytest.fixture
def nbs(tmp_path):
    d = tmp_path / "nbs"; d.mkdir()
    _nb(d / "00_a.ipynb", "NAME = 'a'", LOG)
    _nb(d / "01_b.ipynb", "NAME = 'b'", LOG)
    _nb(d / "14_reproduce.ipynb", "raise RuntimeError('the runner must not run itself')")
    return d


def _log(run_dir): return (Path(run_dir) / "log.txt").read_text().split("\n")[:-1]


def test_stage_notebooks_skip_runner(nbs):
    assert [p.name for p in stage_notebooks(nbs)] == ["00_a.ipynb", "01_b.ipynb"]


def test_runs_in_order_resumes_and_forces(nbs, tmp_path):
    rd = tmp_path / "run"
    runs = reproduce("smoke", rd, nbs_dir=nbs, progress=False)
    assert [(r.name, r.status) for r in runs] == [("00_a", "done"), ("01_b", "done")]
    assert _log(rd) == ["a smoke", "b smoke"]                       # order and injected parameters
    assert (rd / "notebooks" / "01_b.ipynb").exists()
    assert [r.status for r in reproduce("smoke", rd, nbs_dir=nbs, progress=False)] == ["skipped", "skipped"]
    assert _log(rd) == ["a smoke", "b smoke"]
    assert [r.status for r in reproduce("smoke", rd, nbs_dir=nbs, only=["01"], force=True, progress=False)] == ["done"]
    assert _log(rd) == ["a smoke", "b smoke", "b smoke"]
    summary = json.loads((rd / "summary.json").read_text())
    assert summary["notebooks"][0]["name"] == "01_b"


def test_other_profile_is_not_skipped(nbs, tmp_path):
    rd = tmp_path / "run"
    reproduce("smoke", rd, nbs_dir=nbs, only=["00"], progress=False)
    reproduce("full", rd, nbs_dir=nbs, only=["00"], progress=False)
    assert _log(rd) == ["a smoke", "a full"]


def test_first_failure_is_named_and_stops(nbs, tmp_path):
    _nb(nbs / "00_a.ipynb", "x = 1", "raise ValueError('bad data in row 7')")
    rd = tmp_path / "run"
    with pytest.raises(StageFailed) as e:
        reproduce("smoke", rd, nbs_dir=nbs, progress=False)
    msg = str(e.value)
    assert "00_a.ipynb" in msg and "cell 2" in msg and "ValueError: bad data in row 7" in msg
    assert not (rd / "log.txt").exists()                               # 01_b never ran
    assert not marker_path(rd, Path("00_a.ipynb")).exists()
    assert "| 00_a | failed |" in (rd / "summary.md").read_text()
    assert "| 01_b | pending |" in (rd / "summary.md").read_text()


def test_cli_exit_codes(nbs, tmp_path):
    _nb(nbs / "01_b.ipynb", "raise KeyError('x')")
    cmd = [sys.executable, "-m", "coa_lib.reproduce", "--profile", "smoke", "--run-dir", str(tmp_path / "run"), "--nbs-dir", str(nbs)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "FAILED: 01_b.ipynb" in p.stderr
    p = subprocess.run(cmd + ["--only", "nope"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no notebook matches 'nope'" in p.stderr


def test_kill_mid_run_loses_no_completed_notebook(nbs, tmp_path):
    _nb(nbs / "01_b.ipynb", "import time; time.sleep(120)")
    rd = tmp_path / "run"
    cmd = [sys.executable, "-m", "coa_lib.reproduce", "--profile", "smoke", "--run-dir", str(rd), "--nbs-dir", str(nbs)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 90
        while not marker_path(rd, Path("00_a.ipynb")).exists():
            assert time.time() < deadline and p.poll() is None, "first notebook never completed"
            time.sleep(0.2)
        time.sleep(1.0)                                                 # now inside 01_b
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    _nb(nbs / "01_b.ipynb", "NAME = 'b'", LOG)                         # the re-run can finish
    runs = reproduce("smoke", rd, nbs_dir=nbs, progress=False)
    assert [r.status for r in runs] == ["skipped", "done"]
    assert _log(rd) == ["a smoke", "b smoke"]


def test_readme_says_what_the_summary_files_record(nbs, tmp_path):
    "The README's word on `summary.md` / `summary.json` holds: the file it says records the machine (or the commit) does."
    rd = tmp_path / "run"
    reproduce("smoke", rd, nbs_dir=nbs, progress=False)
    said = dict(re.findall(r"`(summary\.(?:md|json))` \(([^)]*)\)", (REPO / "README.md").read_text()))
    assert "summary.md" in said, said
    commit = json.loads((rd / "summary.json").read_text())["commit"]
    for name, what in said.items():
        text = (rd / name).read_text()
        if "machine" in what: assert machine_info()["cpu"] in text, f"README: {name} ({what}); it has no machine"
        if "commit" in what and commit: assert commit in text, f"README: {name} ({what}); it has no commit"


def test_cli_refuses_a_run_dir_that_is_a_file_or_empty(nbs, tmp_path):
    (tmp_path / "a_file").write_text("")
    for bad in (str(tmp_path / "a_file"), str(tmp_path / "a_file" / "run"), ""):
        p = subprocess.run([sys.executable, "-m", "coa_lib.reproduce", "--profile", "smoke", "--run-dir", bad, "--nbs-dir", str(nbs)],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert p.returncode == 2 and "argument --run-dir" in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "nbs"]             # nothing ran, nothing was written


def test_notebook_kernels_print_no_plain_tcp_warning(nbs, tmp_path):
    "The kernels' channels are encrypted, so the batch's log has no 'running over TCP without encryption' line per notebook."
    p = subprocess.run([sys.executable, "-m", "coa_lib.reproduce", "--profile", "smoke", "--run-dir", str(tmp_path / "run"), "--nbs-dir", str(nbs)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "without encryption" not in p.stdout + p.stderr and _log(tmp_path / "run") == ["a smoke", "b smoke"]


def test_the_editable_install_prints_no_setuptools_notice(tmp_path):
    "`make`'s editable install runs with the filter that quiets setuptools' boxed 'Editable installation' notice, and the filter works."
    dry = subprocess.run(["make", "-n", "-B", "-C", str(REPO), ".venv/.installed"], capture_output=True, text=True, timeout=120)
    line = next(l for l in dry.stdout.splitlines() if "pip install" in l and " -e ." in l)
    env = dict(kv.split("=", 1) for kv in shlex.split(line) if kv.startswith("PYTHONWARNINGS="))
    assert env, line
    pkg = tmp_path / "pkg"; (pkg / "mini").mkdir(parents=True); (pkg / "mini" / "__init__.py").write_text("")
    (pkg / "pyproject.toml").write_text('[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = "setuptools.build_meta"\n'
                                        '[project]\nname = "mini"\nversion = "0"\n[tool.setuptools]\npackages = ["mini"]\n')
    build = [sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_editable({str(tmp_path / 'wheel')!r})"]
    noisy = subprocess.run(build, cwd=pkg, capture_output=True, text=True, timeout=120)
    quiet = subprocess.run(build, cwd=pkg, capture_output=True, text=True, timeout=120, env={**os.environ, **env})
    assert noisy.returncode == quiet.returncode == 0, quiet.stderr
    assert env == {"PYTHONWARNINGS": "ignore:Editable installation"}, line
    assert "Editable installation" in noisy.stderr and "Editable installation" not in quiet.stderr
