"""The command line: ``emulator run | collective | schema | sweep | search | plot | calibrate | live``.

The only module (with ``__main__``) that prints. Bad input — any EmulatorError —
exits with code 2 and one clear message; a bug exits with code 1 and a one-line
report (set EMULATOR_DEBUG=1 for the traceback). Subcommands owned by other
modules register through ``add_arguments(parser)`` and a command function.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from typing import Callable, Sequence

from emulator.errors import EmulatorError

# name → (module, add-arguments function, command function, help); imported on use
PLUGINS: dict[str, tuple[str, str, str, str]] = {
    "sweep": ("emulator.studies.sweep", "add_arguments", "sweep_command",
              "run a grid of scenario variants into a results store"),
    "search": ("emulator.studies.search", "add_arguments", "search_command", "find the best parallel layout that fits"),
    "plot": ("emulator.studies.plot", "add_arguments", "plot_command", "plot a sweep's results"),
    "calibrate": ("emulator.tools.calibrate", "add_arguments", "calibrate_command",
                  "fit model constants from nccl-tests logs and a Kineto trace"),
    "live": ("emulator.live.launcher", "add_arguments", "live_command",
             "run a real PyTorch script as a few ranks of an emulated cluster"),
}


class Progress:
    """A one-line progress bar on stderr, shown once a run takes more than ``after`` s."""

    def __init__(self, after: float = 2.0) -> None:
        self.t0 = time.perf_counter()
        self.after = after
        self.shown = False

    def __call__(self, now: float, events: int) -> None:
        wall = time.perf_counter() - self.t0
        if wall < self.after or not sys.stderr.isatty() and not os.environ.get("EMULATOR_PROGRESS"):
            return
        self.shown = True
        rate = events / wall
        sys.stderr.write(f"\r  simulated {now * 1e3:10.3f} ms | {events:>12,} events | {rate:>10,.0f} events/s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")


def _load(args: argparse.Namespace, need_workload: bool = True):
    from emulator.scenario.checks import require_workload
    from emulator.scenario.reader import load_scenario

    sc = load_scenario(args.scenario, args.set or [])
    if need_workload:
        require_workload(sc)
    return sc


def cmd_run(args: argparse.Namespace) -> int:
    from emulator.outputs.summary import human_table, summarize, summary_json
    from emulator.simulation import simulate

    sc = _load(args)
    if args.estimate:
        from emulator.tools.estimate import estimate

        print(estimate(sc))
        return 0
    progress = Progress()
    try:
        result = simulate(sc, progress=progress, record_links=bool(args.out))
    finally:
        progress.close()
    summary = summarize(result)
    if args.out:
        from emulator.outputs import write_outputs

        write_outputs(result, summary, args.out, gantt=not args.no_gantt)
    if args.json:
        sys.stdout.write(summary_json(summary))
    else:
        print(human_table(summary))
        if args.out:
            files = "summary.json spans.csv trace.json" + ("" if args.no_gantt else " gantt.png")
            print(f"outputs in {args.out}/: {files}")
    return 0


def cmd_collective(args: argparse.Namespace) -> int:
    from emulator.scenario.units import format_bytes
    from emulator.tools.collective_bench import collective_table, size_range

    sc = _load(args, need_workload=False)
    rows = collective_table(sc, args.op, size_range(args.sizes), args.gpus)
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    print(f"# {args.op} on {sc.name}")
    print(f"{'size':>12} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}  algorithm")
    for r in rows:
        algo = r["algorithm"] + (f" ({r['protocol']})" if r["protocol"] else "")
        print(f"{format_bytes(r['bytes']):>12} {r['time_s'] * 1e6:12.2f} {r['algbw_GB_per_s']:13.2f} "
              f"{r['busbw_GB_per_s']:13.2f}  {algo}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from emulator.scenario import catalog
    from emulator.scenario.schema import scenario_schema

    names = {"gpu": catalog.gpu_names(), "node": catalog.node_names(), "model": catalog.model_names()}
    sys.stdout.write(json.dumps(scenario_schema(names), indent=2, sort_keys=True) + "\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="emulator",
                                description="Emulate distributed DNN training on a cluster you do not have.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="emulate one training iteration of a scenario")
    run.add_argument("scenario", help="scenario YAML file")
    run.add_argument("--json", action="store_true", help="print exactly one JSON object")
    run.add_argument("--out", metavar="DIR", help="write summary.json, spans.csv, trace.json, gantt.png here")
    run.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a scenario field")
    run.add_argument("--estimate", action="store_true", help="print the expected events and wall time, do not run")
    run.add_argument("--no-gantt", action="store_true", help="skip gantt.png (faster for huge runs)")
    run.set_defaults(func=cmd_run)
    col = sub.add_parser("collective", help="nccl-tests-style table of one collective on the scenario's cluster")
    col.add_argument("scenario")
    col.add_argument("--op", default="all_reduce",
                     help="all_reduce | reduce_scatter | all_gather | all_to_all | broadcast")
    col.add_argument("--sizes", default="8B:8GiB", help="MIN:MAX, doubling (default 8B:8GiB)")
    col.add_argument("--gpus", type=int, help="use only the first N GPUs")
    col.add_argument("--json", action="store_true")
    col.add_argument("--set", action="append", metavar="KEY.PATH=VALUE")
    col.set_defaults(func=cmd_collective)
    sch = sub.add_parser("schema", help="print the JSON Schema of scenario files")
    sch.set_defaults(func=cmd_schema)
    for name, (module, add, func, help_text) in PLUGINS.items():
        mod = importlib.import_module(module)  # a missing module is a broken install: let it show
        sp = sub.add_parser(name, help=help_text)
        getattr(mod, add)(sp)
        sp.set_defaults(func=_plugin(getattr(mod, func)))
    return p


def _plugin(fn: Callable[[argparse.Namespace], object]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        out = fn(args)
        if isinstance(out, str):
            if out:
                print(out)
            return 0
        return out if isinstance(out, int) else 0
    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except EmulatorError as exc:
        print(f"emulator: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("emulator: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`emulator run ... | head`): nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the interpreter's final flush does not fail again
        return 141  # 128 + SIGPIPE, as a shell reports a command killed by the broken pipe
    except RecursionError as exc:
        print(f"emulator: the input is too deeply nested to process ({exc})", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug, not bad input: one line, the traceback on request
        if os.environ.get("EMULATOR_DEBUG"):
            raise
        print(f"emulator: internal error: {type(exc).__name__}: {exc} (set EMULATOR_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return 1
