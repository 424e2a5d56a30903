"""NCCL's tuning model: which algorithm and protocol NCCL picks for a collective.

A port of ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` from NCCL's
src/graph/tuning.cc (github.com/NVIDIA/nccl, commit 5067397c, NCCL 2.30.7 by
makefiles/version.mk). For each (algorithm, protocol) NCCL predicts

    time = latency + S / algbw        (µs and GB/s in NCCL; seconds and B/s here)

and runs the pair with the least time. The constants are NCCL's tables
``ncclTunerConstantsDefaults``: ``baseLatencies``, ``hwLatencies``, ``llMaxBws``,
``perChMaxRingLL128Bws``, ``perChMaxTreeLL128Bws``, ``perChMaxTreeBws``, plus
``nvlsEfficiency`` and ``treeCorrectionFactor`` (same file).

Bandwidth per channel (NCCL's graph search, src/graph/search.cc, is not ported):
across nodes one channel per NIC rail the group can use (the emulator's ring
channels), each at the NIC's calibrated rate; inside one node one channel per GPU,
sharing the GPU's calibrated NVLink (or PCIe) port. Assumed: an x86 Intel host
(``getNetOverhead`` 1 µs, ``llMaxBws`` row 0 across nodes), a balanced tree
pattern, ``sameChannels``, zero ``latencyInter``. LL128 is on with NVLink inside
the node (``typeIntra <= PATH_NVB``). Candidates are the algorithms the emulator
builds: Ring, Tree, CollNet Direct (with ``fabric.sharp``) and NVLS (one node
with NVLink SHARP); NVLS Tree and PAT are left out. Only all-reduce has a choice;
the other collectives are Ring in NCCL's table (all-to-all is not tuned: direct).

Multi-node NVLink (a GB200/GB300 NVL72 rack, ``cluster.node.nvlink_domain``): NCCL's node is the
NVLink domain. It fuses the topology of every rank of an MNNVL clique into one system
(src/graph/topo.cc, ncclTopoGetSystem: "if (comm->MNNVL) { // MNNVL clique support nLocalRanks =
comm->clique.size"), counts the domains as its nodes (src/init.cc, initNvlDomainInfo: ``nNvlDomains =
comm->nNodes``), and so tunes with nNodes = domains: NVLS over one domain (its multicast objects
span the rack's NVLink switches), ring and tree inside it over NVLink, the NICs between domains only;
NVLS Tree only across domains ("Disable NVLS Tree on a single node", tuning.cc ncclTopoTuneModel's
algoEnable loop) and NVLS itself across domains only with CollNet ("Collnet+NVLS", same loop). Here
``hardware`` is that of the domain (network/domain.py, ``network_node``): its GPUs and all its
trays' NICs.
"""
from __future__ import annotations

from dataclasses import dataclass

from emulator.network.domain import network_node
from emulator.scenario.spec import ClusterSpec

# NCCL's indices (src/include/plugin/nccl_tuner.h)
TREE, RING, COLLNET_DIRECT, COLLNET_CHAIN, NVLS, NVLS_TREE, PAT = range(7)
LL, LL128, SIMPLE = range(3)
HW_NVLINK, HW_PCI, HW_NET = range(3)
VOLTA, AMPERE, HOPPER, BLACKWELL = range(4)
PROTOCOLS = ("LL", "LL128", "Simple")

# tuning.cc, ncclTunerConstantsDefaults.baseLatencies [algorithm][protocol], µs
BASE_LATENCIES = (
    (6.8, 14.0, 8.4), (6.6, 14.0, 8.4),  # Tree, Ring
    (0, 0, 0), (0, 0, 0),  # CollNet Direct, CollNet Chain
    (0, 0, 0), (0, 0, 0),  # NVLS, NVLS Tree
    (8.0, 8.0, 8.0),  # PAT
)
# tuning.cc, ncclTunerConstantsDefaults.hwLatencies [NVLINK, PCI, NET][algorithm][protocol], µs
HW_LATENCIES = (
    ((0.6, 1.25, 4.0), (0.6, 1.9, 3.4), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 25), (0, 0, 25), (0, 0, 4.0)),
    ((1.0, 1.9, 4.0), (1.0, 2.5, 5.7), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 0), (0, 0, 0), (0, 0, 4.0)),
    ((5.0, 8.5, 14), (2.7, 4.0, 14.0), (0, 0, 31), (0, 0, 30), (0, 0, 18), (0, 0, 20.9), (0, 0, 14)),
)
# tuning.cc, llMaxBws [Volta/Intel, Ampere/AMD, Hopper, Blackwell][1 node, 2 nodes, more], GB/s
LL_MAX_BWS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
# tuning.cc, perChMaxRingLL128Bws, perChMaxTreeLL128Bws, perChMaxTreeBws [compcap][1, 2, more nodes], GB/s
PER_CH_MAX_RING_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7), (40.0, 40.0, 40.0))
PER_CH_MAX_TREE_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
PER_CH_MAX_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))
NVLS_EFFICIENCY = (0.0, 0.0, 0.85, 0.74)  # tuning.cc, nvlsEfficiency [compcap]
# tuning.cc, treeCorrectionFactor [protocol][log2(S/64)], sizes 64 B to 256 MB
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)
NET_OVERHEAD_US = 1.0  # tuning.cc, getNetOverhead: x86 Intel (AMD: 2.0)
COLLNET_ARITY_US = 0.4  # tuning.cc: "0.4 us arity serialization latency" of CollNet Direct

