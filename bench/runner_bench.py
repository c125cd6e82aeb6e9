"""Runner benchmark: a real daemon against what a user would otherwise run, side by side.

    python bench/runner_bench.py [--quick] [--dir DIR]

Starts ``rungd serve`` in a subprocess with the tools of bench/bench_tools.py, then measures,
each repeat running the rungd figure and its baseline back to back:

(a) round trip of a read tool wrapping /bin/true over one client connection, against
    ``subprocess.run(["/bin/true"])`` in this process (target: p50 at most 2.0x);
(b) the deadline kill of a tree whose child ignores SIGTERM and whose grandchild left the
    session (setsid), against coreutils ``timeout -k GRACE DEADLINE`` on the same argv:
    processes left alive, and when they died (target: 0 survivors, all dead within 100 ms
    past deadline + grace). Times come from watching each pid in /proc every millisecond;
(c) unexpected-prompt detection: from the moment the program printed its question (stamped
    into the question) to the PROMPT_UNEXPECTED envelope in hand; and false alarms, on the
    quiet busy fakes (tests/fakes/busy, every mode) and on prompt runs flagged before their
    question was printed; against the usual heuristic of "no output for as long as rungd
    waits before looking (0.25 s) means it is asking";
(d) a 1 GiB output flood (tests/fakes/flood): the daemon's RSS growth (psutil, sampled
    every 10 ms) and the drain rate, against ``subprocess.run(capture_output=True)`` of the
    same program in a fresh interpreter (its peak RSS growth from getrusage);
(e) 50 concurrent clients, three reads (/bin/true) to one durable write (a note written
    with fsync and read back) each: calls/s, p99 and errors, against 50 threads doing the
    same work directly.

Ratios are rungd / baseline, computed per repeat; the table gives their min / median / max
and the medians of the raw figures. Takes about two and a half minutes; --quick, under one.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench_tools: the argv of each program, shared with the daemon

import bench_tools  # noqa: E402
from rungd import runner
from rungd.client import Client, ClientError
from rungd.config import Config

GIB = 1 << 30
BUSY_MODES = ("sleep", "compute", "socket", "progress", "select")
BUSY_SECONDS = 1.0
QUIET_S = runner.Program(argv=("x",)).quiet_s  # how long rungd waits for quiet before looking
KILL_OBSERVE_S = 1.0  # after deadline + grace, how long to wait before counting survivors


@dataclass
class Plan:
    repeats: int
    round_trips: int
    prompts: int
    busy_rounds: int
    flood_bytes: int
    clients: int
    calls_per_client: int


FULL = Plan(repeats=3, round_trips=150, prompts=4, busy_rounds=2, flood_bytes=GIB, clients=50, calls_per_client=20)
QUICK = Plan(repeats=2, round_trips=40, prompts=2, busy_rounds=1, flood_bytes=GIB, clients=50, calls_per_client=8)


@dataclass
class Figure:
    """One row: a figure measured for rungd and its baseline once per repeat."""

    name: str
    unit: str
    target: str = ""
    meets: Callable[[float, float], bool] | None = None  # (rungd median, ratio median) -> met?
    rungd: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)

    def add(self, rungd: float, baseline: float) -> None:
        self.rungd.append(rungd)
        self.baseline.append(baseline)

    def ratios(self) -> list[float]:
        """rungd / baseline per repeat; repeats whose baseline is 0 or never are left out."""
        return [r / b for r, b in zip(self.rungd, self.baseline) if b not in (0, float("inf"))]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# --- the daemon -------------------------------------------------------------------------------


class Daemon:
    """``rungd serve`` in a subprocess, with the benchmark's tools."""

    def __init__(self, work: Path) -> None:
        # A Unix socket path must fit in 107 bytes, whatever --dir is.
        self._sock_dir = Path(tempfile.mkdtemp(prefix="rb-"))
        self.socket = self._sock_dir / "rungd.sock"
        self.state = work / "state"
        config = work / "rungd.toml"
        gates = "\n[gates]\nread = \"none\"\nreversible = \"log\"\n" if "gates" in Config.model_fields else ""
        config.write_text(
            f'[server]\nsocket = "{self.socket}"\nshutdown_grace_s = 2\n\n[state]\ndir = "{self.state}"\n\n'
            f'[plugins]\nfiles = ["{HERE / "bench_tools.py"}"]\ndisable = ["demo"]\n{gates}'
        )
        self.log = work / "rungd.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "rungd.main", "serve", "--config", str(config)],
                                            stdout=log, stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.process.pid)
        deadline = time.monotonic() + 30
        while True:
            if self.process.poll() is not None:
                raise SystemExit(f"rungd exited at start:\n{self.log.read_text()[-2000:]}")
            try:
                with Client(self.socket) as client:
                    client.hello()
                break
            except ClientError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"rungd never listened:\n{self.log.read_text()[-2000:]}") from None
                time.sleep(0.05)

    def client(self) -> Client:
        return Client(self.socket, timeout=60)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.socket.unlink(missing_ok=True)
        self._sock_dir.rmdir()


