"""The command line: ``emulator COMMAND``, COMMAND one of run, collective, topology, schema, sweep, search, plot,
calibrate, live, validate, export, report, compare.

The only module (with ``__main__``) that prints. Every path a command will write
is checked before it runs (``check_destinations``). Bad input — any EmulatorError —
exits with code 2 and one clear message; a bug exits with code 1 and a one-line
report (set EMULATOR_DEBUG=1 for the traceback). Subcommands owned by other
modules register through ``add_arguments(parser)`` and a command function.

May import: every stage below it (emulator.scenario, emulator.run, emulator.outputs,
emulator.studies, emulator.tools, emulator.live, emulator.errors); it parses arguments and
calls one function of the layer below per command.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any, Callable, Sequence

from emulator.errors import EmulatorError, ReportError, ScenarioError
from emulator.outputs.docs_links import epilog, key_url
from emulator.outputs.printable import printable

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
    "validate": ("emulator.tools.validate", "add_arguments", "validate_command",
                 "compare predictions with your own measurements (a CSV of cases)"),
    "export": ("emulator.tools.export", "add_arguments", "export_command",
               "write a scenario's workload as Chakra ETs and an ASTRA-sim communicator-group file"),
    "report": ("emulator.tools.report", "add_arguments", "report_command",
               "write one self-contained HTML page of a run (a scenario, run first, or a run folder)"),
    "compare": ("emulator.tools.compare", "add_arguments", "compare_command",
                "runs side by side: step time, tokens/s, MFU, memory, breakdown, differences and ratios"),
}


def _load(args: argparse.Namespace, need_workload: bool = True):
    from emulator.scenario.checks import require_workload
    from emulator.scenario.reader import load_scenario

    sc = load_scenario(args.scenario, args.set or [])
    if need_workload:
        require_workload(sc)
    return sc


# the commands whose work is the emulator's own (no PyTorch, no BLAS): numpy loaded by quiet_numpy
SIMULATING = {"run", "collective", "sweep", "search", "validate", "report", "compare"}
# read by numpy once, as it loads: OpenBLAS on one thread, and no huge pages asked for (see below)
_NUMPY_ENV = {"OPENBLAS_NUM_THREADS": "1", "NUMPY_MADVISE_HUGEPAGE": "0"}


def quiet_numpy() -> None:
    """Import numpy with OpenBLAS on one thread and without huge pages, unless numpy is loaded
    already; a variable the user set is left as it is.

    OpenBLAS starts a thread per core when numpy loads it, and the idle thread waits by spinning:
    on the 2-core machine that cost `emulator run` 0.06 s, a tenth of the SimPy floor. The
    emulator does no BLAS work (its numpy use is element-wise, and integer), so nothing else
    changes. Numpy also asks the kernel for huge pages (madvise) for every large array; where
    the kernel then compacts memory to find them (transparent_hugepage defrag "madvise", a
    common default), the first touch of a fresh array stalls: 134 MB took 0.27 s instead of
    0.045 s, and GPT 530B's spans (5.6M entries, three float columns) and breakdown spent
    ~0.4 s on it. The emulator's arrays are written once and read in order, where huge pages
    buy nothing. The variables are removed again right after, so that no child process
    (``emulator live`` runs PyTorch) inherits them."""
    if "numpy" in sys.modules:
        return
    mine = [k for k in _NUMPY_ENV if k not in os.environ]
    for k in mine:
        os.environ[k] = _NUMPY_ENV[k]
    try:
        import numpy  # noqa: F401
    finally:
        for k in mine:
            del os.environ[k]


def cmd_run(args: argparse.Namespace) -> int:
    quiet_numpy()
    from emulator.outputs.summary import human_table, summarize, summary_json
    from emulator.run.simulation import simulate

    sc = _load(args)
    from emulator.studies.estimate import slow_warning

    warning = slow_warning(sc, out=bool(args.out))
    if warning:  # stderr: --json's stdout stays one object
        print(f"emulator: {printable(warning)}", file=sys.stderr)
    if args.estimate:
        from emulator.studies.estimate import estimate

        print(estimate(sc, out=bool(args.out)))
        return 0
    from emulator.outputs.progress import RunProgress

    progress = RunProgress()
    try:
        result = simulate(sc, progress=progress, record_links=bool(args.out))
    finally:
        progress.close()
    summary = summarize(result)
    if args.out:
        from emulator.outputs.run_files import write_outputs
        from emulator.tools.report import as_run_header, scenario_text

        as_run = as_run_header(args.scenario) + scenario_text(args.scenario, args.set or [])
        write_outputs(result, summary, args.out, gantt=not args.no_gantt, scenario_yaml=as_run)
    if args.json:
        sys.stdout.write(summary_json(summary))
    else:
        print(printable(human_table(summary), keep="\n\t"))
        if args.out:
            files = "summary.json spans.csv trace.json ranks.csv" + ("" if args.no_gantt else " gantt.png") \
                + " scenario.yaml"
            print(f"outputs in {printable(args.out)}/: {files}")
    return 0


def cmd_collective(args: argparse.Namespace) -> int:
    quiet_numpy()
    from emulator.scenario.units import format_bytes
    from emulator.tools.collective_bench import collective_table, size_range

    sc = _load(args, need_workload=False)
    rows = collective_table(sc, args.op, size_range(args.sizes), args.gpus)
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    print(f"# {printable(args.op)} on {printable(sc.name)}")
    print(f"{'size':>12} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}  algorithm")
    for r in rows:
        algo = r["algorithm"] + (f" ({r['protocol']})" if r["protocol"] else "")
        print(f"{format_bytes(r['bytes']):>12} {r['time_s'] * 1e6:12.2f} {r['algbw_GB_per_s']:13.2f} "
              f"{r['busbw_GB_per_s']:13.2f}  {algo}")
    from emulator.tools.collective_bench import fault_notes

    for note in fault_notes(rows):
        print(f"# {printable(note)}")
    return 0


def cmd_topology(args: argparse.Namespace) -> int:
    from emulator.tools.topology_listing import listing, listing_text

    data = listing(_load(args, need_workload=False))
    if args.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        print(printable(listing_text(data), keep="\n\t"))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from emulator.scenario import catalog
    from emulator.scenario.schema import scenario_schema

    names = {"gpu": catalog.gpu_names(), "node": catalog.node_names(), "model": catalog.model_names()}
    sys.stdout.write(json.dumps(scenario_schema(names), indent=2, sort_keys=True) + "\n")
    return 0


def _version() -> str:
    """The package's version: its installed metadata, or in a checkout the ``version`` line of
    setup.cfg, which is the one place the version is written."""
    from importlib import metadata
    try:
        return metadata.version("emulator")
    except metadata.PackageNotFoundError:
        cfg = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "setup.cfg")
        try:
            with open(cfg, encoding="utf-8") as f:
                for line in f:
                    key, _, value = line.partition("=")
                    if key.strip() == "version":
                        return value.strip()
        except OSError:
            pass
        return "unknown"


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every command. A plugin's module (and what it imports: the outputs, matplotlib,
    the store) is imported only for the command ``argv`` names; with ``argv`` None, for all of them."""
    p = argparse.ArgumentParser(prog="emulator",
                                description="Emulate distributed DNN training on a cluster you do not have.",
                                **_docs())
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    run = sub.add_parser("run", help="emulate one training iteration of a scenario", **_docs("run"))
    run.add_argument("scenario", help="scenario YAML file")
    run.add_argument("--json", action="store_true", help="print exactly one JSON object")
    run.add_argument("--out", metavar="DIR",
                     help="write summary.json, spans.csv, trace.json, gantt.png, scenario.yaml here")
    run.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a scenario field")
    run.add_argument("--estimate", action="store_true", help="print the expected events and wall time, do not run")
    run.add_argument("--no-gantt", action="store_true", help="skip gantt.png (faster for huge runs)")
    run.set_defaults(func=cmd_run)
    col = sub.add_parser("collective", help="nccl-tests-style table of one collective on the scenario's cluster",
                         **_docs("collective"))
    col.add_argument("scenario")
    col.add_argument("--op", default="all_reduce",
                     help="all_reduce | reduce_scatter | all_gather | all_to_all | broadcast")
    col.add_argument("--sizes", default="8B:8GiB", help="MIN:MAX, doubling (default 8B:8GiB)")
    col.add_argument("--gpus", type=int, help="use only the first N GPUs")
    col.add_argument("--json", action="store_true")
    col.add_argument("--set", action="append", metavar="KEY.PATH=VALUE")
    col.set_defaults(func=cmd_collective)
    top = sub.add_parser("topology", help="list the cluster's GPUs, NICs, switches and links: the names "
                         "cluster.overrides targets", **_docs("topology"))
    top.add_argument("scenario", help="scenario YAML file (only name and cluster are read)")
    top.add_argument("--json", action="store_true", help="print exactly one JSON object")
    top.add_argument("--set", action="append", metavar="KEY.PATH=VALUE", help="override a scenario field")
    top.set_defaults(func=cmd_topology)
    sch = sub.add_parser("schema", help="print the JSON Schema of scenario files", **_docs("schema"))
    sch.set_defaults(func=cmd_schema)
    wanted = _command(argv)
    for name, (module, add, func, help_text) in PLUGINS.items():
        sp = sub.add_parser(name, help=help_text, **_docs(name))
        if wanted is not None and name != wanted:
            continue  # listed in the help; its arguments are read only when it runs
        mod = importlib.import_module(module)  # a missing module is a broken install: let it show
        getattr(mod, add)(sp)
        sp.set_defaults(func=_plugin(getattr(mod, func)))
    return p


