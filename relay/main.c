// SPDX-License-Identifier: Apache-2.0
/*
 * shmbroker-relay's flags, its handle on the local daemon, signals and the
 * loop. One relay per host; it is a client of the local daemon like any
 * worker, and the only part of shmbroker that speaks to the network.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../client/internal.h"
#include "../proto/protocol.h"
#include "relay.h"

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: shmbroker-relay --key-file FILE [--listen ADDR:PORT]\n"
            "                       [--peer NAME=ADDR:PORT]... [--peers-file FILE]\n"
            "                       [--allow-from ADDR[/PREFIX]]...\n"
            "                       [--socket PATH] [--relay-socket PATH] [--name NAME]\n"
            "                       [--max-object BYTES] [--fetch-timeout SECONDS]\n"
            "Carries objects between hosts' shmbroker daemons over UCX.\n"
            "  --key-file FILE      the pre-shared key every relay proves (mode 0600)\n"
            "  --listen ADDR:PORT   accept other relays there\n"
            "  --peer NAME=ADDR:PORT  a relay to fetch from (repeatable)\n"
            "  --peers-file FILE    lines 'peer = NAME ADDR:PORT' ('#' comments)\n"
            "  --allow-from ADDR[/PREFIX]  the listener also admits these addresses\n"
            "                       (repeatable; by default only the peers' addresses)\n"
            "  --socket PATH        the local daemon's socket (default $%s or %s)\n"
            "  --relay-socket PATH  this relay's socket (default: the daemon's + \"%s\")\n"
            "  --name NAME          this relay's name in its hello (default: the host name)\n"
            "  --max-object BYTES   the largest object a peer may make this relay allocate\n"
            "                       (default: the pool's size)\n"
            "  --fetch-timeout SECONDS  a peer's answer to a fetch must come by then, and\n"
            "                       its bytes at 10 MB/s or more after it (default 30)\n"
            "UCX chooses the transport (UCX_TLS, UCX_NET_DEVICES are honoured).\n",
            SHMB_SOCKET_ENV, SHMB_DEFAULT_SOCKET, SHMB_RELAY_SOCKET_SUFFIX);
}

/* The peers file: 'peer = NAME ADDR:PORT' lines, '#' comments, blank lines. */
static int load_peers_file(struct relay *r, const char *path, struct shmb_error *err)
{
    FILE *f = fopen(path, "re");
    char line[512];
    unsigned lineno = 0;
    int rc = 0;

    if (!f)
        return shmb_error_set(err, -errno, "Cannot open the peers file %s: %s.", path,
                              strerror(errno));
    while (fgets(line, sizeof(line), f)) {
        char name[128], addr[128], extra[2];
        char *s = line;
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            rc = shmb_error_set(err, -EINVAL, "%s:%u: a line longer than %zu bytes.", path,
                                lineno, sizeof(line) - 2);
            break;
        }
        s += strspn(s, " \t");
        if (*s == '#' || *s == '\n' || *s == '\r' || *s == 0)
            continue;
        if (sscanf(s, "peer = %127s %127s %1s", name, addr, extra) != 2) {
            rc = shmb_error_set(err, -EINVAL,
                                "%s:%u: expected 'peer = NAME ADDR:PORT', not '%.80s'.", path,
                                lineno, s);
            break;
        }
        if ((rc = peer_add_configured(r, name, addr, err)) < 0) {
            char msg[sizeof(err->message)];
            snprintf(msg, sizeof(msg), "%s", err->message);
            shmb_error_set(err, rc, "%s:%u: %s", path, lineno, msg);
            break;
        }
    }
    fclose(f);
    return rc;
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct relay *r = h->data;
    relay_log("signal %d: stopping", signum);
    uv_stop(r->loop);
}

static void close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* What arrives at the transport rooms, sent to the room of its subject. */
static void on_peer_message(struct peer *p, const struct wire_msg *m)
{
    switch (m->type) {
    case WIRE_FETCH:
        fetch_on_request(p, m);
        break;
    case WIRE_FETCH_REPLY:
        fetch_on_reply(p, m);
        break;
    case WIRE_FETCH_DONE:
        fetch_on_done(p, m);
        break;
    default:
        if (wire_is_queue(m->type))
            forward_on_message(p, m);
        else
            peer_fail(p, "sent a message of type %u, which this relay does not know",
                      (unsigned)m->type);
        break;
    }
}

static void on_peer_ready(struct peer *p)
{
    (void)p;
}

static void on_peer_gone(struct peer *p)
{
    fetch_peer_gone(p);
    forward_peer_gone(p);
}

static void on_work_due(struct relay *r)
{
    fetch_poll(r);
}

static uint64_t next_deadline(const struct relay *r)
{
    return fetch_next_deadline(r);
}

static void on_expire(struct relay *r)
{
    fetch_expire(r);
}