# the emulator's names of NCCL's algorithms
NAMES = {TREE: "tree", RING: "ring", COLLNET_DIRECT: "collnet", NVLS: "nvls"}
# GPU catalog name prefix → NCCL compute-capability index (sm70 Volta, sm80/86/89 Ampere row, sm90 Hopper, sm100)
ARCH_BY_PREFIX = (("V100", VOLTA), ("A100", AMPERE), ("A10", AMPERE), ("L40", AMPERE), ("H", HOPPER),
                  ("GH", HOPPER), ("B", BLACKWELL), ("GB", BLACKWELL))


@dataclass(frozen=True)
class Hardware:
    """What the tuning model needs to know about a cluster's nodes (SI units)."""

    arch: int  # compute-capability index: VOLTA, AMPERE, HOPPER, BLACKWELL
    nvlink: bool  # NVLink/NVSwitch inside the node (else PCIe)
    nics: int  # NICs per node
    nic_bw: float  # B/s per NIC, calibrated (line rate × efficiency)
    intra_bw: float  # B/s per GPU port inside the node, calibrated
    sharp: bool = False  # in-network reduction in the fabric's switches (CollNet)
    nvls: bool = False  # NVLink SHARP inside a node


@dataclass(frozen=True)
class Comm:
    """One communicator: ranks, nodes, and NCCL's channels (count and GB/s each)."""

    ranks: int
    nodes: int
    channels: int
    channel_bw: float  # GB/s

    @property
    def ppn(self) -> float:
        return self.ranks / self.nodes


@dataclass(frozen=True)
class Choice:
    """NCCL's pick for one call: the emulator's algorithm name, the protocol, the predicted time (s)."""

    algorithm: str
    protocol: str
    time_s: float


def arch_of(gpu_name: str) -> int:
    """NCCL's compute-capability row of a catalog GPU (unknown: Ampere, NCCL's sm80 row)."""
    for prefix, arch in ARCH_BY_PREFIX:
        if gpu_name.upper().startswith(prefix):
            return arch
    return AMPERE


def hardware(cluster: ClusterSpec) -> Hardware | None:
    """The tuning inputs of a catalog or inline node; None on a custom graph (no nodes to tune for)."""
    if cluster.node is None or cluster.fabric.kind == "custom":
        return None
    node = network_node(cluster.node)  # NCCL's node with multi-node NVLink is the NVLink domain (domain.py)
    return Hardware(arch_of(node.gpu.name), node.intra == "nvswitch", node.nics,
                    node.nic_bandwidth * node.nic_efficiency, node.intra_bandwidth * node.intra_efficiency,
                    cluster.fabric.sharp, node.nvls_busbw > 0)


def comm_of(hw: Hardware, per_node: list[int]) -> Comm:
    """A group with ``per_node`` members on each of its nodes: one channel per usable NIC rail across
    nodes (as many as the smallest node's members), one per GPU on a single node."""
    ranks, nodes = sum(per_node), len(per_node)
    if nodes == 1:
        return Comm(ranks, 1, ranks, hw.intra_bw / ranks / 1e9)
    k = min(per_node)
    per_node_bw = min(k, max(hw.nics, 1)) * hw.nic_bw
    return Comm(ranks, nodes, k, min(per_node_bw / k, hw.intra_bw) / 1e9)


def log2i(n: int) -> int:
    """NCCL's log2i (log2Down): floor(log2 n), and -1 for 0."""
    return n.bit_length() - 1


def _nsteps(op: str, n: int) -> int:
    return 2 * (n - 1) if op == "all_reduce" else n - 1 if op in ("all_gather", "reduce_scatter") else n


