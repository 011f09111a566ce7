"Hostile code against coa_lib.sandbox.run_python: each program must be contained, with a clear error, and leave the host as it was."
import dataclasses, json, os, socket, subprocess, sys, textwrap, threading, time, uuid
from pathlib import Path

import pytest

from coa_lib.sandbox import run_python, sandbox_info, SANDBOX_UID
from procs import live_pids, stat_fields

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
    "Live host processes whose command line contains `marker`."
    return [(pid, _cmdline(pid)) for pid in live_pids(lambda pid: marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes())]


def sandbox_uid_tmp_entries() -> set[str]:
    "Host /tmp and /dev/shm entries owned by the sandbox uid (a sandbox must never create any)."
    out = set()
    for d in ("/tmp", "/dev/shm"):
        if not os.path.isdir(d): continue
        for p in Path(d).iterdir():
            try:
                if p.lstat().st_uid == SANDBOX_UID: out.add(str(p))
            except OSError:
                pass
    return out


def _cmdline(pid: int) -> str:
    try: return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError: return "?"


def procs_in_ns(ns: str) -> list[int]:
    "Live host processes in the pid namespace `ns` ('pid:[4026532...]': namespace inodes read the same inside and outside)."
    return live_pids(lambda pid: os.readlink(f"/proc/{pid}/ns/pid") == ns)


@pytest.fixture(autouse=True)
def host_unchanged(marker):
    "Around every test: no process or file with the marker survives, no host /tmp entry appears for the sandbox uid, the next call works."
    before = sandbox_uid_tmp_entries()
    yield
    assert procs_with(marker) == [], "sandboxed processes outlived run_python"
    assert sandbox_uid_tmp_entries() <= before, "the sandbox created files in the host /tmp or /dev/shm"
    for d in ("/tmp", "/dev/shm", "/etc", "/root", "/var/tmp", str(REPO), str(REPO.parent), "/"):
        if os.path.isdir(d): assert not any(marker in p.name for p in Path(d).iterdir()), f"a file with the marker appeared in {d}"
    r = run_python("print(6 * 7)")                      # the hostile program broke nothing for the calls after it
    assert r.ok and r.stdout == "42\n", r


def run(code: str, **kw):
    t0 = time.monotonic()
    r = run_python(textwrap.dedent(code), **kw)
    dt = time.monotonic() - t0
    assert dt < kw.get("timeout_s", 5.0) + SLACK_S, f"run_python took {dt:.1f} s"
    return r


_NS_LINE = "import os as _os; print('NS', _os.readlink('/proc/self/ns/pid'), flush=True); del _os\n"

def run_tracked(code: str, **kw):
    "`run`, the program first printing its pid namespace: when run_python returns, no process may be left in it. Its stdout without that line."
    r = run(_NS_LINE + textwrap.dedent(code), **kw)
    first, _, rest = r.stdout.partition("\n")
    assert first.startswith("NS pid:["), r.stdout[:300]
    left = procs_in_ns(first[3:])
    assert left == [], f"processes of the sandbox outlived run_python: {[(p, _cmdline(p)) for p in left]}"
    return dataclasses.replace(r, stdout=rest)


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
        assert not r.ok and "PermissionError: [Errno 13]" in r.error and got == [], r.error      # no TCP socket at all
    finally:
        srv.close()
    r = run("import socket\nprint(socket.gethostbyname('pypi.org'))")
    assert not r.ok and "gaierror" in r.error
    r = run("import urllib.request\nurllib.request.urlopen('http://1.1.1.1', timeout=2)")
    assert not r.ok and "URLError" in r.error and "Permission denied" in r.error, r.error


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


# ================================================================ the growing suite (issue 16): one hostile program per case
# Each case is a program a model could write. It must be contained (a clear error, or a harmless result) and, checked by
# `host_unchanged` after every test, leave nothing behind on the host; `run_tracked` also checks that no process is left
# in the sandbox's own pid namespace.

SANDBOX_ENV = {"PATH", "HOME", "LANG", "TMPDIR", "PWD"}


# ---------------------------------------------------------------- reading secrets

@pytest.mark.parametrize("path", ["'/proc/self/environ'", "f'/proc/{os.getppid()}/environ'", "'/proc/1/environ'", "HOST_PID"],
                         ids=["self", "parent", "init", "host_test_pid"])
def test_environ_files_hold_no_host_secret(path, monkeypatch):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("COA_TEST_SECRET_TOKEN", secret)
    path = path.replace("HOST_PID", f"'/proc/{os.getpid()}/environ'")      # the test process's own pid, as the host numbers it
    r = run("""
        import json, os
        try:
            env = open(PATH, 'rb').read()
            print(env.decode(errors='replace')); print(json.dumps([kv.split(b'=')[0].decode() for kv in env.split(b'\\0') if kv]))
        except OSError as e: print('denied', type(e).__name__)
        """.replace("PATH", path))
    assert r.ok and secret not in r.stdout and "COA_TEST" not in r.stdout, r.stdout
    last = r.stdout.splitlines()[-1]
    assert last.startswith("denied") or set(json.loads(last)) <= SANDBOX_ENV, r.stdout


@pytest.mark.parametrize("owner", [0, 1000, SANDBOX_UID])
def test_other_users_files_are_unreachable(owner, marker):
    if os.geteuid() != 0: pytest.skip("planting files of other users needs root")
    secret = f"secret-{uuid.uuid4().hex}"
    f = REPO / f"{marker}.txt"
    f.write_text(secret); os.chown(f, owner, owner); f.chmod(0o644 if owner == SANDBOX_UID else 0o600)
    try:
        r = run(f"""
            import os
            for p in ('{f}', '/proc/1/root{f}', '/proc/self/root{f}', '/proc/2/root{f}', '../../..{f}', '/proc/self/cwd/../..{f}'):
                try: print('READ', open(p).read())
                except OSError as e: print('denied', type(e).__name__)
            """)
        assert r.ok and secret not in r.stdout and "READ" not in r.stdout and r.stdout.count("denied") == 6, r.stdout
    finally:
        f.unlink()


