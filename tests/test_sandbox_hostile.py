"Hostile code against coa_lib.tools.run_python: each program must be contained, with a clear error, and leave the host as it was."
import json, os, socket, subprocess, sys, textwrap, threading, time, uuid
from pathlib import Path

import pytest

from coa_lib.tools import SANDBOX_UID, run_python, sandbox_info

REPO = Path(__file__).resolve().parents[1]
SLACK_S = 3.0          # a run may take this much longer than its timeout (start-up, kill, reap), never more


@pytest.fixture(scope="module", autouse=True)
def require_sandbox():
    info = sandbox_info()
    if not info.available:   # CI installs bubblewrap with `make venv`: a missing sandbox is a failure, not a skip
        pytest.fail(f"the code sandbox is unavailable: {info.reason}. Run `make venv` (installs bubblewrap).")


@pytest.fixture
def marker():
    return f"coa-hostile-{uuid.uuid4().hex[:12]}"


def procs_with(marker: str) -> list[tuple[int, str]]:
    "Live host processes whose command line contains `marker` (a /proc scan, no psutil)."
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmd and state != "Z": found.append((int(pid), cmd.replace(b"\0", b" ").decode(errors="replace")))
    return found


def sandbox_uid_tmp_entries() -> set[str]:
    "Host /tmp entries owned by the sandbox uid (a sandbox must never create any)."
    out = set()
    for p in Path("/tmp").iterdir():
        try:
            if p.lstat().st_uid == SANDBOX_UID: out.add(p.name)
        except OSError:
            pass
    return out


@pytest.fixture(autouse=True)
def host_unchanged(marker):
    "Around every test: no process or file with the marker survives, no host /tmp entry appears for the sandbox uid."
    before = sandbox_uid_tmp_entries()
    yield
    assert procs_with(marker) == [], "sandboxed processes outlived run_python"
    assert sandbox_uid_tmp_entries() <= before, "the sandbox created files in the host /tmp"
    for d in ("/tmp", "/etc", "/root", "/var/tmp", str(REPO), str(REPO.parent), "/"):
        assert not any(marker in p.name for p in Path(d).iterdir()), f"a file with the marker appeared in {d}"


def run(code: str, **kw):
    t0 = time.monotonic()
    r = run_python(textwrap.dedent(code), **kw)
    dt = time.monotonic() - t0
    assert dt < kw.get("timeout_s", 5.0) + SLACK_S, f"run_python took {dt:.1f} s"
    return r


# ---------------------------------------------------------------- time, processes, memory

def test_infinite_loop_is_stopped():
    r = run("while True: pass", timeout_s=1.0)
    assert r.timed_out and not r.ok
    assert r.error == "TimeoutError: code ran longer than 1 s and was stopped"


def test_sleep_past_timeout_is_stopped():
    r = run("import time\nprint('started', flush=True)\ntime.sleep(60)", timeout_s=1.0)
    assert r.timed_out and r.stdout == "started\n"      # output written before the kill is kept


def test_fork_bomb_is_contained():
    r = run("import os\nwhile True:\n    os.fork()", timeout_s=2.0)
    assert not r.ok and r.error.endswith("BlockingIOError: [Errno 11] Resource temporarily unavailable"), r.error
    assert not r.timed_out                                     # the process limit stops it, not the clock


def test_fork_bomb_does_not_starve_a_concurrent_sandbox():
    bomb = threading.Thread(target=run_python, args=("import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",),
                            kwargs={"timeout_s": 3.0})
    bomb.start(); time.sleep(0.5)
    r = run("print(sum(range(10)))")                     # the process limit counts per sandbox, not per uid
    bomb.join()
    assert r.ok and r.stdout == "45\n", r


def test_subprocess_bomb_is_contained(marker):
    r = run(f"""
        import subprocess, sys
        procs = []
        for i in range(200):
            procs.append(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(100)', '{marker}']))
        """, timeout_s=3.0)
    assert not r.ok
    assert "BlockingIOError" in r.error or "Resource temporarily unavailable" in r.error or r.timed_out, r.error


