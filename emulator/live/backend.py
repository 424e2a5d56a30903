"""The ``emulator`` torch.distributed backend: one local process acts as rank r of a world of N.

A Python subclass of ``torch.distributed.ProcessGroup``, registered with
``Backend.register_backend("emulator", ..., devices=["cpu"])``. Every collective
is intercepted: its data result is computed locally (mirror semantics, below),
its timing is recorded on the live ``Session`` (issued now, completed when the
emulated cluster says so), and it returns a Work whose future is already
completed. ``Work.wait()`` blocks the local clock until the emulated completion.

Data semantics, "mirror": the emulated ranks hold the same data as the local one.
- all_reduce / reduce: SUM → N·x, AVG, MIN, MAX, BAND, BOR → x, PRODUCT → x^N,
  BXOR → 0 for even N (x for odd N). DDP divides the gradients by N before
  a SUM all-reduce, so its averaged gradients come out right.
- all_gather (list or into one tensor) → N copies of the input.
- reduce_scatter (list or from one tensor) → the local shard reduced as above
  (SUM: N × the local shard).
- broadcast → the local tensor, unchanged (the root holds the same data).
- all_to_all → the output blocks are the input blocks (each peer sends what the
  local rank sends it), copied block by block when the split sizes agree.
- send → nothing to do; recv → the last tensor of the same shape and dtype this
  rank sent (what a symmetric copy would send), else the buffer is left as is.
- barrier → nothing.
Subgroups (``new_group``) are process groups of the same class over their global ranks.

Several real ranks (``emulator live --real K``, world ranks 0..K−1 real): a group whose
members are all real runs its collective for real, on the real process group of
those ranks (``emulator.live.peers``: gloo, or NCCL for CUDA tensors), asynchronously,
timed by the wall clock. A group that mixes real and emulated ranks gets its data by
the mirror rules of ``emulator.live.mirror`` (each emulated member holds the data of a
real member; the real members combine theirs for real, weighted by how many members
hold it) and its timing from the emulator, starting at the latest real member's
arrival (exchanged for real). Mixed gather, scatter, list all-to-all and uneven
all-to-all are refused with a message.

CUDA tensors: accepted when CUDA is present (the host synchronizes with the device
before stamping an issue, where the real job's collective would start on the
device's timeline); without CUDA a CUDA tensor is a clear error.

Install with ``install(session)`` before ``init_process_group("emulator", ...)``.
It also (1) skips DDP's cross-rank parameter-shape check for emulator groups (it
calls a C++ path that a Python process group cannot serve, and mirror ranks are
identical by construction), (2) makes the end of a backward pass wait for the
communication issued during it (DDP waits for its gradient buckets there), and
(3) hooks optimizer steps: a step waits for outstanding communication, and the
end of a step ends an iteration. ``uninstall()`` undoes (1)-(3) and drops the session
when the live run ends (``emulator.live.run``); the backend name stays registered
(torch cannot unregister one), and without a session nothing patched remains.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions
from torch._C._distributed_c10d import Work as _CWork

from emulator.live.mirror import is_real, mirrors, real_members, weights
from emulator.live.session import CommRecord, Session

BACKEND = "emulator"
# session: the live Session; registered: the backend name is registered with torch (once per
# process); undo: what puts torch back as it was, one callable per patch or hook, in install order
_state: dict[str, Any] = {"session": None, "registered": False, "undo": [], "peers": None}


def session() -> Session:
    s = _state["session"]
    if s is None:
        raise RuntimeError("the emulator backend has no live session: call emulator.live.backend.install() first")
    return s


class EmulatorWork(_CWork):
    """A Work whose data is ready; ``wait()`` advances the local clock to the emulated completion."""

    def __init__(self, result: Any, record: CommRecord | None) -> None:
        super().__init__()
        self.record = record
        self.future: torch.futures.Future[Any] = torch.futures.Future()
        self.future.set_result(result)

    def wait(self, timeout: Any = None) -> bool:
        if self.record is not None:
            s = session()
            with s.clock.hidden():
                s.wait(self.record, "barrier" if self.record.op == "barrier" else "wait")
        return True

    def get_future(self) -> torch.futures.Future:
        return self.future

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self) -> Any:
        return self.future.value()


class RealWork(_CWork):
    """A collective among real ranks running on the real transport; ``wait()`` waits for it."""

    def __init__(self, work: Any, record: CommRecord) -> None:
        super().__init__()
        self.work = work
        self.record = record

    def wait(self, timeout: Any = None) -> bool:
        s = session()
        s.complete(self.record.seq, "barrier" if self.record.op == "barrier" else "wait")
        return True

    def get_future(self) -> torch.futures.Future:
        return self.work.get_future()

    def is_completed(self) -> bool:
        return bool(self.work.is_completed())

    def is_success(self) -> bool:
        return bool(self.work.is_success())

    def result(self) -> Any:
        return self.work.result()


Work = EmulatorWork | RealWork


def peers() -> Any:
    """The real ranks' ``Peers`` (``emulator live --real K`` with K > 1)."""
    p = _state["peers"]
    if p is None:
        raise RuntimeError("the emulator backend has no real peers: install(session, peers) first")
    return p


