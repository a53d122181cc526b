// SPDX-License-Identifier: Apache-2.0
/*
 * The pre-shared key: loaded from a file only the relay's user may read, and
 * the proofs relays give of it at connection (HMAC-SHA256 from OpenSSL's
 * libcrypto over both sides' fresh nonces). Knows nothing about UCX.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "relay.h"

/* What the proof is over, so that a proof made for another purpose (or by
 * the other side of this connection) never passes for this one. */
#define AUTH_LABEL "shmbroker-relay auth v1"

int auth_load_key(struct relay *r, const char *path, struct shmb_error *err)
{
    struct stat st;
    int fd = -1, rc;
    ssize_t got;
    size_t len = 0;

    /* O_NONBLOCK: a FIFO put there is refused below, not waited on forever.
     * Symbolic links are followed (Kubernetes mounts a Secret's files as
     * links into a directory it swaps): what is checked below is the file
     * opened, through its descriptor. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        rc = -errno;
        return shmb_error_set(err, rc, "Cannot open the key file %s: %s. Make one with "
                              "'head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE'.",
                              path, strerror(-rc));
    }
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        shmb_error_set(err, rc, "Cannot stat the key file %s: %s.", path, strerror(-rc));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = shmb_error_set(err, -EINVAL, "The key file %s is not a regular file.", path);
        goto fail;
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        rc = shmb_error_set(err, -EPERM,
                            "The key file %s has mode %04o: others than its owner may read "
                            "or change it. Run 'chmod 600 %s'.",
                            path, (unsigned)(st.st_mode & 07777), path);
        goto fail;
    }
    if (st.st_uid != geteuid()) {
        rc = shmb_error_set(err, -EPERM,
                            "The key file %s belongs to uid %u, not to the relay's user "
                            "(uid %u). Run 'chown %u %s'.",
                            path, (unsigned)st.st_uid, (unsigned)geteuid(),
                            (unsigned)geteuid(), path);
        goto fail;
    }
    while (len < sizeof(r->key) + 1) {
        unsigned char tmp[512];
        got = read(fd, tmp, sizeof(tmp));
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            rc = -errno;
            shmb_error_set(err, rc, "Cannot read the key file %s: %s.", path, strerror(-rc));
            goto fail;
        }
        if (got == 0)
            break;
        if (len + (size_t)got > sizeof(r->key)) {
            rc = shmb_error_set(err, -EINVAL,
                                "The key file %s is longer than %d bytes: it is not a key.",
                                path, RELAY_KEY_MAX);
            goto fail;
        }
        memcpy(r->key + len, tmp, (size_t)got);
        len += (size_t)got;
    }
    /* A trailing newline (echo, an editor) is not part of the key. */
    while (len && (r->key[len - 1] == '\n' || r->key[len - 1] == '\r'))
        len--;
    if (len < RELAY_KEY_MIN) {
        rc = shmb_error_set(err, -EINVAL,
                            "The key file %s holds %zu bytes; a key needs at least %d. Make "
                            "one with 'head -c 32 /dev/urandom | base64 > FILE'.",
                            path, len, RELAY_KEY_MIN);
        goto fail;
    }
    r->key_len = len;
    close(fd);
    return 0;
fail:
    OPENSSL_cleanse(r->key, sizeof(r->key));
    close(fd);
    return rc;
}

int auth_nonce(unsigned char *out, size_t len)
{
    return RAND_bytes(out, (int)len) == 1 ? 0 : -EIO;
}

void auth_proof(const struct relay *r, bool dialler, const unsigned char *their_nonce,
                const unsigned char *my_nonce, unsigned char out[WIRE_MAC_LEN])
{
    unsigned char msg[sizeof(AUTH_LABEL) + 1 + 2 * WIRE_NONCE_LEN];
    unsigned int outlen = WIRE_MAC_LEN;
    size_t n = 0;

    memcpy(msg, AUTH_LABEL, sizeof(AUTH_LABEL));
    n += sizeof(AUTH_LABEL);
    msg[n++] = dialler ? 'D' : 'L';
    memcpy(msg + n, their_nonce, WIRE_NONCE_LEN);
    n += WIRE_NONCE_LEN;
    memcpy(msg + n, my_nonce, WIRE_NONCE_LEN);
    n += WIRE_NONCE_LEN;
    if (!HMAC(EVP_sha256(), r->key, (int)r->key_len, msg, n, out, &outlen))
        memset(out, 0, WIRE_MAC_LEN); /* proves nothing: the other side refuses it */
}

bool auth_check(const struct relay *r, bool dialler, const unsigned char *their_nonce,
                const unsigned char *my_nonce, const unsigned char mac[WIRE_MAC_LEN])
{
    unsigned char want[WIRE_MAC_LEN];
    static const unsigned char zero[WIRE_MAC_LEN];
    /* Their proof is made from their side: our nonce is theirs, theirs is
     * their own. */
    auth_proof(r, dialler, my_nonce, their_nonce, want);
    if (CRYPTO_memcmp(want, zero, WIRE_MAC_LEN) == 0)
        return false;
    return CRYPTO_memcmp(want, mac, WIRE_MAC_LEN) == 0;
}