# ---------------------------------------------------------------- writing: /dev/shm, file sizes

def test_dev_shm_is_private_and_gone_afterwards(marker):
    host = Path("/dev/shm", f"{marker}-host")
    host.write_text("host shared memory"); host.chmod(0o666)
    try:
        r = run(f"""
            import os
            print(sorted(os.listdir('/dev/shm')))
            open('/dev/shm/{marker}', 'w').write('from the sandbox')
            open('/dev/shm/{marker}-host', 'w').write('overwritten')
            print(sorted(os.listdir('/dev/shm')))
            """)
        assert r.ok and r.stdout == f"[]\n['{marker}', '{marker}-host']\n", r.observation()   # writable, but its own
        assert host.read_text() == "host shared memory" and not Path("/dev/shm", marker).exists()
        r = run("import os\nprint(os.listdir('/dev/shm'))")
        assert r.ok and r.stdout == "[]\n"                                     # the next sandbox starts with an empty one
    finally:
        host.unlink()


def test_filling_dev_shm_stops_at_its_size():
    r = run("for i in range(100):\n    open(f'/dev/shm/f{i}', 'wb').write(b'x' * (8 << 20))")
    assert not r.ok and "No space left on device" in r.error, r.error


@pytest.mark.parametrize("grow", ["os.truncate(os.open('sparse.bin', os.O_CREAT | os.O_WRONLY), 1 << 34)",
                                  "os.posix_fallocate(os.open('f.bin', os.O_CREAT | os.O_WRONLY), 0, 1 << 30)",
                                  "open('/dev/shm/big.bin', 'wb').write(b'x' * (32 << 20))"], ids=["sparse", "fallocate", "shm"])
def test_file_size_limit_holds_for_sparse_preallocated_and_shm_files(grow):
    r = run(f"import os\n{grow}")
    assert not r.ok and "File too large" in r.error, r.error


@pytest.mark.parametrize("fill", ["for i in range(100):\n    open(f'/tmp/f{i}', 'wb').write(b'x' * (8 << 20))",
                                  "import itertools\nfor i in itertools.count():\n    open(f'/tmp/e{i}', 'w').close()"], ids=["bytes", "inodes"])
def test_a_filled_tmp_is_gone_for_the_next_call(fill):
    r = run(fill, timeout_s=1.0)
    assert not r.ok and ("No space left on device" in r.error or r.timed_out), r.error
    r = run("import os\nst = os.statvfs('/tmp')\nprint(sorted(os.listdir('/tmp')), os.listdir('.'), st.f_bavail * st.f_frsize >> 20)")
    listing, free_mb = r.stdout.rsplit(" ", 1)
    assert r.ok and listing == "['work'] ['main.py']" and int(free_mb) >= 60, r.stdout     # a fresh, empty /tmp


# ---------------------------------------------------------------- unix sockets and the network

def test_unix_sockets_inside_are_socket_pairs_only(marker):
    # socket pairs (asyncio's self-pipe, multiprocessing.Pipe) work; named and abstract sockets cannot be made (a listener's
    # backlog holds its clients' data where no fd counts it: 1.2 GB in 8 s at memory_mb=128 in the issue-27 probe)
    r = run(f"""
        import asyncio, multiprocessing, socket
        a, b = socket.socketpair(); a.sendall(b'ping'); print(b.recv(4).decode())
        async def main(): return 'asyncio'
        print(asyncio.run(main()))
        c, d = multiprocessing.Pipe(); c.send('pipe'); print(d.recv())
        for addr in ('/tmp/{marker}.sock', '\\0{marker}'):
            try: socket.socket(socket.AF_UNIX).bind(addr); print('BOUND', addr)
            except PermissionError as e: print('refused', e.errno)
        """)
    assert r.ok and r.stdout == "ping\nasyncio\npipe\nrefused 13\nrefused 13\n", r.observation()
    probe = socket.socket(socket.AF_UNIX)                    # its socket file stayed in its /tmp (host_unchanged), its name in its netns
    with pytest.raises(OSError): probe.connect(f"\0{marker}")
    probe.close()


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_unix_socket_to_a_host_server_fails(kind, marker):
    addr = f"/tmp/{marker}.sock" if kind == "path" else f"\0{marker}"
    srv = socket.socket(socket.AF_UNIX); srv.bind(addr); srv.listen(1); srv.settimeout(0.2)
    if kind == "path": os.chmod(addr, 0o777)
    try:
        r = run(f"""
            import socket
            s = socket.socket(socket.AF_UNIX); s.settimeout(1)
            s.connect({addr!r}); s.sendall(b'hello host'); print('connected')
            """)
        assert not r.ok and "connected" not in r.stdout, r.observation()
        assert "PermissionError: [Errno 13]" in r.error, r.error
        with pytest.raises(socket.timeout): srv.accept()          # the host server saw no connection
    finally:
        srv.close()
        if kind == "path": os.unlink(addr)


def _host_ip() -> str:
    "This machine's address on its outside interface (no packet is sent)."
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1)); return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


@pytest.mark.parametrize("bind, dial", [("::1", "::1"), ("0.0.0.0", "HOST_IP"), ("0.0.0.0", "0.0.0.0"), ("127.0.0.1", "localhost")])
def test_tcp_to_a_host_server_fails(bind, dial):
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    srv = socket.socket(family)
    try: srv.bind((bind, 0))
    except OSError: srv.close(); pytest.skip(f"this host cannot listen on {bind}")
    srv.listen(1); srv.settimeout(0.2)
    port, dial = srv.getsockname()[1], dial.replace("HOST_IP", _host_ip())
    try:
        r = run(f"import socket\ns = socket.create_connection(({dial!r}, {port}), timeout=1)\ns.sendall(b'hi')\nprint('connected')")
        assert not r.ok and "connected" not in r.stdout, r.observation()
        with pytest.raises(socket.timeout): srv.accept()          # the host server saw no connection
    finally:
        srv.close()


