# SPDX-License-Identifier: Apache-2.0
"""One multimodal cache shared by several vLLM API servers, over shmbrokerd.

vLLM keeps its shared-memory multimodal cache for deployments with a single
API-server process: its store has one writer, and with several API servers
vLLM falls back to a cache per process. shmbrokerd has many writers, so
``SharedShmObjectStorage`` lets N API servers (the writers, each with its
own store of the same ring name on one daemon) and the engine's workers
(the readers, unchanged) share one store:

- is_cached() and get_cached() see every writer's objects, not only this
  writer's; the pair get_cached() returns counts from the ring's base, which
  the writers of a ring share, so a reader resolves it as any other.
- The same key put twice is stored once: put() of a key another writer has
  stored hands that object out and returns its pair instead of raising
  vLLM's "already exists" (put of a key this writer stored still raises, as
  vLLM's). When the other writer has not committed it yet, put() waits for
  the commit (half a second at most; then it raises vLLM's ValueError,
  which vLLM's sender takes as a benign duplicate and sends the item).
- Eviction never drops an object a reader still awaits: each hand-out adds
  the reads its readers will make, counted as vLLM's protocol makes them (a
  reader's first sight of a pair is one read, its get; each later sight is
  two, its touch and its get), whichever writer handed it out; the daemon
  evicts only objects whose awaited reads are done.

What differs from the single-writer store, on purpose: clear() and close()
delete only this writer's objects that no reader awaits (the others stay for
their readers, and the daemon evicts them once read), and clear() does not
start the pairs again at (0, 0), since the other writers' pairs count from
the same base; and the guard of a writer killed without close() deletes,
as close() would, only its objects that no reader awaits. The objects a
closed or killed writer leaves awaited are its guard's: it deletes each
once read, and those still awaited after _vllm_guard._GUARD_GRACE_S, so that
readers that never come do not hold them (and every client's reclaim
behind them) for ever.

The objects are the daemon's under daemon_key(ring name, key), so that
other tenants' objects of the same key are never taken for the ring's.

``enable_shared_mm_cache()`` is the hook that lets vLLM use the shm cache
with several API servers (the shmbroker plugin calls it when
$SHMBROKER_VLLM_SHARED_MM is set). This module knows vLLM's multimodal cache
decision and sender cache; the store underneath is vllm.py's.
"""

import collections
import hashlib
import importlib
import sys
import time
from typing import Any, Tuple

from .errors import KeyExists, NotFound, ShmBrokerError
from .vllm import PickleSerde, ShmBrokerObjectStorage

__all__ = ["SharedShmObjectStorage", "enable_shared_mm_cache", "SHARED_ENV", "daemon_key"]

# The variable that turns the shared mode on in the plugin.
SHARED_ENV = "SHMBROKER_VLLM_SHARED_MM"
# Keys a writer remembers whose touch found no object (a hand-out of such a
# key later counts the touch's reads too); a request has far fewer items.
_MISSED_MAX = 1 << 16
# Objects is_cached keeps pinned until their hand-out (_keep): vLLM hands
# out each right after; these bound what a caller that does not leaves.
_KEPT_MAX = 256
# Others' objects a hand-out checks are still there (_prune_foreign).
_FOREIGN_CHECKS = 4
# How long a put waits for another writer to commit the key it is writing,
# polling from _PENDING_POLL_S, doubling: a copy into shared memory takes
# far less; past it, vLLM's "already exists" (its sender sends the item).
_PENDING_WAIT_S = 0.5
_PENDING_POLL_S = 0.001