# --- (a) round trip -----------------------------------------------------------------------------


def round_trip(daemon: Daemon, plan: Plan, p50: Figure, p99: Figure) -> None:
    rungd_ms, base_ms = [], []
    with daemon.client() as client:
        for _ in range(plan.round_trips):  # interleaved, so both see the same noise
            start = time.perf_counter()
            envelope = client.call("bench_true_run", {})
            rungd_ms.append((time.perf_counter() - start) * 1000)
            assert envelope.status == "ok", envelope
            start = time.perf_counter()
            subprocess.run(["/bin/true"], check=True)
            base_ms.append((time.perf_counter() - start) * 1000)
    p50.add(percentile(rungd_ms, 50), percentile(base_ms, 50))
    p99.add(percentile(rungd_ms, 99), percentile(base_ms, 99))


# --- (b) deadline kill ---------------------------------------------------------------------------


def tree_pids(pidfile: Path, timeout: float = 10) -> dict[str, psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pidfile.exists():
            lines = pidfile.read_text().split("\n")
            found = dict(line.split() for line in lines if line.count(" ") == 1)
            if len(found) == 3:
                return {role: psutil.Process(int(pid)) for role, pid in found.items()}
        time.sleep(0.002)
    raise RuntimeError(f"the tree never reported its three pids in {pidfile}")


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            data = file.read()
    except OSError:
        return True
    return data[data.rindex(b")") + 2 : data.rindex(b")") + 3] in (b"Z", b"X")  # a zombie is dead


def watch_deaths(procs: dict[str, psutil.Process], until: float) -> dict[str, float | None]:
    """When each process died (monotonic), or None if it was alive at ``until``."""
    deaths: dict[str, float | None] = dict.fromkeys(procs)
    while time.monotonic() < until and None in deaths.values():
        for role, proc in procs.items():
            if deaths[role] is None and _dead(proc.pid):
                deaths[role] = time.monotonic()
        time.sleep(0.001)
    return deaths


def kill_survivors(procs: dict[str, psutil.Process]) -> None:
    for proc in procs.values():
        try:
            proc.kill()  # psutil checks the start time first: never a reused pid
        except psutil.NoSuchProcess:
            pass


def deadline_kill(daemon: Daemon, work: Path, repeat: int, survivors: Figure, child_dead: Figure,
                  all_dead: Figure) -> None:
    deadline, grace = bench_tools.TREE_DEADLINE_S, bench_tools.TREE_GRACE_S
    results = {}
    for who in ("rungd", "timeout"):
        pidfile = work / f"tree-{who}-{repeat}.pids"
        result: dict[str, object] = {}
        start = time.monotonic()
        if who == "rungd":
            def call(result: dict[str, object] = result, pidfile: Path = pidfile) -> None:
                with daemon.client() as client:
                    result["envelope"] = client.call("bench_tree_run", {"pidfile": str(pidfile)})
            caller = threading.Thread(target=call)
            caller.start()
        else:
            timeout = subprocess.Popen(["timeout", "-k", f"{grace:g}", f"{deadline:g}",
                                        *bench_tools.tree_argv(str(pidfile))])
        procs = tree_pids(pidfile)
        deaths = watch_deaths(procs, start + deadline + grace + KILL_OBSERVE_S)
        if who == "rungd":
            caller.join()
            envelope = result["envelope"]
            assert envelope.error is not None and envelope.error.code == "TIMEOUT", envelope  # type: ignore[attr-defined]
        else:
            timeout.wait()
        kill_survivors(procs)
        results[who] = (start, deaths)

    def past(start: float, at: float | None, mark: float) -> float:
        return float("inf") if at is None else (at - start - mark) * 1000

    (r_start, r_deaths), (t_start, t_deaths) = results["rungd"], results["timeout"]
    survivors.add(sum(at is None for at in r_deaths.values()), sum(at is None for at in t_deaths.values()))
    child_dead.add(past(r_start, r_deaths["parent"], deadline), past(t_start, t_deaths["parent"], deadline))

    def last(deaths: dict[str, float | None]) -> float | None:
        return None if None in deaths.values() else max(d for d in deaths.values() if d is not None)

    all_dead.add(past(r_start, last(r_deaths), deadline + grace), past(t_start, last(t_deaths), deadline + grace))


# --- (c) unexpected prompts ----------------------------------------------------------------------

ASKED_AT = re.compile(r"\[asked at (\d+\.\d+)\]")


def quiet_heuristic(argv: tuple[str, ...], quiet_s: float, limit_s: float) -> tuple[str, float, bytes]:
    """The baseline detector: a program that prints nothing for ``quiet_s`` is asking.

    Returns ("prompt", when it decided, what the program printed), or "exited" (the program
    ended) or "gave up" (``limit_s`` passed) in place of "prompt".
    """
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    selector = selectors.DefaultSelector()
    for stream in (proc.stdout, proc.stderr):
        os.set_blocking(stream.fileno(), False)
        selector.register(stream, selectors.EVENT_READ)
    output = bytearray()
    last_output = time.monotonic()
    give_up = last_output + limit_s
    try:
        while selector.get_map():
            for key, _ in selector.select(timeout=0.005):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if chunk:
                    output += chunk
                    last_output = time.monotonic()
                else:
                    selector.unregister(key.fileobj)
            now = time.monotonic()
            if proc.poll() is None and now - last_output >= quiet_s:
                return "prompt", now, bytes(output)
            if now > give_up:
                return "gave up", now, bytes(output)
        proc.wait()
        return "exited", time.monotonic(), bytes(output)
    finally:
        selector.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()


def prompts(daemon: Daemon, plan: Plan, latency: Figure, false_positives: Figure) -> None:
    """Detection latency on a program that asks, and false alarms on programs that do not.

    A detector that calls a program a prompt before it printed its question (the heuristic
    does when the interpreter starts slowly on a loaded machine) raised a false alarm: that
    counts as a false positive, and the run is tried again for its latency.
    """
    runs = {"rungd": 0, "heuristic": 0}
    alarms = {"rungd": 0, "heuristic": 0}
    samples: dict[str, list[float]] = {"rungd": [], "heuristic": []}

    def through_rungd() -> float | None:
        with daemon.client() as client:
            envelope = client.call("bench_prompt_run", {})
        received = time.monotonic()
        assert envelope.error is not None and envelope.error.code == "PROMPT_UNEXPECTED", envelope
        asked = ASKED_AT.search(envelope.error.message)
        return (received - float(asked.group(1))) * 1000 if asked else None

    def through_heuristic() -> float | None:
        verdict, decided, printed = quiet_heuristic(bench_tools.prompt_argv(), QUIET_S, limit_s=10)
        assert verdict == "prompt", (verdict, printed)
        asked = ASKED_AT.search(printed.decode())
        return (decided - float(asked.group(1))) * 1000 if asked else None

    for _ in range(plan.prompts):
        for side, detect in (("rungd", through_rungd), ("heuristic", through_heuristic)):
            for _attempt in range(5):
                runs[side] += 1
                measured = detect()
                if measured is not None:
                    samples[side].append(measured)
                    break
                alarms[side] += 1
    # Busy, quiet children that never read stdin: none of them is asking anything.
    with ThreadPoolExecutor(len(BUSY_MODES)) as pool:
        def busy_rungd(mode: str) -> bool:
            with daemon.client() as client:
                env = client.call("bench_busy_run", {"mode": mode, "seconds": BUSY_SECONDS})
            if env.status != "ok" and env.error.code not in ("PROMPT_UNEXPECTED", "AUTH_REQUIRED"):
                raise AssertionError(f"busy {mode}: {env.error}")
            return env.status != "ok"

        def busy_heuristic(mode: str) -> bool:
            verdict, _, _ = quiet_heuristic(bench_tools.busy_argv(mode, BUSY_SECONDS), QUIET_S, limit_s=10)
            return verdict == "prompt"

        for _ in range(plan.busy_rounds):
            for side, detect in (("rungd", busy_rungd), ("heuristic", busy_heuristic)):
                alarms[side] += sum(pool.map(detect, BUSY_MODES))
                runs[side] += len(BUSY_MODES)
    latency.add(statistics.median(samples["rungd"]), statistics.median(samples["heuristic"]))
    false_positives.add(alarms["rungd"] / runs["rungd"] * 100, alarms["heuristic"] / runs["heuristic"] * 100)


# --- (d) output flood ---------------------------------------------------------------------------

CAPTURE = """
import resource, subprocess, sys, time
argv = sys.argv[1:]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.monotonic()
done = subprocess.run(argv, capture_output=True)
elapsed = time.monotonic() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(len(done.stdout), elapsed, (after - before) * 1024)
"""


def flood(daemon: Daemon, plan: Plan, rss: Figure, rate: Figure) -> None:
    size = plan.flood_bytes
    before = daemon.ps.memory_info().rss
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], daemon.ps.memory_info().rss)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    start = time.monotonic()
    try:
        with daemon.client() as client:
            envelope = client.call("bench_flood_run", {"size": size}, wait_s=300)
    finally:
        elapsed = time.monotonic() - start
        done.set()
        sampler.join()
    assert envelope.status == "ok" and envelope.fields["stdout_bytes"] == size, envelope
    out = subprocess.run([sys.executable, "-c", CAPTURE, *bench_tools.flood_argv(size)],
                         capture_output=True, text=True, check=True).stdout.split()
    captured, base_elapsed, base_growth = int(out[0]), float(out[1]), int(out[2])
    assert captured == size
    rss.add((peak[0] - before) / (1 << 20), base_growth / (1 << 20))
    rate.add(size / elapsed / (1 << 20), size / base_elapsed / (1 << 20))


