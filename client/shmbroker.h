// SPDX-License-Identifier: Apache-2.0
/*
 * shmbroker client library: connect to shmbrokerd, map its shared-memory
 * segment, and put and get objects in place. The bytes never cross the
 * socket; only offsets do.
 *
 * Every call is blocking and returns 0 (or a documented non-negative value)
 * on success and a negative errno on failure; shmb_errmsg() then holds the
 * daemon's (or the library's) message. The library never prints, never exits
 * and never touches the application's signal handlers.
 *
 * Threads: one handle per thread; handles share nothing that needs a lock.
 * A handle serves one call at a time: a call made while another thread's
 * call runs on the same handle fails at once with -EBUSY and sends nothing
 * (shmb_errmsg, read in the refused thread, says so). shmb_close is not
 * refused that way (it returns nothing and frees the handle): close a handle
 * only once no other thread can be inside a call on it. Pointers a handle
 * returned stay valid in any thread until released.
 *
 * fork(): a handle belongs to the process that connected it. In a child made
 * by fork() after that, every call on the inherited handle (shmb_connect and
 * shmb_reconnect too) fails with -ECHILD and sends nothing: the child shares
 * the parent's socket, and the two would take each other's replies. In the
 * child, shmb_close the inherited handle (that closes only the child's copy
 * of the socket and the mapping; the parent's connection, pins and pending
 * allocations are untouched) and connect a new handle with shmb_new and
 * shmb_connect. Pointers the parent obtained stay mapped in the child but
 * are pinned only for the parent. The library counts forks with
 * pthread_atfork, so a child made by a raw clone() system call is not
 * recognised. The shmb_set_ calls only set options and are not checked.
 *
 * Keys are UTF-8 text of 1 to SHMB_KEY_MAX_LEN bytes (a C string, so no
 * NUL). Every call that takes a key, the _nowait and _many ones included,
 * refuses any other with -EINVAL before sending anything, with the words the
 * daemon uses.
 *
 * Every request carries an "id" (a counter of the handle) and every reply
 * must carry the one the call waits for. A reply that does not (the answer to
 * some other request) fails the call with -ECONNRESET and closes the
 * connection, which releases the handle's pins and pending allocations as a
 * disconnect does; call shmb_reconnect to go on. One call's reply is never
 * handed to another.
 */
#ifndef SHMBROKER_H
#define SHMBROKER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SHMB_KEY_MAX_LEN 255

typedef struct shmb shmb_t;

/* What the daemon said about its segment at hello. */
typedef struct shmb_info {
    char segment[256];
    uint64_t size;
    uint64_t data_offset;
    uint64_t data_size;
    uint64_t max_object_size;
    uint64_t alignment;
    /* Added with pools: the pool this connection uses and its backing
     * ("shm", "memfd" or "hugetlbfs"); "" from a daemon without pools. */
    char pool[33];
    char backing[16];
} shmb_info_t;

/* Occupancy, as shmbrokerctl status shows it. */
typedef struct shmb_stats {
    uint64_t size, data_size, used, free;
    uint64_t objects, pending, pinned, clients;
    uint64_t max_object_size, uptime_s, shm_dir_free;
    int64_t pid;
    uint64_t allocs, commits, gets, evictions, enospc;
    char segment[256];
    char version[32];
    char shm_dir[4096];
    int has_blocker;
    char blocker_key[SHMB_KEY_MAX_LEN + 1];
    uint64_t blocker_pins, blocker_readers;
    char blocker_state[16];
    /* Added after the first release (0.1.0): see shmb_stats_sized. */
    uint64_t expired_allocs, lease_expiries, noreply_errors;
    /* Added with pools: the pool these figures are of, its backing ("shm",
     * "memfd", "hugetlbfs") and the group it is restricted to ("" when none;
     * all "" from a daemon without pools). */
    char pool[33];
    char backing[16];
    char group[65];
    /* Added with reads in place: awaited reads that readers counted in
     * place (shmb_read) rather than with a get. */
    uint64_t fast_reads;
} shmb_stats_t;

/* One object of a shmb_list, as the daemon lists it. */
typedef struct shmb_object_info {
    const char *key; /* UTF-8, NUL-terminated; owned by the list */
    uint64_t offset, size;
    uint64_t pins;    /* readers holding it now */
    uint64_t readers; /* reads it still awaits */
    uint64_t age_ms;  /* since it was allocated */
    char state[16];   /* "pending", "committed", ... */
} shmb_object_info_t;

