"""Nothing is left in the system temp dir (issue 27 item 21): a temporary run dir goes however its process ends (normal exit,
`os._exit` as nbdev_test's worker processes end, SIGKILL); a notebook run by nbdev_test in a worker leaves no folder; the
stage notebooks make no temporary folder that only an `atexit` handler or nobody would remove."""
import json, os, re, shutil, signal, subprocess, sys, tempfile, time
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]


def _env(tmp: Path) -> dict:
    "An environment whose temp dir is `tmp` (empty, ours alone); torch's compile cache, a cache and not a temporary, elsewhere."
    tmp.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp), "TORCHINDUCTOR_CACHE_DIR": str(tmp.parent / "torch-cache"), "OMP_NUM_THREADS": "1"}


def _left(tmp: Path, wait: float = 30.0) -> list[str]:
    "What is still in `tmp` once the cleanup had `wait` seconds (the watcher works after its process has gone)."
    deadline = time.time() + wait
    while any(tmp.iterdir()) and time.time() < deadline: time.sleep(0.1)
    return sorted(p.name for p in tmp.iterdir())


MAKE = "import os, sys\nfrom coa_lib.core import resolve_run_dir\nrd = resolve_run_dir(None)\n(rd / 'x').write_text('x')\nprint(rd, flush=True)\n"


@pytest.mark.parametrize("end", ["sys.exit(0)", "os._exit(0)", "raise SystemExit('failed')"])
def test_temporary_run_dir_goes_however_the_process_ends(tmp_path, end):
    tmp = tmp_path / "tmp"
    p = subprocess.run([sys.executable, "-c", MAKE + end], env=_env(tmp), capture_output=True, text=True, timeout=120)
    rd = Path(p.stdout.strip())
    assert rd.parent == tmp, p.stderr
    assert _left(tmp) == []


def test_temporary_run_dir_goes_after_sigkill(tmp_path):
    tmp = tmp_path / "tmp"
    p = subprocess.Popen([sys.executable, "-c", MAKE + "import time; time.sleep(300)"], env=_env(tmp), stdout=subprocess.PIPE, text=True)
    try:
        rd = Path(p.stdout.readline().strip())
        assert rd.is_dir() and rd.parent == tmp
    finally:
        p.send_signal(signal.SIGKILL); p.wait(timeout=30)
    assert _left(tmp) == []


def test_a_fork_ending_leaves_its_parents_run_dir(tmp_path):
    tmp = tmp_path / "tmp"
    code = MAKE + ("pid = os.fork()\nif pid == 0: sys.exit(0)\nos.waitpid(pid, 0)\n"        # the fork exits normally, atexit and all
                   "print(json.dumps(rd.is_dir()), flush=True)\n")
    p = subprocess.run([sys.executable, "-c", "import json\n" + code], env=_env(tmp), capture_output=True, text=True, timeout=120)
    assert p.stdout.split()[1:] == ["true"], p.stdout + p.stderr
    assert _left(tmp) == []                                                       # and it goes when the parent ends


@pytest.fixture
def short_tmp_path():
    "A fresh folder with a short path: multiprocessing puts AF_UNIX sockets under TMPDIR, and a socket path may not pass 107 bytes (xdist's tmp_path can)."
    d = Path(tempfile.mkdtemp(prefix="coa-test-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_nbdev_test_in_a_worker_leaves_nothing(short_tmp_path):
    "`make test` runs notebooks in worker processes that end with `os._exit`: no atexit handler runs there."
    tmp = short_tmp_path / "tmp"
    p = subprocess.run([str(Path(sys.executable).parent / "nbdev_test"), "--path", "nbs/14c_report.ipynb", "--n_workers", "1"],
                       cwd=REPO, env=_env(tmp), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    assert _left(tmp) == []


# the stage notebooks of issue 27 item 21 (a smoke run left their folders in the temp dir), and this report's notebook
NOTEBOOKS = ["05_teacher_mas", "05b_mas", "09_sft", "09c_sft", "10_agentic_rl", "10a_rl", "10b_rl_updates", "12_flow_grpo", "12a_flow_grpo", "13_efficiency", "14c_report"]   # stage notebooks and, since issue 26, their libraries


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_makes_no_folder_it_does_not_remove(name):
    "`mkdtemp()` needs someone to remove its folder; in a notebook use `temp_dir()`, `scratch_dir(...)` or `with TemporaryDirectory()`."
    cells = [c.source for c in nbformat.read(REPO / "nbs" / f"{name}.ipynb", as_version=4).cells if c.cell_type == "code"]
    bad = [l.strip() for src in cells for l in src.splitlines()
           if "mkdtemp(" in l or ("TemporaryDirectory(" in l and not re.search(r"\bwith\b.*TemporaryDirectory\(", l))]
    assert not bad, bad
