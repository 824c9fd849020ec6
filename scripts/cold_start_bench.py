"""Cold start as the user sees it (issue 24 item 2): whole-process wall time and peak RSS of
`hearth run --backend B --max-tokens 1 hi`, llama.cpp against the torch engine with an empty prepared-weight
cache (its first start on a model) and with a filled one (every later start).

Each round runs, back to back: torch with the cache emptied ("cold cache"), torch again ("warm cache"),
llama.cpp; rounds interleave, so on a shared machine the three compare runs made within the same minute.
Peak RSS is the largest process of the run (os.wait4's ru_maxrss: hearth's own process or its runner child,
whichever peaked higher), as `/usr/bin/time -v` reports it; CPU seconds are user + system of all of them
(steadier than wall time on a shared machine, but not what the user waits for).  Target: torch (warm) within
1.5x of llama.cpp's median wall time; the script reports, it never fails on speed (figures belong to the
machine: docs/torch-engine.md "Cold start").

Every start but "resident" runs with --keep-alive 0 (a new runner each time: the cold start proper).
"resident" is what a later `hearth run` meets within --keep-alive (default 5m) of an earlier one with the same
model and plan (backends/runner/resident.py): one unmeasured run leaves its runner loaded, the measured run
answers from it, `hearth stop` ends it.  Its peak RSS is hearth's own process (the runner is not its child).

    python scripts/cold_start_bench.py                       # starter model, 5 rounds
    python scripts/cold_start_bench.py --rounds 3 --json out.json --model PATH
    python scripts/cold_start_bench.py --baseline /path/to/other/checkout   # + its torch engine, same rounds
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = (
    ("torch", "cold cache"),
    ("torch", "warm cache"),
    ("llama.cpp", ""),
    ("torch", "resident"),
    ("llama.cpp", "resident"),
)


def run_once(cmd: list[str], env: dict[str, str], cwd: str | None = None) -> tuple[float, float, int, int]:
    """(wall seconds, CPU seconds, peak RSS in bytes, exit status) of one whole process and its children."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode:
        print(f"  exit {proc.returncode}: {err.strip().splitlines()[-1:] or ''}", file=sys.stderr)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, proc.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", default=None, help="model name or path (default: the starter)")
    ap.add_argument("--prompt", default="hi")
    ap.add_argument("--json", default=None, help="also write the runs and the table here")
    ap.add_argument(
        "--baseline",
        default=None,
        metavar="CHECKOUT",
        help="also run the torch engine of another hearth checkout (its .venv), in the same rounds: before vs after",
    )
    args = ap.parse_args(argv)

    from app.paths import get_paths

    weights = get_paths().cache_dir / "weights"  # where the app points the torch engine's cache (app/loading.py)
    base = [sys.executable, "-m", "app", "run", "--max-tokens", "1"]
    if args.model:
        base += ["--model", args.model]
    env = dict(os.environ)
    kinds = KINDS + ((("torch", "baseline"),) if args.baseline else ())
    runs: list[dict] = []
    for r in range(args.rounds):
        for backend, cache in kinds:
            if cache == "cold cache":
                shutil.rmtree(weights, ignore_errors=True)
            cmd, cwd = [*base, "--backend", backend, args.prompt], None
            if cache == "baseline":
                cwd = str(Path(args.baseline).resolve())
                cmd[0] = str(Path(cwd) / ".venv" / "bin" / "python")
            run_env = env | {"HEARTH_KEEP_ALIVE": "60s" if cache == "resident" else "0"}
            if cache == "resident":
                run_once(cmd, run_env, cwd)  # leaves its runner loaded
            wall, cpu, rss, rc = run_once(cmd, run_env, cwd)
            if cache == "resident":
                subprocess.run([sys.executable, "-m", "app", "stop"], env=env, stdout=subprocess.DEVNULL, check=False)
            run = {"round": r, "backend": backend, "cache": cache, "wall_s": wall, "cpu_s": cpu, "peak_rss": rss}
            runs.append(run | {"rc": rc})
            print(
                f"round {r + 1}: {backend:9} {cache:10} {wall:6.2f} s wall {cpu:6.2f} s CPU {rss / 2**20:7.0f} MiB",
                file=sys.stderr,
            )

    rows = []
    for backend, cache in kinds:
        mine = [x for x in runs if x["backend"] == backend and x["cache"] == cache and x["rc"] == 0]
        if not mine:
            continue
        walls = [x["wall_s"] for x in mine]
        rows.append(
            {
                "backend": backend,
                "cache": cache,
                "runs": len(mine),
                "wall_median_s": statistics.median(walls),
                "wall_min_s": min(walls),
                "wall_max_s": max(walls),
                "cpu_median_s": statistics.median(x["cpu_s"] for x in mine),
                "peak_rss_median_mib": statistics.median(x["peak_rss"] for x in mine) / 2**20,
            }
        )
    llama = next((x for x in rows if x["backend"] == "llama.cpp"), None)
    print(
        f"{'engine':10} {'cache':10} {'runs':>4} {'median s':>9} {'min-max s':>13} {'CPU s':>6} {'peak RSS':>9} "
        f"{'vs llama':>8}"
    )
    for x in rows:
        ratio = f"{x['wall_median_s'] / llama['wall_median_s']:.2f}x" if llama else "-"
        print(
            f"{x['backend']:10} {x['cache'] or '-':10} {x['runs']:>4} {x['wall_median_s']:>9.2f} "
            f"{x['wall_min_s']:>6.2f}-{x['wall_max_s']:<6.2f} {x['cpu_median_s']:>6.2f} "
            f"{x['peak_rss_median_mib']:>5.0f} MiB {ratio:>8}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": runs, "rows": rows}, indent=2))
    return 0 if all(x["rc"] == 0 for x in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