def daemon_key(ring_name, key):
    """The daemon's key of the object a shared store of ring ring_name keeps
    for key: the ring's own namespace, so that what other tenants of the
    daemon keep under the same key (another ring's store, any client) is
    never taken for this ring's object, nor handed out to its readers."""
    ring = hashlib.sha1(str(ring_name).encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return "vmm%s:%s" % (ring, key)


class _KeyIndex(dict):
    """key_index of a shared store: the store keeps it by daemon key
    (daemon_key); a lookup by the caller's key finds the same entry."""

    def __init__(self, prefix):
        super().__init__()
        self.prefix = prefix

    def __missing__(self, key):
        if isinstance(key, str) and not key.startswith(self.prefix):
            return self[self.prefix + key]
        raise KeyError(key)


class SharedShmObjectStorage(ShmBrokerObjectStorage):
    """ShmBrokerObjectStorage whose writers share one store: same constructor
    and methods (see the module's help for what the shared mode changes).

    Attribute ``shared_stats`` (writers): ``stored`` objects this writer
    stored, ``handed_out_others``
    hand-outs of objects another writer stored, ``put_found`` puts that found
    the key stored by another writer (stored once, not twice)."""

    shared = True
    _guard_keeps_awaited = True
    # A put waits for its commit: another writer's object of the key (EEXIST)
    # is handed out instead, which must be known when put returns.
    _put_waits = True

    def __init__(self, max_object_size: int, n_readers: int, ring_buffer,
                 serde_class: type = PickleSerde, reader_lock: Any = None):
        super().__init__(max_object_size, n_readers, ring_buffer, serde_class=serde_class,
                         reader_lock=reader_lock)
        # The daemon keeps this ring's objects under daemon_key(ring, key):
        # the methods taking a key add the prefix, everything below them
        # (indexes, the guard, the daemon) sees the prefixed key.
        self._prefix = daemon_key(ring_buffer.name, "")
        self.key_index = _KeyIndex(self._prefix)
        self._foreign = {}  # key -> (offset, chunk id) of others' objects handed out here
        self._missed = collections.OrderedDict()  # keys whose touch found nothing
        self._kept = collections.OrderedDict()  # key -> Pin taken by is_cached (_keep)
        self.shared_stats = {"stored": 0, "handed_out_others": 0, "put_found": 0}

    # ---- the caller's keys -------------------------------------------------

    def _dkey(self, key):
        """The daemon's key of key (a key already prefixed, as the store's
        own calls pass, stays as it is)."""
        return key if key.startswith(self._prefix) else self._prefix + key

    def put(self, key: str, value: Any) -> Tuple[int, int]:
        try:
            return super().put(self._dkey(key), value)
        except KeyExists:
            raise KeyExists("EEXIST", "Key '%s' already exists in the storage."
                            % key) from None

    def is_cached(self, key: str) -> bool:
        return super().is_cached(self._dkey(key))

    def get_cached(self, key: str) -> Tuple[int, int]:
        try:
            return super().get_cached(self._dkey(key))
        except KeyError:
            raise KeyError(key) from None

    def touch(self, key: str, address: int = 0, monotonic_id: int = 0) -> None:
        return super().touch(self._dkey(key), address, monotonic_id)

    # ---- helpers -----------------------------------------------------------

    def _own_alive(self, key):
        """Whether key is this writer's object and still stored."""
        return key in self._objects and super()._is_cached(key)

    def _keep(self, key):
        """Pin the committed object of key until this writer hands it out
        or puts it (or _KEPT_MAX newer ones are kept): whether there is one.
        The pin counts no read (a touch of one read first, which the get
        takes)."""
        client = self._client
        try:
            client.touch(key, 1)
            pin = client.get(key)
        except NotFound:
            self._drop_foreign(key)
            return False
        self._let_go_kept(key)
        self._kept[key] = pin
        while len(self._kept) > _KEPT_MAX:
            self._let_go_kept(next(iter(self._kept)))
        return True

    def _let_go_kept(self, key):
        pin = self._kept.pop(key, None)
        if pin is not None:
            try:
                pin.release(noreply=True)
            except ShmBrokerError:
                pass  # the connection went, and the pin with it

    def _note_missed(self, key):
        self._missed[key] = True
        self._missed.move_to_end(key)
        while len(self._missed) > _MISSED_MAX:
            self._missed.popitem(last=False)

    def _drop_foreign(self, key):
        if self._foreign.pop(key, None) is not None:
            pair = self.key_index.pop(key, None)
            if pair is not None and self.id_index.get(pair[1]) == key:
                del self.id_index[pair[1]]

    def _prune_foreign(self):
        """Drop from the indexes others' objects the daemon evicted, looking
        at the oldest hand-outs' chunk headers in the segment (no round
        trip), a few per call, so that the index of a long run stays the
        size of what is stored. One still there goes to the back."""
        for _ in range(min(_FOREIGN_CHECKS, len(self._foreign))):
            key = next(iter(self._foreign))
            where = self._foreign.pop(key)
            if self._header(where[0], committed=True) == (where[1], key):
                self._foreign[key] = where
            else:
                pair = self.key_index.pop(key, None)
                if pair is not None and self.id_index.get(pair[1]) == key:
                    del self.id_index[pair[1]]

    def _rekey(self):
        super()._rekey()
        if self._base is None:
            return
        for key, (offset, chunk_id) in getattr(self, "_foreign", {}).items():
            pair = self._rel(offset, chunk_id)
            self.key_index[key] = pair
            self.id_index[pair[1]] = key

    def _hand_out_foreign(self, key, reads):
        """Hand out another writer's object of key: it awaits reads more
        reads; its pair, counted from the ring's base. KeyError when it is
        not stored (or not committed yet), or when this writer knows no base
        to count from."""
        client = self._client
        if self._current_base() is None:
            raise KeyError(key)
        try:
            # One read more, taken at once by the get that finds where it is.
            client.touch(key, reads + 1)
            pin = client.get(key)
        except NotFound:
            self._drop_foreign(key)
            raise KeyError(key) from None
        try:
            offset = pin.offset
            header = self._header(offset, committed=True)
        finally:
            pin.release(noreply=True)
        if header is None or header[1] != key:
            raise KeyError(key)  # cannot be while it was pinned; say not cached
        self._foreign.pop(key, None)
        self._foreign[key] = (offset, header[0])  # the newest hand-out last
        self._prune_foreign()
        pair = self._rel(offset, header[0])
        self.key_index[key] = pair
        self.id_index[pair[1]] = key
        self.shared_stats["handed_out_others"] += 1
        return pair

    # ---- the writer --------------------------------------------------------

    def _is_cached(self, key: str) -> bool:
        if not self.is_writer:
            return super()._is_cached(key)
        with self.ring_buffer.lock:
            if self._own_alive(key):
                return True
            if self._current_base() is None:
                return False  # no pair could be given for it
            if key in self._missed:
                # The touch missed the item, and another writer may have put
                # it since, its reads perhaps all done: pinned here, so that
                # it stays until get_cached, which vLLM calls right after a
                # True here, relying on nothing going in between.
                return self._keep(key)
            if self._client.contains(key):
                return True
            self._drop_foreign(key)
            return False

    def _get_cached(self, key: str) -> Tuple[int, int]:
        with self.ring_buffer.lock:
            # A touch that found nothing counted no reads; the readers' touch
            # of this hand-out will count one each: this hand-out adds them.
            extra = self.n_readers if self._missed.pop(key, None) else 0
            try:
                if self._own_alive(key):
                    pair = super()._get_cached(key)
                    if extra:
                        try:
                            self._client.touch(key, extra)
                        except NotFound:
                            pass
                    return pair
                return self._hand_out_foreign(key, self.n_readers + extra)
            finally:
                self._let_go_kept(key)  # handed out: its reads keep it now

    def _touch(self, key: str, address: int = 0, monotonic_id: int = 0) -> None:
        if not self.is_writer:
            return super()._touch(key, address, monotonic_id)
        with self.ring_buffer.lock:
            try:
                self._client.touch(key, self.n_readers)
            except NotFound:
                self._note_missed(key)
                self._drop_foreign(key)
            else:
                # This request's touch counted: a miss of an earlier one
                # (whose put failed) must not count again.
                self._missed.pop(key, None)
        return None

    def _put(self, key: str, value: Any) -> Tuple[int, int]:
        assert self.is_writer, "Only the writer can put objects."
        with self.ring_buffer.lock:
            self._let_go_kept(key)
            if self._own_alive(key):
                raise KeyExists("EEXIST", "Key '%s' already exists in the storage." % key)
            missed = self._missed.pop(key, None)
            self._drop_foreign(key)  # gone, or about to be found again
            deadline = time.monotonic() + _PENDING_WAIT_S
            delay = _PENDING_POLL_S
            while True:
                try:
                    pair = super()._put(key, value)
                except KeyExists:
                    # Another writer's: hand its object out, as touch and
                    # get_cached would have had this writer seen it cached.
                    try:
                        pair = self._hand_out_foreign(key, 2 * self.n_readers)
                    except KeyError:
                        # Not committed yet: its writer is copying it in.
                        if time.monotonic() >= deadline:
                            raise KeyExists("EEXIST", "Key '%s' already exists in the "
                                            "storage." % key) from None
                        time.sleep(delay)
                        delay = min(2 * delay, 20 * _PENDING_POLL_S)
                        continue
                    self.shared_stats["put_found"] += 1
                    return pair
                except BaseException:
                    if missed:
                        self._note_missed(key)
                    raise
                self.shared_stats["stored"] += 1
                return pair

    def clear(self) -> None:
        """Forget every object this writer stored or handed out, deleting
        those of its own that no reader awaits; the pairs keep counting from
        the ring's base, which the other writers share."""
        if not self.is_writer:
            return
        with self.ring_buffer.lock:
            if self.ring_buffer.client is not None:
                self._again(self._delete_own)
            for key in list(self._objects):
                self._forget(key)
            self._foreign.clear()
            self._missed.clear()
            for key in list(self._kept):
                self._let_go_kept(key)
            self.key_index.clear()
            self.id_index.clear()

    def _delete_own(self):
        """Delete this writer's objects that no reader pins or awaits; the
        others stay for their readers (another writer may have handed them
        out), and the daemon evicts them once read."""
        client = self._client
        for key, (offset, chunk_id) in list(self._objects.items()):
            if self._header(offset, committed=True) != (chunk_id, key):
                continue
            for obj in client.list(key, 64):
                if obj.get("key") == key and obj.get("offset") == offset:
                    if obj.get("readers", 0) == 0 and obj.get("pins", 0) == 0:
                        try:
                            client.delete(key)
                        except NotFound:
                            pass
                    break


# ---- letting vLLM use the shm cache with several API servers ---------------

# Where vLLM decides which multimodal cache to use, by version: (module,
# attribute path, kind). "type": returns None/"processor_only"/"lru"/"shm";
# "ipc": returns whether the caches may talk between processes.
_DECISIONS = (
    ("vllm.multimodal.cache.factories", ("_get_cache_type",), "type"),
    ("vllm.multimodal.registry", ("MultiModalRegistry", "_get_cache_type"), "type"),
    ("vllm.multimodal.cache", ("_get_cache_type",), "type"),
    ("vllm.multimodal.cache", ("_enable_ipc_cache",), "ipc"),
)
# Where vLLM's shm sender and receiver caches live, by version.
_CACHE_MODULES = ("vllm.multimodal.cache.shm", "vllm.multimodal.cache")
_MARK = "_shmbroker_shared_mm"


def shared_mode_applies(vllm_config) -> bool:
    """Whether the shared mode changes vLLM's decision for this config: the
    shm cache asked for (mm_processor_cache_type "shm", a positive
    mm_processor_cache_gb) with more than one API server, and one data
    parallel engine (or an external load balancer), which is the only
    reason vLLM would not use it."""
    parallel = vllm_config.parallel_config
    mm = vllm_config.model_config.get_multimodal_config()
    count = getattr(parallel, "_api_process_count", 1)
    one_engine = parallel.data_parallel_size == 1 or bool(
        getattr(parallel, "data_parallel_external_lb", False))
    return (count > 1 and one_engine and getattr(mm, "mm_processor_cache_type", None) == "shm"
            and getattr(mm, "mm_processor_cache_gb", 0) > 0)


def _config_arg(args):
    """The VllmConfig among a decision's arguments (a method's self aside)."""
    for a in args:
        if hasattr(a, "parallel_config") and hasattr(a, "model_config"):
            return a
    return None


def _wrap_decision(orig, kind):
    def decide(*args, **kwargs):
        result = orig(*args, **kwargs)
        config = kwargs.get("vllm_config") or _config_arg(args)
        if config is None:
            return result
        if kind == "type" and result == "processor_only" and shared_mode_applies(config):
            return "shm"
        if kind == "ipc" and not result and shared_mode_applies(config):
            return True
        return result
    decide.__name__ = getattr(orig, "__name__", "decide")
    decide.__doc__ = getattr(orig, "__doc__", None)
    decide.__wrapped__ = orig
    setattr(decide, _MARK, True)
    return decide


def _wrap_sender(cls):
    """Make vLLM's sender cache (ShmObjectStoreSenderCache) keep its prompt
    updates for items another API server stored: it keeps them per process,
    so an item counts as cached here only when this process has its prompt
    updates, and an item it processed is given them before vLLM's method
    finds it in the shared store."""
    is_cached_item = cls.is_cached_item
    get_and_update_item = cls.get_and_update_item
    if getattr(is_cached_item, _MARK, False):
        return False

    def shared_is_cached_item(self, mm_hash):
        return mm_hash in self._p0_cache and is_cached_item(self, mm_hash)

    def shared_get_and_update_item(self, mm_item, mm_hash):
        if mm_item is not None and mm_hash not in self._p0_cache:
            self._p0_cache[mm_hash] = mm_item[1]
        return get_and_update_item(self, mm_item, mm_hash)

    for new, old in ((shared_is_cached_item, is_cached_item),
                     (shared_get_and_update_item, get_and_update_item)):
        new.__name__ = old.__name__
        new.__doc__ = old.__doc__
        new.__wrapped__ = old
        setattr(new, _MARK, True)
    cls.is_cached_item = shared_is_cached_item
    cls.get_and_update_item = shared_get_and_update_item
    return True


def enable_shared_mm_cache(modules=None):
    """Let vLLM use its shared-memory multimodal cache with several API
    servers, all sharing one SharedShmObjectStorage:

    - vLLM's decision (factories._get_cache_type, MultiModalRegistry.
      _get_cache_type or cache._enable_ipc_cache, whichever this vLLM has)
      answers "shm" where it would have fallen back to "processor_only" only
      because there is more than one API server (shared_mode_applies);
    - the shm cache module's SingleWriterShmObjectStorage becomes
      SharedShmObjectStorage (its readers are the same as ShmBrokerObjectStorage's);
    - its ShmObjectStoreSenderCache keeps prompt updates per process, as
      _wrap_sender says.

    modules: {module name: module} to patch (a test's stand-ins); None
    imports vLLM's. Returns the list of what was changed, as "module.name".
    Calling it again changes nothing more. RuntimeError when this vLLM has
    no decision or no shm cache this function knows: nothing is changed
    then, and vLLM would not share its cache."""
    def find(name):
        if modules is not None:
            return modules.get(name)
        if name in sys.modules:
            return sys.modules[name]
        try:
            return importlib.import_module(name)
        except ImportError:
            return None

    decisions = []
    for name, path, kind in _DECISIONS:
        mod = find(name)
        owner = mod
        for attr in path[:-1]:
            owner = getattr(owner, attr, None) if owner is not None else None
        if owner is None or not callable(getattr(owner, path[-1], None)):
            continue
        decisions.append((name, owner, path, kind))
    cache_mod = None
    for name in _CACHE_MODULES:
        mod = find(name)
        if mod is not None and hasattr(mod, "ShmObjectStoreSenderCache"):
            cache_mod = (name, mod)
            break
    if not decisions or cache_mod is None:
        raise RuntimeError(
            "%s is set, but this vLLM has %s that shmbroker knows (%s), so its multimodal "
            "cache cannot be shared by several API servers. Unset %s (vLLM then keeps a cache "
            "per API server), or use a shmbroker made for this vLLM."
            % (SHARED_ENV, "no multimodal cache decision" if not decisions
               else "no ShmObjectStoreSenderCache",
               ", ".join("%s.%s" % (n, ".".join(p)) for n, p, _ in _DECISIONS) if not decisions
               else " or ".join(_CACHE_MODULES), SHARED_ENV))
    changed = []
    for name, owner, path, kind in decisions:
        current = getattr(owner, path[-1])
        if getattr(current, _MARK, False):
            continue
        setattr(owner, path[-1], _wrap_decision(current, kind))
        changed.append("%s.%s" % (name, ".".join(path)))
    name, mod = cache_mod
    if getattr(mod, "SingleWriterShmObjectStorage", None) is not SharedShmObjectStorage:
        mod.SingleWriterShmObjectStorage = SharedShmObjectStorage
        changed.append("%s.SingleWriterShmObjectStorage" % name)
    if _wrap_sender(mod.ShmObjectStoreSenderCache):
        changed.append("%s.ShmObjectStoreSenderCache" % name)
    return changed
