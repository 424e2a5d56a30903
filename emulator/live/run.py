"""The child side of ``emulator live``: ``python -m emulator.live.run SCRIPT [ARGS...]``.

It builds the live Session from the environment the launcher sets, installs the
``emulator`` backend, makes ``init_process_group()`` pick it (any backend the
script names is replaced by "emulator"; the store is an in-process HashStore,
so no MASTER_ADDR/PORT and no rendezvous), runs the unmodified script with
runpy as ``__main__``, writes the run's record (JSON) for the launcher, and at the end
destroys the process group and undoes its patches of torch (``_end``).

Environment (set by the launcher):
EMULATOR_LIVE_SCENARIO (path), EMULATOR_LIVE_SET (JSON list of --set overrides),
EMULATOR_LIVE_WORLD, EMULATOR_LIVE_CLOCK (wall | virtual), EMULATOR_LIVE_RECORD
(output path), EMULATOR_LIVE_PROFILE (1: run under the PyTorch profiler), RANK;
with several real ranks (``--real K``): EMULATOR_LIVE_REAL (K), EMULATOR_LIVE_MASTER
(host:port of the real ranks' store) and EMULATOR_LIVE_STATE (the state file of the
launcher's watchdog, ``emulator.live.watchdog``). The real ranks' clocks share one origin,
real rank 0's ``time.perf_counter()`` once all of them are up (``Peers.origin``: one monotonic
clock on one machine). Tooling only: EMULATOR_LIVE_PACE (a directory): each time the local
rank ends a wait on communication, one datagram goes to the UNIX socket ``rank<RANK>`` there,
if something listens (``_pace``; benchmarks/live_real_check.py's in-step neighbours).
"""
from __future__ import annotations

import json
import os
import runpy
import sys
from typing import Any, Callable

NEEDS_TORCH = "emulator live needs PyTorch: pip install '.[live]'"
MAX_PROFILE_EVENTS = 200_000


def _fail(message: str) -> int:
    """Hand a bad-input message to the launcher (through the record file), else print it."""
    out = os.environ.get("EMULATOR_LIVE_RECORD")
    if out:
        with open(out, "w", encoding="utf-8") as fh:
            json.dump({"error": message}, fh)
    else:
        sys.stderr.write(f"emulator: {message}\n")
    return 2


def _session():
    from emulator.live.clock import Clock
    from emulator.live.cost import CommCost
    from emulator.live.faults import live_faults
    from emulator.live.session import Session
    from emulator.live.watchdog import Beacon
    from emulator.scenario.reader import load_scenario

    overrides = json.loads(os.environ.get("EMULATOR_LIVE_SET", "[]"))
    scenario = load_scenario(os.environ["EMULATOR_LIVE_SCENARIO"], overrides)
    world = int(os.environ["EMULATOR_LIVE_WORLD"])
    rank = int(os.environ.get("RANK", "0"))
    real = int(os.environ.get("EMULATOR_LIVE_REAL", "1"))
    cost = CommCost(scenario, world)
    slow, notes = live_faults(scenario, cost.topology, world, real)
    clock = Clock(os.environ.get("EMULATOR_LIVE_CLOCK", "wall"))
    pipeline, note = _pipeline(scenario, world, rank, real, slow)
    skew = scenario.live
    model = (skew.skew_base, skew.skew_slope) if skew.skew == "model" else None
    live = Session(clock, cost, world, rank, real=real, slow=slow, pipeline=pipeline, skew=model)
    if model is not None:
        notes.append(f"live.skew: model: an emulated member of a collective arrives (e_n - e_k) x "
                     f"({skew.skew_base * 1e3:g} ms + {skew.skew_slope:g} x the compute since the last "
                     "synchronisation) after its mirror")
    live.notes.extend(notes + ([note] if note else []))
    live.beacon = Beacon(os.environ.get("EMULATOR_LIVE_STATE"), rank)
    if os.environ.get("EMULATOR_LIVE_PACE"):
        live.on_synced.append(_pace(os.path.join(os.environ["EMULATOR_LIVE_PACE"], f"rank{rank}")))
    return live


def _pace(path: str) -> Callable[[], None]:
    """A callable that sends one datagram to the UNIX socket ``path``; nothing, and no error, when
    nobody listens there (the pace is a hint to a process beside the run, never part of it)."""
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setblocking(False)

    def send() -> None:
        try:
            sock.sendto(b"w", path)
        except OSError:  # no listener (yet), or its queue is full: the hint is dropped
            pass
    return send