def test_udp_to_a_host_server_is_lost():
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); srv.bind(("0.0.0.0", 0)); srv.settimeout(0.3)
    port = srv.getsockname()[1]
    try:
        r = run(f"""
            import socket
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            for host in ('127.0.0.1', {_host_ip()!r}, '255.255.255.255'):
                try: u.sendto(b'leak', (host, {port})); print('sent', host)
                except OSError as e: print('failed', host, e.errno)
            """)
        assert r.ok and "sent 127.0.0.1" in r.stdout, r.observation()     # the sandbox's own loopback accepts it
        with pytest.raises(socket.timeout): srv.recvfrom(100)                # ... and nothing reaches the host
    finally:
        srv.close()


@pytest.mark.parametrize("kind", ["tcp", "abstract"])
def test_a_sandbox_listener_is_unreachable_from_the_host(kind, marker):
    if kind == "tcp":
        with socket.socket() as s: s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        family, addr = socket.AF_INET, ("127.0.0.1", port)
    else:
        family, addr = socket.AF_UNIX, f"\0{marker}"
    res, reached = [], []
    code = f"""
        import socket, time
        try: s = socket.socket({int(family)}); s.bind({addr!r}); s.listen(8); s.settimeout(1.0)
        except PermissionError as e: print('refused', e.errno, flush=True); time.sleep(1.0); raise SystemExit
        print('listening', flush=True)
        try: s.accept(); print('CONNECTED')
        except socket.timeout: print('no connection')
        """
    t = threading.Thread(target=lambda: res.append(run(code, timeout_s=3.0))); t.start()
    while t.is_alive():                                  # dial it from the host all the time the sandbox listens
        c = socket.socket(family); c.settimeout(0.2)
        try: c.connect(addr); reached.append(addr)
        except OSError: pass
        finally: c.close()
        time.sleep(0.05)
    t.join()
    assert res[0].ok and res[0].stdout == "refused 13\n" and reached == [], (res[0].observation(), reached)


def _dns_query(name: str) -> bytes:
    return b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00\x00\x01\x00\x01"


def _host_nameservers() -> list[str]:
    try: return [l.split()[1] for l in Path("/etc/resolv.conf").read_text().splitlines() if l.startswith("nameserver")][:2]
    except (OSError, IndexError): return []


@pytest.mark.parametrize("lookup", [
    "import socket\nprint(socket.gethostbyname('pypi.org'))",
    "import socket\nprint(socket.getaddrinfo('github.com', 443, proto=socket.IPPROTO_TCP))",
    "import subprocess\nr = subprocess.run(['getent', 'ahosts', 'pypi.org'], capture_output=True, text=True)\nprint(r.stdout)\nraise SystemExit(r.returncode)",
    "RAW_UDP"], ids=["gethostbyname", "getaddrinfo", "getent", "raw_udp"])
def test_dns_lookups_fail(lookup):
    if lookup == "RAW_UDP":                              # a hand-made query to public resolvers and to the host's own
        lookup = textwrap.dedent(f"""
            import socket
            answers = 0
            for ns in {["8.8.8.8", "1.1.1.1", "127.0.0.53", *_host_nameservers()]!r}:
                u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(0.2)
                try: u.sendto({_dns_query("pypi.org")!r}, (ns, 53)); u.recvfrom(512); answers += 1; print('ANSWER from', ns)
                except OSError as e: print(ns, type(e).__name__)
            raise SystemExit(answers == 0)
            """)
    r = run(lookup)
    assert not r.ok and "ANSWER" not in r.stdout, r.observation()
    assert "gaierror" in r.error or "exit code" in r.error, r.error


# ---------------------------------------------------------------- signalling out

@pytest.fixture
def sentinel(marker):
    "A host process with the sandbox's uid (when we are root): what a signal that escaped the sandbox would hit first."
    kw = dict(user=SANDBOX_UID, group=SANDBOX_UID, extra_groups=[]) if os.geteuid() == 0 else {}
    p = subprocess.Popen([sandbox_info().python, "-c", "import time; time.sleep(120)", f"{marker}-sentinel"], start_new_session=True,
                         stdin=subprocess.DEVNULL, **kw)
    time.sleep(0.05)
    yield p
    p.kill(); p.wait()


SIGNAL_PROGRAMS = {   # name -> (program, what the program itself sees)
    "kill_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('alive')", "alive"),   # its init ignores it
    "kill_all": ("import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('alive')", "ProcessLookupError"),     # no one else to kill
    "kill_all_shell": ("import os\nos.system('kill -9 -1; kill -STOP -1')\nprint('alive')", "SIGKILL"),      # the shell kills python
    "killpg_own": ("import os, signal\nos.killpg(0, signal.SIGKILL)", "SIGKILL"),
    "killpg_parent": ("import os, signal\nos.killpg(os.getpgid(os.getppid()), signal.SIGKILL)\nprint('alive')", "ProcessLookupError"),
    "host_pids": ("import os, signal\nfor pid in (TEST_PID, SENTINEL_PID):\n    try: os.kill(pid, signal.SIGKILL); print('sent', pid)\n"
                  "    except OSError as e: print('denied', pid, e.errno)\nprint('alive')", "alive"),   # those pids do not exist in there
    "every_pid": ("import os, signal\nme = os.getpid()\nfor pid in range(2, 1 << 16):\n    if pid != me:\n"
                  "        try: os.kill(pid, signal.SIGKILL)\n        except OSError: pass\nprint('alive')", "alive"),
    "stop_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\nprint('alive')", "alive"),      # ignored too
    "ptrace_parent": ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.ptrace(16, 1, None, None), ctypes.get_errno())",
                      "timeout"),                                     # it can freeze its own init: a hang, which the clock ends
}