def _docs(command: str | None = None) -> dict[str, Any]:
    """The help's end: an example and the guide page (emulator/outputs/docs_links.py), kept as written."""
    return {"epilog": epilog(command), "formatter_class": argparse.RawDescriptionHelpFormatter}


def _command(argv: Sequence[str] | None) -> str | None:
    """The subcommand ``argv`` names (its first word that is not an option); None: import all."""
    if argv is None:
        return None
    return next((a for a in argv if not a.startswith("-")), "")


def _plugin(fn: Callable[[argparse.Namespace], object]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        out = fn(args)
        if isinstance(out, tuple):  # (text, exit code): a report that may also be a failure
            text, code = out
            if text:
                print(text)
            return int(code)
        if isinstance(out, str):
            if out:
                print(printable(out, keep="\n\t"))
            return 0
        return out if isinstance(out, int) else 0
    return run


# what each command writes: (option attribute, option, "file" | "folder"), checked before any work
DESTINATIONS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "run": (("out", "--out", "folder"),),
    "sweep": (("db", "--db", "file"), ("csv", "--csv", "file"), ("export_csv", "--export-csv", "file")),
    "search": (("db", "--db", "file"), ("csv", "--csv", "file")),
    "plot": (("out", "--out", "file"),),
    "calibrate": (("out", "--out", "file"),),
    "export": (("out", "--out", "folder"),),
    "validate": (("out", "--out", "folder"),),
    "report": (("out", "--out", "file"),),
    "compare": (("out", "--out", "file"),),
}  # emulator live reads its own options after the scenario: it checks --out itself (live/launcher.py)