def bandwidth(op: str, algo: int, proto: int, comm: Comm, hw: Hardware) -> float:
    """NCCL's algorithm bandwidth (GB/s) of (algo, proto); 0: not usable. tuning.cc, ncclTopoTuneModel."""
    if op == "broadcast" and algo != RING:
        return 0.0
    if op in ("all_gather", "reduce_scatter") and algo not in (RING, NVLS, COLLNET_DIRECT):
        return 0.0
    if algo == NVLS and (proto != SIMPLE or comm.channels < 2):
        return 0.0
    if proto == LL128 and not hw.nvlink:  # LL128 only with typeIntra <= PATH_NVB
        return 0.0
    n_ch, nodes, ppn = comm.channels, comm.nodes, comm.ppn
    idx2 = nodes - 1 if nodes <= 2 else 2
    ll_max = LL_MAX_BWS[hw.arch if nodes == 1 else 0][idx2]
    bw = comm.channel_bw
    if algo == NVLS:
        intra = bw * NVLS_EFFICIENCY[hw.arch] * (n_ch - 1) / n_ch
        intra *= 2.0 if op == "all_reduce" else (ppn - 1) / ppn
        bw = min(intra, bw)
    bus = n_ch * bw
    if algo == RING and proto == LL:
        bus = min(ll_max, bus * .5)
    if algo == RING and proto == LL128:
        bus = min(bus * 0.92, n_ch * PER_CH_MAX_RING_LL128[hw.arch][idx2])
    if algo == TREE and op == "all_reduce":
        bus = min(bus * .92, n_ch * PER_CH_MAX_TREE[hw.arch][idx2])
    if algo == TREE and proto == LL:
        bus = min(bus * 1.0 / 3.8, ll_max)
    if algo == TREE and proto == LL128:
        bus = min(bus * (7.0 / 9.0 if nodes == 1 else 120.0 / 128.0), n_ch * PER_CH_MAX_TREE_LL128[hw.arch][idx2])
    if algo == COLLNET_DIRECT:
        if proto != SIMPLE or op != "all_reduce":  # all-gather/reduce-scatter need a CollNet plugin's iallgather
            return 0.0
        factor = ppn / n_ch  # GPU/NIC ratio
        factor -= (factor - 1) / 2
        bus /= factor
        if hw.arch >= HOPPER:
            bus *= .85
    if algo in (RING, NVLS):
        return bus * comm.ranks / _nsteps(op, comm.ranks)
    return bus * .5


def latency(op: str, algo: int, proto: int, comm: Comm, hw: Hardware) -> float:
    """NCCL's latency (µs) of (algo, proto). tuning.cc, ncclTopoTuneModel."""
    nodes, ranks = comm.nodes, comm.ranks
    ppn_int = ranks // nodes
    intra_hw = HW_NVLINK if hw.nvlink else HW_PCI
    lat = BASE_LATENCIES[algo][proto]
    intra = HW_LATENCIES[intra_hw][algo][proto]
    inter = HW_LATENCIES[HW_NET][TREE if comm.ppn == 1 else algo][proto]  # + latencyInter (0), twice for Simple
    nsteps = _nsteps(op, ranks)
    if algo == RING:
        if op == "broadcast":  # sameChannels
            return lat + HW_LATENCIES[intra_hw if nodes == 1 else HW_NET][RING][proto]
        overhead = 0.0 if nodes == 1 else NET_OVERHEAD_US * (3 if proto == SIMPLE else 1)
        intra = max(intra, overhead)
        n_inter = 0 if nodes == 1 else 2 * (nodes - 1) if op == "all_reduce" else nodes - 1
        return lat + (nsteps - n_inter) * intra + n_inter * inter
    if algo == TREE:
        return lat + 2 * ((ppn_int - 1) * intra + log2i(nodes) * inter) if op == "all_reduce" else lat
    if algo == COLLNET_DIRECT:
        return lat + 2 * (min(1, ppn_int - 1) * intra + (ppn_int - 1) * COLLNET_ARITY_US) + inter
    if algo == NVLS:
        return intra + (inter if nodes > 1 else 0.0)
    return lat


def algo_time(op: str, algo: int, proto: int, nbytes: float, comm: Comm, hw: Hardware) -> float | None:
    """NCCL's predicted time (s) of one call, or None where (algo, proto) is not usable.
    tuning.cc, ncclTopoGetAlgoTime, with one operation in flight (numPipeOps 1)."""
    bw = bandwidth(op, algo, proto, comm, hw)
    if bw <= 0:
        return None
    lat = latency(op, algo, proto, comm, hw)
    log_size = log2i(int(nbytes) >> 6)
    if algo == TREE and op == "all_reduce" and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[proto][log_size]
    if (algo == RING and proto == SIMPLE and comm.nodes > 1 and op == "all_reduce"
            and nbytes / (comm.channels * comm.ranks) >= 64):
        lat *= 1.9 if hw.arch == VOLTA else 1.4  # "Plateau effect of ring"
    return lat * 1e-6 + nbytes / (bw * 1e9)


def choose(op: str, nbytes: float, comm: Comm, hw: Hardware, algorithms: tuple[str, ...]) -> Choice:
    """NCCL's pick among ``algorithms`` (emulator names) and its protocols: the least predicted time;
    ties go to the lower (algorithm, protocol) index, as NCCL's loop keeps the first minimum."""
    best: Choice | None = None
    for algo in sorted(NAMES):
        if NAMES[algo] not in algorithms:
            continue
        for proto in (LL, LL128, SIMPLE):
            t = algo_time(op, algo, proto, nbytes, comm, hw)
            if t is not None and (best is None or t < best.time_s):
                best = Choice(NAMES[algo], PROTOCOLS[proto], t)
    if best is None:
        raise ValueError(f"no NCCL algorithm among {', '.join(algorithms)} runs {op}")
    return best


def ring_only(op: str) -> bool:
    """Operations for which NCCL's table holds only the ring (or, all-to-all, no table at all)."""
    return op != "all_reduce"


__all__ = ["Choice", "Comm", "Hardware", "algo_time", "arch_of", "bandwidth", "choose", "comm_of", "hardware",
           "latency", "log2i", "ring_only"]
