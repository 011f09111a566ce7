"The host's process table for tests that check what a run left behind (a /proc scan, no psutil)."
import os
from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    "The fields of /proc/PID/stat after the command name (state, ppid, pgrp, ...), or None once the process is gone."
    try: return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError): return None


def is_live(pid: int) -> bool:
    "The process exists and is not a zombie."
    f = stat_fields(pid)
    return f is not None and f[0] != "Z"


def live_pids(where=lambda pid: True) -> list[int]:
    "Live host processes for which `where(pid)` holds (it may raise OSError for a process that just went)."
    out = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if where(int(p)) and is_live(int(p)): out.append(int(p))
        except OSError:
            continue
    return out