/* What shmb_list returns: objects[0..count), oldest first. */
typedef struct shmb_list {
    size_t count;
    int truncated; /* more objects matched than the list holds */
    shmb_object_info_t *objects;
} shmb_list_t;

/* One connection of a shmb_clients. */
typedef struct shmb_client_info {
    int64_t pid, uid, gid;
    const char *name; /* as the client said at hello, "" without (or when its pool
                       * has a group= that leaves this client out); owned by the list */
    char mode[4];     /* "rw" or "ro" */
    uint64_t pins, pending, bytes_pinned;
    uint64_t connected_unix; /* seconds since the epoch */
    int self;                /* this handle's own connection */
} shmb_client_info_t;

/* What shmb_clients returns: clients[0..count). */
typedef struct shmb_clients {
    size_t count;
    shmb_client_info_t *clients;
    /* Added after the first release (0.1.0), here rather than in
     * shmb_client_info_t, whose size programs built then index clients[]
     * by: pools[i] is the pool clients[i] said hello to ("" before its
     * hello, and from a daemon without pools). Owned by the list. */
    const char *const *pools;
    /* Added after 0.1.0 too: own_pids[i] is the pid clients[i]'s hello said
     * it has in its own pid namespace, 0 when it said none. Where
     * clients[i].pid is 0 (a client in a pid namespace the daemon cannot see
     * into), it is all there is to tell the process by. Owned by the list. */
    const int64_t *own_pids;
} shmb_clients_t;

/* A new, unconnected handle; NULL when out of memory. */
shmb_t *shmb_new(void);

/* Map the segment without prefaulting it (MAP_POPULATE is the default, so
 * that the first write to each page does not fault in the hot path; turn it
 * off for huge segments). Call before shmb_connect. */
void shmb_set_populate(shmb_t *c, int populate);

/* Connect read-only: the daemon passes a read-only descriptor, the segment
 * is mapped PROT_READ, and alloc, commit, abort, touch and delete fail with
 * -EPERM. Call before shmb_connect. */
void shmb_set_read_only(shmb_t *c, int read_only);

/* Let shmb_alloc and shmb_put wait up to wait_ms for space when the segment
 * is full (the daemon answers as soon as a release, delete or abort makes
 * room, oldest waiter first), instead of failing with -ENOSPC at once; they
 * fail with -ETIMEDOUT when the time runs out. 0 (the default) never waits. */
void shmb_set_alloc_wait(shmb_t *c, unsigned wait_ms);

/* Use the pool called pool (a daemon may serve several, each its own
 * segment, keys and limits; PROTOCOL.md, "Pools"): hello names it, and
 * every call of the handle acts on it. NULL or "" (the default) is the
 * daemon's default pool: its first, or the first this process may use when
 * the first's group= leaves it out. The name is copied; one longer than 32
 * bytes makes shmb_connect fail with -EINVAL, and a pool the daemon does not
 * have with -ENOENT (the message lists its pools). Call before shmb_connect:
 * shmb_reconnect says hello to the pool shmb_connect did, whatever this is
 * told after it. */
void shmb_set_pool(shmb_t *c, const char *pool);

/* Connect to the daemon at socket_path (NULL: $SHMBROKER_SOCKET, else
 * /run/shmbroker/shmbroker.sock), say hello with name (may be NULL), receive
 * the segment's descriptor and map it. -ECONNREFUSED or -ENOENT when no
 * daemon listens there. */
int shmb_connect(shmb_t *c, const char *socket_path, const char *name);

/* After a call failed with -ECONNRESET (the daemon exited or restarted, or a
 * reply came out of step with its request):
 * connect again to the same socket with the same name, mode and pool. Pins and
 * pending allocations of the old connection are gone; objects committed
 * before a daemon restart are still there. When the daemon serves the same
 * segment file, the mapping is kept, so pointers to committed objects that
 * were read before stay valid (re-get them to pin them again). */
int shmb_reconnect(shmb_t *c);

/* Disconnect (the daemon releases every pin and pending allocation), unmap
 * and free the handle. Pointers from this handle become invalid. */
void shmb_close(shmb_t *c);

/* The segment's description; NULL before shmb_connect succeeded. */
const shmb_info_t *shmb_info(const shmb_t *c);

