"""Regenerate the study figures in plots/ (PNG + SVG) from the scenarios in plots/studies/.

    .venv/bin/python plots/make_plots.py [--jobs N] [--db-dir DIR]

1. fabric-oversubscription: iteration time against the fat-tree oversubscription, one
   line per NIC rate (a sweep, a line plot);
2. layout-tp-pp: tokens/s over the TP × PP plane of GPT-3 2.7B on 16 GPUs (a heatmap);
3. scale-pareto: tokens/s against GPUs for GPT-3 6.7B on 1–8 DGX H100 nodes and TP 2–8
   (the Pareto front);
4. hot-links: link utilisation over one iteration on a 4:1 oversubscribed fat-tree;
5. gantt-quickstart: the Gantt chart of scenarios/quickstart.yaml (PNG only, as `run --out`);
6. host-launch: iteration time against the host's cost of a launch, eager and with CUDA graphs of the
   attention, the router and the preprocess (Qwen3-30B-A3B on two GB200 racks);
7. cpu-offload-time and cpu-offload-memory: the iteration time and the memory per GPU against the layers
   offloaded to the host (Llama-3 70B on 64 GB200, Megatron-Bridge's recipe);
8. hybrid-tp-time and hybrid-tp-memory: Nemotron-H 56B on 64 GB200 against the TP size (DP = 64 / TP), the
   iteration time and the memory per GPU;
9. sparse-attention: the attention block's time per token of a DeepSeek-V3.2 layer (DeepSeek Sparse Attention)
   and of a DeepSeek-V3 layer (dense MLA) on one GB200 against the sequence length, forward and backward, the
   indexer's share shown (workload/sparse_attention.py; kernel costs, no simulation);
10. deepseek-v4: the attention block's time per token of DeepSeek-V4-Flash's three layer kinds (sliding, CSA, HCA)
   and of DeepSeek-V3.2's DSA layer on one GB200 against the sequence length, and mHC's two blocks (fused kernels)
   (workload/compressed_attention.py, workload/hyper_connection.py; kernel costs, no simulation).

The result databases go to --db-dir (default: a temporary folder), so re-running with
the same folder only draws. Takes about two minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from emulator.outputs.gantt import write_gantt  # noqa: E402
from emulator.outputs.linkplot import plot_links  # noqa: E402
from emulator.run.simulation import simulate  # noqa: E402
from emulator.scenario import load_scenario  # noqa: E402
from emulator.studies.executor import LocalExecutor  # noqa: E402
from emulator.studies.plot import plot_study  # noqa: E402
from emulator.studies.store import ResultStore  # noqa: E402
from emulator.studies.sweep import build_points, expand, run_points  # noqa: E402

STUDIES = os.path.join(HERE, "studies")


def sweep(scenario: str, varies: list[tuple[str, list[str]]], db: str, jobs: int) -> None:
    points, invalid = build_points(os.path.join(STUDIES, scenario), [], expand(varies), skip_invalid=True)
    with ResultStore(db) as store:
        stats = run_points(points, store, LocalExecutor(jobs))
    print(f"{scenario}: {len(points)} points ({len(invalid)} invalid left out), ran {stats.ran} "
          f"in {stats.wall_s:.1f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--db-dir", default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    db_dir = args.db_dir or tempfile.mkdtemp(prefix="emulator-plots-")
    db = lambda name: os.path.join(db_dir, name + ".sqlite")  # noqa: E731
    out = lambda name: os.path.join(HERE, name + ".png")  # noqa: E731

    sweep("fabric.yaml", [("cluster.fabric.oversubscription", ["1", "2", "4", "8"]),
                          ("cluster.node.nic_bandwidth", ["100 Gb/s", "200 Gb/s", "400 Gb/s"])],
          db("fabric"), args.jobs)
    plot_study(db("fabric"), out("fabric-oversubscription"), x="cluster.fabric.oversubscription",
               metric="iteration_time_s")

    sweep("layout.yaml", [("parallel.tp", ["1", "2", "4", "8"]), ("parallel.pp", ["1", "2", "4", "8"])],
          db("layout"), args.jobs)
    plot_study(db("layout"), out("layout-tp-pp"), x="parallel.tp", by="parallel.pp", metric="tokens_per_s")

    sweep("scale.yaml", [("cluster.nodes", ["1", "2", "4", "8"]), ("parallel.tp", ["2", "4", "8"])],
          db("scale"), args.jobs)
    plot_study(db("scale"), out("scale-pareto"), pareto=True)

    # eager, and the graphs Megatron-Core's MoE recipes take (a dropless MoE layer is not captured whole; the
    # sweep leaves out the combinations the rules refuse)
    sweep("host.yaml", [("cluster.node.host_launch", ["0 us", "11.3 us", "25 us", "50 us", "100 us"]),
                        ("training.cuda_graph_impl", ["none", "transformer_engine"]),
                        ("training.cuda_graph_modules", ["[]", "[attn,moe_router,moe_preprocess]"])],
          db("host"), args.jobs)
    plot_study(db("host"), out("host-launch"), x="cluster.node.host_launch", metric="iteration_time_s")

    # layer-wise CPU offloading: the time and the memory against the layers offloaded
    sweep("cpu-offload.yaml", [("training.cpu_offloading_num_layers",
                                ["1", "10", "20", "30", "40", "50", "60", "70", "79"])], db("cpu-offload"), args.jobs)
    plot_study(db("cpu-offload"), out("cpu-offload-time"), x="training.cpu_offloading_num_layers",
               metric="iteration_time_s")
    plot_study(db("cpu-offload"), out("cpu-offload-memory"), x="training.cpu_offloading_num_layers",
               metric="memory.peak_bytes_per_gpu")

    hybrid_tp(db, out, args.jobs)
    sparse_attention(out("sparse-attention"))
    deepseek_v4(out("deepseek-v4"))

    result = simulate(load_scenario(os.path.join(STUDIES, "hot-links.yaml")), record_links=True)
    plot_links(result, out("hot-links"), top=16)
    quick = simulate(load_scenario(os.path.join(os.path.dirname(HERE), "scenarios", "quickstart.yaml")))
    write_gantt(out("gantt-quickstart"), quick)
    print(f"figures in {HERE} ({time.perf_counter() - t0:.1f} s); databases in {db_dir}")


def hybrid_tp(db, out, jobs: int) -> None:  # noqa: ANN001
    """A hybrid model's TP size: the time and the memory (dp follows: 64 / tp)."""
    sweep("hybrid.yaml", [("parallel.tp", ["1", "2", "4", "8"])], db("hybrid"), jobs)
    plot_study(db("hybrid"), out("hybrid-tp-time"), x="parallel.tp", metric="iteration_time_s")
    plot_study(db("hybrid"), out("hybrid-tp-memory"), x="parallel.tp", metric="memory.peak_bytes_per_gpu")