def test_memory_bomb_gets_memory_error():
    r = run("x = bytearray(4 << 30)")
    assert not r.ok and r.error.endswith("MemoryError")
    r = run("chunks = []\nwhile True: chunks.append(b'x' * (16 << 20))", memory_mb=256)
    assert not r.ok and "MemoryError" in r.error


def test_sandboxed_processes_are_first_for_the_oom_killer():
    r = run("import os\nif os.fork() == 0:\n    print(open('/proc/self/oom_score_adj').read().strip()); os._exit(0)\nos.wait()")
    assert r.ok and r.stdout == "1000\n"


def test_memory_limit_is_per_call():
    assert run("x = bytearray(200 << 20); print(len(x))", memory_mb=512).ok
    assert "MemoryError" in run("x = bytearray(200 << 20)", memory_mb=128).error


def test_thread_bomb_is_contained():
    r = run("""
        import threading, time
        n = 0
        try:
            while True:
                threading.Thread(target=time.sleep, args=(30,), daemon=True).start(); n += 1
        except RuntimeError as e:
            print('stopped after', n, 'threads:', e)
        """, timeout_s=3.0)
    assert r.ok and "can't start new thread" in r.stdout and int(r.stdout.split()[2]) < 100


def test_recursion_bombs():
    r = run("def f(n): return f(n + 1)\nf(0)")
    assert r.error.endswith("RecursionError: maximum recursion depth exceeded")
    r = run("import sys\nsys.setrecursionlimit(10**7)\ndef f(n): return f(n + 1)\nf(0)", timeout_s=2.0, memory_mb=256)
    assert not r.ok and ("MemoryError" in r.error or "Crashed" in r.error or r.timed_out), r.error


# ---------------------------------------------------------------- output

def test_huge_stdout_is_cut_and_stopped():
    r = run("while True: print('x' * 1000)")
    assert not r.ok and r.error.startswith("OutputLimitError")
    assert len(r.stdout) < 10_000 and "output truncated" in r.stdout


def test_one_huge_print_is_truncated():
    r = run("print('y' * 10**8)")
    assert not r.ok and len(r.stdout) < 10_000


def test_huge_stderr_is_cut():
    r = run("import sys\nfor _ in range(10**6): sys.stderr.write('e' * 1000)")
    assert not r.ok and r.error.startswith("OutputLimitError") and len(r.stderr) < 10_000


def test_binary_garbage_output_is_readable_text():
    r = run("import os, sys\nsys.stdout.buffer.write(os.urandom(20000) + b'\\x00\\x1b[2J\\xff\\xfe')")
    assert r.ok and isinstance(r.stdout, str)
    assert not any(c in r.stdout for c in "\x00\x1b\x07")
    assert len(r.observation()) < 3000


# ---------------------------------------------------------------- file system

def test_huge_file_write_hits_the_file_size_limit():
    r = run("open('big.bin', 'wb').write(b'x' * (100 << 20))")
    assert not r.ok and "File too large" in r.error


def test_filling_the_private_tmp_stops_at_its_size():
    r = run("""
        for i in range(100):
            open(f'/tmp/f{i}', 'wb').write(b'x' * (8 << 20))
        """)
    assert not r.ok and "No space left on device" in r.error


@pytest.mark.parametrize("where", ["/etc", "/work", "/root", "REPO", "/usr/lib", "/var/tmp", "/"])
def test_writes_outside_the_working_dir_fail(where, marker):
    target = str(REPO) if where == "REPO" else where
    r = run(f"open('{target}/{marker}.txt', 'w').write('pwned')")
    assert not r.ok and any(s in r.error for s in ("Read-only file system", "Permission denied", "No such file")), r.error
    assert not Path(target, f"{marker}.txt").exists()


