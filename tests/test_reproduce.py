"The papermill runner: order, resume, --force, first failure named, interruption loses no completed notebook."
import json, os, signal, subprocess, sys, time
from pathlib import Path

import nbformat
import pytest

from coa_lib.reproduce import StageFailed, marker_path, reproduce, stage_notebooks

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