@pytest.mark.parametrize("name", list(SIGNAL_PROGRAMS))
def test_signals_from_the_sandbox_reach_no_host_process(name, sentinel):
    code, expect = SIGNAL_PROGRAMS[name]
    r = run_tracked(code.replace("TEST_PID", str(os.getpid())).replace("SENTINEL_PID", str(sentinel.pid)), timeout_s=1.0)
    time.sleep(0.05)
    assert sentinel.poll() is None, "a host process was killed from the sandbox"
    assert stat_fields(sentinel.pid)[0] in "SR", "a host process was stopped"
    if expect == "alive": assert r.ok and r.stdout.endswith("alive\n") and "sent" not in r.stdout, r
    elif expect == "timeout": assert r.timed_out, r
    else: assert not r.ok and not r.timed_out and expect in r.error, r


# ---------------------------------------------------------------- identity and privileges

@pytest.mark.parametrize("call", ["os.setgid(0)", "os.seteuid(0)", "os.setresuid(0, 0, 0)", "os.setresgid(0, 0, 0)", "os.setgroups([0])"])
def test_identity_changes_fail(call):
    r = run(f"""
        import os
        try: {call}; print('ALLOWED')
        except OSError as e: print('denied', e.errno)
        print(os.getresuid(), os.getresgid(), os.getgroups())
        """)
    assert r.ok and r.stdout.startswith("denied") and r.stdout.endswith(f"({SANDBOX_UID}, {SANDBOX_UID}, {SANDBOX_UID}) " * 2 + "[]\n"), r.stdout


@pytest.mark.parametrize("argv", [["su", "-c", "id", "root"], ["mount", "-t", "tmpfs", "none", "/tmp/work"], ["unshare", "-r", "id"]],
                         ids=["su", "mount", "unshare"])
def test_setuid_programs_give_no_privilege(argv):
    r = run(f"import subprocess\nr = subprocess.run({argv!r}, capture_output=True, text=True)\nprint(r.returncode, r.stdout)")
    assert r.ok and not r.stdout.startswith("0 ") and "uid=0" not in r.stdout, r.stdout


@pytest.mark.parametrize("name", ["RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_CORE"])
def test_rlimits_cannot_be_raised_from_inside(name):
    r = run(f"""
        import resource as R
        before = R.getrlimit(R.{name})
        for new in ((R.RLIM_INFINITY, R.RLIM_INFINITY), (before[1] + 1, before[1] + 1), (before[1], R.RLIM_INFINITY)):
            try: R.setrlimit(R.{name}, new); print('RAISED', new)
            except ValueError as e: print('denied:', e)
        print(R.getrlimit(R.{name}) == before, before[1] != R.RLIM_INFINITY)
        """)
    assert r.ok and "RAISED" not in r.stdout and r.stdout.endswith("True True\n"), r.stdout


def test_rlimits_cannot_be_raised_by_a_shell():
    r = run("import subprocess\nsubprocess.run(['bash', '-c', 'ulimit -u unlimited && echo RAISED; prlimit --pid $$ --nofile=4096:4096 && echo RAISED; ulimit -Hu'])")
    assert r.ok and "RAISED" not in r.stdout and r.stdout.strip().splitlines()[-1] == "16", r.stdout


# ---------------------------------------------------------------- ctypes: libc and raw system calls

CTYPES_CALLS = {       # call -> errnos it may fail with (it must fail)
    "setrlimit_nproc": ("libc.setrlimit(R.RLIMIT_NPROC, ctypes.byref((ctypes.c_ulong * 2)(1 << 20, 1 << 20)))", {1}),
    "syscall_setuid": ("libc.syscall({'x86_64': 105, 'aarch64': 146}[platform.machine()], 0)", {1, 22}),
    "unshare_user": ("libc.unshare(0x10000000)", {1, 22, 28}),                 # CLONE_NEWUSER: --disable-userns
    "mount": ("libc.mount(b'none', b'/tmp/work', b'tmpfs', 0, None)", {1}),
    "chroot": ("libc.chroot(b'/tmp')", {1}),
    "sethostname": ("libc.sethostname(b'pwned', 5)", {1}),
    # the kernel objects RLIMIT_AS does not count are switched off (seccomp), also through another ABI's numbers (x32)
    "shmget": ("libc.shmget(0, 1 << 20, 0o1600)", {38}),
    "msgget": ("libc.msgget(0, 0o1600)", {38}),
    "semget": ("libc.semget(0, 1, 0o1600)", {38}),
    "memfd_create": ("libc.syscall({'x86_64': 319, 'aarch64': 279}[platform.machine()], b'x', 0)", {38}),
    "x32_shmget": ("libc.syscall({'x86_64': 0x40000000 | 29, 'aarch64': 194}[platform.machine()], 0, 1 << 20, 0o1600)", {38}),
}


@pytest.mark.parametrize("name", list(CTYPES_CALLS))
def test_ctypes_libc_calls_fail(name):
    call, errnos = CTYPES_CALLS[name]
    r = run(f"""
        import ctypes, platform, resource as R, socket
        libc = ctypes.CDLL(None, use_errno=True)
        before = R.getrlimit(R.RLIMIT_NPROC)
        print({call}, ctypes.get_errno(), R.getrlimit(R.RLIMIT_NPROC) == before, socket.gethostname())
        """)
    ret, err, same, host = r.stdout.split()
    assert r.ok and ret == "-1" and int(err) in errnos and same == "True" and host == "sandbox", r.stdout


