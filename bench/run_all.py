"""Runs every benchmark script in bench/ (each in its own subprocess, with a timeout) and prints
their summary tables at the end.

A script's summary is what follows its last line starting with "=== summary" if it prints one,
else its last paragraph (after the last blank line). Full outputs are saved to
`--log-dir` (default runs/bench/, git-ignored). Scripts run one after the other: they time themselves, and
two benchmarks at once would measure each other. The load average is printed before each.

Usage: python bench/run_all.py [--only mlm_step,masking] [--timeout 3600] [--list]
Extra arguments per script: `EXTRA_ARGS` below (e.g. every backend for the MLM step).
Not a test: numbers depend on the machine and its load.
"""
import argparse
import glob
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Arguments each script gets from the runner (the scripts' own defaults otherwise).
EXTRA_ARGS = {
    "bench_mlm_step.py": ["--backend", "all"],
}
# Per-script timeout in seconds (default: --timeout).
TIMEOUTS = {
    "bench_mlm_step.py": 3 * 1800,
}


def summary(stdout):
    lines = stdout.rstrip().splitlines()
    marks = [i for i, line in enumerate(lines) if line.startswith("=== summary")]
    if marks:
        return "\n".join(lines[marks[-1]:])
    blanks = [i for i, line in enumerate(lines) if not line.strip()]
    return "\n".join(lines[blanks[-1] + 1:] if blanks else lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None,
                        help="comma list of script names, with or without bench_ / .py")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per script")
    parser.add_argument("--log-dir", default=os.path.join(HERE, "..", "runs", "bench"))
    parser.add_argument("--list", action="store_true", help="list the scripts and exit")
    args = parser.parse_args()

    scripts = sorted(glob.glob(os.path.join(HERE, "bench_*.py")))
    if args.only:
        wanted = {n.strip().removeprefix("bench_").removesuffix(".py")
                  for n in args.only.split(",")}
        scripts = [s for s in scripts
                   if os.path.basename(s)[len("bench_"):-len(".py")] in wanted]
    if args.list:
        print("\n".join(os.path.basename(s) for s in scripts))
        return 0
    os.makedirs(args.log_dir, exist_ok=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.setdefault("KERAS_BACKEND", "tensorflow")

    results = []
    for script in scripts:
        name = os.path.basename(script)
        cmd = [sys.executable, script] + EXTRA_ARGS.get(name, [])
        timeout = TIMEOUTS.get(name, args.timeout)
        load = os.getloadavg()[0]
        print(f"--- {name} (load average {load:.1f}, timeout {timeout:.0f} s): "
              f"{' '.join(cmd[1:])}", flush=True)
        start = time.perf_counter()
        # Own process group, so that a timeout also ends the script's own subprocesses.
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
            status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            status = f"timeout after {timeout:.0f} s"
        elapsed = time.perf_counter() - start
        log = os.path.join(args.log_dir, name[:-3] + ".log")
        with open(log, "w") as f:
            f.write(stdout + "\n--- stderr ---\n" + stderr)
        print(f"    {status} in {elapsed:.0f} s (log: {log})", flush=True)
        text = summary(stdout) if stdout.strip() else ""
        if status != "ok":
            text += "\n" + "\n".join(stderr.rstrip().splitlines()[-15:])
        results.append((name, status, elapsed, load, text))

    print("\n================ bench summaries ================")
    for name, status, elapsed, load, text in results:
        print(f"\n## {name}: {status}, {elapsed:.0f} s, load average at start {load:.1f}")
        print(text.strip() or "(no output)")
    return 0 if all(r[1] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
