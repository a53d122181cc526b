// SPDX-License-Identifier: Apache-2.0
/*
 * The protocol cases as data: runs every tests/protocol/NAME.case file
 * against a real shmbrokerd on a temporary socket (the format is described
 * in tests/protocol/README) and prints PASS or FAIL per file. It also fails
 * when an op of proto/ops.def has no case file of its own, and when a wire
 * error code a plain connection can cause appears in no expected reply, so
 * that a new op or code without cases breaks the build.
 *
 * SHMB_PROTOCOL_DIR overrides the folder (default tests/protocol, from the
 * repository root, where tests/run.sh runs). SHMB_CASES_SHOW=1 prints every
 * reply as it arrives, to help write a new case.
 */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../proto/error.h"
#include "../../proto/protocol.h"
#include "harness.h"

/* Silence is checked for this long: a reply comes within a millisecond. */
#define CASE_QUIET_MS 300
#define CASE_MAX_CONNS 8
#define CASE_MAX_CAPTURES 32
#define CASE_MAX_ARGS 16
#define CASE_MAX_CODES 64

/* Wire codes a plain connection to a healthy daemon cannot cause: running
 * out of descriptors or memory, and a segment file a client broke. Their
 * end-to-end tests (test_bounds, test_hostile_rw, the chaos test) cover them. */
static const char *const uncoverable_codes[] = {"EMFILE", "ENOMEM", "EIO"};

struct case_conn {
    char name[32];
    struct h_conn c;
    bool open;
};

struct case_capture {
    char name[32];
    json_t *value;
};

/* One case file being run. */
struct case_run {
    const char *file;
    int lineno;
    struct h_fix *fix;
    struct h_daemon *daemon;
    char size[32];
    const char *args[CASE_MAX_ARGS + 1];
    char argbuf[512];
    struct case_conn conns[CASE_MAX_CONNS];
    int nconns;
    struct case_conn *cur;
    struct case_capture caps[CASE_MAX_CAPTURES];
    int ncaps;
    bool show;
};

/* Error codes named by some expected reply, over every file. */
static char seen_codes[CASE_MAX_CODES][16];
static int nseen_codes;

static void note_code(const char *code)
{
    int i;

    for (i = 0; i < nseen_codes; i++)
        if (strcmp(seen_codes[i], code) == 0)
            return;
    if (nseen_codes < CASE_MAX_CODES)
        snprintf(seen_codes[nseen_codes++], sizeof(seen_codes[0]), "%s", code);
}

static bool code_seen(const char *code)
{
    int i;

    for (i = 0; i < nseen_codes; i++)
        if (strcmp(seen_codes[i], code) == 0)
            return true;
    return false;
}