/* The last call's error: its negative errno, its name (as shmb_strerror;
 * "OK" for 0) and the message, in a string the handle owns until the next
 * call. A call refused with -EBUSY or -ECHILD (see Threads and fork() above)
 * leaves the handle alone: these report it in the refused thread until its
 * next call. */
int shmb_errcode(const shmb_t *c);
const char *shmb_errname(const shmb_t *c);
const char *shmb_errmsg(const shmb_t *c);

/* Zero-copy write: reserve size bytes under key and get a pointer to them in
 * *ptr; write the payload, then shmb_commit (makes it visible) or shmb_abort.
 * readers: how many reads the object awaits before it may be reclaimed.
 * -EEXIST, -E2BIG, -ENOSPC (the message names what blocks). A size of 2^63
 * bytes or more, which the protocol cannot carry, is refused with -E2BIG
 * before anything is sent (shmb_put too). */
int shmb_alloc(shmb_t *c, const char *key, size_t size, unsigned readers, void **ptr);
int shmb_commit(shmb_t *c, const char *key);
int shmb_abort(shmb_t *c, const char *key);

/* Fetch key from another host: the local shmbroker-relay (its socket is the
 * daemon's path + ".relay") asks peer's relay, which pins the object there;
 * its bytes are read by RMA straight into an allocation in this handle's
 * daemon and committed under the same key (awaiting no reads, as a put with
 * readers 0), then shmb_get it as any object. Fetches of one key from one
 * peer at once share one transfer. 0, or: -ENOTCONN (no relay, or the peer
 * is not connected), -ENOENT (no such peer, no such key there), -EEXIST
 * (the key is here already), -E2BIG, -ENOSPC, -ECONNRESET (the transfer was
 * cut: nothing was kept, no pin is left). Blocks until the relay answers. */
int shmb_fetch(shmb_t *c, const char *peer, const char *key);

/* The local relay's status as a JSON object in *json (the caller frees it
 * with free()): its name, listen address, connections refused, transfers
 * under way, and per peer its address, direction ("out": dialled, "in":
 * dialled us), state, transport, bytes and messages each way, fetches served,
 * transfers made, objects pinned for it and last error. -ENOTCONN when no
 * relay is attached to this handle's daemon. */
int shmb_relay_status(shmb_t *c, char **json);

/* Copying write, in one round trip: the payload is copied into this
 * handle's arena (a run of the segment the daemon granted it; asked for,
 * and refilled, as puts need it) and committed there with one request
 * (commit_at). Falls back to alloc, memcpy, commit (two round trips) on a
 * read-only handle, with arenas off (shmb_set_arena(c, 0)), or for an
 * object larger than an arena may be. Visible to every client once it
 * returns 0. -ECANCELED, nothing put, when an earlier shmb_put_nowait of
 * this handle was refused (see there). */
int shmb_put(shmb_t *c, const char *key, const void *data, size_t size, unsigned readers);

/* Fire-and-forget put: as shmb_put through the arena, but the commit is sent
 * without waiting for the answer (no round trip while the arena lasts).
 * Ordering: the daemon handles one connection's requests in order, so the
 * object is visible to everyone once any later request on this handle has
 * been answered (any call that waits for a reply: shmb_contains, shmb_get,
 * shmb_put ...). A shmb_read of it on this same handle before that gets
 * it all the same: the read looks for the commit in the catalog for up to
 * shmb_set_read_wait's time, then asks the daemon, which answers after the
 * commit (so a put and its read make no waited round trip when the daemon
 * publishes in time). The daemon never
 * takes the arena back while such a commit is on its way (PROTOCOL.md
 * section 11), so a 0 here is refused only if the key holds another object
 * by then (EEXIST), readers is over the daemon's bound (EINVAL), the daemon
 * runs out of memory or the segment was broken by a client (or lost if the
 * connection ends first). A refusal is not
 * reported by this call: the reply to the handle's next request tells the
 * library, and the handle's next shmb_put or shmb_put_nowait returns
 * -ECANCELED, naming the first refused key, its error and how many more
 * were refused, without putting its own object (put again what was lost,
 * then that one); shmb_sync waits for them and reports them without
 * putting. When the connection ends (lost, or shmb_reconnect) before
 * a reply proved such puts handled, the call that finds it lost names them
 * and the next put after shmb_reconnect returns -ECANCELED as well: they
 * may not have been made (look for them with shmb_contains). The daemon counts them too
 * (noreply_errors). Needs an arena: -ENOTSUP without one (read-only handle, arenas off, a
 * daemon that grants none), nothing sent; then use shmb_put. When this put cannot go
 * through an arena (the daemon has no room for one now, the object is larger than an
 * arena may be), it is put as shmb_put puts it, waiting for the answer. */