def _pipeline(scenario, world: int, rank: int, real: int, slow: dict[int, float] | None = None):
    """The emulated stages when the live world is one pipeline (``parallel.pp`` = world) with the
    real rank as stage 0; None without a pipeline. Any other pipeline layout is refused."""
    from emulator.errors import EmulatorError
    from emulator.live.pipeline import Pipeline, refusal

    p = scenario.parallel
    if p.pp <= 1:
        return None, ""
    why = refusal(p.pp, p.schedule, world, real, rank)  # the launcher refuses it first; a direct run here
    if why:
        raise EmulatorError(f"{scenario.path or scenario.name}: {why}")
    chunks = f" ({p.virtual_stages} model chunks per stage)" if p.virtual_stages > 1 else ""
    slowed = "".join(f"; stage {r}'s F and B x{f:g} (gpu_slowdown)" for r, f in sorted((slow or {}).items()))
    return Pipeline(p.schedule, p.pp, p.virtual_stages, slow), (
        f"pipeline: stage 0 real, stages 1..{p.pp - 1} emulated, each running {p.schedule}{chunks} on the "
        f"measured compute per micro-batch{slowed}")


def _peers(live):
    """The other real ranks (``--real K``, K > 1), else None."""
    if live.real <= 1:
        return None
    from emulator.live.peers import Peers

    with live.beacon.blocked("rendezvous", tuple(range(live.real)), tuple(range(live.real))):
        peers = Peers(live.rank, live.real, os.environ["EMULATOR_LIVE_MASTER"])
        # the real ranks' common origin: when the last of them is ready, not when the launcher started
        # them (their start, torch's import, would count as the first iteration's compute)
        live.clock.t0 = peers.origin()
    return peers


def _patch_init(live) -> Callable[[], None]:
    """``init_process_group(...)`` → the emulator backend on an in-process store, whatever was asked.
    Returns what puts the original back."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.init_process_group

    def init_process_group(backend: Any = None, init_method: Any = None, timeout: Any = None,
                           world_size: int = -1, rank: int = -1, store: Any = None, **kwargs: Any) -> Any:
        if backend not in (None, "emulator"):
            live.notes.append(f"the script asked for backend {backend!r}; the emulator backend replaced it")
        if timeout is not None:
            kwargs["timeout"] = timeout
        return original("emulator", world_size=live.world, rank=live.rank, store=dist.HashStore(), **kwargs)

    # the patch takes the script's arguments whatever they are: looser than torch's own signature
    dist.init_process_group = init_process_group  # type: ignore[assignment]
    c10d.init_process_group = init_process_group  # type: ignore[assignment]

    def undo() -> None:
        if dist.init_process_group is init_process_group:  # type: ignore[comparison-overlap]
            dist.init_process_group = original
        if c10d.init_process_group is init_process_group:  # type: ignore[comparison-overlap]
            c10d.init_process_group = original

    return undo


def _profile_events(path: str, marker_wall: float, clock) -> list[dict]:
    """The profiler's complete events, moved onto the local timeline (ts, dur in µs)."""
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)
    events = [e for e in doc.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    mark = next((e for e in events if e.get("name") == "emulator::t0"), None)
    if mark is None:
        return []
    out = []
    for e in events[:MAX_PROFILE_EVENTS]:
        if e is mark:
            continue
        wall = marker_wall + (float(e["ts"]) - float(mark["ts"])) * 1e-6
        out.append({"name": e.get("name", ""), "cat": e.get("cat", ""), "tid": str(e.get("tid", "")),
                    "ts_s": clock.local_of_wall(wall), "dur_s": float(e.get("dur", 0.0)) * 1e-6})
    return out


def main(argv: list[str]) -> int:
    if not argv:
        return _fail("usage: python -m emulator.live.run SCRIPT [ARGS...]")
    try:
        import torch  # noqa: F401
    except ImportError:
        return _fail(NEEDS_TORCH)
    from emulator.errors import EmulatorError
    from emulator.live import backend
    from emulator.outputs.atomic import write_text

    try:
        live = _session()
    except EmulatorError as exc:
        return _fail(str(exc))
    backend.install(live, _peers(live))
    unpatch_init = _patch_init(live)
    profile = os.environ.get("EMULATOR_LIVE_PROFILE") == "1"
    prof = None
    marker_wall = 0.0
    if profile:
        from torch.profiler import ProfilerActivity, record_function
        from torch.profiler import profile as _profile

        prof = _profile(activities=[ProfilerActivity.CPU])
        prof.__enter__()
        with record_function("emulator::t0"):
            marker_wall = live.clock.wall()
    code = 0
    try:
        if argv[0] == "-m" and len(argv) > 1:
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        try:
            live.finish()
            record = live.to_dict()
            if prof is not None:
                import tempfile

                prof.__exit__(None, None, None)
                with tempfile.TemporaryDirectory() as tmp:
                    path = os.path.join(tmp, "profile.json")
                    prof.export_chrome_trace(path)
                    record["profile"] = _profile_events(path, marker_wall, live.clock)
            out = os.environ.get("EMULATOR_LIVE_RECORD")
            if out:
                write_text(out, json.dumps(record))
        finally:
            _end(unpatch_init)
    return code


def _end(unpatch_init: Callable[[], None]) -> None:
    """The end of the live session: the process group goes, and torch is as it was before the run
    (init_process_group, autograd.backward, DDP's check and the optimizer hooks are the originals)."""
    import torch.distributed as dist

    from emulator.live import backend

    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # the script may have torn it down already
        pass
    finally:
        unpatch_init()
        backend.uninstall()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