/* Report a failure at the current line of the case file; always false. */
static bool case_fail(struct case_run *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static bool case_fail(struct case_run *r, const char *fmt, ...)
{
    va_list ap;

    fflush(stdout);
    printf("%s:%d: ", r->file, r->lineno);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
    return false;
}

/* Whether text matches pattern, where "<*>" stands for any run of characters. */
static bool glob_match(const char *pattern, const char *text)
{
    const char *star = strstr(pattern, "<*>");
    size_t head;

    if (star == NULL)
        return strcmp(pattern, text) == 0;
    head = (size_t)(star - pattern);
    if (strncmp(pattern, text, head) != 0)
        return false;
    pattern = star + 3;
    for (text += head;; text++) {
        if (glob_match(pattern, text))
            return true;
        if (*text == '\0')
            return false;
    }
}

static json_t *capture_get(struct case_run *r, const char *name)
{
    int i;

    for (i = 0; i < r->ncaps; i++)
        if (strcmp(r->caps[i].name, name) == 0)
            return r->caps[i].value;
    return NULL;
}

/* Match got against the expected value want; path names the place for the
 * message. Strict: objects have the same fields, arrays the same length. */
static bool match(struct case_run *r, const json_t *want, json_t *got, const char *path)
{
    char sub[256];

    if (json_is_string(want)) {
        const char *w = json_string_value(want);
        size_t wl = strlen(w);

        if (strcmp(w, "<any>") == 0)
            return true;
        if (strcmp(w, "<int>") == 0)
            return json_is_integer(got) ||
                   case_fail(r, "%s: an integer expected", path);
        if (strcmp(w, "<bool>") == 0)
            return json_is_boolean(got) || case_fail(r, "%s: a boolean expected", path);
        if (strcmp(w, "<str>") == 0)
            return json_is_string(got) || case_fail(r, "%s: a string expected", path);
        if (wl > 3 && strncmp(w, "<$", 2) == 0 && w[wl - 1] == '>') {
            json_t *old = capture_get(r, w);

            if (old != NULL)
                return json_equal(old, got) ||
                       case_fail(r, "%s: not the value captured as %s", path, w);
            if (r->ncaps == CASE_MAX_CAPTURES)
                return case_fail(r, "more than %d captures", CASE_MAX_CAPTURES);
            snprintf(r->caps[r->ncaps].name, sizeof(r->caps[0].name), "%s", w);
            r->caps[r->ncaps++].value = json_incref(got);
            return true;
        }
        if (!json_is_string(got))
            return case_fail(r, "%s: a string expected", path);
        return glob_match(w, json_string_value(got)) ||
               case_fail(r, "%s: expected \"%s\",\n    got \"%s\"", path, w,
                         json_string_value(got));
    }
    if (json_is_object(want)) {
        const char *key;
        json_t *value;

        if (!json_is_object(got))
            return case_fail(r, "%s: an object expected", path);
        json_object_foreach(got, key, value) {
            if (json_object_get(want, key) == NULL)
                return case_fail(r, "%s: unexpected field \"%s\"", path, key);
        }
        json_object_foreach((json_t *)want, key, value) {
            json_t *g = json_object_get(got, key);

            snprintf(sub, sizeof(sub), "%s.%s", path, key);
            if (g == NULL)
                return case_fail(r, "%s: missing", sub);
            if (!match(r, value, g, sub))
                return false;
        }
        return true;
    }
    if (json_is_array(want)) {
        size_t i;

        if (!json_is_array(got) || json_array_size(got) != json_array_size(want))
            return case_fail(r, "%s: an array of %zu expected", path, json_array_size(want));
        for (i = 0; i < json_array_size(want); i++) {
            snprintf(sub, sizeof(sub), "%s[%zu]", path, i);
            if (!match(r, json_array_get(want, i), json_array_get(got, i), sub))
                return false;
        }
        return true;
    }
    return json_equal(want, got) || case_fail(r, "%s: values differ", path);
}

/* Note every "error" code an expected reply names, batch replies included. */
static void note_codes(const json_t *want)
{
    const json_t *code = json_object_get(want, "error");
    const json_t *replies = json_object_get(want, "replies");
    size_t i;

    if (json_is_string(code))
        note_code(json_string_value(code));
    for (i = 0; i < json_array_size(replies); i++)
        note_codes(json_array_get(replies, i));
}

static struct case_conn *conn_find(struct case_run *r, const char *name)
{
    int i;

    for (i = 0; i < r->nconns; i++)
        if (strcmp(r->conns[i].name, name) == 0)
            return &r->conns[i];
    return NULL;
}

/* Start the daemon on first use, with the flags of "! daemon". */
static bool ensure_daemon(struct case_run *r)
{
    if (r->daemon != NULL)
        return true;
    r->daemon = h_daemon_new(r->fix, r->size);
    if (h_daemon_spawn(r->fix, r->daemon, r->args) < 0)
        return case_fail(r, "cannot start %s: %s", h_daemon_bin(), strerror(errno));
    if (h_daemon_wait_ready(r->daemon, H_READY_TIMEOUT_MS) < 0)
        return case_fail(r, "shmbrokerd did not listen within %d ms", H_READY_TIMEOUT_MS);
    return true;
}

static bool conn_open(struct case_run *r, const char *name)
{
    struct case_conn *cc;
    int rc;

    if (!ensure_daemon(r))
        return false;
    if (conn_find(r, name) != NULL)
        return case_fail(r, "connection %s is already open", name);
    if (r->nconns == CASE_MAX_CONNS)
        return case_fail(r, "more than %d connections", CASE_MAX_CONNS);
    cc = &r->conns[r->nconns++];
    snprintf(cc->name, sizeof(cc->name), "%s", name);
    rc = h_conn_open(&cc->c, r->daemon->socket);
    if (rc < 0)
        return case_fail(r, "connect: %s", strerror(-rc));
    cc->open = true;
    r->cur = cc;
    return true;
}

/* The current connection; the first request of a file opens "main". */
static bool need_conn(struct case_run *r)
{
    return r->cur != NULL || conn_open(r, "main");
}

/* "! daemon --size 1M --flag value...": the daemon's flags. */
static bool directive_daemon(struct case_run *r, char *rest)
{
    int n = 0;
    char *tok, *save = NULL;

    if (r->daemon != NULL)
        return case_fail(r, "\"! daemon\" comes before the first request");
    snprintf(r->argbuf, sizeof(r->argbuf), "%s", rest);
    for (tok = strtok_r(r->argbuf, " \t", &save); tok != NULL;
         tok = strtok_r(NULL, " \t", &save)) {
        if (strcmp(tok, "--size") == 0) {
            tok = strtok_r(NULL, " \t", &save);
            if (tok == NULL)
                return case_fail(r, "--size needs a value");
            snprintf(r->size, sizeof(r->size), "%s", tok);
            continue;
        }
        if (n == CASE_MAX_ARGS)
            return case_fail(r, "more than %d daemon flags", CASE_MAX_ARGS);
        r->args[n++] = tok;
    }
    r->args[n] = NULL;
    return true;
}

static bool expect_reply(struct case_run *r, const char *text)
{
    json_error_t jerr;
    json_t *want = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    json_t *got = NULL;
    char *line = NULL;
    bool ok;
    int rc;

    if (want == NULL)
        return case_fail(r, "the expected reply is not JSON: %s", jerr.text);
    note_codes(want);
    rc = h_conn_recv_line(&r->cur->c, &line, H_REPLY_TIMEOUT_MS);
    if (rc < 0) {
        json_decref(want);
        return case_fail(r, "no reply on %s: %s", r->cur->name, strerror(-rc));
    }
    if (r->show)
        printf("  %s< %s\n", r->cur->name, line);
    got = json_loads(line, JSON_REJECT_DUPLICATES, &jerr);
    if (got == NULL)
        ok = case_fail(r, "the reply is not JSON: %s", line);
    else if (!(ok = match(r, want, got, "reply")))
        printf("    expected: %s\n    got:      %s\n", text, line);
    json_decref(want);
    json_decref(got);
    free(line);
    return ok;
}

static bool expect_quiet(struct case_run *r)
{
    char *line = NULL;
    int rc = h_conn_recv_line(&r->cur->c, &line, CASE_QUIET_MS);

    if (rc == -ETIMEDOUT)
        return true;
    if (rc == 0) {
        case_fail(r, "a reply where none was expected: %s", line);
        free(line);
        return false;
    }
    return case_fail(r, "the connection ended: %s", strerror(-rc));
}

static bool expect_eof(struct case_run *r)
{
    int rc = h_conn_wait_eof(&r->cur->c, H_REPLY_TIMEOUT_MS);

    if (rc == 0)
        return true;
    return case_fail(r, rc > 0 ? "more bytes instead of the end of the connection"
                               : "the daemon did not close the connection");
}

/* "! oversize N": N bytes of one line, without its newline. */
static bool send_oversize(struct case_run *r, const char *arg)
{
    long n = strtol(arg, NULL, 10);
    char *buf;
    int rc;

    if (n <= 0 || n > 16L * 1024 * 1024)
        return case_fail(r, "\"! oversize\" takes a byte count");
    buf = malloc((size_t)n);
    if (buf == NULL)
        return case_fail(r, "out of memory");
    memset(buf, 'x', (size_t)n);
    rc = h_conn_send(&r->cur->c, buf, (size_t)n);
    free(buf);
    /* The daemon may close before it has read everything: that is fine. */
    return rc == 0 || rc == -EPIPE || rc == -ECONNRESET ||
           case_fail(r, "send: %s", strerror(-rc));
}

static bool run_directive(struct case_run *r, char *text)
{
    char *arg = text + strcspn(text, " \t");

    if (*arg != '\0')
        *arg++ = '\0';
    arg += strspn(arg, " \t");
    if (strcmp(text, "daemon") == 0)
        return directive_daemon(r, arg);
    if (strcmp(text, "connect") == 0)
        return conn_open(r, *arg != '\0' ? arg : "main");
    if (strcmp(text, "use") == 0) {
        struct case_conn *cc = conn_find(r, arg);

        if (cc == NULL || !cc->open)
            return case_fail(r, "no open connection %s", arg);
        r->cur = cc;
        return true;
    }
    if (strcmp(text, "sleep") == 0) {
        h_sleep_ms(atoi(arg));
        return true;
    }
    if (!need_conn(r))
        return false;
    if (strcmp(text, "quiet") == 0)
        return expect_quiet(r);
    if (strcmp(text, "eof") == 0)
        return expect_eof(r);
    if (strcmp(text, "close") == 0) {
        h_conn_close(&r->cur->c);
        r->cur->open = false;
        r->cur = NULL;
        return true;
    }
    if (strcmp(text, "oversize") == 0)
        return send_oversize(r, arg);
    return case_fail(r, "unknown directive \"! %s\"", text);
}

static bool run_line(struct case_run *r, char *line)
{
    size_t len = strlen(line);

    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
        line[--len] = '\0';
    if (len == 0 || line[0] == '#')
        return true;
    if (len < 2 || line[1] != ' ')
        return case_fail(r, "a line starts with \"> \", \"< \", \"! \" or \"#\"");
    if (line[0] == '!')
        return run_directive(r, line + 2);
    if (!need_conn(r))
        return false;
    if (line[0] == '>') {
        int rc = h_conn_sendline(&r->cur->c, line + 2);

        if (r->show)
            printf("  %s> %s\n", r->cur->name, line + 2);
        return rc == 0 || case_fail(r, "send: %s", strerror(-rc));
    }
    if (line[0] == '<')
        return expect_reply(r, line + 2);
    return case_fail(r, "a line starts with \"> \", \"< \", \"! \" or \"#\"");
}

/* Run one case file; true when every line held. */
static bool run_file(const char *path, const char *name)
{
    struct case_run r;
    void *state = NULL;
    char line[SHMB_MAX_LINE + 16];
    bool ok = true;
    FILE *fp;
    int i;

    memset(&r, 0, sizeof(r));
    r.file = name;
    r.show = getenv("SHMB_CASES_SHOW") != NULL && strcmp(getenv("SHMB_CASES_SHOW"), "1") == 0;
    snprintf(r.size, sizeof(r.size), "1M");
    fp = fopen(path, "r");
    if (fp == NULL) {
        printf("%s: %s\n", path, strerror(errno));
        return false;
    }
    if (h_setup(&state) != 0) {
        fclose(fp);
        return false;
    }
    r.fix = state;
    while (ok && fgets(line, sizeof(line), fp) != NULL) {
        r.lineno++;
        ok = run_line(&r, line);
    }
    fclose(fp);
    /* A file that sends nothing proves nothing. */
    if (ok && r.daemon == NULL)
        ok = case_fail(&r, "the file sends no request");
    for (i = 0; i < r.nconns; i++)
        if (r.conns[i].open)
            h_conn_close(&r.conns[i].c);
    for (i = 0; i < r.ncaps; i++)
        json_decref(r.caps[i].value);
    r.fix->passed = ok;
    h_teardown(&state);
    return ok;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);

    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool file_listed(char **names, size_t n, const char *want)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (strcmp(names[i], want) == 0)
            return true;
    return false;
}

