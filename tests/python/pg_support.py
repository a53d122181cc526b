# SPDX-License-Identifier: Apache-2.0
"""Helpers of the tests that make queues over process groups, as vLLM does:
run a function in N forked members of a group, a torch.distributed gloo
group or vLLM's StatelessProcessGroup (the stand-in under vllm_standin/),
each member reporting "ok" or what went wrong.

A torch test is skipped when torch is not installed (Debian:
python3-torch); a skip is never counted as a pass.
"""

import multiprocessing
import os
import socket
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.path.join(HERE, "vllm_standin")
if STANDIN not in sys.path:
    sys.path.insert(0, STANDIN)

CTX = multiprocessing.get_context("fork")
WAIT = 30.0
KINDS = ("stateless", "torch")


def torch_or_skip(test):
    """torch.distributed with gloo, or the test is skipped."""
    try:
        import torch.distributed as dist
    except ImportError:
        test.skipTest("torch is not installed (Debian: apt-get install python3-torch)")
    if not dist.is_available() or not dist.is_gloo_available():
        test.skipTest("this torch has no distributed gloo backend")
    return dist


def numpy_or_skip(test):
    try:
        import numpy
    except ImportError:
        test.skipTest("numpy is not installed (make test installs python3-numpy)")
    return numpy


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_group(kind, rank, world_size, port):
    """This member's group of kind."""
    if kind == "torch":
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                                world_size=world_size)
        return dist.group.WORLD
    from vllm.distributed.utils import StatelessProcessGroup

    return StatelessProcessGroup.create("127.0.0.1", port, rank, world_size)


def barrier(pg):
    """Every member of pg got here (a torch ProcessGroup's own barrier()
    does not wait: dist.barrier does)."""
    if hasattr(pg, "broadcast_obj"):
        pg.barrier()
    else:
        import torch.distributed as dist

        dist.barrier(group=pg)


def _member(results, fn, kind, rank, world_size, port, env):
    os.environ.update(env)
    pg = None
    try:
        pg = make_group(kind, rank, world_size, port)
        out = fn(pg, rank, world_size)
        results.put((rank, "ok" if out is None else out))
    except BaseException:
        results.put((rank, traceback.format_exc()))
    finally:
        if pg is not None and hasattr(pg, "close"):
            pg.close(WAIT)


def distributed_run(test, fn, world_size, kind, env=None):
    """fn(pg, rank, world_size) in world_size forked members of a group of
    kind; returns {rank: "ok" or what it returned, or its traceback}.
    Members still running after WAIT seconds each are killed."""
    if kind == "torch":
        torch_or_skip(test)
    results = CTX.Queue()
    port = free_port()
    procs = [CTX.Process(target=_member, args=(results, fn, kind, r, world_size, port,
                                               dict(env or {})))
             for r in range(world_size)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in range(world_size):
            rank, what = results.get(timeout=WAIT * 4)
            out[rank] = what
    finally:
        for p in procs:
            p.join(WAIT)
            if p.is_alive():
                p.kill()
                p.join()
    return out