int shmb_put_nowait(shmb_t *c, const char *key, const void *data, size_t size,
                    unsigned readers);

/* Wait until the daemon has handled every put this handle sent without
 * waiting (one request, only when some were sent since the last answered
 * call): 0 when each was made, else -ECANCELED naming the first refused key
 * (or one that may be lost with its connection), its error and how many
 * more, as the next shmb_put would (the record is then cleared; put again
 * what was lost). A writer whose last puts go without waiting calls it to
 * learn of them without putting again. */
int shmb_sync(shmb_t *c);

/* The arena size this handle asks for: 0 turns arenas off, any other value
 * is a floor (an arena is at least 4 times the largest recent chunk, at
 * most what the daemon grants). Default SHMB_ARENA_DEFAULT. */
#define SHMB_ARENA_DEFAULT (256u * 1024u)
void shmb_set_arena(shmb_t *c, size_t bytes);

/* Zero-copy read: pin key and get a const pointer to its bytes and their
 * length, valid until shmb_release (or shmb_close). Each get counts one read
 * and must be released once. -ENOENT when absent or not committed. */
int shmb_get(shmb_t *c, const char *key, const void **ptr, size_t *size);
int shmb_release(shmb_t *c, const char *key);

/* Copy-out read, with no system call: look key up in the catalog the daemon
 * publishes in the segment, copy its payload into buf (cap bytes), check
 * that nothing changed under the copy; when the catalog cannot say (the
 * table was moving, the object changed under the copy twice, the catalog is
 * full, or puts of this handle sent without waiting are unanswered: see
 * shmb_set_read_wait), ask the daemon (get, copy, release: one round
 * trip). *size gets
 * the payload's length. Counts one read, as shmb_get does.
 * -ENOENT when no committed object has key; -ENOBUFS when cap is too small
 * (*size says how much is needed, nothing copied; an awaited read is
 * counted then only when the daemon answered: its get counts one).
 * Never from a segment its daemon gave up: -ECONNRESET (and the connection
 * closed, as any lost one) once the daemon stopped or died, within 20 ms of
 * it (a look at the connection every 10 ms of reading, one poll()).
 * Which call when: shmb_read for small and medium objects a reader copies
 * anyway (no round trip); shmb_get/shmb_release to read large objects in
 * place (zero copy: a pin needs the daemon, two round trips, one of them
 * with shmb_release_nowait). */
int shmb_read(shmb_t *c, const char *key, void *buf, size_t cap, size_t *size);

/* How long shmb_read of the key this handle last put with shmb_put_nowait,
 * while that put is unanswered and the catalog does not list it yet, looks
 * again for it (its commit is on its way; the CPU is yielded between looks)
 * before it asks the daemon, which answers after the commit (a round
 * trip). Any other miss while such puts are unanswered asks the daemon at
 * once. 0 asks at once; default SHMB_READ_WAIT_DEFAULT; -EINVAL over
 * SHMB_READ_WAIT_MAX. */
#define SHMB_READ_WAIT_DEFAULT 200u
#define SHMB_READ_WAIT_MAX 1000000u
int shmb_set_read_wait(shmb_t *c, unsigned wait_us);

/* How this handle's shmb_read calls went: served from the catalog, or by
 * the daemon (a miss the catalog could not prove, a change under the copy,
 * no catalog), and copies retried after a change under them. */
typedef struct {
    uint64_t fast;     /* answered from the mapping, hits and proven misses */
    uint64_t fallback; /* answered by the daemon */
    uint64_t retries;  /* copies redone */
} shmb_read_stats_t;
void shmb_read_stats(const shmb_t *c, shmb_read_stats_t *out);

/* Release without waiting for the daemon's answer: the request is sent and
 * the call returns. An error (no such pin) is logged by the daemon and
 * counted in its stats, not reported here. */
int shmb_release_nowait(shmb_t *c, const char *key);

/* One buffer of an object of several frames. */
typedef struct shmb_frame {
    const void *data;
    size_t size;
} shmb_frame_t;

