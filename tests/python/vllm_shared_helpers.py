# SPDX-License-Identifier: Apache-2.0
"""Helpers of test_vllm_shared.py and the bench that run in other processes:
API-server writers and engine-worker readers following vLLM's sender and
receiver cache protocol over one shared store.
"""

import hashlib
import os
import random
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

from shmbroker.vllm import ShmBrokerObjectStorage, SingleWriterShmRingBuffer  # noqa: E402
from shmbroker.vllm_shared import SharedShmObjectStorage  # noqa: E402


def value_of(key, size):
    """The bytes of key's item: size bytes that differ from every other key's."""
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def open_store(cls, socket_path, name, ring_size, max_object_size, n_readers, writer):
    ring = SingleWriterShmRingBuffer(data_buffer_size=ring_size, name=name, create=writer,
                                     socket_path=socket_path)
    return cls(max_object_size=max_object_size, n_readers=n_readers, ring_buffer=ring)


def send(store, request, items):
    """vLLM's sender cache (P0) for one request of hashes: is_cached for each,
    touch each, then for each the cached object's pair or a put; an item that
    cannot be stored (a duplicate being written, or no room) is sent itself.
    The messages for the workers: (hash, "addr", address, id) or (hash,
    "item", bytes)."""
    for h in request:
        store.is_cached(h)
    for h in request:
        store.touch(h)
    out = []
    for h in request:
        if store.is_cached(h):
            out.append((h, "addr") + tuple(store.get_cached(h)))
            continue
        try:
            out.append((h, "addr") + tuple(store.put(h, items[h])))
        except (ValueError, MemoryError):
            out.append((h, "item", items[h]))
    return out


def receive(store, message, items):
    """vLLM's receiver cache (P1 worker) for one request: touch each address,
    then get each; the hashes whose bytes were wrong or missing, with why."""
    bad = []
    for m in message:
        if m[1] == "addr":
            store.touch(m[0], address=m[2], monotonic_id=m[3])
    for m in message:
        try:
            got = store.get(m[2], m[3]) if m[1] == "addr" else m[2]
        except Exception as e:  # reported: an object evicted while awaited
            bad.append((m[0], "%s: %s" % (type(e).__name__, e)))
            continue
        if got != items[m[0]]:
            bad.append((m[0], "wrong bytes (%d of %d)" % (len(got), len(items[m[0]]))))
    return bad


def writer_main(wid, cfg, phases, queues, barrier, results):
    """An API server: for each phase, a list of requests (lists of hashes);
    each request's messages go to every worker's queue. Puts ("writer", wid,
    stats, phase outputs) or ("error", wid, text) on results."""
    store = None
    try:
        cls = SharedShmObjectStorage if cfg["shared"] else ShmBrokerObjectStorage
        store = open_store(cls, cfg["socket"], cfg["name"], cfg["ring_size"],
                           cfg["max_object_size"], len(queues), True)
        items = cfg["items"]
        outs = []
        unacked = 0
        for phase in phases:
            barrier.wait()
            sent = []
            for request in phase:
                message = send(store, request, items)
                sent.append(message)
                for q in queues:
                    q.put(("req", wid, message))
                # As an API server waits for its answers, so that workers
                # read while writers write (and read objects get evicted).
                unacked += len(queues)
                while unacked > cfg["window"] * len(queues):
                    cfg["acks"][wid].get(timeout=120)
                    unacked -= 1
            outs.append(sent)
        barrier.wait()  # every writer done: none closes under another's hand-out
        stats = dict(getattr(store, "shared_stats", {}))
        results.put(("writer", wid, stats, outs))
    except BaseException:
        results.put(("error", wid, traceback.format_exc()))
        barrier.abort()
    finally:
        for q in queues:
            q.put(("done", wid, None))
        if store is not None:
            barrier_done = cfg.get("close_after")
            if barrier_done is not None:
                barrier_done.wait(120)
            store.close()


def reader_main(rid, cfg, queue, nwriters, results):
    """An engine worker: reads every request's messages until each writer said
    done; puts ("reader", rid, messages read, bad list) on results."""
    store = None
    try:
        store = open_store(ShmBrokerObjectStorage, cfg["socket"], cfg["name"], cfg["ring_size"],
                           cfg["max_object_size"], 0, False)
        items = cfg["items"]
        done = 0
        read = 0
        bad = []
        while done < nwriters:
            kind, wid, message = queue.get()
            if kind == "done":
                done += 1
                continue
            bad += receive(store, message, items)
            read += 1
            cfg["acks"][wid].put(rid)
        results.put(("reader", rid, read, bad))
    except BaseException:
        results.put(("error", "reader %d" % rid, traceback.format_exc()))
    finally:
        if store is not None:
            store.close()


def requests_for(wid, keys, nrequests, per_request, seed=0):
    """nrequests requests of per_request hashes drawn from keys, the same for
    the same (wid, seed)."""
    rng = random.Random(seed * 1000 + wid)
    return [rng.sample(keys, per_request) for _ in range(nrequests)]