# --- (e) concurrent clients ---------------------------------------------------------------------


def _mix(repeat: int, client_no: int, calls: int, read: Callable[[], bool],
         write: Callable[[str, str], bool]) -> tuple[list[float], int]:
    """One client's calls: three reads, then a write of a note never written before."""
    latencies, errors = [], 0
    for n in range(calls):
        start = time.perf_counter()
        try:
            ok = write(f"r{repeat}-c{client_no}-{n}", f"note {n} of client {client_no}") if n % 4 == 3 else read()
        except (ClientError, OSError, subprocess.SubprocessError):
            ok = False
        latencies.append((time.perf_counter() - start) * 1000)
        errors += not ok
    return latencies, errors


def concurrent_clients(daemon: Daemon, work: Path, plan: Plan, repeat: int, rate: Figure, p99: Figure,
                       errors: Figure) -> None:
    def through_rungd(client_no: int) -> tuple[list[float], int]:
        with daemon.client() as client:
            def read() -> bool:
                return client.call("bench_true_run", {}).status == "ok"

            def write(key: str, text: str) -> bool:
                env = client.call("bench_note_put", {"key": key, "text": text}, request_id=key)
                return env.status == "ok" and env.effect == "changed"

            return _mix(repeat, client_no, plan.calls_per_client, read, write)

    notes = work / f"notes-{repeat}"
    notes.mkdir()

    def directly(client_no: int) -> tuple[list[float], int]:
        def read() -> bool:
            return subprocess.run(["/bin/true"], check=False).returncode == 0

        def write(key: str, text: str) -> bool:
            bench_tools.write_durably(notes / key, text)
            return (notes / key).read_text() == text

        return _mix(repeat, client_no, plan.calls_per_client, read, write)

    figures = []
    for worker in (through_rungd, directly):
        start = time.monotonic()
        with ThreadPoolExecutor(plan.clients) as pool:
            results = list(pool.map(worker, range(plan.clients)))
        elapsed = time.monotonic() - start
        latencies = [ms for lat, _ in results for ms in lat]
        figures.append((len(latencies) / elapsed, percentile(latencies, 99), sum(e for _, e in results)))
    (r_rate, r_p99, r_err), (b_rate, b_p99, b_err) = figures
    rate.add(r_rate, b_rate)
    p99.add(r_p99, b_p99)
    errors.add(r_err, b_err)