I386_SHMGET = """
import ctypes, mmap
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(bytes([0x53, 0xb8]) + (395).to_bytes(4, 'little') + bytes([0x31, 0xdb, 0xb9]) + (1 << 20).to_bytes(4, 'little')
        + bytes([0xba]) + (0o1600).to_bytes(4, 'little') + bytes([0xcd, 0x80, 0x5b, 0xc3]))
# push rbx; mov eax, 395 (i386 shmget); xor ebx, ebx; mov ecx, 1 MB; mov edx, 0o1600; int 0x80; pop rbx; ret
print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))())
"""


def test_the_32_bit_abi_cannot_sidestep_the_filter():
    if os.uname().machine != "x86_64": pytest.skip("int 0x80 is x86-64's door to the i386 system calls")
    r = run(I386_SHMGET)
    # -38 (ENOSYS) from the filter, or a crash where the kernel has no i386 emulation; a segment id (>= 0) is an escape
    assert (r.ok and r.stdout == "-38\n") or (not r.ok and "SIGSEGV" in r.error), r.observation()


# ---------------------------------------------------------------- process and thread bombs

@pytest.mark.parametrize("bomb", [
    "import multiprocessing as mp, time\nwhile True:\n    mp.Process(target=time.sleep, args=(30,)).start()",   # then joins them
    "import multiprocessing as mp\nwith mp.Pool(200) as pool:\n    print(pool.map(abs, range(10)))",
    "import subprocess, time\nsubprocess.Popen(['bash', '-c', ':(){ :|:& };:'])\ntime.sleep(30)",
    "import subprocess, time\nsubprocess.Popen(['sh', '-c', 'b(){ b|b& }; b'])\ntime.sleep(30)",
    "import os\nos.system(\"bash -c ':(){ :|:& };:' &\")\nprint('left it running')"],
    ids=["multiprocessing_processes", "multiprocessing_pool", "bash_classic", "sh_named", "bash_detached"])
def test_fork_bombs_are_contained(bomb):
    r = run_tracked(bomb, timeout_s=1.0)
    if "left it running" in bomb:                        # the program exits at once: its bomb dies with the sandbox
        assert r.ok and r.stdout == "left it running\n" and r.seconds < 1.0, r
    elif "multiprocessing" in bomb:                      # the process limit stops it, or the fd limit (two pipes a process)
        assert not r.ok and ("BlockingIOError: [Errno 11] Resource temporarily unavailable" in r.stderr
                             or "OSError: [Errno 24] Too many open files" in r.stderr), r
    else:                                                # the shell keeps retrying its forks: the clock stops it
        assert r.timed_out, r


@pytest.mark.parametrize("spin", [
    "import threading\ndef spin():\n    while True: pass\nfor _ in range(8): threading.Thread(target=spin, daemon=True).start()\nspin()",
    "import threading\ndef spin():\n    while True: pass\nfor _ in range(8): threading.Thread(target=spin).start()\nprint('main done')"],
    ids=["daemon_threads", "threads_outliving_main"])
def test_spinning_threads_are_stopped(spin):
    r = run_tracked(spin, timeout_s=1.0)
    assert not r.ok and (r.timed_out or "SIGXCPU" in r.error), r


# ---------------------------------------------------------------- memory

@pytest.mark.parametrize("hog", [
    "import numpy\nnumpy.ones(10 ** 10)",
    "import mmap\nm = mmap.mmap(-1, 8 << 30)",
    "s = 'x' * 10 ** 10",
    "import time\nheld = []\nwhile True:\n    held.append(bytearray(1 << 20)); time.sleep(0.002)",      # slow growth
    "import os\nheld = []\nwhile True:\n    held.append(os.urandom(1 << 20))"],
    ids=["numpy_huge", "mmap_8gb", "string_10gb", "slow_growth", "bytes_growth"])
def test_memory_hogs_hit_the_limit(hog):
    r = run(hog, memory_mb=128, timeout_s=3.0)
    assert not r.ok and not r.timed_out and ("MemoryError" in r.error or "Cannot allocate memory" in r.error), r.error


SHM_HOG = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype, libc.shmat.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
held = 0
for i in range(4):                                     # 4 x 64 MB, each touched, then detached: kept by the kernel
    sid = libc.shmget(0, 64 << 20, 0o1600)
    if sid < 0: raise OSError(ctypes.get_errno(), 'shmget failed')
    p = libc.shmat(sid, None, 0)
    if p in (None, 2 ** 64 - 1): raise OSError(ctypes.get_errno(), 'shmat failed')
    ctypes.memset(p, 1, 64 << 20); libc.shmdt(p); held += 64
print('held', held, 'MB')
"""

MEMFD_HOG = """
import os
held = []
for i in range(12):                                    # 12 x 16 MB in memory files, none of it mapped
    fd = os.memfd_create(f'hog{i}'); os.write(fd, b'x' * (16 << 20)); held.append(fd)
