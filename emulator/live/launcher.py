"""``emulator live SCENARIO [--world N] [--real K] [--clock wall|virtual] [--out DIR] -- python train.py ...``

Runs an unmodified PyTorch training script as rank r (default 0) of a world of N
on the scenario's emulated cluster. The script runs in a child process
(``python -m emulator.live.run``) with RANK, WORLD_SIZE, LOCAL_RANK (and
MASTER_ADDR/PORT, unused) set, so its plain ``init_process_group()`` picks the
``emulator`` backend. At the end the launcher prints the per-iteration time and
the exposed communication, and writes summary.json, trace.json (Perfetto) and
record.json into ``--out``.

With ``--real K`` it starts K child processes, world ranks 0..K−1, that form a
real process group among themselves (``emulator.live.peers``); the other ranks are
emulated and mirror them (``emulator.live.mirror``). K must divide N, so that every
emulated rank r mirrors real rank r mod K, the translate of the real block. The
summary is rank 0's, with each real rank's iteration time beside it.

This module imports no torch (the CLI imports it to register the subcommand);
without torch, ``emulator live`` says so: "emulator live needs PyTorch: pip install '.[live]'".
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from emulator.errors import EmulatorError
from emulator.live.watchdog import RankState, read_state, verdict

NEEDS_TORCH = "emulator live needs PyTorch: pip install '.[live]'"
_PYTHON = re.compile(r"^python[0-9.]*(\.exe)?$")


def torch_available() -> bool:
    """Whether this interpreter can import torch (checked without importing it)."""
    return importlib.util.find_spec("torch") is not None


def _options(p: argparse.ArgumentParser, suppress: bool = False) -> None:
    d = (lambda v: argparse.SUPPRESS) if suppress else (lambda v: v)
    p.add_argument("--world", type=int, default=d(None),
                   help="world size N (default: tp*pp*dp*cp of the scenario, else its GPUs)")
    p.add_argument("--rank", type=int, default=d(0), help="the world rank the local process plays (default 0)")
    p.add_argument("--real", type=int, default=d(1), metavar="K",
                   help="run K real processes, world ranks 0..K-1, talking for real (gloo; NCCL on GPUs)")
    p.add_argument("--clock", choices=("wall", "virtual"), default=d("wall"),
                   help="wall: sleep until emulated completions; virtual: only account (fast)")
    p.add_argument("--out", metavar="DIR", default=d(os.path.join("out", "live")),
                   help="write summary.json, trace.json, record.json here (default: out/live)")
    p.add_argument("--profile", action="store_true", default=d(False),
                   help="record the script's ops with the PyTorch profiler")
    p.add_argument("--json", action="store_true", default=d(False), help="print the summary as one JSON object")
    p.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", default=d(None),
                   help="override a scenario field")


def add_arguments(p: argparse.ArgumentParser) -> None:
    _options(p)
    p.add_argument("rest", nargs=argparse.REMAINDER, metavar="SCENARIO [OPTIONS] -- python train.py [ARGS]",
                   help="the scenario YAML (the emulated cluster), then the training command after --")


def _split(args: argparse.Namespace) -> argparse.Namespace:
    """Options may sit between the scenario and ``--``: parse that part again."""
    rest = list(args.rest)
    cut = rest.index("--") if "--" in rest else len(rest)
    inner = argparse.ArgumentParser(prog="emulator live", add_help=False)
    _options(inner, suppress=True)
    inner.add_argument("scenario")
    try:
        ns, unknown = inner.parse_known_args(rest[:cut])
    except SystemExit:
        raise EmulatorError("emulator live: usage: emulator live SCENARIO [OPTIONS] -- python train.py "
                            "[ARGS]") from None
    if unknown:
        raise EmulatorError(f"emulator live: unknown options {' '.join(unknown)} (the training command goes after --)")
    merged = argparse.Namespace(**{**vars(args), **vars(ns)})
    if isinstance(getattr(ns, "set", None), list) and args.set:
        merged.set = list(args.set) + ns.set
    merged.command = rest[cut + 1:]
    return merged


def _command(cmd: list[str]) -> list[str]:
    """The child command line: ``python -m emulator.live.run SCRIPT ARGS``."""
    if not cmd:
        raise EmulatorError("emulator live: give the training command after --, e.g. -- python train.py")
    if _PYTHON.match(cmd[0]):  # a bare "python": the interpreter that runs the emulator (and has torch)
        python, rest = sys.executable, cmd[1:]
    elif _PYTHON.match(os.path.basename(cmd[0])):
        python, rest = cmd[0], cmd[1:]
    elif cmd[0].endswith(".py"):
        python, rest = sys.executable, cmd
    else:
        raise EmulatorError(f"emulator live: expected `python SCRIPT.py ...` (or `SCRIPT.py ...`) after --, "
                            f"got {cmd[0]!r}")
    if not rest:
        raise EmulatorError("emulator live: no script to run after the python interpreter")
    if rest[0] != "-m" and not os.path.isfile(rest[0]):
        raise EmulatorError(f"emulator live: no such script: {rest[0]}")
    if python == sys.executable and not torch_available():
        raise EmulatorError(NEEDS_TORCH)
    return [python, "-m", "emulator.live.run", *rest]


def _world(args: argparse.Namespace, scenario) -> int:
    from emulator.network.topology import build_topology

    gpus = len(build_topology(scenario.cluster).gpus)
    p = scenario.parallel
    world = args.world if args.world is not None else (
        p.tp * p.pp * p.dp * p.cp if p.tp * p.pp * p.dp * p.cp > 1 else gpus)
    if not 1 <= world <= gpus:
        raise EmulatorError(f"--world: expected 1..{gpus} (the GPUs of {scenario.name}), got {world}")
    if not 0 <= args.rank < world:
        raise EmulatorError(f"--rank: expected 0..{world - 1}, got {args.rank}")
    real = getattr(args, "real", 1)
    if not 1 <= real <= world or world % real:
        raise EmulatorError(f"--real: expected a divisor of the world size {world} (the real ranks 0..K-1 are "
                            f"mirrored by their translates), got {real}")
    if real > 1 and args.rank:
        raise EmulatorError("--rank: with --real K the real processes are world ranks 0..K-1; leave --rank out")
    from emulator.live.pipeline import refusal

    why = refusal(p.pp, p.schedule, world, real, args.rank)
    if why:
        raise EmulatorError(f"{scenario.path or scenario.name}: {why}")
    return world


def _env(args: argparse.Namespace, scenario, world: int, record: str, rank: int | None = None,
         shared: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    gpn = scenario.cluster.node.gpus_per_node if scenario.cluster.node else world
    p = scenario.parallel
    rank = args.rank if rank is None else rank
    env.update(shared or {})
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % gpn),
        "LOCAL_WORLD_SIZE": str(min(gpn, world)), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
        "EMULATOR_LIVE_SCENARIO": os.path.abspath(args.scenario),
        "EMULATOR_LIVE_SET": json.dumps(args.set or []),
        "EMULATOR_LIVE_WORLD": str(world), "EMULATOR_LIVE_CLOCK": args.clock,
        "EMULATOR_LIVE_RECORD": record, "EMULATOR_LIVE_PROFILE": "1" if args.profile else "0",
        "EMULATOR_LIVE_TP": str(p.tp), "EMULATOR_LIVE_PP": str(p.pp), "EMULATOR_LIVE_DP": str(p.dp),
    })
    return env


def live_command(args: argparse.Namespace) -> str | int:
    from emulator.live.report import human, summarize, write_report
    from emulator.outputs.destination import check_folder
    from emulator.scenario.reader import load_scenario

    args = _split(args)
    check_folder(args.out, "--out")  # before the script starts, as every command's destinations
    scenario = load_scenario(args.scenario, args.set or [])
    world = _world(args, scenario)
    cmd = _command(list(args.command))
    real = getattr(args, "real", 1)
    with tempfile.TemporaryDirectory(prefix="emulator-live-") as tmp:
        paths = [os.path.join(tmp, f"record-{k}.json") for k in range(real)]
        if real == 1:
            codes = _run_all([(cmd, _env(args, scenario, world, paths[0]))], [])
            rc = codes[0]
            first = 0
        else:
            shared = {"EMULATOR_LIVE_REAL": str(real), "EMULATOR_LIVE_MASTER": f"127.0.0.1:{_free_port()}"}
            states = [os.path.join(tmp, f"state-{k}.json") for k in range(real)]
            codes = _run_all([(cmd, {**_env(args, scenario, world, paths[k], k, shared),
                                     "EMULATOR_LIVE_STATE": states[k]}) for k in range(real)], states)
            first = _first_failed(codes)
            rc = codes[first]
        records = []
        for k, path in enumerate(paths):
            if not os.path.exists(path):
                k = first if codes[first] else k  # the rank that ended the run, not one stopped after it
                stopped = " (the other ranks were stopped after it)" if real > 1 and codes[k] else ""
                raise EmulatorError(f"emulator live: the script (real rank {k}) exited with code {codes[k]} "
                                    f"before the run was recorded{stopped}")
            with open(path, encoding="utf-8") as fh:
                records.append(json.load(fh))
    for rec in records:
        if "error" in rec:
            raise EmulatorError(rec["error"])
    for k, rec in enumerate(records):
        if not rec.get("initialised", True):
            who = f" (real rank {k})" if real > 1 else ""
            raise EmulatorError(f"emulator live: the script{who} never called torch.distributed.init_process_group, "
                                "so nothing ran on the emulated cluster; call it (with any backend: the emulator "
                                "replaces it) before the first collective")
    record = records[0]
    if real > 1:
        record["real_records"] = records[1:]
    summary = summarize(record, scenario.name)
    paths = write_report(args.out, record, summary)
    if rc != 0:
        raise EmulatorError(f"emulator live: the script exited with code {rc}; partial report in {args.out}/")
    if args.json:
        return json.dumps(summary)
    return human(summary) + f"\noutputs in {args.out}/: " + " ".join(os.path.basename(p) for p in paths)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_all(jobs: list[tuple[list[str], dict[str, str]]], states: list[str]) -> list[int]:
    """Start every (command, environment); wait for all. If one fails,
    stop the others (they would wait for it on the real group until its timeout). If the watchdog
    (``emulator.live.watchdog``, on the ranks' ``states`` files) finds a deadlock among the real
    ranks, stop every process of the run and raise it. Returns the exit codes."""
    procs = [subprocess.Popen(cmd, env=env, preexec_fn=_die_with(os.getpid())) for cmd, env in jobs]
    watch = _Watch(states) if states else None
    before = signal.signal(signal.SIGTERM, _terminated)  # a terminated launcher stops its processes too
    try:
        while [p.poll() for p in procs].count(None):  # poll each one: any() would stop at the first running
            if any(p.returncode not in (None, 0) for p in procs):
                codes = [p.returncode for p in procs]  # before the others are stopped: who ended it, and how
                _stop(procs)
                return [c if c is not None else p.wait() for c, p in zip(codes, procs)]
            why = watch.check([p.returncode for p in procs]) if watch else None
            if why:
                _stop(procs)
                raise EmulatorError(f"emulator live: {why}; every process of the run was stopped")
            time.sleep(0.05)
        return [p.wait() for p in procs]
    finally:
        signal.signal(signal.SIGTERM, before)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _first_failed(codes: list[int]) -> int:
    """The real rank that ended the run: the first with its own failing exit code; a rank the launcher
    stopped after it (SIGTERM, -15, or SIGKILL, -9) only where no rank failed on its own."""
    own = [k for k, c in enumerate(codes) if c and c not in (-signal.SIGTERM, -signal.SIGKILL)]
    return own[0] if own else next((k for k, c in enumerate(codes) if c), 0)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with(parent: int):
    """A ``preexec_fn`` for a rank's process: on Linux, ask the kernel for SIGKILL when the launcher
    dies (``prctl(PR_SET_PDEATHSIG)``), so that a launcher killed outright (SIGKILL, which it cannot
    catch to stop its ranks) leaves no rank behind; if the launcher is gone already (between fork
    and prctl), end at once. Elsewhere, nothing (the launcher's SIGTERM handler and ``finally`` stop
    the ranks on every exit it sees)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child between fork and exec only calls

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
    return preexec


def _terminated(signum: int, frame: object) -> None:
    raise EmulatorError("emulator live: terminated; every process of the run was stopped")


class _Watch:
    """The launcher's side of the watchdog: how long each rank's state has stood."""

    def __init__(self, states: list[str]) -> None:
        self.states = states
        self.seen: list[tuple] = [()] * len(states)
        self.since = [time.monotonic()] * len(states)

    def check(self, codes: list[int | None]) -> str | None:
        now = time.monotonic()
        ranks = []
        for k, (path, code) in enumerate(zip(self.states, codes)):
            waiting, initialised, seq = read_state(path, k)
            key = (seq, code)
            if key != self.seen[k]:
                self.seen[k], self.since[k] = key, now
            ranks.append(RankState(k, waiting, initialised, code, now - self.since[k]))
        return verdict(ranks)


def _stop(procs: list[subprocess.Popen], grace_s: float = 3.0) -> None:
    """SIGTERM to every process still running, SIGKILL after ``grace_s``."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
