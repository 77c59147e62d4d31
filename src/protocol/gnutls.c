/* SPDX-License-Identifier: BSD-3-Clause */
/* GnuTLS, loaded with dlopen when TLS is asked for (see proto.h): the one
 * loader that pdio serve (src/server/tls.c) and pdio(1)'s client
 * (src/cli/tls_client.c) fill their tables of GnuTLS's functions with.
 */
#include <config.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>

#include "proto.h"

int
pdio_gnutls_load (const char *const *names, void **addr, size_t n,
                  char *why, size_t len)
{
  void *lib;

  /* Never closed: sessions and credentials may be made again. */
  lib = dlopen (PDIO_GNUTLS_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    snprintf (why, len, "TLS needs GnuTLS: %s (apt-get install libgnutls30)",
              dlerror ());
    return -ENOENT;
  }
  for (size_t i = 0; i < n; i++) {
    if ((addr[i] = dlsym (lib, names[i])) == NULL) {
      snprintf (why, len, "%s: no %s: GnuTLS is too old", PDIO_GNUTLS_SONAME,
                names[i]);
      return -ENOSYS;
    }
  }
  return 0;
}
