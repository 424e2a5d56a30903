"""`collectives.algorithm: auto` picks by the emulator's own cost (issue 30): it runs the fastest of its
candidates, so more bandwidth never makes it slower and a larger message never finishes sooner."""
import pytest

from emulator.scenario import load_scenario_text
from emulator.tools.collective_bench import collective_table


def _times(node, nodes, algorithm, sizes, extra=()):
    sc = load_scenario_text(f"name: a\ncluster: {{nodes: {nodes}, node: {node}}}\n"
                            f"collectives: {{algorithm: {algorithm}}}\n", "a.yaml", list(extra))
    return [r["time_s"] for r in collective_table(sc, "all_reduce", sizes)]


def test_doubling_the_nics_never_slows_auto_down():
    # 16 DGX H100, 512 MiB: NCCL's model picked the tree at 400 Gb/s (2,921 us) and the ring at 800 Gb/s,
    # which the flows run in 3,541 us (the tree: 2,605 us). By its own cost auto runs the faster of the two.
    size, nic = [2**29], "cluster.node.nic_bandwidth=800 Gb/s"
    slow = _times("dgx-h100", 16, "auto", size)[0]
    fast = _times("dgx-h100", 16, "auto", size, [nic])[0]
    fixed = [_times("dgx-h100", 16, algo, size, [nic])[0] for algo in ("ring", "tree")]
    assert fast == min(fixed) <= slow


def test_a_larger_message_never_finishes_sooner_with_auto():
    # 2 DGX A100: NCCL's model switched to the ring at 256 KiB (128.6 us, 30 steps of ~4 us) and back to the
    # tree at 512 KiB (45.7 us). By its own cost auto stays on the tree, whose time grows with the size.
    sizes = [2.0**k for k in range(3, 31)]  # 8 B to 1 GiB
    auto = _times("dgx-a100", 2, "auto", sizes)
    assert all(a <= b for a, b in zip(auto, auto[1:]))
    ring, tree = _times("dgx-a100", 2, "ring", sizes), _times("dgx-a100", 2, "tree", sizes)
    assert auto == [min(r, t) for r, t in zip(ring, tree)]
    assert auto[15] == pytest.approx(43.69e-6, rel=1e-3)  # 256 KiB: the tree's 43.7 us, not the ring's 128.6