print('held', 16 * len(held), 'MB')
"""


@pytest.mark.parametrize("hog", [SHM_HOG, MEMFD_HOG], ids=["sysv_shm", "memfd"])
def test_memory_outside_the_address_space_is_bounded(hog):
    # memory that RLIMIT_AS does not count (SysV segments, memory files) must not let a sandbox hold more than its limit
    r = run_tracked(hog, memory_mb=128, timeout_s=3.0)
    assert not r.ok and "held" not in r.stdout, r.observation()


# ---------------------------------------------------------------- output

@pytest.mark.parametrize("flood", [
    "import sys\nsys.stdout.write('x' * 10_000_000)",
    "import sys\nsys.stderr.write('e' * 10_000_000)",
    "import os\nos.write(1, b'x' * 10_000_000)",
    "import os\nos.system('yes xxxxxxxxx | head -c 10000000')",
    "import os\nfor _ in range(4):\n    if os.fork() == 0: break\nfor _ in range(2_500): print('z' * 1000)"],     # 5 processes, 2.5 MB each
    ids=["stdout", "stderr", "os_write", "shell_child", "five_processes"])
def test_ten_megabytes_of_output_are_cut(flood):
    r = run_tracked(flood, timeout_s=3.0)
    assert not r.ok and r.error.startswith("OutputLimitError"), r.error
    assert len(r.stdout) < 10_000 and len(r.stderr) < 10_000 and r.seconds < 3.0


# ---------------------------------------------------------------- programs that ignore signals

@pytest.mark.parametrize("stubborn", [
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)",
    "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nsignal.setitimer(signal.ITIMER_REAL, 0.1, 0.1)\ntime.sleep(60)",
    "import signal, time\nfor s in signal.valid_signals():\n    try: signal.signal(s, signal.SIG_IGN)\n    except (OSError, ValueError): pass\ntime.sleep(60)",
    "import subprocess\nsubprocess.run(['sh', '-c', \"trap '' TERM INT HUP ALRM QUIT USR1; sleep 60 & wait\"])",
    "import os, signal, time\nif os.fork() == 0:\n    os.setsid()\n    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT): signal.signal(s, signal.SIG_IGN)\n    time.sleep(60)\nos.wait()"],
    ids=["sigterm", "sigalrm_timer", "all_signals", "shell_trap", "child_own_session"])
def test_programs_ignoring_signals_are_stopped_at_the_timeout(stubborn):
    r = run_tracked(stubborn, timeout_s=1.0)
    assert r.timed_out and r.error == "TimeoutError: code ran longer than 1 s and was stopped", r


# ---------------------------------------------------------------- symlink escapes

@pytest.mark.parametrize("target", ["/proc/1/root{f}", "{f}", "/proc/self/root/../..{f}", "/proc/1/cwd/../../..{f}", "{repo}", "/etc"],
                         ids=["proc_1_root", "host_file", "proc_self_root_dotdot", "proc_1_cwd_dotdot", "repo_dir", "etc"])
def test_symlink_escapes_reach_no_host_file(target, marker):
    secret = f"secret-{uuid.uuid4().hex}"
    f = REPO / f"{marker}.txt"
    f.write_text(secret); f.chmod(0o644)
    target = target.format(f=f, repo=REPO)
    try:
        r = run(f"""
            import os
            os.symlink({target!r}, '/tmp/{marker}'); os.symlink({target!r}, 'link')
            for p in ('/tmp/{marker}', 'link', 'link/{f.name}', 'link/passwd', 'link/shadow', 'link/hostname'):
                try: print('READ', p, open(p).read())
                except OSError as e: print('denied', p, type(e).__name__)
            try: open('link/{marker}-written.txt', 'w').write('pwned'); print('WROTE')
            except OSError as e: print('denied write', type(e).__name__)
            """)
        assert r.ok and secret not in r.stdout and "READ" not in r.stdout and "WROTE" not in r.stdout, r.stdout
        assert f.read_text() == secret and not (REPO / f"{marker}-written.txt").exists()
    finally:
        f.unlink()


def test_hard_links_and_bind_tricks_fail(marker):
    r = run(f"""
        import os, subprocess
        for f in (lambda: os.link('/usr/bin/python3', 'py'), lambda: os.link('/proc/1/exe', 'init'),
                  lambda: os.rename('/usr/bin/python3', '/tmp/work/py'), lambda: os.symlink('/tmp/work', '/usr/{marker}')):
            try: f(); print('ALLOWED')
            except OSError as e: print('denied', e.errno)
        """)
    assert r.ok and "ALLOWED" not in r.stdout and r.stdout.count("denied") == 4, r.stdout
    assert not Path("/usr", marker).exists()


# ================================================================ issue 27: keyrings, socket buffers, exit status, set-up spoofing

# ---------------------------------------------------------------- the kernel's key store

KEY_CALLS = """
import ctypes, platform
ADD_KEY, REQUEST_KEY, KEYCTL = {'x86_64': (248, 249, 250), 'aarch64': (217, 218, 219)}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long
def call(*a):
    r = libc.syscall(*[ctypes.c_long(x) if isinstance(x, int) else x for x in a]); return r, ctypes.get_errno() if r < 0 else 0
