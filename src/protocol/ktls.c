/* SPDX-License-Identifier: BSD-3-Clause */
/* kTLS: hands a finished GnuTLS session's record state to the kernel, so
 * that plain send and recv on the socket carry TLS (see proto.h).
 *
 * GnuTLS is not linked: pdio's server loads it with dlopen only when TLS
 * is asked for (src/server/tls.c).  A caller holding a session has it
 * loaded already, so its functions are found in the loaded copy
 * (RTLD_NOLOAD), whichever way that caller got it.
 */
#include <config.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <linux/tls.h>
#include <gnutls/gnutls.h>

#include "proto.h"

#ifndef SOL_TLS
#define SOL_TLS 282
#endif

static struct {
  __typeof__ (gnutls_protocol_get_version) *protocol_get_version;
  __typeof__ (gnutls_cipher_get) *cipher_get;
  __typeof__ (gnutls_cipher_get_name) *cipher_get_name;
  __typeof__ (gnutls_record_get_state) *record_get_state;
  __typeof__ (gnutls_record_check_pending) *record_check_pending;
} gt;

static int
say (char *why, size_t len, int ret, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  vsnprintf (why, len, fmt, ap);
  va_end (ap);
  return ret;
}

static bool
find_gnutls (void)
{
  void *lib;

  if (gt.record_get_state)
    return true;
  lib = dlopen (PDIO_GNUTLS_SONAME, RTLD_NOW | RTLD_NOLOAD);
  if (lib == NULL)
    return false;
  gt.protocol_get_version = dlsym (lib, "gnutls_protocol_get_version");
  gt.cipher_get = dlsym (lib, "gnutls_cipher_get");
  gt.cipher_get_name = dlsym (lib, "gnutls_cipher_get_name");
  gt.record_check_pending = dlsym (lib, "gnutls_record_check_pending");
  gt.record_get_state = dlsym (lib, "gnutls_record_get_state");
  /* The handle stays open: the session's library stays loaded anyway. */
  return gt.protocol_get_version && gt.cipher_get && gt.cipher_get_name &&
         gt.record_check_pending && gt.record_get_state;
}

/* One direction's crypto_info, the largest of the kernel's kinds. */
union crypto_info {
  struct tls_crypto_info info;
  struct tls12_crypto_info_aes_gcm_128 gcm128;
  struct tls12_crypto_info_aes_gcm_256 gcm256;
  struct tls12_crypto_info_chacha20_poly1305 chacha;
};

/* Fills ci for one direction (read: the peer's records); its size, or 0
 * with why set.
 */
static size_t
fill (gnutls_session_t s, bool read, gnutls_protocol_t ver,
      gnutls_cipher_algorithm_t cipher, union crypto_info *ci,
      char *why, size_t len)
{
  gnutls_datum_t mac, iv, key;
  unsigned char seq[8];
  bool tls13 = ver == GNUTLS_TLS1_3;
  int r;

  r = gt.record_get_state (s, read, &mac, &iv, &key, seq);
  if (r < 0)
    return say (why, len, 0, "no %s record state (%d)",
                read ? "read" : "write", r);
  memset (ci, 0, sizeof *ci);
  ci->info.version = tls13 ? TLS_1_3_VERSION : TLS_1_2_VERSION;
  /* The nonces: with AES-GCM, TLS 1.3 derives all 12 bytes (salt, then
   * iv) from the secret, and TLS 1.2 fixes a 4-byte salt and sends the
   * rest in each record, where GnuTLS puts the sequence number and so
   * must the kernel.  ChaCha20 has a 12-byte fixed IV in both.
   */
#define GCM(field, CIPHER)                                              \
  do {                                                                  \
    ci->info.cipher_type = CIPHER;                                      \
    if (key.size != sizeof ci->field.key ||                             \
        iv.size < sizeof ci->field.salt ||                              \
        (tls13 && iv.size != sizeof ci->field.salt + sizeof ci->field.iv)) \
      return say (why, len, 0, "%s: unexpected key or IV length (%u, %u)", \
                  gt.cipher_get_name (cipher), key.size, iv.size);      \
    memcpy (ci->field.key, key.data, sizeof ci->field.key);             \
    memcpy (ci->field.salt, iv.data, sizeof ci->field.salt);            \
    if (tls13)                                                          \
      memcpy (ci->field.iv, iv.data + sizeof ci->field.salt,            \
              sizeof ci->field.iv);                                     \
    else                                                                \
      memcpy (ci->field.iv, seq, sizeof ci->field.iv);                  \
    memcpy (ci->field.rec_seq, seq, sizeof ci->field.rec_seq);          \
    return sizeof ci->field;                                            \
  } while (0)
  switch (cipher) {
  case GNUTLS_CIPHER_AES_128_GCM:
    GCM (gcm128, TLS_CIPHER_AES_GCM_128);
  case GNUTLS_CIPHER_AES_256_GCM:
    GCM (gcm256, TLS_CIPHER_AES_GCM_256);
  case GNUTLS_CIPHER_CHACHA20_POLY1305:
    ci->info.cipher_type = TLS_CIPHER_CHACHA20_POLY1305;
    if (key.size != sizeof ci->chacha.key || iv.size != sizeof ci->chacha.iv)
      return say (why, len, 0, "%s: unexpected key or IV length (%u, %u)",
                  gt.cipher_get_name (cipher), key.size, iv.size);
    memcpy (ci->chacha.key, key.data, sizeof ci->chacha.key);
    memcpy (ci->chacha.iv, iv.data, sizeof ci->chacha.iv);
    memcpy (ci->chacha.rec_seq, seq, sizeof ci->chacha.rec_seq);
    return sizeof ci->chacha;
  default:
    return say (why, len, 0, "cipher %s is not one kTLS takes (AES-128-GCM, "
                "AES-256-GCM, CHACHA20-POLY1305)",
                gt.cipher_get_name (cipher));
  }
#undef GCM
}