/* Objects of several frames (PROTOCOL.md, "Objects of several buffers
 * (frames)"): one payload holding n buffers, each 64-aligned, behind a
 * header with the count and each length, as pickle protocol 5's out-of-band
 * buffers or a msgpack encoder's tensors need; the Python client reads and
 * writes the same layout.
 *
 * shmb_put_frames allocates the whole payload once, writes the header and
 * copies frames[0..n) straight into the segment, and commits; n is 0 to
 * 65535, and a frame of size 0 may have a NULL data. -EINVAL (n above 65535,
 * a NULL pointer with a size, a bad key) and -E2BIG (lengths adding up past
 * 2^63 bytes) are refused before anything is sent; otherwise the errors are
 * shmb_alloc's and shmb_commit's (a failed commit is followed by an abort).
 * readers as for shmb_alloc. */
int shmb_put_frames(shmb_t *c, const char *key, size_t n, const shmb_frame_t *frames,
                    unsigned readers);

/* Pin key like shmb_get and point frames[0..*n) at its frames, each 64-byte
 * aligned in memory, read-only, valid until shmb_release(c, key). When the
 * object holds more than max frames, the pin is released and the call fails
 * with -ENOBUFS, *n set to the count (max 0, frames NULL: a way to ask the
 * count; an object of no frames then succeeds, pinned, with *n 0).
 * When the payload is not in the frames layout (put with shmb_put, say), the
 * pin is released and the call fails with -EPROTO, *n 0, shmb_errmsg giving
 * the numbers. -ENOENT and the rest as shmb_get. A frame of size 0 points
 * at its place in the payload, which may be the next frame's or the end. */
int shmb_get_frames(shmb_t *c, const char *key, shmb_frame_t *frames, size_t max, size_t *n);

/* The payload size of n frames of these lengths (at least the 64-byte
 * header), to check it against shmb_info's max_object_size; 0 when n is
 * above 65535 or the size would reach 2^63 bytes, which no object may. */
size_t shmb_frames_size(size_t n, const size_t *lengths);

/* Batches: n operations in one round trip (put: two, for the allocations
 * and the commits). results[i] (when results is not NULL) gets each one's 0
 * or negative errno; the call returns 0 when all succeeded, else the error
 * of the first key (lowest index) that failed, whose message shmb_errmsg()
 * holds. put_many aborts the allocations it could not commit. get_many pins
 * like shmb_get; release each key once.
 *
 * Any n works: the calls split the work into batch lines of at most 4096 ops
 * and 64 KiB, in order, one round trip each (put_many: at most 1024
 * allocations per line, committed before the next line is allocated; when a
 * lower --max-pending, or allocations the handle already holds, stop a line
 * part way, what was allocated is committed and the rest goes again, so
 * put_many fails with -EDQUOT only when the handle alone holds the whole
 * cap). A bad key anywhere
 * refuses the whole call with -EINVAL before anything is sent (the message
 * names its index), and so does a put_many size of 2^63 bytes or more, with
 * -E2BIG. When the call fails as a whole (that, or a lost
 * connection), every results[i] not already final holds its error: objects
 * put_many committed in earlier lines stay committed (their result is 0),
 * and get_many hands out no pointer. */
int shmb_put_many(shmb_t *c, size_t n, const char *const *keys, const void *const *data,
                  const size_t *sizes, unsigned readers, int *results);
int shmb_get_many(shmb_t *c, size_t n, const char *const *keys, const void **ptrs,
                  size_t *sizes, int *results);
/* Sends the releases without waiting (as shmb_release_nowait), in writes of
 * about 64 KiB. */
int shmb_release_many(shmb_t *c, size_t n, const char *const *keys);

/* Add readers awaited reads to key. */
int shmb_touch(shmb_t *c, const char *key, unsigned readers);

/* Remove key now; its bytes go when the last reader releases them. */
int shmb_delete(shmb_t *c, const char *key);

/* 1 when key is committed, 0 when not, or a negative errno. */
int shmb_contains(shmb_t *c, const char *key);

/* Occupancy figures and counters of the handle's pool (clients counts every
 * connection to the daemon), in out (size: sizeof(*out)). A program
 * built against an older shmbroker.h passes a smaller shmb_stats_t: the
 * library fills only the fields that fit in size bytes, and refuses with
 * -EINVAL a size smaller than the first release's struct. */