int main(void)
{
    const char *dir = getenv("SHMB_PROTOCOL_DIR");
    char **names = NULL;
    size_t n = 0, i;
    int failed = 0;
    struct dirent *de;
    DIR *dp;

    signal(SIGPIPE, SIG_IGN);
    if (dir == NULL)
        dir = "tests/protocol";
    dp = opendir(dir);
    if (dp == NULL) {
        printf("FAIL: cases (%s: %s; run from the repository root)\n", dir, strerror(errno));
        return 1;
    }
    while ((de = readdir(dp)) != NULL) {
        char **grown;

        if (!has_suffix(de->d_name, ".case"))
            continue;
        grown = realloc(names, (n + 1) * sizeof(*names));
        if (grown == NULL || (grown[n] = strdup(de->d_name)) == NULL) {
            printf("FAIL: cases (out of memory)\n");
            return 1;
        }
        names = grown;
        n++;
    }
    closedir(dp);
    qsort(names, n, sizeof(*names), name_cmp);

    for (i = 0; i < n; i++) {
        char path[PATH_MAX];
        bool ok;

        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        ok = run_file(path, names[i]);
        printf("%s: %s\n", ok ? "PASS" : "FAIL", names[i]);
        fflush(stdout);
        failed += !ok;
    }

    /* Every op has its own file, so that a new op cannot land without cases. */
    for (i = 0; i < SHMB_OP_COUNT; i++) {
        char want[64];

        snprintf(want, sizeof(want), "%s.case", shmb_ops[i].name);
        if (!file_listed(names, n, want)) {
            printf("FAIL: op-%s (no case file %s/%s)\n", shmb_ops[i].name, dir, want);
            failed++;
        }
    }
    /* Every wire code a plain connection can cause is some case's reply. */
    for (i = 0; i < shmb_error_ncodes; i++) {
        const struct shmb_error_code *ec = &shmb_error_codes[i];
        bool exempt = false;
        size_t k;

        for (k = 0; k < sizeof(uncoverable_codes) / sizeof(uncoverable_codes[0]); k++)
            exempt |= strcmp(uncoverable_codes[k], ec->name) == 0;
        if (ec->where != SHMB_ERR_WIRE || exempt)
            continue;
        if (!code_seen(ec->name)) {
            printf("FAIL: code-%s (no case expects it)\n", ec->name);
            failed++;
        }
    }
    if (failed == 0)
        printf("PASS: coverage (%d ops, every wire code)\n", (int)SHMB_OP_COUNT);

    for (i = 0; i < n; i++)
        free(names[i]);
    free(names);
    return failed == 0 ? 0 : 1;
}