int
pdio_ktls_enable (struct gnutls_session_int *s, int fd, bool rx, char *why,
                  size_t len)
{
  union crypto_info tx_ci, rx_ci;
  size_t tx_len, rx_len = 0;
  gnutls_protocol_t ver;
  gnutls_cipher_algorithm_t cipher;

  if (!find_gnutls ())
    return say (why, len, -1, "%s is not loaded, or lacks "
                "gnutls_record_get_state", PDIO_GNUTLS_SONAME);
  ver = gt.protocol_get_version (s);
  if (ver != GNUTLS_TLS1_2 && ver != GNUTLS_TLS1_3)
    return say (why, len, -1, "kTLS takes TLS 1.2 and 1.3 only");
  cipher = gt.cipher_get (s);
  /* Records GnuTLS has read ahead would be lost to the kernel. */
  if (rx && gt.record_check_pending (s) > 0)
    return say (why, len, -1, "GnuTLS holds received data not yet read");
  tx_len = fill (s, false, ver, cipher, &tx_ci, why, len);
  if (tx_len == 0)
    return -1;
  if (rx && (rx_len = fill (s, true, ver, cipher, &rx_ci, why, len)) == 0)
    return -1;

  /* The kernel loads the tls module itself (request_module) when modprobe
   * can: ENOENT means it is neither loaded nor loadable.
   */
  if (setsockopt (fd, SOL_TCP, TCP_ULP, "tls", sizeof "tls") == -1) {
    int e = errno;

    return say (why, len, -1, "setsockopt TCP_ULP \"tls\": %s%s", strerror (e),
                e == ENOENT ? " (no tls kernel module: modprobe tls)" : "");
  }
  /* Until a key is set the ULP passes bytes through untouched, so a
   * refusal here still leaves the socket to user-space TLS; once one
   * direction is in the kernel, there is no way back.
   */
  if (setsockopt (fd, SOL_TLS, TLS_TX, &tx_ci, tx_len) == -1) {
    int e = errno;

    memset (&tx_ci, 0, sizeof tx_ci);
    memset (&rx_ci, 0, sizeof rx_ci);
    return say (why, len, -1, "setsockopt TLS_TX (%s, TLS 1.%d): %s%s",
                gt.cipher_get_name (cipher), ver == GNUTLS_TLS1_3 ? 3 : 2,
                strerror (e), e == ENOENT ? " (the kernel's crypto API "
                "lacks the cipher: modprobe gcm, or chacha20poly1305)" : "");
  }
  memset (&tx_ci, 0, sizeof tx_ci);
  if (rx && setsockopt (fd, SOL_TLS, TLS_RX, &rx_ci, rx_len) == -1) {
    int e = errno;

    memset (&rx_ci, 0, sizeof rx_ci);
    return say (why, len, -2, "setsockopt TLS_RX (%s, TLS 1.%d): %s; the "
                "send side is in the kernel already: the connection cannot "
                "go on", gt.cipher_get_name (cipher),
                ver == GNUTLS_TLS1_3 ? 3 : 2, strerror (e));
  }
  memset (&rx_ci, 0, sizeof rx_ci);
  snprintf (why, len, "kTLS %s%s, TLS 1.%d", gt.cipher_get_name (cipher),
            rx ? "" : " (send only)", ver == GNUTLS_TLS1_3 ? 3 : 2);
  return 0;
}