# --- the table ----------------------------------------------------------------------------------


def fmt(value: float) -> str:
    if value == float("inf"):
        return "never"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"


def fmt_ratio(value: float) -> str:
    return f"{value:.2f}x"


def print_table(figures: list[Figure]) -> None:
    rows = [("figure", "unit", "rungd", "baseline", "ratio min", "median", "max", "target", "met")]
    for fig in figures:
        ratios = fig.ratios()
        r_med, b_med = statistics.median(fig.rungd), statistics.median(fig.baseline)
        ratio_med = statistics.median(ratios) if ratios else float("inf")
        met = "" if fig.meets is None else ("yes" if fig.meets(r_med, ratio_med) else "NO")
        shown = [fmt_ratio(min(ratios)), fmt_ratio(ratio_med), fmt_ratio(max(ratios))] if ratios else ["-"] * 3
        rows.append((fig.name, fig.unit, fmt(r_med), fmt(b_med), *shown, fig.target, met))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        cells = [cell.ljust(widths[i]) if i < 2 or i >= 7 else cell.rjust(widths[i]) for i, cell in enumerate(row)]
        print("  ".join(cells).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and calls (under a minute)")
    parser.add_argument("--dir", type=Path, default=None, help="where to work (default: the temp folder)")
    args = parser.parse_args()
    plan = QUICK if args.quick else FULL
    if not Path("/usr/bin/timeout").exists() and not any(
            Path(p, "timeout").exists() for p in os.environ.get("PATH", "").split(":")):
        raise SystemExit("coreutils `timeout` is needed for the deadline-kill baseline")

    rt50 = Figure("(a) round trip /bin/true, p50", "ms", "<= 2.0x", lambda r, x: x <= 2.0)
    rt99 = Figure("(a) round trip /bin/true, p99", "ms")
    kill_survivors_fig = Figure("(b) kill: survivors (of 3)", "procs", "0", lambda r, x: r == 0)
    kill_child = Figure("(b) kill: direct child dead, past deadline", "ms")
    kill_all = Figure("(b) kill: all dead, past deadline+grace", "ms", "< 100 ms", lambda r, x: r < 100)
    prompt_latency = Figure("(c) prompt detected, after it was printed", "ms", "< 1000 ms", lambda r, x: r < 1000)
    prompt_fp = Figure("(c) false alarms: quiet, not asking", "% runs", "0", lambda r, x: r == 0)
    flood_rss = Figure("(d) 1 GiB flood: RSS growth", "MiB")
    flood_rate = Figure("(d) 1 GiB flood: drain rate", "MiB/s")
    mix_rate = Figure(f"(e) {plan.clients} clients: throughput", "calls/s")
    mix_p99 = Figure(f"(e) {plan.clients} clients: p99", "ms")
    mix_errors = Figure(f"(e) {plan.clients} clients: errors", "calls", "0", lambda r, x: r == 0)
    figures = [rt50, rt99, kill_survivors_fig, kill_child, kill_all, prompt_latency, prompt_fp, flood_rss,
               flood_rate, mix_rate, mix_p99, mix_errors]

    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="runner-bench-", dir=args.dir) as folder:
        work = Path(folder)
        print(f"{work}: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, Python {platform.python_version()}, "
              f"{plan.repeats} repeats{' (--quick)' if args.quick else ''}", flush=True)
        daemon = Daemon(work)
        try:
            for repeat in range(plan.repeats):
                print(f"repeat {repeat + 1}/{plan.repeats}: round trips", end="", flush=True)
                round_trip(daemon, plan, rt50, rt99)
                print(", deadline kill", end="", flush=True)
                deadline_kill(daemon, work, repeat, kill_survivors_fig, kill_child, kill_all)
                print(", prompts", end="", flush=True)
                prompts(daemon, plan, prompt_latency, prompt_fp)
                print(", flood", end="", flush=True)
                flood(daemon, plan, flood_rss, flood_rate)
                print(", clients", end="", flush=True)
                concurrent_clients(daemon, work, plan, repeat, mix_rate, mix_p99, mix_errors)
                print(f" ({time.monotonic() - began:.0f} s)", flush=True)
        finally:
            daemon.stop()
    print()
    print_table(figures)
    print(f"\nratio = rungd / baseline per repeat. Baselines: (a) subprocess.run; (b) timeout -k "
          f"{bench_tools.TREE_GRACE_S:g} {bench_tools.TREE_DEADLINE_S:g}; (c) 'quiet for {QUIET_S:g} s means a "
          f"prompt'; (d) subprocess.run(capture_output=True); (e) the same work in {plan.clients} threads. "
          f"Took {time.monotonic() - began:.0f} s.")


if __name__ == "__main__":
    main()
