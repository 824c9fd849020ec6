"""Run the hearth CLI of this tree in a child process and measure what it cost: exit code, output, CPU seconds
and peak resident memory (the child's own rusage from os.wait4), under an address-space cap so that a
regression that allocates gigabytes fails the test instead of the machine.

CPU time rather than wall time is what the tests bound: CI machines are shared, and a child that waits for a
core is not slow itself.  A wall-clock timeout still catches hangs (a FIFO, a 10^9-iteration loop).

Peak memory is the child's own VmHWM (/proc/self/status, per address space), written at exit by a two-line
wrapper around `python -m app`: ru_maxrss from wait4 would not do, because Linux carries the forking parent's
resident size into the child's ru_maxrss across exec (a pytest that has imported torch made every child look
like 290 MiB).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADDRESS_SPACE_CAP = 4 << 30  # bytes of virtual memory the child may map (numpy's thread pools map a lot)
HEADER_CPU_S = 1.0  # issue 16: a header problem costs under 1 s ...
HEADER_RSS_MIB = 256  # ... and 256 MiB


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str
    cpu_s: float  # user + system seconds of the child
    wall_s: float
    maxrss_mib: float  # peak resident set of the child

    def error_lines(self) -> list[str]:
        return self.stderr.strip().splitlines()


_WRAPPER = """
import atexit, os, runpy, sys
def _hwm():
    with open("/proc/self/status") as f, open(os.environ["HEARTH_TEST_HWM_FILE"], "w") as out:
        out.write(next((l.split()[1] for l in f if l.startswith("VmHWM:")), ""))
if os.path.exists("/proc/self/status"):
    atexit.register(_hwm)
sys.argv[0] = "hearth"
runpy.run_module("app", run_name="__main__", alter_sys=True)
"""


def _cap() -> None:  # runs in the child before exec
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_CAP, ADDRESS_SPACE_CAP))


def compiled_tree() -> None:
    """Write the bytecode of hearth's packages (a wheel install has it) so that no measured call compiles them."""
    import compileall

    for package in ("app", "backends", "hwprobe", "kernels"):
        compileall.compile_dir(ROOT / package, quiet=1)


def hearth(*args: str, timeout: float = 30.0, env: dict[str, str] | None = None, stdin: str | None = None) -> CliResult:
    """`python -m app ARGS` with this tree first on the path (HEARTH_HOME comes from the test's environment)."""
    child_env = {**os.environ, "HEARTH_THREADS": "2", **(env or {})}
    # Measured as users run it: an installed hearth (pipx, a wheel) has its bytecode, while these machines set
    # PYTHONDONTWRITEBYTECODE=1, and compiling hearth's ~300 modules from source cost ~0.2-0.3 s of the 1 s
    # header budget in every call (a CI run went over it).  The bytecode is written once (compiled_tree).
    child_env.pop("PYTHONDONTWRITEBYTECODE", None)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryFile() as inp,
        tempfile.NamedTemporaryFile("r") as hwm,
    ):
        child_env["HEARTH_TEST_HWM_FILE"] = hwm.name
        if stdin is not None:
            inp.write(stdin.encode())
            inp.seek(0)
        start = time.perf_counter()
        p = subprocess.Popen(
            [sys.executable, "-c", _WRAPPER, *args],
            stdin=inp,
            stdout=out,
            stderr=err,
            env=child_env,
            cwd=ROOT,
            preexec_fn=_cap,
        )
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > timeout:
                p.kill()
                _, status, usage = os.wait4(p.pid, 0)
                p.returncode = -9
                raise AssertionError(f"hearth {' '.join(args)} ran past {timeout} s (killed)")
            time.sleep(0.005)
        wall = time.perf_counter() - start
        p.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for it again
        out.seek(0)
        err.seek(0)
        peak_kib = hwm.read().strip()
        return CliResult(
            p.returncode,
            out.read().decode(errors="replace"),
            err.read().decode(errors="replace"),
            usage.ru_utime + usage.ru_stime,
            wall,
            int(peak_kib) / 1024 if peak_kib else usage.ru_maxrss / 1024,
        )


def assert_one_line_error(r: CliResult, match: str, *, code: int = 2, cheap: bool = True) -> None:
    """Exit `code`, no traceback, one `hearth: error:` line containing `match` (plus at most its hint line);
    with `cheap`, within the header budget of CPU time and memory."""
    assert r.returncode == code, f"exit {r.returncode}, stderr:\n{r.stderr}"
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.error_lines()
    assert lines and lines[0].startswith("hearth: error: "), r.stderr
    assert match in lines[0], f"{match!r} not in {lines[0]!r}"
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("  hint: ")), r.stderr
    if cheap:
        assert r.cpu_s < HEADER_CPU_S, f"took {r.cpu_s:.2f} s of CPU: {lines[0]}"
        assert r.maxrss_mib < HEADER_RSS_MIB, f"peaked at {r.maxrss_mib:.0f} MiB: {lines[0]}"