def _device(tensors: Any) -> str:
    """"cuda" if any tensor is on a GPU (after a synchronize: the issue is stamped on the device's
    timeline), else "cpu"; a CUDA tensor without CUDA is a clear error."""
    flat = _flatten(tensors)
    if not any(t.device.type == "cuda" for t in flat):
        return "cpu"
    if not torch.cuda.is_available():
        raise RuntimeError("emulator backend: a CUDA tensor was handed to a collective, but this machine has no "
                           "CUDA device; run the script on CPU tensors here, or on a machine with a GPU")
    torch.cuda.synchronize()
    return "cuda"


def _flatten(x: Any) -> list[Any]:
    """The tensors in a tensor or (nested) list of them."""
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _flatten(item)]
    if hasattr(x, "device"):
        return [x]
    return []


def _sum_opts(op: Any = None) -> Any:
    o = dist.AllreduceOptions()
    o.reduceOp = dist.ReduceOp.SUM if op is None else op
    return o


def _nbytes(t: torch.Tensor) -> float:
    return float(t.numel() * t.element_size())


def _reduce_mirror(t: torch.Tensor, op: Any, n: int) -> None:
    """In place: the reduction of n identical copies of ``t``."""
    R = dist.ReduceOp
    op = getattr(op, "op", op)  # a ReduceOp object → its RedOpType
    if op == R.SUM:
        t.mul_(n)
    elif op == R.PRODUCT:
        t.pow_(n)
    elif op == R.BXOR:
        if n % 2 == 0:
            t.zero_()
    elif op in (R.AVG, R.MIN, R.MAX, R.BAND, R.BOR):
        pass
    else:
        raise RuntimeError(f"emulator backend: reduce op {op} is not supported")