def check_destinations(args: argparse.Namespace) -> None:
    """Every path the command will write can be written: else a one-line DestinationError (exit 2), now."""
    targets = [(flag, getattr(args, attr, None), kind) for attr, flag, kind in DESTINATIONS.get(args.command, ())]
    if args.command == "sweep" and args.export_csv:  # --db is only read
        targets = [t for t in targets if t[0] != "--db"]
    if args.command == "search" and getattr(args, "scenario", None):  # search's defaults: out/SCENARIO-search.*
        db = args.db or os.path.join("out", os.path.splitext(os.path.basename(args.scenario))[0] + "-search.sqlite")
        targets = [("--db", db, "file"), ("--csv", args.csv or os.path.splitext(db)[0] + ".csv", "file")]
    if args.command == "report" and not args.out:  # report's default: DIR/report.html or NAME-report.html
        from emulator.tools.report import default_out

        targets = [("--out", default_out(args.source), "file")]
    if args.command == "plot" and args.out:  # plot writes an SVG beside the PNG
        targets.append(("--out", os.path.splitext(args.out)[0] + ".svg", "file"))
    found = [(flag, str(path), kind) for flag, path, kind in targets if path is not None]
    if not found or getattr(args, "estimate", False):
        return
    from emulator.outputs.destination import check_file, check_folder
    from emulator.outputs.run_files import OUTPUT_FILES

    for flag, path, kind in found:
        if kind == "folder":
            check_folder(path, flag, OUTPUT_FILES if args.command == "run" else ())
        else:
            check_file(path, flag)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if _command(argv) in SIMULATING:  # before a plugin's module imports numpy
        quiet_numpy()
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        check_destinations(args)
        return args.func(args)
    except EmulatorError as exc:
        lines = str(exc).split("\n") if isinstance(exc, ReportError) else [str(exc)]
        print("emulator: " + "\n".join(map(printable, lines)), file=sys.stderr)
        if isinstance(exc, ScenarioError) and exc.key and sys.stderr.isatty():  # a person reads it: the key's entry
            from emulator.scenario.schema import all_key_paths  # (programs and tests keep the one line)

            print(f"see {key_url(exc.key, set(all_key_paths()))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("emulator: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`emulator run ... | head`): nothing more to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the interpreter's final flush does not fail again
        return 141  # 128 + SIGPIPE, as a shell reports a command killed by the broken pipe
    except RecursionError as exc:
        print(f"emulator: the input is too deeply nested to process ({printable(str(exc))})", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug, not bad input: one line, the traceback on request
        if os.environ.get("EMULATOR_DEBUG"):
            raise
        print(f"emulator: internal error: {type(exc).__name__}: {printable(str(exc))} "
              "(set EMULATOR_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1