"""
SESSION, USER, USER_SESSION = -3, -4, -5          # KEY_SPEC_*_KEYRING

KEYRING_CALLER = KEY_CALLS + """
import json, sys
from coa_lib.sandbox import run_python
marker, secret, inside, later = sys.argv[1], sys.argv[2].encode(), sys.argv[3], sys.argv[4]
assert call(KEYCTL, 1, None)[0] > 0                # KEYCTL_JOIN_SESSION_KEYRING: a fresh session keyring, ours alone
assert call(ADD_KEY, b'user', f'{marker}-secret'.encode(), secret, len(secret), -3)[0] > 0
r1, r2 = run_python(inside), run_python(later)
seen = call(KEYCTL, 10, -3, b'user', f'{marker}-planted'.encode(), 0)     # KEYCTL_SEARCH the caller's session keyring
print(json.dumps({'inside': r1.stdout + (r1.error or ''), 'later': r2.stdout + (r2.error or ''), 'caller_sees_planted': seen}))
"""


def test_the_callers_keyring_is_out_of_reach_both_ways(marker):
    # a secret in the caller's session keyring (inherited across the change of user) must not be readable inside, and a key
    # planted inside must reach neither the caller nor a later run: the key system calls do not exist in the sandbox
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    inside = KEY_CALLS + textwrap.dedent(f"""
        kid = call(KEYCTL, 10, {SESSION}, b'user', b'{marker}-secret', 0)                 # KEYCTL_SEARCH
        buf = ctypes.create_string_buffer(256)
        got = call(KEYCTL, 11, kid[0], buf, 256) if kid[0] > 0 else kid                   # KEYCTL_READ
        print('search', *kid, 'read', *got, buf.value.decode(errors='replace'))
        print('request', *call(REQUEST_KEY, b'user', b'{marker}-secret', None, 0))
        for ring in ({SESSION}, {USER}, {USER_SESSION}):
            print('plant', ring, *call(ADD_KEY, b'user', b'{marker}-planted', b'evil', 4, ring))
        """)
    later = KEY_CALLS + textwrap.dedent(f"""
        for ring in ({SESSION}, {USER}, {USER_SESSION}): print('later', ring, *call(KEYCTL, 10, ring, b'user', b'{marker}-planted', 0))
        """)
    p = subprocess.run([sys.executable, "-c", KEYRING_CALLER, marker, secret, inside, later], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert secret not in out["inside"], out["inside"]
    assert out["inside"].splitlines() == ["search -1 38 read -1 38 ", "request -1 38",                   # every call: ENOSYS
                                          f"plant {SESSION} -1 38", f"plant {USER} -1 38", f"plant {USER_SESSION} -1 38"], out["inside"]
    assert out["caller_sees_planted"][0] == -1, out                                    # not in the caller's session keyring
    assert out["later"].count(" -1 38") == 3, out["later"]                              # nor anywhere a later run looks


# ---------------------------------------------------------------- sockets: families and buffer sizes

SOCKETS = {   # name -> (what the program makes, errno: 0 = allowed)
    "vsock": ("socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)", 13),       # vsock is not isolated by the network namespace
    "unix_stream": ("socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)", 13),
    "unix_dgram": ("socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)", 13),
    "tcp": ("socket.socket(socket.AF_INET, socket.SOCK_STREAM)", 13),
    "tcp6": ("socket.socket(socket.AF_INET6, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)", 13),
    "netlink": ("socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)", 13),
    "alg": ("socket.socket(socket.AF_ALG, socket.SOCK_SEQPACKET, 0)", 13),
    "packet": ("socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, 0)", 13),
    "udp_l2tp": ("socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 115)", 13),  # a datagram socket of another protocol
    "socketpair_dgram": ("socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)", 13),
    "udp": ("socket.socket(socket.AF_INET, socket.SOCK_DGRAM)", 0),
    "udp6": ("socket.socket(socket.AF_INET6, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, socket.IPPROTO_UDP)", 0),
    "socketpair": ("socket.socketpair()", 0),
}


@pytest.mark.parametrize("name", list(SOCKETS))
def test_only_socket_pairs_and_udp_can_be_made(name):
    make, errno_ = SOCKETS[name]
    r = run(f"import socket\ntry: {make}; print('made')\nexcept OSError as e: print('refused', e.errno)")
    assert r.ok and r.stdout == ("made\n" if errno_ == 0 else f"refused {errno_}\n"), r.observation()


@pytest.mark.parametrize("call, errno_", [
    ("socket.socketpair()[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 26)", 1),
    ("socket.socketpair()[0].setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 26)", 1),
    ("socket.socket(socket.AF_INET, socket.SOCK_DGRAM).setsockopt(socket.SOL_SOCKET, 32, 1 << 26)", 1),     # SO_SNDBUFFORCE
    ("fcntl.fcntl(os.pipe()[1], 1031, 1 << 20)", 1),                                                         # F_SETPIPE_SZ
    ("(ctypes.CDLL(None, use_errno=True).syscall(425, 8, ctypes.create_string_buffer(120)), ctypes.get_errno())", 38),
    ("socket.socketpair()[0].setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)", 0)],
    ids=["so_sndbuf", "so_rcvbuf", "so_sndbufforce", "f_setpipe_sz", "io_uring_setup", "so_keepalive"])
def test_buffer_sizes_cannot_be_raised(call, errno_):
    # io_uring would make sockets and set their options where the filter cannot see the arguments: it does not exist
    r = run(f"import ctypes, fcntl, os, socket\ntry: print('ret', {call})\nexcept OSError as e: print('refused', e.errno)")
    want = {0: "ret None\n", 1: "refused 1\n", 38: "ret (-1, 38)\n"}[errno_]
    assert r.ok and r.stdout == want, r.observation()


BUFFER_HOG = """
import os, socket, sys, time
KIND, CAP = {kind!r}, {cap}                     # CAP: a process stops at this many bytes (the old sandbox had no bound)
def fill(s):
    n = 0
    s.setblocking(False)
    for size in (106_368, 65_536, 4096, 1):      # the largest skb a unix stream socket takes first, then smaller ones
        while n < CAP:
            try: n += s.send(b'x' * size)
            except OSError: break
    return n
