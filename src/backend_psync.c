/* The psync backend: preadv2/pwritev2 on the same O_DIRECT fd.  For
 * kernels and sandboxes that refuse io_uring.
 */
#include <config.h>

#include <errno.h>
#include <sys/uio.h>

#include "io.h"

static int
psync_submit (struct io_ctx *ctx, struct io_sub *subs, unsigned n)
{
  unsigned i;

  for (i = 0; i < n; i++) {
    struct io_sub *s = &subs[i];
    ssize_t r;

    if (s->write)
      r = pwritev2 (ctx->fd, s->iov, s->iovcnt, s->offset, s->rw_flags);
    else
      r = preadv2 (ctx->fd, s->iov, s->iovcnt, s->offset, s->rw_flags);
    s->res = r >= 0 ? r : -errno;
  }
  return 0;
}

const struct io_backend backend_psync = {
  .name = "psync",
  .submit = psync_submit,
};