static void on_local_request(struct local_client *lc, const char *op, json_t *req)
{
    if (strcmp(op, "fetch") == 0)
        fetch_local_request(lc, req);
    else if (strcmp(op, "queue_subscribe") == 0)
        forward_local_subscribe(lc, req);
    else if (strcmp(op, "queue_state") == 0)
        forward_local_state(lc, req);
    else
        local_reply_error(lc, -EINVAL, "Unknown op '%.40s': the relay serves fetch, "
                          "queue_subscribe, queue_state and status.", op);
}

static void on_local_gone(struct local_client *lc)
{
    fetch_client_gone(lc->relay, lc);
    forward_client_gone(lc);
}

static void on_status(const struct relay *r, json_t *reply)
{
    json_object_set_new(reply, "transfers", json_integer((json_int_t)r->ntransfers));
    json_object_set_new(reply, "waiting", json_integer((json_int_t)fetch_waiters(r)));
    json_object_set_new(reply, "tcp_puts", json_integer((json_int_t)tcp_guard_puts_allowed()));
    forward_status(r, reply);
}

static const struct relay_hooks hooks = {
    .peer_message = on_peer_message,
    .peer_ready = on_peer_ready,
    .peer_gone = on_peer_gone,
    .work_due = on_work_due,
    .next_deadline = next_deadline,
    .expire = on_expire,
    .local_request = on_local_request,
    .local_admit = fetch_admit,
    .peer_data = fetch_on_data,
    .local_gone = on_local_gone,
    .status = on_status,
};

/* The flags that are read before anything starts. */
struct flags {
    const char *key_file, *peers_file, *relay_socket;
    char *peer_args[RELAY_PEERS_MAX + 1];
    unsigned npeer_args;
};

/* --max-object and --fetch-timeout: 0, or 2 (the exit status) with a message. */
static int parse_number_flag(struct relay *r, int opt, const char *arg)
{
    char *end;
    errno = 0;
    if (opt == 'm') {
        unsigned long long v = strtoull(arg, &end, 10);
        if (errno || *end || v == 0 || arg[0] == '-') {
            fprintf(stderr, "shmbroker-relay: --max-object takes a positive number of "
                            "bytes, not '%s'.\n", arg);
            return 2;
        }
        r->max_object = v;
        return 0;
    }
    unsigned long v = strtoul(arg, &end, 10);
    if (errno || *end || v == 0 || v > 86400 || arg[0] == '-') {
        fprintf(stderr, "shmbroker-relay: --fetch-timeout takes 1 to 86400 seconds, "
                        "not '%s'.\n", arg);
        return 2;
    }
    r->fetch_timeout_ms = (uint64_t)v * 1000;
    return 0;
}

static int parse_name(struct relay *r, const char *arg)
{
    if (strlen(arg) == 0 || strlen(arg) > RELAY_NAME_MAX ||
        strspn(arg, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                    "0123456789-_.") != strlen(arg)) {
        fprintf(stderr, "shmbroker-relay: --name is 1 to %d of A-Z a-z 0-9 - _ ., "
                        "not '%.80s'.\n", RELAY_NAME_MAX, arg);
        return 2;
    }
    snprintf(r->name, sizeof(r->name), "%s", arg);
    return 0;
}