def test_host_tmp_is_private(marker):
    secret = Path("/tmp") / f"{marker}-secret.txt"
    secret.write_text("host secret"); secret.chmod(0o644)
    try:
        r = run(f"import os\nprint(os.path.exists('{secret}'))\nopen('/tmp/{marker}-new', 'w').write('x')\nprint(os.getcwd())")
        assert r.ok and r.stdout == "False\n/tmp/work\n"
        assert not (Path("/tmp") / f"{marker}-new").exists()
    finally:
        secret.unlink()


ALLOWED_TOP = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr"}


def test_only_the_allowlist_is_visible(marker):
    # world-readable files planted where a host keeps data: the repo, a sibling checkout's place, /var/tmp, /opt, /etc
    planted = [REPO / f"{marker}.txt", REPO.parent / f"{marker}.txt", Path("/var/tmp", f"{marker}.txt"),
               Path("/opt", f"{marker}.txt"), Path("/etc", f"{marker}.txt")]
    for f in planted: f.write_text("host secret"); f.chmod(0o644)
    try:
        r = run(f"""
            import os, json
            seen = {{p: os.path.exists(p) for p in {[str(f) for f in planted] + [str(REPO), "/root", "/home", "/etc/passwd"]!r}}}
            print(json.dumps([sorted(os.listdir('/')), sorted(os.listdir('/etc')), seen]))
            """)
        top, etc, seen = json.loads(r.stdout)
        assert set(top) <= ALLOWED_TOP, top
        assert set(etc) <= {"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives"}, etc
        assert not any(seen.values()), seen
    finally:
        for f in planted: f.unlink()


def test_numpy_and_sympy_import_inside():
    # `make venv` installs Debian's python3-numpy and python3-sympy for the sandbox's interpreter (a failure, not a skip)
    r = run("import numpy, sympy\nprint(int(numpy.arange(10).sum()), sympy.simplify('(x**2 - 1)/(x - 1)'))")
    assert r.ok and r.stdout == "45 x + 1\n", r.observation()


def test_chmod_chown_setuid_fail():
    r = run("""
        import os
        for f in (lambda: os.setuid(0), lambda: os.chmod('/usr/bin/python3', 0o4777), lambda: os.chown('/etc/passwd', 65534, 65534),
                  lambda: os.mknod('/dev/evil'), lambda: os.mount if False else open('/proc/sys/kernel/hostname', 'w').write('x')):
            try: f(); print('ALLOWED')
            except (OSError, AttributeError) as e: print('denied', type(e).__name__)
        print('uid', os.getuid(), os.geteuid())
        """)
    assert r.ok and "ALLOWED" not in r.stdout and "uid 65534 65534" in r.stdout, r.stdout


# ---------------------------------------------------------------- secrets, processes, network

def test_parent_environment_is_not_visible(monkeypatch):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("COA_TEST_SECRET_TOKEN", secret)
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    r = run("""
        import os
        print(dict(os.environ))
        for p in os.listdir('/proc'):
            if p.isdigit():
                try: print(open(f'/proc/{p}/environ', 'rb').read())
                except OSError as e: print(p, e)
        """)
    assert r.ok and secret not in r.stdout and "COA_TEST_SECRET_TOKEN" not in r.stdout


def test_shells_run_unprivileged_and_contained(marker):
    r = run(f"""
        import os, subprocess
        os.system('id; touch /etc/{marker}; touch {REPO}/{marker}; echo hi > /tmp/{marker}')
        print(subprocess.run(['sh', '-c', 'cat /etc/shadow; ls /root'], capture_output=True, text=True))
        """)
    assert r.ok and "uid=65534" in r.stdout and "root:" not in r.stdout, r.stdout
    assert "No such file" in r.stdout and ("Read-only file system" in r.stderr or "Permission denied" in r.stderr), r.stderr
    assert not any(p.exists() for p in (Path("/etc", marker), REPO / marker, Path("/tmp", marker)))


