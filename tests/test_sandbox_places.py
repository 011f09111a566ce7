"""The sandbox works wherever the code lives: a checkout under a 0700 directory, under the user's home (root's: 0700),
in a path with spaces, read-only, and the package installed on its own, run from another directory."""
import json, os, shutil, subprocess, sys, tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, os, sys
import coa_lib.sandbox as t
place = sys.argv[1]
assert t.__file__.startswith(place), (t.__file__, place)           # the copy under test, not the repo's package
r = t.run_python("import os, numpy\\nprint(6 * 7, os.path.exists(%r), os.listdir('/tmp/work'))" % place)
print(json.dumps({"ok": r.ok, "isolated": r.isolated, "out": r.stdout, "error": r.error, "reason": t.sandbox_info().reason}))
"""


def copy_checkout(dest: Path) -> Path:
    "A checkout's worth of the package: `coa_lib/` and the settings.ini that marks the repository's root, copied to `dest`."
    shutil.copytree(REPO / "coa_lib", dest / "coa_lib", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "settings.ini", dest / "settings.ini")
    return dest


def run_from(pkg_parent: Path, cwd: Path, wrap: list[str] = ()) -> dict:
    env = {**os.environ, "PYTHONPATH": str(pkg_parent), "PYTHONDONTWRITEBYTECODE": "1"}
    p = subprocess.run([*wrap, sys.executable, "-c", CHILD, str(pkg_parent)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def check(res: dict):
    assert res["ok"] and res["isolated"], res
    assert res["out"] == "42 False ['main.py']\n", res         # ran, and the checkout does not exist inside the sandbox


@pytest.fixture
def private_dir():
    d = Path(tempfile.mkdtemp(prefix="coa-place-"))         # mode 0700, as `mktemp -d` makes it
    assert (d.stat().st_mode & 0o777) == 0o700
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_checkout_under_a_0700_directory(private_dir):
    repo = copy_checkout(private_dir / "repo")
    check(run_from(repo, repo))


def test_checkout_under_the_home_directory():
    home = Path.home()
    d = Path(tempfile.mkdtemp(prefix="coa-place-", dir=home))
    try:
        repo = copy_checkout(d / "repo")
        check(run_from(repo, repo))
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_checkout_in_a_path_with_spaces(private_dir):
    repo = copy_checkout(private_dir / "my checkouts" / "coa lab")
    check(run_from(repo, repo))


def test_read_only_checkout(private_dir):
    repo = copy_checkout(private_dir / "repo")
    if os.geteuid() == 0:        # root writes through file modes: make the checkout a read-only mount in a private namespace
        unshare = shutil.which("unshare")
        if not unshare: pytest.skip("util-linux `unshare` is needed to make a read-only mount as root")
        script = f'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"'
        wrap = [unshare, "--mount", "--propagation", "private", "sh", "-c", script, str(repo)]
        probe = subprocess.run([*wrap, "sh", "-c", f'touch "{repo}/x" 2>&1; true'], capture_output=True, text=True)
        assert "Read-only file system" in probe.stdout, probe.stdout + probe.stderr
    else:
        for p in sorted(repo.rglob("*"), reverse=True): p.chmod(p.stat().st_mode & ~0o222)
        repo.chmod(0o555); wrap = []
    check(run_from(repo, repo, wrap))


def test_installed_package_run_from_elsewhere(private_dir):
    # `pip install` of (a copy of) the repository into a site dir: the package alone, no repository around it
    src = private_dir / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "runs", "build", "*.egg-info", "__pycache__",
                                                             ".pytest_cache", ".hypothesis", "bench", "nbs", "tests", "data"))
    site = private_dir / "site-packages"
    p = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                        "--target", str(site), str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert (site / "coa_lib" / "tools.py").exists() and not (site / "settings.ini").exists()
    elsewhere = private_dir / "work"; elsewhere.mkdir()
    check(run_from(site, elsewhere))