class EmulatorProcessGroup(dist.ProcessGroup):
    """Rank ``rank`` of a group of ``size``; ``ranks`` are its members' world ranks."""

    def __init__(self, rank: int, size: int, ranks: list[int]) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the (rank, size) constructor a Python backend uses
        self.ranks = tuple(ranks) if ranks else tuple(range(size))
        self._sent: dict[tuple, torch.Tensor] = {}
        self._name = ""

    def getBackendName(self) -> str:
        return BACKEND

    # c10d names every group (``_set_group_name``) and DeviceMesh / FSDP2 read it back; the C++
    # ProcessGroup keeps the name on its backends, which a Python process group does not have
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        if not self._name:
            raise RuntimeError("ProcessGroup name not set")
        return self._name

    def _issue(self, op: str, nbytes: float, root: int = -1, peer: int = -1) -> CommRecord:
        s = session()
        return s.issue(op, self.ranks, nbytes, root=root, peer=peer)

    def _work(self, result: Any, op: str, nbytes: float, root: int = -1, peer: int = -1) -> EmulatorWork:
        return EmulatorWork(result, self._issue(op, nbytes, root, peer))

    # -- several real ranks ------------------------------------------------------------
    def _several(self) -> bool:
        return session().real > 1

    def _all_real(self) -> bool:
        return is_real(self.ranks, session().real)

    def _real(self, op: str, nbytes: float, device: str, call: Callable[[Any], Any]) -> RealWork:
        """Run ``call(pg)`` on the real group of this group's (all real) members, asynchronously."""
        s = session()
        with s.beacon.blocked(op, self.ranks, self.ranks):  # a new group waits for all its members
            pg = peers().group(self.ranks, device)
        work = call(pg)
        return RealWork(work, s.issue_real(op, self.ranks, nbytes, work))

    def _mixed(self, result: Any, op: str, nbytes: float, device: str, data: Callable[[Any, list[int]], None],
               root: int = -1) -> Work:
        """A group of real and emulated ranks: ``data(pg, reals)`` combines the real members' data
        for real (``pg`` None when this rank is the only real member); the timing is emulated,
        from the latest real member's arrival."""
        s = session()
        with s.clock.hidden():
            issued = s.clock.now()
            arrival = s.arrival(self.ranks)
            reals = sorted(real_members(self.ranks, s.real))
            with s.beacon.blocked(op, self.ranks, tuple(reals)):
                start = peers().exchange(tuple(reals), arrival)
                data(peers().group(tuple(reals), device) if len(reals) > 1 else None, reals)
            s.blocked_until_now(issued, "real exchange")  # waiting on the other real ranks is not compute
            return EmulatorWork(result, s.issue(op, self.ranks, nbytes, root, arrival=start))

    def _refuse(self, op: str) -> RuntimeError:
        return RuntimeError(f"emulator backend: {op} over group {list(self.ranks)} is not supported with "
                            f"several real ranks (0..{session().real - 1}); run it with --real 1")

    def _mixed_allreduce(self, tensors: list[torch.Tensor], op: Any) -> Work:
        R = dist.ReduceOp
        op = getattr(op, "op", op)
        s = session()
        w = weights(self.ranks, s.real)[s.rank]
        n = self.size()
        if op not in (R.SUM, R.AVG, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR):
            raise RuntimeError(f"emulator backend: reduce op {op} is not supported")

        def data(pg: Any, reals: list[int]) -> None:
            for t in tensors:  # this rank's data, held by w members
                if op in (R.SUM, R.AVG):
                    t.mul_(w / n if op == R.AVG else w)
                elif op == R.PRODUCT:
                    t.pow_(w)
                elif op == R.BXOR and w % 2 == 0:
                    t.zero_()
            if pg is not None:
                real_op = R.SUM if op == R.AVG else op
                pg.allreduce(tensors, _sum_opts(real_op)).wait()

        return self._mixed(tensors, "all_reduce", sum(map(_nbytes, tensors)), _device(tensors), data)

    def _gathered(self, pg: Any, reals: list[int], inp: torch.Tensor) -> dict[int, torch.Tensor]:
        """Each real member's ``inp`` (a real all-gather among them), by world rank."""
        if pg is None:
            return {reals[0]: inp}
        outs = [torch.empty_like(inp) for _ in reals]
        pg.allgather([outs], [inp]).wait()
        return dict(zip(reals, outs))

    def _mixed_gather_into(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor]) -> Work:
        """All-gather into one tensor per input: slot j holds member j's mirror's input."""
        mirror = mirrors(self.ranks, session().real)

        def data(pg: Any, reals: list[int]) -> None:
            for o, i in zip(outputs, inputs):
                got = self._gathered(pg, reals, i.contiguous())
                view = o.view(self.size(), -1)
                for j, m in enumerate(self.ranks):
                    view[j].copy_(got[mirror[m]].reshape(-1))

        return self._mixed(outputs, "all_gather", sum(map(_nbytes, outputs)), _device(inputs), data)

    def _mixed_reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], op: Any) -> Work:
        """Reduce-scatter from one tensor per output: member j gets Σ_k w_k · input_k[j] (AVG: / n)."""
        R = dist.ReduceOp
        op = getattr(op, "op", op)
        if op not in (R.SUM, R.AVG):
            raise RuntimeError(f"emulator backend: reduce-scatter with {op} over a mixed group is not supported")
        s = session()
        w = weights(self.ranks, s.real)[s.rank]
        me = self.rank()

        def data(pg: Any, reals: list[int]) -> None:
            for o, i in zip(outputs, inputs):
                x = i.reshape(self.size(), -1) * (w / self.size() if op == R.AVG else w)
                if pg is not None:
                    pg.allreduce([x], _sum_opts()).wait()
                o.copy_(x[me].view_as(o))

        return self._mixed(outputs, "reduce_scatter", sum(map(_nbytes, inputs)), _device(inputs), data)

    # -- collectives -------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if self._several():
            if not self._all_real():
                return self._mixed_allreduce(tensors, op)
            if getattr(op, "op", op) == dist.ReduceOp.AVG:  # gloo has no AVG: divide, then sum
                for t in tensors:
                    t.div_(self.size())
                op = dist.ReduceOp.SUM
            return self._real("all_reduce", sum(map(_nbytes, tensors)), _device(tensors),
                              lambda pg: pg.allreduce(tensors, _sum_opts(op)))
        _device(tensors)
        with session().clock.hidden():
            for t in tensors:
                _reduce_mirror(t, op, self.size())
            return self._work(tensors, "all_reduce", sum(map(_nbytes, tensors)))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> Work:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> Work:
        if self._several():  # every member gets the reduction (a superset of what the root needs)
            return self.allreduce(tensors, _sum_opts(opts.reduceOp))
        _device(tensors)
        with session().clock.hidden():
            for t in tensors:
                _reduce_mirror(t, opts.reduceOp, self.size())
            # a ring reduce moves the volume of a reduce-scatter; costed as one
            return self._work(tensors, "reduce_scatter", sum(map(_nbytes, tensors)))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> Work:
        if self._several():
            root = self.ranks[opts.rootRank]
            nbytes = sum(map(_nbytes, tensors))
            dev = _device(tensors)
            if self._all_real():
                return self._real("broadcast", nbytes, dev, lambda pg: pg.broadcast(tensors, opts))
            src = mirrors(self.ranks, session().real)[root]

            def data(pg: Any, reals: list[int]) -> None:
                if pg is not None:
                    o = dist.BroadcastOptions()
                    o.rootRank = reals.index(src)
                    pg.broadcast(tensors, o).wait()

            return self._mixed(tensors, "broadcast", nbytes, dev, data, root=root)
        _device(tensors)
        with session().clock.hidden():
            root = self.ranks[opts.rootRank]
            return self._work(tensors, "broadcast", sum(map(_nbytes, tensors)), root=root)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> Work:
        nbytes = self.size() * sum(map(_nbytes, input_tensors))
        if self._several():
            dev = _device(input_tensors)
            if self._all_real():
                return self._real("all_gather", nbytes, dev,
                                  lambda pg: pg.allgather(output_tensors, input_tensors, AllgatherOptions()))
            mirror = mirrors(self.ranks, session().real)

            def data(pg: Any, reals: list[int]) -> None:
                for outs, inp in zip(output_tensors, input_tensors):
                    got = self._gathered(pg, reals, inp.contiguous())
                    for o, m in zip(outs, self.ranks):
                        o.copy_(got[mirror[m]])

            return self._mixed(output_tensors, "all_gather", nbytes, dev, data)
        _device(input_tensors)
        with session().clock.hidden():
            for outs, inp in zip(output_tensors, input_tensors):
                for o in outs:
                    o.copy_(inp)
            return self._work(output_tensors, "all_gather", nbytes)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Work:
        if self._several():
            if self._all_real():
                return self._real("all_gather", _nbytes(output), _device([input]),
                                  lambda pg: pg._allgather_base(output, input, AllgatherOptions()))
            return self._mixed_gather_into([output], [input])
        _device([input])
        with session().clock.hidden():
            output.view(self.size(), -1).copy_(input.reshape(1, -1).expand(self.size(), -1))
            return self._work([output], "all_gather", _nbytes(output))

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> Work:
        if self._several():  # on the real transport too, one real all-gather per pair
            return self._mixed_gather_into(outputs, inputs)
        _device(inputs)
        with session().clock.hidden():
            for o, i in zip(outputs, inputs):
                o.view(self.size(), -1).copy_(i.reshape(1, -1).expand(self.size(), -1))
            return self._work(outputs, "all_gather", sum(map(_nbytes, outputs)))

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any) -> Work:
        if self._several():
            return self._mixed_reduce_scatter(output_tensors, [torch.stack(list(ins)) for ins in input_tensors],
                                              opts.reduceOp)
        _device(output_tensors)
        with session().clock.hidden():
            me = self.rank()
            for out, ins in zip(output_tensors, input_tensors):
                out.copy_(ins[me])
                _reduce_mirror(out, opts.reduceOp, self.size())
            return self._work(output_tensors, "reduce_scatter", self.size() * sum(map(_nbytes, output_tensors)))

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Work:
        if self._several():
            return self._mixed_reduce_scatter([output], [input], opts.reduceOp)
        _device([input])
        with session().clock.hidden():
            output.copy_(input.reshape(self.size(), -1)[self.rank()].view_as(output))
            _reduce_mirror(output, opts.reduceOp, self.size())
            return self._work([output], "reduce_scatter", _nbytes(input))

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any) -> Work:
        if self._several():
            return self._mixed_reduce_scatter(outputs, inputs, opts.reduceOp)
        _device(inputs)
        with session().clock.hidden():
            for o, i in zip(outputs, inputs):
                o.copy_(i.reshape(self.size(), -1)[self.rank()].view_as(o))
                _reduce_mirror(o, opts.reduceOp, self.size())
            return self._work(outputs, "reduce_scatter", sum(map(_nbytes, inputs)))

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> Work:
        if self._several():
            even = not output_split_sizes and not input_split_sizes and output.shape == input.shape
            if not even:
                raise self._refuse("an all-to-all with uneven splits")
            if self._all_real():
                return self._real("all_to_all", _nbytes(input), _device([input]),
                                  lambda pg: pg.alltoall_base(output, input, [], [], dist.AllToAllOptions()))
            mirror = mirrors(self.ranks, session().real)
            me = self.rank()

            def data(pg: Any, reals: list[int]) -> None:
                got = self._gathered(pg, reals, input.contiguous())
                outs = output.view(self.size(), -1)
                for j, m in enumerate(self.ranks):  # member j sends this rank its block ``me``
                    outs[j].copy_(got[mirror[m]].reshape(self.size(), -1)[me])

            return self._mixed([output], "all_to_all", _nbytes(input), _device([input]), data)
        _device([input])
        with session().clock.hidden():
            if list(output_split_sizes) == list(input_split_sizes) and output.shape == input.shape:
                output.copy_(input)
            else:  # uneven splits: each peer sends what the local rank sends it, as far as it fits
                outs = output.split(list(output_split_sizes) or output.shape[0] // self.size())
                ins = input.split(list(input_split_sizes) or input.shape[0] // self.size())
                for o, i in zip(outs, ins):
                    k = min(o.shape[0], i.shape[0])
                    o[:k].copy_(i[:k])
            return self._work([output], "all_to_all", _nbytes(input))

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> Work:
        if self._several():
            raise self._refuse("an all-to-all of tensor lists")
        with session().clock.hidden():
            for o, i in zip(output_tensors, input_tensors):
                o.copy_(i)
            return self._work(output_tensors, "all_to_all", sum(map(_nbytes, input_tensors)))

    def barrier(self, opts: Any = None) -> Work:
        if self._several():
            if self._all_real():
                return self._real("barrier", 4.0, "cpu", lambda pg: pg.barrier(dist.BarrierOptions()))
            return self._mixed([], "barrier", 4.0, "cpu", lambda pg, reals: None)
        with session().clock.hidden():
            return self._work([], "barrier", 4.0)

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any) -> Work:
        if self._several():
            raise self._refuse("a gather")
        with session().clock.hidden():
            for outs, inp in zip(output_tensors, input_tensors):
                for o in outs:
                    o.copy_(inp)
            # costed as an all-gather of the same output (a lower bound would be a tree; this is NCCL's ring)
            return self._work(output_tensors, "all_gather", self.size() * sum(map(_nbytes, input_tensors)))

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any) -> Work:
        if self._several():
            raise self._refuse("a scatter")
        with session().clock.hidden():
            me = self.rank()
            for out, ins in zip(output_tensors, input_tensors):
                if ins:  # the root's list; elsewhere the root (a mirror) sends what it would send here
                    out.copy_(ins[me])
            return self._work(output_tensors, "all_gather", self.size() * sum(map(_nbytes, output_tensors)))

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> Work:
        return self.allgather(output_lists, inputs, opts)

    # torch 2.13 names of the single-tensor collectives
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base

    # -- point to point ------------------------------------------------------------
    def _p2p_real(self, op: str, tensors: list[torch.Tensor], peer: int, tag: int) -> RealWork | None:
        """A send/recv between two real ranks runs on their real pair group; None if the peer is emulated."""
        s = session()
        world_peer = self.ranks[peer]
        if s.real <= 1 or world_peer >= s.real:
            return None
        pair = tuple(sorted((s.rank, world_peer)))
        dev = _device(tensors)
        with s.beacon.blocked(op, pair, pair, world_peer):
            pg = peers().group(pair, dev)
        other = pair.index(world_peer)
        work = pg.send(tensors, other, tag) if op == "send" else pg.recv(tensors, other, tag)
        return RealWork(work, s.issue_real(op, pair, sum(map(_nbytes, tensors)), work))

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> Work:
        real = self._p2p_real("send", tensors, dst, tag)
        if real is not None:
            return real
        _device(tensors)
        with session().clock.hidden():
            for t in tensors:
                self._sent[(tuple(t.shape), t.dtype)] = t.detach().clone()
            return self._work(tensors, "send", sum(map(_nbytes, tensors)), peer=self.ranks[dst])

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> Work:
        real = self._p2p_real("recv", tensors, src, tag)
        if real is not None:
            return real
        _device(tensors)
        with session().clock.hidden():
            for t in tensors:
                sent = self._sent.get((tuple(t.shape), t.dtype))
                if sent is not None:
                    t.copy_(sent)
            return self._work(tensors, "recv", sum(map(_nbytes, tensors)), peer=self.ranks[src])