def test_host_processes_are_invisible(marker):
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        r = run(f"""
            import os
            pids = [p for p in os.listdir('/proc') if p.isdigit()]
            seen = [open(f'/proc/{{p}}/cmdline', 'rb').read() for p in pids]
            print(len(pids), any(b'{marker}' in c for c in seen))
            """)
        assert r.ok and r.stdout.split()[1] == "False" and int(r.stdout.split()[0]) <= 4, r.stdout
    finally:
        host.kill(); host.wait()


def test_signal_tricks_do_not_reach_the_host(marker):
    host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        r = run("""
            import os, signal
            for target in (os.getppid(), 1, -1):
                try: os.kill(target, signal.SIGKILL); print('sent', target)
                except OSError as e: print('denied', target, e.errno)
            print('still here')
            """)
        assert host.poll() is None, "a host process was killed from the sandbox"
        assert "still here" in r.stdout or "Crashed" in (r.error or "")
    finally:
        host.kill(); host.wait()


def test_killing_the_sandbox_parent_is_harmless():
    r = run("import os, signal\nos.kill(os.getppid(), signal.SIGTERM)\nos.kill(os.getppid(), signal.SIGKILL)\nprint('done')")
    assert r.stdout in ("done\n", "") and os.getpid() > 0       # the test process is alive and the call returned


def test_orphaned_daemons_ignoring_sigterm_are_killed(marker):
    r = run(f"""
        import os, sys
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, '-c',
                         'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)', '{marker}'])
            os._exit(0)
        print('parent exits')
        """)
    assert r.ok and r.stdout == "parent exits\n" and r.seconds < 3        # returns at once, not after the daemon


def test_daemons_are_killed_on_timeout_too(marker):
    r = run(f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)',
                          '{marker}'], start_new_session=True)
        time.sleep(300)
        """, timeout_s=1.0)
    assert r.timed_out


def test_network_is_blocked():
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1); srv.settimeout(0.2)
    port = srv.getsockname()[1]
    got = []
    def accept():
        try: got.append(srv.accept())
        except OSError: pass
    try:
        r = run(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')")
        accept()
        assert not r.ok and "ConnectionRefusedError" in r.error and got == [], r.error
    finally:
        srv.close()
    r = run("import socket\nprint(socket.gethostbyname('pypi.org'))")
    assert not r.ok and "gaierror" in r.error
    r = run("import urllib.request\nurllib.request.urlopen('http://1.1.1.1', timeout=2)")
    assert not r.ok and ("unreachable" in r.error.lower() or "URLError" in r.error)


# ---------------------------------------------------------------- crashes and exits

def test_ctypes_segfault_is_reported():
    r = run("import ctypes\nctypes.string_at(0)")
    assert not r.ok and "SIGSEGV" in r.error


def test_exit_codes():
    assert run("import sys; sys.exit(0)").ok
    r = run("import sys; sys.exit(3)")
    assert not r.ok and r.error == "SystemExit: exit code 3"
    r = run("raise SystemExit('bye')")
    assert not r.ok and "bye" in r.error and "exit code 1" in r.error
    r = run("import os; os._exit(7)")
    assert not r.ok and "exit code 7" in r.error


def test_stdin_is_closed_and_bad_source_is_an_error():
    r = run("input()")
    assert not r.ok and "EOFError" in r.error
    r = run("def broken(:\n  pass")
    assert not r.ok and "SyntaxError" in r.error
    r = run("print('\\ud800' + 'ok')")                      # a lone surrogate cannot be printed: an error, not a crash
    assert not r.ok and "UnicodeEncodeError" in r.error
    r = run("x = '\ud800'")                                  # a lone surrogate in the source itself
    assert isinstance(r.ok, bool)


def test_nested_user_namespaces_are_disabled():
    r = run("import subprocess\nprint(subprocess.run(['unshare', '-U', 'true'], capture_output=True, text=True).returncode)")
    assert r.ok and r.stdout.strip() != "0"