/* The command line into r and f: -1 to go on, or the exit status. */
static int parse_flags(struct relay *r, struct flags *f, int argc, char **argv)
{
    static const struct option opts[] = {
        {"key-file", required_argument, NULL, 'k'},
        {"listen", required_argument, NULL, 'l'},
        {"peer", required_argument, NULL, 'p'},
        {"peers-file", required_argument, NULL, 'f'},
        {"allow-from", required_argument, NULL, 'a'},
        {"socket", required_argument, NULL, 's'},
        {"relay-socket", required_argument, NULL, 'r'},
        {"name", required_argument, NULL, 'n'},
        {"max-object", required_argument, NULL, 'm'},
        {"fetch-timeout", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    int opt, rc = 0;

    while (rc == 0 && (opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case 'k':
            f->key_file = optarg;
            break;
        case 'l':
            r->listen_addr = optarg;
            break;
        case 'p':
            if (f->npeer_args >= RELAY_PEERS_MAX) {
                fprintf(stderr, "shmbroker-relay: more than %d --peer flags.\n",
                        RELAY_PEERS_MAX);
                return 2;
            }
            f->peer_args[f->npeer_args++] = optarg;
            break;
        case 'f':
            f->peers_file = optarg;
            break;
        case 'a': {
            struct shmb_error err = {0};
            if (admit_allow_from(r, optarg, &err) < 0) {
                fprintf(stderr, "shmbroker-relay: %s\n", err.message);
                return 2;
            }
            break;
        }
        case 's':
            r->daemon_socket = optarg;
            break;
        case 'r':
            f->relay_socket = optarg;
            break;
        case 'n':
            rc = parse_name(r, optarg);
            break;
        case 'm':
        case 't':
            rc = parse_number_flag(r, opt, optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("shmbroker-relay %s\n", SHMB_VERSION);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (rc)
        return rc;
    if (optind < argc) {
        fprintf(stderr, "shmbroker-relay: unexpected argument '%s'.\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    return -1;
}

/* The key, the paths and the peers the flags name: -1 to go on, or the exit
 * status with a message. */
static int configure(struct relay *r, struct flags *f)
{
    struct shmb_error err = {0};
    int n;

    if (!f->key_file) {
        fprintf(stderr, "shmbroker-relay: --key-file is required: relays refuse peers that "
                        "do not prove the same pre-shared key.\n");
        return 2;
    }
    if (auth_load_key(r, f->key_file, &err) < 0) {
        fprintf(stderr, "shmbroker-relay: %s\n", err.message);
        return 1;
    }
    r->daemon_socket = shmb_socket_path(r->daemon_socket);
    if (f->relay_socket)
        n = snprintf(r->local_path, sizeof(r->local_path), "%s", f->relay_socket);
    else
        n = snprintf(r->local_path, sizeof(r->local_path), "%s%s", r->daemon_socket,
                     SHMB_RELAY_SOCKET_SUFFIX);
    if (n < 0 || (size_t)n >= sizeof(r->local_path)) {
        fprintf(stderr, "shmbroker-relay: the relay's socket path is longer than %zu "
                        "bytes; give a shorter one with --relay-socket.\n",
                sizeof(r->local_path) - 1);
        return 2;
    }
    for (unsigned i = 0; i < f->npeer_args; i++) {
        char *eq = strchr(f->peer_args[i], '=');
        if (!eq) {
            fprintf(stderr, "shmbroker-relay: --peer takes NAME=ADDR:PORT, not '%s'.\n",
                    f->peer_args[i]);
            return 2;
        }
        *eq = 0;
        if (peer_add_configured(r, f->peer_args[i], eq + 1, &err) < 0) {
            fprintf(stderr, "shmbroker-relay: %s\n", err.message);
            return 2;
        }
    }
    if (f->peers_file && load_peers_file(r, f->peers_file, &err) < 0) {
        fprintf(stderr, "shmbroker-relay: %s\n", err.message);
        return 2;
    }
    return -1;
}

/* Connect to the daemon, set up UCX and the local socket, and run the loop
 * until a signal: the exit status. */
static int serve(struct relay *r)
{
    struct shmb_error err = {0};

    r->c = shmb_new();
    if (!r->c) {
        fprintf(stderr, "shmbroker-relay: out of memory.\n");
        return 1;
    }
    shmb_set_arena(r->c, 0);
    shmb_set_alloc_wait(r->c, 0);
    if (shmb_connect(r->c, r->daemon_socket, "shmbroker-relay") < 0) {
        fprintf(stderr, "shmbroker-relay: %s\n", shmb_errmsg(r->c));
        return 1;
    }
    r->loop = uv_default_loop();
    if (peer_setup(r, &err) < 0 || fetch_register_pool(r, &err) < 0 ||
        forward_setup(r, &err) < 0 || local_listen(r, &err) < 0) {
        fprintf(stderr, "shmbroker-relay: %s\n", err.message);
        return 1;
    }
    if (!r->max_object)
        r->max_object = r->pool_size;
    fetch_watch_daemon(r);
    uv_signal_init(r->loop, &r->sigterm);
    uv_signal_init(r->loop, &r->sigint);
    r->sigterm.data = r->sigint.data = r;
    uv_signal_start(&r->sigterm, on_signal, SIGTERM);
    uv_signal_start(&r->sigint, on_signal, SIGINT);
    relay_log("%s serving %s%s%s", r->name, r->local_path, r->listen_addr ? ", listening on " : "",
              r->listen_addr ? r->listen_addr : "");
    uv_run(r->loop, UV_RUN_DEFAULT);
    return 0;
}

/* Whatever serve() set up, closed in the reverse order. */
static void teardown(struct relay *r)
{
    if (r->loop) {
        local_close_all(r);
        forward_teardown(r);
        if (r->worker)
            peer_teardown(r);
        fetch_unwatch_daemon(r);
        fetch_unregister_pool(r);
        uv_walk(r->loop, close_walk, NULL);
        uv_run(r->loop, UV_RUN_DEFAULT);
        uv_loop_close(r->loop);
        if (r->worker)
            ucp_worker_destroy(r->worker);
        if (r->ctx)
            ucp_cleanup(r->ctx);
    }
    shmb_close(r->c);
}

int main(int argc, char **argv)
{
    static struct relay relay;
    static struct flags flags;
    struct relay *r = &relay;
    int rc;

    signal(SIGPIPE, SIG_IGN);
    r->hooks = hooks;
    r->fetch_timeout_ms = RELAY_FETCH_TIMEOUT_MS;
    if (gethostname(r->name, sizeof(r->name) - 1) != 0 || !r->name[0])
        strcpy(r->name, "relay");
    r->name[strcspn(r->name, ".")] = 0; /* the short name, as a peer name */
    if ((rc = parse_flags(r, &flags, argc, argv)) >= 0)
        return rc;
    if ((rc = configure(r, &flags)) >= 0)
        return rc;
    rc = serve(r);
    teardown(r);
    return rc;
}