int shmb_stats_sized(shmb_t *c, shmb_stats_t *out, size_t size);

/* The first release's call, kept for programs built against it: fills the
 * fields before expired_allocs. Programs built against this header call
 * shmb_stats_sized through the macro, and get every field. */
int shmb_stats(shmb_t *c, shmb_stats_t *out);
#define shmb_stats(c, out) shmb_stats_sized((c), (out), sizeof(*(out)))

/* The figures of every pool of the daemon, in its configuration order: *pools
 * gets count (*count) entries, each filled as shmb_stats fills its struct
 * (clients: the connections of that pool), with pool, backing and group set;
 * free it with shmb_stats_pools_free. From a daemon without pools, one entry:
 * its segment, pool "". *pools NULL and *count 0 on failure. */
int shmb_stats_pools(shmb_t *c, shmb_stats_t **pools, size_t *count);
void shmb_stats_pools_free(shmb_stats_t *pools);

/* The stats reply as the daemon sent it, without its "id": one line of JSON
 * (PROTOCOL.md, "stats"), malloc'ed in *json, caller frees. For tools that
 * pass it on untouched. */
int shmb_stats_json(shmb_t *c, char **json);

/* The objects whose key starts with prefix (NULL or "": all), oldest first,
 * at most limit of them (1 to 100000; 0: the daemon's default, 1000). *out
 * gets the list (free it with shmb_list_free), NULL on failure. */
int shmb_list(shmb_t *c, const char *prefix, size_t limit, shmb_list_t **out);
void shmb_list_free(shmb_list_t *list);

/* Every connection to the daemon, this one included (self). *out gets the
 * list (free it with shmb_clients_free), NULL on failure. */
int shmb_clients(shmb_t *c, shmb_clients_t **out);
void shmb_clients_free(shmb_clients_t *clients);

/* Send one raw JSON request (an object, without the trailing newline and
 * without "noreply": true) and receive the raw reply line in *reply
 * (malloc'ed, caller frees). For tools; returns the reply's error code when
 * it says "ok": false. A request with its own "id" gets a reply with that id;
 * without one, the library adds its own and takes it out of the reply. */
int shmb_request(shmb_t *c, const char *request, char **reply);

/* The name of a negative errno: the protocol's ("ENOSPC"), "OK" for 0, and
 * for a code the protocol does not name the C library's ("EACCES"), else "E"
 * and the number. A static string, except for a number the C library does
 * not name: the calling thread's until its next call. The protocol itself
 * sends only its own names. */
const char *shmb_strerror(int code);

/* ---- Broadcast queues (PROTOCOL.md, "Queues") -----------------------------
 *
 * One writer, up to 64 reader seats, a ring of slots: every reader reads
 * every message, in order. A queue lives in the daemon (shmb_queue_create)
 * and belongs to the pool of the connection that created it; its slots and
 * flags are a memory area of their own that every member maps read-write,
 * so a message costs no round trip: the writer fills a slot in place and
 * publishes it, readers read it in place, and both sides wait on a futex of
 * the area (a short spin first; no CPU while idle). Membership is the
 * connection: a reader whose connection closes (exit, crash, SIGKILL) stops
 * being waited for at once, and the writer's closing is the end of the
 * queue for its readers once they have read what it published.
 *
 * A message longer than the slot size goes as an object of the pool (key
 * "q/<queue>/<seq>", awaiting one read per live seat) referenced from the
 * slot: shmb_queue_reserve and shmb_queue_dequeue then cost a round trip or
 * two, and the bytes still never cross the socket.
 *
 * Every call returns 0 or a negative errno with its message in
 * shmb_errmsg(c) of the connection the queue was opened on. The data path's
 * errors: -ETIMEDOUT (the wait timed out), -ECANCELED (the queue was shut
 * down), -EPIPE (end of queue: the writer is gone and every message it
 * published has been read), -ENOTCONN (this reader's seat was dropped or
 * given to another), -EIO (the area is corrupt), -ECONNRESET (shmbrokerd
 * went away). Timeouts are in milliseconds: -1 waits for ever, 0 not at all.
 *
 * A daemon killed without a clean stop (SIGKILL, a crash) wakes nobody, so
 * a wait longer than about a second is cut into slices of about a second,
 * and between them the connection's socket is polled (never read): once it
 * is closed the wait ends with -ECONNRESET ("shmbrokerd went away"; the
 * queue has no daemon to watch its members: reconnect and open it again).
 * One poll() a second costs an idle member nothing to speak of.
 *
 * A queue handle belongs to the process and the connection that opened it:
 * close it before its connection (shmb_close), and use it, like its
 * connection, in one thread at a time: its calls write the connection's
 * error. In a child of fork() every call on an inherited queue handle fails
 * with -ECHILD and touches nothing (shmb_queue_done does nothing;
 * shmb_queue_close only frees the child's copy): the role is the parent's.
 * The calls that go to the daemon (create, open, shutdown, delete, list,
 * and messages longer than a slot) are refused with -EBUSY while another
 * thread's call runs on the connection; a message within the slot size
 * never touches it. A dequeue refused so leaves the message in place (the
 * next dequeue returns it), a release that cannot be sent then waits in the
 * handle for its next call that gets the connection, and shmb_queue_close
 * waits for the other call to end. */
