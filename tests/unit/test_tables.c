// SPDX-License-Identifier: Apache-2.0
/*
 * PROTOCOL.md agrees with the tables: the ops of proto/ops.def and the codes
 * of proto/errors.def are what the reference lists, in its headings, its
 * error table and the sentences that name a class of ops. A row added to a
 * table and not to the document (or the other way) fails here.
 *
 * Runs from the repository root (tests/run.sh does); SHMB_PROTOCOL_MD names
 * another copy of the document.
 */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../../proto/error.h"
#include "../../proto/protocol.h"

#define MAX_NAMES 64

/* A list of names read from the document or the tables. */
struct names {
    char v[MAX_NAMES][32];
    int n;
};

/* The document, read once by the group setup. */
static char *doc;

static void names_add(struct names *l, const char *s, size_t len)
{
    assert_true(l->n < MAX_NAMES);
    assert_true(len < sizeof(l->v[0]));
    memcpy(l->v[l->n], s, len);
    l->v[l->n][len] = '\0';
    l->n++;
}

static void names_print(const char *what, const struct names *l)
{
    int i;

    printf("%s:", what);
    for (i = 0; i < l->n; i++)
        printf(" %s", l->v[i]);
    printf("\n");
}

/* The two lists hold the same names in the same order. */
static void assert_same(const char *what, const struct names *doc_names,
                        const struct names *table)
{
    int i;
    bool same = doc_names->n == table->n;

    for (i = 0; same && i < table->n; i++)
        same = strcmp(doc_names->v[i], table->v[i]) == 0;
    if (!same) {
        printf("PROTOCOL.md disagrees with the tables on %s\n", what);
        names_print("  PROTOCOL.md", doc_names);
        names_print("  tables     ", table);
    }
    assert_true(same);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* The same names, whatever the order the sentence lists them in. */
static void assert_same_set(const char *what, struct names *doc_names, struct names *table)
{
    qsort(doc_names->v, (size_t)doc_names->n, sizeof(doc_names->v[0]), cmp_name);
    qsort(table->v, (size_t)table->n, sizeof(table->v[0]), cmp_name);
    assert_same(what, doc_names, table);
}

/* The text from the line starting with from up to the line starting with to
 * (or the end); fails the test when from is missing. Not NUL-terminated:
 * *len bytes. */
static const char *between(const char *text, const char *from, const char *to, size_t *len)
{
    const char *start = strstr(text, from), *end;

    if (start == NULL)
        fail_msg("PROTOCOL.md has no \"%s\"", from);
    end = to != NULL ? strstr(start + strlen(from), to) : NULL;
    if (end == NULL)
        end = start + strlen(start);
    *len = (size_t)(end - start);
    return start;
}

/* Every `quoted` word of text[0..len). */
static void quoted_words(const char *text, size_t len, struct names *out)
{
    const char *end = text + len, *open, *close;

    for (;;) {
        open = memchr(text, '`', (size_t)(end - text));
        if (open == NULL)
            return;
        close = memchr(open + 1, '`', (size_t)(end - open - 1));
        if (close == NULL)
            return;
        names_add(out, open + 1, (size_t)(close - open - 1));
        text = close + 1;
    }
}

/* The ops whose flags, masked by mask, equal want. */
static void ops_with(unsigned mask, unsigned want, struct names *out)
{
    int i;

    for (i = 0; i < SHMB_OP_COUNT; i++)
        if ((shmb_ops[i].flags & mask) == want)
            names_add(out, shmb_ops[i].name, strlen(shmb_ops[i].name));
}

/* Section 2's table row of a code: from "| `CODE` |" to the end of its line. */
static const char *code_row(const char *code, size_t *len)
{
    char head[64];
    size_t sec_len;
    const char *sec = between(doc, "## 2. ", "## 3. ", &sec_len), *row, *nl;

    snprintf(head, sizeof(head), "\n| `%s` |", code);
    row = strstr(sec, head);
    if (row == NULL || row >= sec + sec_len)
        fail_msg("section 2's table has no row for %s", code);
    row += strlen(head);
    nl = strchr(row, '\n');
    *len = nl != NULL ? (size_t)(nl - row) : strlen(row);
    return row;
}

/* Proves that section 5 has one "### NAME" heading per op of proto/ops.def,
 * in the table's order, and no other. */
static void test_op_headings(void **state)
{
    struct names heads = {0}, ops = {0};
    size_t len;
    const char *sec = between(doc, "## 5. Ops", "## 6. ", &len), *end = sec + len, *p;

    (void)state;
    for (p = sec; p != NULL && p < end; p = strchr(p, '\n')) {
        p += *p == '\n';
        if (strncmp(p, "### ", 4) == 0)
            names_add(&heads, p + 4, strcspn(p + 4, " \n"));
    }
    ops_with(0, 0, &ops);
    assert_same("the op headings of section 5", &heads, &ops);
}

/* Proves that the code column of section 2's table lists exactly the
 * SHMB_ERR_WIRE codes of proto/errors.def, in order. */
static void test_error_table(void **state)
{
    struct names rows = {0}, codes = {0};
    size_t len, i;
    const char *sec = between(doc, "## 2. ", "## 3. ", &len), *end = sec + len, *p;

    (void)state;
    p = strstr(sec, "\n| code | when |");
    assert_non_null(p);
    /* The rows: the lines that follow the heading's separator and start "| `". */
    for (p = strchr(p + 1, '\n'); p != NULL && p < end; p = strchr(p, '\n')) {
        p++;
        if (strncmp(p, "|---", 4) == 0)
            continue;
        if (strncmp(p, "| `", 3) != 0)
            break;
        names_add(&rows, p + 3, strcspn(p + 3, "`"));
    }
    for (i = 0; i < shmb_error_ncodes; i++)
        if (shmb_error_codes[i].where == SHMB_ERR_WIRE)
            names_add(&codes, shmb_error_codes[i].name, strlen(shmb_error_codes[i].name));
    assert_same("the codes of section 2's table", &rows, &codes);
}

/* Proves that the *noreply* paragraph of section 5 names exactly the ops
 * flagged SHMB_OPF_NOREPLY (the words quoted before "accept"). */
static void test_noreply_paragraph(void **state)
{
    struct names words = {0}, ops = {0};
    size_t len;
    const char *para = between(doc, "**noreply.** ", " accept", &len);

    (void)state;
    quoted_words(para, len, &words);
    ops_with(SHMB_OPF_NOREPLY, SHMB_OPF_NOREPLY, &ops);
    assert_same_set("the ops that take noreply", &words, &ops);
}

/* The words quoted in section 2's row of code between the phrases from and
 * to, which must both be in that row, in that order. */
static void row_words(const char *code, const char *from, const char *to, struct names *out)
{
    size_t row_len;
    const char *row = code_row(code, &row_len);
    const char *start = strstr(row, from), *stop = strstr(row, to);

    if (start == NULL || stop == NULL || start > stop || stop >= row + row_len)
        fail_msg("section 2's %s row no longer says \"%s ... %s\"", code, from, to);
    quoted_words(start, (size_t)(stop - start), out);
}

/* Proves that the EPERM row of section 2 names exactly the ops flagged
 * SHMB_OPF_WRITES (the words quoted between "sent" and "with or without"). */
static void test_eperm_row(void **state)
{
    struct names words = {0}, ops = {0};

    (void)state;
    row_words("EPERM", " sent ", "with or without", &words);
    ops_with(SHMB_OPF_WRITES, SHMB_OPF_WRITES, &ops);
    assert_same_set("the ops refused to read-only connections", &words, &ops);
}

/* Proves that the EINVAL row of section 2 names exactly the ops without
 * SHMB_OPF_BATCH as those a batch element may not be (the words quoted
 * between "or that is" and "or carries"). */
static void test_batch_einval(void **state)
{
    struct names words = {0}, ops = {0};

    (void)state;
    row_words("EINVAL", "or that is ", "or carries", &words);
    ops_with(SHMB_OPF_BATCH, 0, &ops);
    assert_same_set("the ops a batch may not hold", &words, &ops);
}

static int load_doc(void **state)
{
    const char *path = getenv("SHMB_PROTOCOL_MD");
    FILE *fp;
    long n;

    (void)state;
    if (path == NULL)
        path = "proto/PROTOCOL.md";
    fp = fopen(path, "r");
    if (fp == NULL) {
        printf("cannot open %s (run from the repository root)\n", path);
        return -1;
    }
    if (fseek(fp, 0, SEEK_END) != 0 || (n = ftell(fp)) < 0 || fseek(fp, 0, SEEK_SET) != 0 ||
        (doc = calloc(1, (size_t)n + 1)) == NULL || fread(doc, 1, (size_t)n, fp) != (size_t)n) {
        fclose(fp);
        return -1;
    }
    fclose(fp);
    return 0;
}

static int free_doc(void **state)
{
    (void)state;
    free(doc);
    doc = NULL;
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_headings),     cmocka_unit_test(test_error_table),
        cmocka_unit_test(test_noreply_paragraph), cmocka_unit_test(test_eperm_row),
        cmocka_unit_test(test_batch_einval),
    };

    return cmocka_run_group_tests(tests, load_doc, free_doc);
}