def hog():
    held, keep = 0, []
    try:
        for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):      # ask for 64 MB buffers first
            try: socket.setdefaulttimeout(None); a, b = socket.socketpair(); a.setsockopt(socket.SOL_SOCKET, opt, 1 << 26); a.close(); b.close()
            except OSError: pass
        while held < CAP:
            if KIND == 'socketpairs':
                a, b = socket.socketpair()
                for s in (a, b):
                    try: s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 26)
                    except OSError: pass
                held += fill(a) + fill(b); keep += [a, b]
            elif KIND == 'closed_peers':            # the data of a closed peer waits in the survivor
                a, b = socket.socketpair(); held += fill(a); a.close(); keep.append(b)
            elif KIND == 'listener_backlog':        # clients connect, fill and close: their data waits in the backlog
                srv = socket.socket(socket.AF_UNIX); srv.bind(f'\\0hog{{os.getpid()}}-{{len(keep)}}'); srv.listen(4096); keep.append(srv)
                for _ in range(4096):
                    c = socket.socket(socket.AF_UNIX); c.setblocking(False)
                    try: c.connect(srv.getsockname())
                    except OSError: c.close(); break
                    held += fill(c); c.close()
                    if held >= CAP: break
            elif KIND == 'tcp':
                srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(64); keep.append(srv)
                c = socket.create_connection(srv.getsockname()); s, _ = srv.accept(); keep += [c, s]
                for _ in range(20):
                    held += fill(c) + fill(s); time.sleep(0.005)
            elif KIND == 'udp':
                u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(('127.0.0.1', 0)); keep.append(u)
                for _ in range(8): u.sendto(b'x' * 60_000, u.getsockname())
                held += int.from_bytes(u.getsockopt(socket.SOL_SOCKET, 55, 36)[:4], sys.byteorder)   # SO_MEMINFO: receive queue
            elif KIND == 'pipes':
                r, w = os.pipe(); os.set_blocking(w, False)
                try:
                    import fcntl; fcntl.fcntl(w, 1031, 1 << 20)          # F_SETPIPE_SZ: 1 MB pipes
                except OSError: pass
                while held < CAP:
                    try: held += os.write(w, b'x' * 4096)
                    except OSError: break
                os.close(w); keep.append(r)
    except OSError as e:
        return held, e.errno
    return held, 0
report_r, report_w = os.pipe()
kids = 0
for _ in range(16):                              # as many processes as the sandbox allows, each filling every fd it may open
    try: pid = os.fork()
    except OSError: break
    if pid == 0:
        os.close(report_r); held, err = hog(); os.write(report_w, f'{{held}} {{err}}\\n'.encode()); os.close(report_w)
        time.sleep(30); os._exit(0)
    kids += 1
os.close(report_w)
held, err = hog()
with os.fdopen(report_r) as f: reports = [l.split() for l in f.read().splitlines()][:kids]   # every child holds its buffers now
total = held + sum(int(h) for h, _ in reports)
print(kids + 1, 'processes', sorted({{err, *(int(e) for _, e in reports)}}), 'held MB', round(total / 2 ** 20, 1))
os._exit(0)
"""


@pytest.mark.parametrize("kind", ["socketpairs", "closed_peers", "listener_backlog", "tcp", "udp", "pipes"])
def test_socket_and_pipe_buffers_are_bounded(kind):
    # kernel buffers are memory RLIMIT_AS does not count: in the issue-27 probe socket pairs held 300 MB (one process here:
    # 470 MB with 64 MB SO_SNDBUF), a listener's backlog 1.2 GB, loopback TCP 223 MB, all at memory_mb=128. Now only socket
    # pairs and UDP exist, at the default buffer size, and a process has 32 fds: the whole sandbox stays under its memory limit.
    r = run_tracked(BUFFER_HOG.format(kind=kind, cap=24 << 20), memory_mb=128, timeout_s=10.0)
    assert r.ok, r.observation()
    words = r.stdout.split()
    assert int(words[0]) >= 12, r.stdout                   # it did run as many processes
    assert float(words[-1]) < 128, r.stdout                 # ... and together they hold less than one process's limit


# ---------------------------------------------------------------- the program's own exit status

@pytest.mark.parametrize("code, error", [
    ("import sys; sys.exit(137)", "SystemExit: exit code 137"),
    ("raise SystemExit(139)", "SystemExit: exit code 139"),
    ("import os; os._exit(137)", "SystemExit: exit code 137"),
    ("import ctypes; ctypes.CDLL(None)._exit(143)", "SystemExit: exit code 143"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "Crashed: the process died with SIGKILL ("),
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", "Crashed: the process died with SIGTERM (")],
    ids=["sys_exit_137", "system_exit_139", "os_exit_137", "libc_exit_143", "sigkill", "sigterm"])
def test_exit_codes_are_told_from_signals(code, error):
    # bwrap exits with 128 + N both for exit code 128 + N and for death by signal N: the sandbox's pid 1 records which it was
    r = run(code)
    assert not r.ok and r.error.startswith(error) and (error.endswith("(") or r.error == error), r.error


# ---------------------------------------------------------------- the sandbox's own failure cannot be faked

BWRAP_SPOOFS = [
    "import sys\nsys.stderr.write(\"bwrap: Can't find source path /usr/bin/python3: No such file or directory\\n\")\nsys.exit(1)",
    "import os\nos.write(2, b'bwrap: execvp /usr/bin/python3: No such file or directory\\n')\nos._exit(1)",
    "import os, sys\nos.close(1)\nsys.stderr.write('bwrap: setting up uid map: Permission denied\\n')\nos.kill(os.getpid(), 9)",
    "import os\nos.write(2, b'bwrap: Creating new namespace failed\\n')\nos.close(0); os.close(1); os.close(2)\nos._exit(1)",
]


@pytest.mark.parametrize("code", BWRAP_SPOOFS, ids=["stderr_exit_1", "os_write_os_exit", "no_stdout_sigkill", "all_closed"])
def test_a_program_cannot_pass_for_a_broken_sandbox(code):
    # the bootstrap writes `R` on a status pipe before the program starts: a run without it is the sandbox's own failure,
    # whatever the program printed, and a run with it never is
    r = run(code)
    assert not r.ok and not r.error.startswith("SandboxError") and not r.sandbox_failed, r
    assert "bwrap: " in r.error and ("exit code 1" in r.error or "SIGKILL" in r.error), r.error


@pytest.mark.parametrize("python", ["/nonexistent/python3", "/bin/false"], ids=["missing_interpreter", "not_our_bootstrap"])
def test_a_real_set_up_failure_is_still_the_sandboxs(python):
    import coa_lib.sandbox as S
    info = sandbox_info()
    r = S._run_sandboxed("print(1)", S.SandboxLimits(), info.bwrap, python)
    assert not r.ok and r.sandbox_failed and r.error.startswith("SandboxError: bwrap failed to set up the sandbox"), r