typedef struct shmb_queue shmb_queue_t;

#define SHMB_QUEUE_TEMPORARY 1u /* deleted once its writer and last live reader are gone */
#define SHMB_QUEUE_WRITER (-1)   /* shmb_queue_open's seat: the writer role */
#define SHMB_QUEUE_ANY_SEAT (-2) /* a reader at the lowest free or dead seat */

/* Create the queue name (1 to 32 of A-Z, a-z, 0-9, '_', '-') in the
 * connection's pool: seats reader seats (1..64), slots slots (2..65536; 0:
 * 10) of slot_size bytes (64..1 GiB; 0: 10 MiB). The daemon reserves the
 * area now (-ENOMEM when the host's memory cannot hold it). The same
 * geometry existing already is not an error; another is -EEXIST. flags:
 * 0 or SHMB_QUEUE_TEMPORARY. */
int shmb_queue_create(shmb_t *c, const char *name, uint32_t seats, uint64_t slots,
                      uint64_t slot_size, unsigned flags);

/* Open name as its writer (seat SHMB_QUEUE_WRITER), as reader seat k
 * (0..seats-1, which must be free or dead), or as a reader at the lowest
 * free or dead seat (SHMB_QUEUE_ANY_SEAT); maps the queue. A reader starts
 * at the next message published. *q gets the handle (close it with
 * shmb_queue_close), NULL on failure: -ENOENT (no such queue in this pool),
 * -EBUSY (the writer role or the seat is held; the message names the
 * holder), -ECANCELED (shut down), -EPERM (a read-only connection). A
 * connection may hold several roles, of several queues. */
int shmb_queue_open(shmb_t *c, const char *name, int seat, shmb_queue_t **q);

/* The seat q reads (SHMB_QUEUE_WRITER for the writer), and its slots'
 * payload size (a message up to it goes in the slot). */
int shmb_queue_seat(const shmb_queue_t *q);
size_t shmb_queue_slot_size(const shmb_queue_t *q);

/* How long q's waits spin before they sleep on the futex. 0 (the default):
 * an adaptive 1 to 50 us, which costs nothing while idle but pays a wake-up
 * (~10-50 us) for a message that comes after it. spin_us (up to 100000):
 * spin that long, so messages that come within it are seen at once, as by
 * a busy-polling reader, while a queue idle for longer still sleeps and
 * uses no CPU. -EINVAL past the bound. */
int shmb_queue_set_spin(shmb_queue_t *q, unsigned spin_us);

/* Writer, zero-copy: wait (timeout_ms) until the next slot is free and point
 * *buf at len bytes to fill, then shmb_queue_publish. len up to the slot
 * size: *buf is in the slot. Longer: an object of len bytes is allocated in
 * the pool (shmb_set_alloc_wait applies; -ENOSPC, -E2BIG as shmb_alloc) and
 * *buf is in the segment. *buf is valid until the publish; a second reserve
 * before it replaces the first (whose bytes are dropped). */
int shmb_queue_reserve(shmb_queue_t *q, size_t len, void **buf, int timeout_ms);

/* Writer: publish the first len bytes of the reserved buffer (len up to the
 * reserve's) as the next message; readers blocked on the queue wake.
 * -EINVAL without a reservation. */
int shmb_queue_publish(shmb_queue_t *q, size_t len);

/* Writer, copying: reserve len bytes, copy data, publish. */
int shmb_queue_enqueue(shmb_queue_t *q, const void *data, size_t len, int timeout_ms);