def _create(opts: Any, pg_options: Any = None) -> EmulatorProcessGroup:
    session().beacon.init()  # the script called init_process_group (or new_group)
    return EmulatorProcessGroup(opts.group_rank, opts.group_size, list(opts.global_ranks_in_group))


# -- installation ------------------------------------------------------------------
def install(live: Session, real_peers: Any = None) -> None:
    """Make ``live`` the session of the emulator backend (with ``real_peers``, the other real ranks,
    when there are several); register it and put its patches and hooks in (once)."""
    _state["session"] = live
    _state["peers"] = real_peers
    if not _state["registered"]:
        devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=devices)
        _state["registered"] = True
    if not _state["undo"]:
        _state["undo"] = [_patch_ddp_check(), _patch_backward(), *_hook_optimizers()]


def uninstall() -> None:
    """Undo ``install``: DDP's parameter-shape check and ``torch.autograd.backward`` are the
    originals again, the optimizer step hooks are removed, and the backend has no session.
    Safe to call twice or without an install."""
    undo = _state["undo"]
    while undo:
        undo.pop()()  # the reverse of the install order
    _state["session"] = None
    _state["peers"] = None


def _patch_ddp_check() -> Callable[[], None]:
    import torch.nn.parallel.distributed as ddp

    original = ddp._verify_param_shape_across_processes

    @functools.wraps(original)
    def verify(process_group: Any, tensors: Any, logger: Any = None) -> Any:
        if isinstance(process_group, EmulatorProcessGroup):
            return None  # mirror ranks hold the same parameters by construction
        return original(process_group, tensors, logger)

    ddp._verify_param_shape_across_processes = verify

    def undo() -> None:
        if ddp._verify_param_shape_across_processes is verify:  # not if someone wrapped it since
            ddp._verify_param_shape_across_processes = original

    return undo


def _patch_backward() -> Callable[[], None]:
    original = torch.autograd.backward

    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        live = _state["session"]
        since = len(live.comms) if live is not None else 0
        out = original(*args, **kwargs)
        if live is not None and len(live.comms) > since:
            with live.clock.hidden():
                live.sync("backward", since)
        return out

    torch.autograd.backward = backward

    def undo() -> None:
        # if another library wrapped it since, leave its wrapper: ours is a pass-through without a session
        if torch.autograd.backward is backward:
            torch.autograd.backward = original

    return undo


def _hook_optimizers() -> list[Callable[[], None]]:
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        live = _state["session"]
        if live is not None:
            with live.clock.hidden():
                live.sync("optimizer")

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        live = _state["session"]
        if live is not None:
            live.step(id(optimizer))

    return [register_optimizer_step_pre_hook(pre).remove, register_optimizer_step_post_hook(post).remove]
