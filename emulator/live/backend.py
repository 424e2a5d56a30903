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
from torch._C._distributed_c10d import Work as _CWork

from emulator.live.session import CommRecord, Session

BACKEND = "emulator"
# session: the live Session; registered: the backend name is registered with torch (once per
# process); undo: what puts torch back as it was, one callable per patch or hook, in install order
_state: dict[str, Any] = {"session": None, "registered": False, "undo": []}


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

    # -- collectives -------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> EmulatorWork:
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        with session().clock.hidden():
            for t in tensors:
                _reduce_mirror(t, op, self.size())
            return self._work(tensors, "all_reduce", sum(map(_nbytes, tensors)))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> EmulatorWork:
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> EmulatorWork:
        with session().clock.hidden():
            for t in tensors:
                _reduce_mirror(t, opts.reduceOp, self.size())
            # a ring reduce moves the volume of a reduce-scatter; costed as one
            return self._work(tensors, "reduce_scatter", sum(map(_nbytes, tensors)))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> EmulatorWork:
        with session().clock.hidden():
            root = self.ranks[opts.rootRank]
            return self._work(tensors, "broadcast", sum(map(_nbytes, tensors)), root=root)

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> EmulatorWork:
        with session().clock.hidden():
            for outs, inp in zip(output_tensors, input_tensors):
                for o in outs:
                    o.copy_(inp)
            return self._work(output_tensors, "all_gather", self.size() * sum(map(_nbytes, input_tensors)))

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> EmulatorWork:
        with session().clock.hidden():
            output.view(self.size(), -1).copy_(input.reshape(1, -1).expand(self.size(), -1))
            return self._work([output], "all_gather", _nbytes(output))

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> EmulatorWork:
        with session().clock.hidden():
            for o, i in zip(outputs, inputs):
                o.view(self.size(), -1).copy_(i.reshape(1, -1).expand(self.size(), -1))
            return self._work(outputs, "all_gather", sum(map(_nbytes, outputs)))

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any) -> EmulatorWork:
        with session().clock.hidden():
            me = self.rank()
            for out, ins in zip(output_tensors, input_tensors):
                out.copy_(ins[me])
                _reduce_mirror(out, opts.reduceOp, self.size())
            return self._work(output_tensors, "reduce_scatter", self.size() * sum(map(_nbytes, output_tensors)))

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> EmulatorWork:
        with session().clock.hidden():
            output.copy_(input.reshape(self.size(), -1)[self.rank()].view_as(output))
            _reduce_mirror(output, opts.reduceOp, self.size())
            return self._work([output], "reduce_scatter", _nbytes(input))

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any) -> EmulatorWork:
        with session().clock.hidden():
            for o, i in zip(outputs, inputs):
                o.copy_(i.reshape(self.size(), -1)[self.rank()].view_as(o))
                _reduce_mirror(o, opts.reduceOp, self.size())
            return self._work(outputs, "reduce_scatter", sum(map(_nbytes, inputs)))

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> EmulatorWork:
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
                 opts: Any = None) -> EmulatorWork:
        with session().clock.hidden():
            for o, i in zip(output_tensors, input_tensors):
                o.copy_(i)
            return self._work(output_tensors, "all_to_all", sum(map(_nbytes, input_tensors)))

    def barrier(self, opts: Any = None) -> EmulatorWork:
        with session().clock.hidden():
            return self._work([], "barrier", 4.0)

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any) -> EmulatorWork:
        with session().clock.hidden():
            for outs, inp in zip(output_tensors, input_tensors):
                for o in outs:
                    o.copy_(inp)
            # costed as an all-gather of the same output (a lower bound would be a tree; this is NCCL's ring)
            return self._work(output_tensors, "all_gather", self.size() * sum(map(_nbytes, input_tensors)))

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any) -> EmulatorWork:
        with session().clock.hidden():
            me = self.rank()
            for out, ins in zip(output_tensors, input_tensors):
                if ins:  # the root's list; elsewhere the root (a mirror) sends what it would send here
                    out.copy_(ins[me])
            return self._work(output_tensors, "all_gather", self.size() * sum(map(_nbytes, output_tensors)))

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> EmulatorWork:
        return self.allgather(output_lists, inputs, opts)

    # torch 2.13 names of the single-tensor collectives
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base

    # -- point to point ------------------------------------------------------------
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> EmulatorWork:
        with session().clock.hidden():
            for t in tensors:
                self._sent[(tuple(t.shape), t.dtype)] = t.detach().clone()
            return self._work(tensors, "send", sum(map(_nbytes, tensors)), peer=self.ranks[dst])

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> EmulatorWork:
        with session().clock.hidden():
            for t in tensors:
                sent = self._sent.get((tuple(t.shape), t.dtype))
                if sent is not None:
                    t.copy_(sent)
            return self._work(tensors, "recv", sum(map(_nbytes, tensors)), peer=self.ranks[src])


def _create(opts: Any, pg_options: Any = None) -> EmulatorProcessGroup:
    return EmulatorProcessGroup(opts.group_rank, opts.group_size, list(opts.global_ranks_in_group))


# -- installation ------------------------------------------------------------------
def install(live: Session) -> None:
    """Make ``live`` the session of the emulator backend; register it and put its patches and hooks in (once)."""
    _state["session"] = live
    if not _state["registered"]:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
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
