"""The README's test command run several times in a row while other processes keep the cores busy.

    python benchmarks/suite_under_load.py                     # 3 runs of `python -m pytest -q -n auto`, 2 busy loops
    python benchmarks/suite_under_load.py --runs 1 -- tests/test_serving.py -q   # any pytest arguments
    python benchmarks/suite_under_load.py --show --command -- python -m pytest -q -s tests/test_fork.py

A verdict must not depend on how fast the machine is that day (issue 63): a test that compares
two timings, or bounds a wait by a figure chosen on a quiet day, passes alone and fails when
the other cores are busy. This starts `--hogs` processes that each spin on one core
(`python -c 'while True: pass'`, each in a process group of its own), runs the command `--runs`
times while they spin, and ends them by their process group (never by a name pattern), also
when it is interrupted. For each run it prints the wall time, the exit status and pytest's last
line; at the end, how much CPU the busy loops had (their share of the run's wall time, from
/proc), so a run that was not loaded is seen as such. Exit status 1 when any run failed.

It takes several runs of the whole suite (about 8 to 12 minutes each here), so it is not in CI.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README_COMMAND = [sys.executable, "-m", "pytest", "-q", "-n", "auto"]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of `pid` so far, from /proc/PID/stat (fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@contextmanager
def busy_cores(count: int) -> Iterator[list[int]]:
    """`count` processes spinning on a core each, ended by their own process group on exit."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(count)
    ]
    try:
        yield [hog.pid for hog in hogs]
    finally:
        for hog in hogs:
            if hog.poll() is None:
                os.killpg(hog.pid, signal.SIGKILL)  # its own group: what this script started, only
            hog.wait()


def interrupted(signum: int, frame: object) -> None:
    """SIGTERM ends the script as Ctrl-C does, so the busy loops are ended on either."""
    raise KeyboardInterrupt


def last_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=2, help="processes that each keep one core busy")
    parser.add_argument(
        "--command", action="store_true", help="the arguments after -- are a whole command, not pytest's"
    )
    parser.add_argument("--show", action="store_true", help="print each run's whole output, passed or not")
    parser.add_argument("rest", nargs="*", help="pytest's arguments (default: the README's -q -n auto)")
    args = parser.parse_args()
    if args.command:
        command = args.rest
    else:
        command = [sys.executable, "-m", "pytest", *args.rest] if args.rest else README_COMMAND
    signal.signal(signal.SIGTERM, interrupted)
    print(f"command: {' '.join(command)}; {args.runs} runs, {args.hogs} busy loops", flush=True)
    failed = 0
    with busy_cores(args.hogs) as hogs:
        hogs_before = [cpu_seconds(pid) for pid in hogs]
        began = time.monotonic()
        for number in range(1, args.runs + 1):
            started = time.monotonic()
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
            took = time.monotonic() - started
            failed += done.returncode != 0
            print(f"run {number}: {took:.0f} s, exit {done.returncode}: {last_line(done.stdout)}", flush=True)
            if done.returncode != 0 or args.show:
                print(done.stdout[-20000:], done.stderr[-5000:], sep="\n", flush=True)
        wall = time.monotonic() - began
        shares = [(cpu_seconds(pid) - before) / wall for pid, before in zip(hogs, hogs_before, strict=True)]
    print(
        f"{args.runs - failed} of {args.runs} runs passed in {wall:.0f} s; the busy loops had "
        + ", ".join(f"{share:.0%}" for share in shares)
        + " of a core each"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