/* Reader: wait (timeout_ms) for the next message and point *data at its len
 * bytes, in place (read-only): in the slot, or for a message longer than a
 * slot in the pool's segment (pinned). The pointer is valid until
 * shmb_queue_done or the next dequeue, which calls it first: until then the
 * writer may not reuse the slot, so finish promptly. -EINVAL on the writer's
 * handle. */
int shmb_queue_dequeue(shmb_queue_t *q, const void **data, size_t *len, int timeout_ms);

/* Reader: finished with the message dequeued last (nothing if none): its
 * slot may be reused and its object's pin is released (without waiting for
 * the daemon). */
void shmb_queue_done(shmb_queue_t *q);

/* Wait (timeout_ms) until the queue is ready to use: for the writer, until
 * every seat has a live reader; for a reader, until there is something to
 * dequeue or to learn: a writer has it open, messages were published, or
 * the writer is gone (dequeue then drains and says -EPIPE). -ETIMEDOUT,
 * -ECANCELED, -ECONNRESET. It looks every millisecond or so: a start-up
 * call, not a data path. */
int shmb_queue_wait_ready(shmb_queue_t *q, int timeout_ms);

/* Leave the queue (the writer's leaving is the end of the queue for its
 * readers, once drained; a reader's seat becomes free), unmap it and free
 * q, whatever the daemon answers: its error is returned (-ENOENT when the
 * role was left already, say by a raw queue_close; -ENOTCONN or
 * -ECONNRESET when the connection is lost, which took the role with it).
 * While another thread's call runs on the connection it waits for that call
 * to end. NULL does nothing. */
int shmb_queue_close(shmb_queue_t *q);

/* Shut name down: every member's wait ends with -ECANCELED, and so does
 * every later open. Idempotent. */
int shmb_queue_shutdown(shmb_t *c, const char *name);

/* Delete name: -EBUSY while a writer or a live reader holds it. Members
 * keep their mappings until they close. */
int shmb_queue_delete(shmb_t *c, const char *name);

/* One seat of a shmb_queue_info_t. Strings are owned by the list. */
typedef struct shmb_queue_seat_info {
    uint32_t seat;
    const char *state; /* "live", "dead" or "free" */
    int64_t client;    /* the holder's client id, pid and name (a dead seat: */
    int64_t pid;       /* of the connection that died); -1, -1, "" when none */
    const char *name;
    uint64_t behind; /* messages published that it has not read */
} shmb_queue_seat_info_t;

/* One queue as queue_list shows it (PROTOCOL.md). Strings are owned by the
 * list. The names (the queue's, its members') are "" when the queue's pool
 * has a group= that leaves this client out. */
typedef struct shmb_queue_info {
    const char *name, *pool;
    uint32_t seats;
    uint64_t slots, slot_size, size;
    int temporary;
    const char *state; /* "open", "writer_gone" or "shutdown" */
    uint64_t messages; /* published since creation */
    uint64_t depth;    /* published, not yet read by the slowest live seat */
    uint32_t seats_live, seats_dead, seats_free;
    int has_writer;
    int64_t writer_client, writer_pid;
    const char *writer_name;
    int writer_waiting;
    uint32_t readers_waiting;
    /* The slowest live seat while it holds the writer back, else -1. */
    int blocker_seat;
    int64_t blocker_client, blocker_pid;
    const char *blocker_name;
    uint64_t blocker_behind;
    size_t nseats;
    const shmb_queue_seat_info_t *seat_list; /* nseats of them */
} shmb_queue_info_t;

/* What shmb_queue_list returns: queues[0..count), in creation order. */
typedef struct shmb_queue_list {
    size_t count;
    const shmb_queue_info_t *queues;
    void *reply; /* the library's */
} shmb_queue_list_t;

/* Every queue of every pool of the daemon, each with its seats. *out gets
 * the list (free it with shmb_queue_list_free), NULL on failure. */
int shmb_queue_list(shmb_t *c, shmb_queue_list_t **out);
/* The same without the seats (nseats 0, seat_list NULL): a reply whose size
 * does not grow with the seats, for callers that show only the figures. */
int shmb_queue_summary(shmb_t *c, shmb_queue_list_t **out);
void shmb_queue_list_free(shmb_queue_list_t *list);

#ifdef __cplusplus
}
#endif

#endif
