# SPDX-License-Identifier: Apache-2.0
"""What one multimodal store shared by several vLLM API servers saves: the
items and bytes of shared memory that hold the same requests' items when
each API server has a store of its own, and when they share one.

    python3 tests/bench/bench_vllm_shared.py [--servers 4] [--workers 2]
        [--items 64] [--item-size 262144] [--requests 40] [--per-request 3]
        [--json FILE]

Each API server (a process) sends --requests requests of --per-request
items drawn from the same --items images (their overlap is what real
traffic's popular images give), through vLLM's sender cache protocol
(tests/python/vllm_shared_helpers.py):
  per process  each server has its own single-writer store, on a daemon of
               its own (ShmBrokerObjectStorage), as vLLM's store is one per
               writer; nothing reads them
  shared       the servers share one SharedShmObjectStorage on one daemon,
               and --workers engine workers read every request's items
               through vLLM's receiver protocol, checking every byte
Both daemons are big enough that nothing is evicted: the figures are what
the stores hold at the end, from the daemons' object lists. Prints a table
and, with --json, one JSON line. Nothing here asserts a timing.
"""

import argparse
import json
import multiprocessing
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import shmbroker  # noqa: E402
import vllm_shared_helpers as H  # noqa: E402
from shmbroker.vllm_shared import daemon_key  # noqa: E402


def snapshot(socket_path, keys, name):
    """(objects, payload bytes) of the items' keys the daemon holds (the
    shared store keeps them in its ring's namespace, daemon_key)."""
    keys = set(keys) | {daemon_key(name, k) for k in keys}
    with shmbroker.Client(socket_path) as c:
        objs = [o for o in c.list(limit=100000) if o["key"] in keys]
    return len(objs), sum(o["size"] for o in objs)


def run(args, shared, items, requests_of):
    ctx = multiprocessing.get_context("fork")
    size = 2 * sum(len(v) for v in items.values()) + (8 << 20)
    daemons = [shmbroker.spawn_daemon(size) for _ in range(1 if shared else args.servers)]
    try:
        nreaders = args.workers if shared else 0
        base = {"name": "bench-mm-%d" % os.getpid(), "items": items, "ring_size": size,
                "max_object_size": max(len(v) for v in items.values()) + 4096,
                "shared": shared, "close_after": ctx.Event(), "window": 2,
                "acks": [ctx.Queue() for _ in range(args.servers)]}
        queues = [ctx.Queue() for _ in range(nreaders)]
        results = ctx.Queue()
        barrier = ctx.Barrier(args.servers, timeout=300)
        procs = []
        for r in range(nreaders):
            cfg = dict(base, socket=daemons[0].socket_path)
            procs.append(ctx.Process(target=H.reader_main,
                                     args=(r, cfg, queues[r], args.servers, results)))
        for w in range(args.servers):
            cfg = dict(base, socket=daemons[0 if shared else w].socket_path)
            procs.append(ctx.Process(target=H.writer_main,
                                     args=(w, cfg, [requests_of(w)], queues, barrier,
                                           results)))
        start = time.monotonic()
        for p in procs:
            p.start()
        stats, bad, errors = {}, [], []
        for _ in range(len(procs)):
            r = results.get(timeout=600)
            if r[0] == "writer":
                stats[r[1]] = r[2]
            elif r[0] == "reader":
                bad += r[3]
            else:
                errors.append(r)
        elapsed = time.monotonic() - start
        held = [snapshot(d.socket_path, items, base["name"]) for d in daemons]
        base["close_after"].set()
        for p in procs:
            p.join(120)
        if errors or bad:
            raise SystemExit("bench_vllm_shared: %s" % (errors or bad[:5]))
        return {"objects": sum(h[0] for h in held), "bytes": sum(h[1] for h in held),
                "seconds": elapsed, "writers": stats}
    finally:
        for d in daemons:
            d.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--servers", type=int, default=4, help="API-server processes")
    ap.add_argument("--workers", type=int, default=2, help="engine workers (readers)")
    ap.add_argument("--items", type=int, default=64, help="distinct images")
    ap.add_argument("--item-size", type=int, default=256 << 10, help="bytes per item")
    ap.add_argument("--requests", type=int, default=40, help="requests per server")
    ap.add_argument("--per-request", type=int, default=3, help="items per request")
    ap.add_argument("--json", help="append one JSON line to this file")
    args = ap.parse_args()
    keys = ["img-%03d" % i for i in range(args.items)]
    items = {k: H.value_of(k, args.item_size) for k in keys}

    def requests_of(w):
        return H.requests_for(w, keys, args.requests, args.per_request, seed=7)

    seen = [len({k for r in requests_of(w) for k in r}) for w in range(args.servers)]
    per = run(args, False, items, requests_of)
    shared = run(args, True, items, requests_of)
    saved = per["bytes"] - shared["bytes"]
    print("vLLM multimodal store: %d API servers, %d workers, %d requests of %d items each "
          "from %d images of %s bytes" % (args.servers, args.workers, args.requests,
                                           args.per_request, args.items, args.item_size))
    print("%-13s %8s %14s" % ("", "items", "bytes"))
    print("%-13s %8d %14d" % ("per process", per["objects"], per["bytes"]))
    print("%-13s %8d %14d" % ("shared", shared["objects"], shared["bytes"]))
    print("saved: %d items, %d bytes of shared memory (%.0f%%); distinct items each server "
          "saw: %s; hand-outs of another server's item: %d"
          % (per["objects"] - shared["objects"], saved,
             100.0 * saved / per["bytes"] if per["bytes"] else 0.0, seen,
             sum(s["handed_out_others"] + s["put_found"] for s in shared["writers"].values())))
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps({"bench": "vllm_shared_mm", "servers": args.servers,
                                "workers": args.workers, "items": args.items,
                                "item_size": args.item_size, "requests": args.requests,
                                "per_request": args.per_request,
                                "per_process_items": per["objects"],
                                "per_process_bytes": per["bytes"],
                                "shared_items": shared["objects"],
                                "shared_bytes": shared["bytes"],
                                "saved_bytes": saved}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