def sparse_attention(path: str) -> None:
    """The attention block per token against the sequence length: DSA's (its indexer apart) and dense MLA's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from emulator.outputs.figures import save_figure
    seqs = [4096, 8192, 16384, 32768, 65536, 131072]
    rows = {name: [_attention_per_token(name, s) for s in seqs] for name in ("deepseek-v3", "deepseek-v3.2")}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(seqs, [r[0] for r in rows["deepseek-v3"]], "o-", label="DeepSeek-V3: dense MLA (flash attention)")
    ax.plot(seqs, [r[0] for r in rows["deepseek-v3.2"]], "s-", label="DeepSeek-V3.2: DSA, the whole block")
    ax.plot(seqs, [r[1] for r in rows["deepseek-v3.2"]], "s--", label="DeepSeek-V3.2: its indexer and sparse loss")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("attention block, forward + backward (us per token)")
    ax.set_title("One layer's attention on one GB200 (TP 1, no CP)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def deepseek_v4(path: str) -> None:
    """DeepSeek-V4-Flash's attention per token against the sequence length, each layer kind, beside DSA's."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from emulator.outputs.figures import save_figure
    seqs = [4096, 8192, 16384, 32768, 65536, 131072]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    kinds = ((0, "o-", "V4-Flash sliding (window 128)"), (4, "s-", "V4-Flash CSA (ratio 4, top 512)"),
             (128, "^-", "V4-Flash HCA (ratio 128)"))
    for ratio, marker, label in kinds:
        ax.plot(seqs, [_attention_per_token("deepseek-v4-flash", s, ratio)[0] for s in seqs], marker, label=label)
    ax.plot(seqs, [_attention_per_token("deepseek-v4-flash", s, 0)[2] for s in seqs], "k:",
            label="V4-Flash mHC, both blocks (fused)")
    ax.plot(seqs, [_attention_per_token("deepseek-v3.2", s)[0] for s in seqs], "d--", color="grey",
            label="DeepSeek-V3.2 DSA (top 2048)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("forward + backward (us per token)")
    ax.set_title("One layer's attention on one GB200 (TP 1, no CP)")
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_yticks([0.1, 0.2, 0.5, 1, 2, 5])
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 0.1), ncol=2)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _attention_per_token(preset: str, seq: int, ratio: int = -1) -> tuple[float, float, float]:
    """(the attention block's, the indexer's and its loss's, mHC's fused kernels') microseconds per token, forward
    and backward, of one layer of ``preset`` at ``seq`` tokens on one GB200 (``ratio``: a DeepSeek-V4 layer's)."""
    from dataclasses import replace

    from emulator.scenario.catalog import gpu, model_preset
    from emulator.workload import layer as Ly
    from emulator.workload.kernel_cost import kernel_time

    g = gpu("B200-GB200")
    L = Ly.layer_shape(replace(model_preset(preset), seq_len=seq, use_fused_mhc=True), 1, flash=True)
    L = replace(L, csa=ratio) if ratio >= 0 else L
    kernels = Ly.kernels(Ly.forward_steps(L) + Ly.backward_steps(L))
    hc = [k for k in kernels if k.name.startswith("hc.")]
    block = [k for k in kernels if not k.name.startswith(("ln2", "mlp", "moe", "shared", "bda2", "swiglu", "hc."))]
    indexer = [k for k in block if k.name.startswith("attn.indexer")]
    per = 1e6 / seq
    return tuple(sum(kernel_time(k, g) for k in ks) * per for ks in (block, indexer, hc))  # type: ignore[return-value]


if __name__ == "__main__":
    main()
