"""The report of a live run: per-iteration time, exposed communication, a Perfetto trace.

Reads only the run's record (``Session.to_dict()``), never the live process.

Iterations end at optimizer steps: iteration k runs from the end of step k−1 to
the end of step k (the first from the start of the script, so it holds the
set-up and the warm-up; the mean leaves it out when there are more). For each
iteration, on the local rank's timeline:
- exposed communication = the time the rank was blocked on emulated communication;
- communication = the union of the emulated collectives' busy intervals (on any stream);
- compute = iteration − exposed communication (everything the local rank ran);
- overlapped communication = the communication outside the blocked intervals, i.e. the union of
  both minus the exposed communication (a wait for a late member, a straggler or the skew model's
  lag, is blocked time before the collective's busy interval, not a part of it);
- communication share = exposed communication / iteration.
"""
from __future__ import annotations

import json

from emulator.outputs.atomic import write_atomic, write_text
from emulator.outputs.fileset import write_set


def _clipped(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of ``intervals`` inside [lo, hi]."""
    total = 0.0
    cur: tuple[float, float] | None = None  # the union's current piece
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi):
        if cur is None or s > cur[1]:
            if cur is not None:
                total += cur[1] - cur[0]
            cur = (s, e)
        else:
            cur = (cur[0], max(cur[1], e))
    if cur is not None:
        total += cur[1] - cur[0]
    return total


def iterations(record: dict) -> list[dict]:
    """One row per iteration: start_s, end_s, time_s, exposed_comm_s, comm_s, overlapped_comm_s, compute_s."""
    waits = [(w["start_s"], w["end_s"]) for w in record["waits"]]
    comms = [(c["start_s"], c["end_s"]) for c in record["comms"]]
    bounds = list(record["steps_s"]) or [record["end_s"]]
    rows, lo = [], 0.0
    for hi in bounds:
        exposed = _clipped(waits, lo, hi)
        rows.append({"start_s": lo, "end_s": hi, "time_s": hi - lo, "exposed_comm_s": exposed,
                     "comm_s": _clipped(comms, lo, hi), "overlapped_comm_s": _clipped(comms + waits, lo, hi) - exposed,
                     "compute_s": hi - lo - exposed})
        lo = hi
    return rows


def _mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows) if rows else 0.0


def summarize(record: dict, scenario: str) -> dict:
    """The summary (``summary.json``): DESIGN's key names where they apply, live facts under ``live``."""
    rows = iterations(record)
    steady = rows[1:] if len(rows) > 1 else rows
    it = _mean(steady, "time_s")
    exposed = _mean(steady, "exposed_comm_s")
    comm = _mean(steady, "comm_s")
    return {
        "scenario": scenario,
        "gpus": record["world"],
        "iteration_time_s": it,
        "breakdown_s": {"compute": _mean(steady, "compute_s"), "exposed_comm": exposed},
        "live": {
            "rank": record["rank"],
            "clock": record["clock"],
            "iterations": len(rows),
            "iterations_averaged": len(steady),
            "iteration_times_s": [r["time_s"] for r in rows],
            "comm_s": comm,
            "overlapped_comm_s": _mean(steady, "overlapped_comm_s"),
            "comm_share": exposed / it if it > 0 else 0.0,
            "collectives": len(record["comms"]),
            "collectives_per_iteration": _per_iteration(record, steady),
            "comm_bytes_per_iteration": _bytes_per_iteration(record, steady),
            "emulator_overhead_s": record["hidden_s"],
            "engine_runs": record["engine_runs"],
            "run_s": record["end_s"],
            "notes": record["notes"],
            "real": record.get("real", 1),
            "real_ranks": [_rank_row(r) for r in [record, *record.get("real_records", [])]],
        },
    }


def _rank_row(record: dict) -> dict:
    """A real rank's own mean iteration time (the first iteration left out, as above)."""
    rows = iterations(record)
    steady = rows[1:] if len(rows) > 1 else rows
    return {"rank": record["rank"], "iteration_time_s": _mean(steady, "time_s"),
            "exposed_comm_s": _mean(steady, "exposed_comm_s")}


def _in(rows: list[dict], t: float) -> bool:
    return any(r["start_s"] <= t < r["end_s"] for r in rows)


def _per_iteration(record: dict, rows: list[dict]) -> float:
    n = sum(1 for c in record["comms"] if _in(rows, c["issue_s"]))
    return n / len(rows) if rows else 0.0


def _bytes_per_iteration(record: dict, rows: list[dict]) -> float:
    b = sum(c["bytes"] for c in record["comms"] if _in(rows, c["issue_s"]))
    return b / len(rows) if rows else 0.0


def human(summary: dict) -> str:
    live = summary["live"]
    it = summary["iteration_time_s"]
    lines = [
        f"live run on {summary['scenario']}: rank {live['rank']} of {summary['gpus']} (clock: {live['clock']})"
        + (f", ranks 0..{live['real'] - 1} real" if live.get("real", 1) > 1 else ""),
        f"  iterations           {live['iterations']} (mean over the last {live['iterations_averaged']})",
        f"  iteration time       {it * 1e3:10.3f} ms",
        f"  compute (measured)   {summary['breakdown_s']['compute'] * 1e3:10.3f} ms",
        f"  exposed comm         {summary['breakdown_s']['exposed_comm'] * 1e3:10.3f} ms"
        f"  ({live['comm_share'] * 100:.1f}% of the iteration)",
        f"  comm (emulated)      {live['comm_s'] * 1e3:10.3f} ms"
        f"  ({live['overlapped_comm_s'] * 1e3:.3f} ms overlapped)",
        f"  collectives/iter     {live['collectives_per_iteration']:10.1f}"
        f"  ({live['comm_bytes_per_iteration'] / 1e6:.3f} MB)",
    ]
    if live.get("real", 1) > 1:
        lines.append("  real ranks           " + "  ".join(f"{r['rank']}: {r['iteration_time_s'] * 1e3:.3f} ms"
                                                        for r in live["real_ranks"]))
    lines += [f"  note: {n}" for n in live["notes"]]
    return "\n".join(lines)


def trace_events(record: dict, scenario: str) -> list[dict]:
    """Perfetto trace events (µs): the local rank's iterations, waits, real ops and emulated comm."""
    us = 1e6
    pid = record["rank"]
    ev: list[dict] = [{"ph": "M", "pid": pid, "name": "process_name",
                       "args": {"name": f"rank {pid} (local, real) of {record['world']} · {scenario}"}}]
    threads = ["iterations", "blocked on comm"]
    streams = sorted({c["stream"] for c in record["comms"]})
    threads += [f"{s} (emulated)" for s in streams]
    prof_tids = sorted({p["tid"] for p in record.get("profile", [])})
    threads += [f"torch ops (profiler, thread {t})" for t in prof_tids]
    for tid, name in enumerate(threads):
        ev.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}})
        ev.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}})
    for k, r in enumerate(iterations(record)):
        ev.append({"ph": "X", "pid": pid, "tid": 0, "name": f"iteration {k}", "cat": "iteration",
                   "ts": r["start_s"] * us, "dur": r["time_s"] * us,
                   "args": {"exposed_comm_us": r["exposed_comm_s"] * us, "comm_us": r["comm_s"] * us}})
    for w in record["waits"]:
        ev.append({"ph": "X", "pid": pid, "tid": 1, "name": f"wait ({w['reason']})", "cat": "exposed_comm",
                   "ts": w["start_s"] * us, "dur": (w["end_s"] - w["start_s"]) * us})
    sid = {s: 2 + i for i, s in enumerate(streams)}
    for c in record["comms"]:
        ev.append({"ph": "X", "pid": pid, "tid": sid[c["stream"]], "name": c["op"], "cat": "comm",
                   "ts": c["start_s"] * us, "dur": (c["end_s"] - c["start_s"]) * us,
                   "args": {"bytes": c["bytes"], "group_size": len(c["group"]),
                            "queued_us": (c["start_s"] - c["issue_s"]) * us}})
    ptid = {t: 2 + len(streams) + i for i, t in enumerate(prof_tids)}
    for p in record.get("profile", []):
        ev.append({"ph": "X", "pid": pid, "tid": ptid[p["tid"]], "name": p["name"], "cat": p["cat"] or "cpu_op",
                   "ts": p["ts_s"] * us, "dur": p["dur_s"] * us})
    return ev


LIVE_FILES = ("summary.json", "trace.json", "record.json")  # the marker first (outputs/fileset.py)


def write_report(out_dir: str, record: dict, summary: dict) -> list[str]:
    """Write summary.json, trace.json and record.json into ``out_dir`` as one set (outputs/fileset.py:
    a summary.json only ever sits beside files of its own run); return the paths."""
    doc = {"displayTimeUnit": "ms", "otherData": {"scenario": summary["scenario"], "live": True},
           "traceEvents": trace_events(record, summary["scenario"])}
    writers = {"summary.json": lambda p: write_text(p, json.dumps(summary, indent=2) + "\n"),
               "trace.json": lambda p: write_atomic(p, lambda fh: json.dump(doc, fh, separators=(",", ":"))),
               "record.json": lambda p: write_text(p, json.dumps(record) + "\n")}
    return write_set(out_dir, writers, LIVE_FILES)
