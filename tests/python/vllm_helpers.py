# SPDX-License-Identifier: Apache-2.0
"""Helpers of test_vllm.py that run in other processes (multiprocessing
"spawn" imports them by module name): reader processes and serdes.
"""

import os
import pickle
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(HERE)), "client", "python")
if PACKAGE_DIR not in sys.path:
    sys.path.insert(0, PACKAGE_DIR)

from shmbroker.vllm import PickleSerde, ShmBrokerObjectStorage  # noqa: E402


def reader_process(handle, items, results):
    """Open the store from handle and get every (key, value, address, id) of
    items; put (key, "ok") or (key, "error text") on the results queue."""
    try:
        store = ShmBrokerObjectStorage.create_from_handle(handle)
    except Exception as e:  # reported, so that the test says what went wrong
        results.put(("<open>", "%s: %s" % (type(e).__name__, e)))
        return
    try:
        for key, value, address, monotonic_id in items:
            try:
                got = store.get(address, monotonic_id)
                results.put((key, "ok" if got == value else "got %r" % (got,)))
            except Exception as e:
                results.put((key, "%s: %s" % (type(e).__name__, e)))
    finally:
        store.close()


class StallingSerde(PickleSerde):
    """A serde whose deserialize announces itself (a byte on the file
    descriptor in $STALL_FD) and then never returns: a reader stuck in the
    middle of a read, holding its pin, for a test to kill."""

    def deserialize(self, data):
        fd = int(os.environ["STALL_FD"])
        os.write(fd, b"!")
        while True:
            time.sleep(60)


def stalled_reader_main(handle_bytes, address, monotonic_id):
    """Entry point of the process a test SIGKILLs mid-read."""
    handle = pickle.loads(handle_bytes)
    store = ShmBrokerObjectStorage.create_from_handle(handle)
    store.get(address, monotonic_id)


class PartsSerde:
    """A serde in vLLM's shape (metadata plus a list of buffers), as
    MsgpackSerde is: serialize gives (list of bytes, nbytes, metadata,
    md_bytes) and deserialize finds the data at the end of the view."""

    def serialize(self, value):
        parts = [bytes(p) for p in value]
        nbytes = sum(len(p) for p in parts)
        metadata = pickle.dumps(("parts", nbytes, [len(p) for p in parts]), protocol=5)
        return parts, nbytes, metadata, len(metadata)

    def deserialize(self, data):
        kind, nbytes, lengths = pickle.loads(data)
        assert kind == "parts"
        body = data[len(data) - nbytes:]
        out = []
        pos = 0
        for n in lengths:
            out.append(bytes(body[pos:pos + n]))
            pos += n
        return out



class RawSerde:
    """Bytes as they are, no metadata: a serialized size the test chooses."""

    def serialize(self, value):
        return bytes(value), len(value), b"", 0

    def deserialize(self, data):
        return bytes(data)
