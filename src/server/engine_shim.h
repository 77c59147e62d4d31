/* TEMPORARY: the asynchronous engine API of /work/notes/async-api.md,
 * declared here until the engine-async branch lands in src/engine.h;
 * engine_shim.c implements it on the synchronous engine.  Delete both
 * files (and the include in server.h) when merging engine-async.
 */
#ifndef PDIO_SERVER_ENGINE_SHIM_H
#define PDIO_SERVER_ENGINE_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <liburing.h>

#include "engine.h"

struct pdio_thread;
struct pdio_thread_config {
  size_t pool_bytes;            /* 0: 64 MiB */
  unsigned ring_entries;        /* 0: 256 */
};
extern int pdio_thread_new (struct pdio_image *img,
                            const struct pdio_thread_config *cfg,
                            struct pdio_thread **tp);
extern void pdio_thread_free (struct pdio_thread *t);

struct pdio_completion {
  void (*fn) (struct pdio_completion *c, int res, uint32_t cqe_flags);
};
extern struct io_uring *pdio_thread_ring (struct pdio_thread *t);
extern struct io_uring_sqe *pdio_thread_sqe (struct pdio_thread *t);
extern int pdio_thread_poll (struct pdio_thread *t, unsigned wait_nr,
                             const struct __kernel_timespec *timeout);

extern void *pdio_buf_get (struct pdio_thread *t, size_t len);
extern void pdio_buf_put (struct pdio_thread *t, void *buf, size_t len);

enum pdio_op { PDIO_OP_READ, PDIO_OP_WRITE, PDIO_OP_ZERO, PDIO_OP_TRIM,
               PDIO_OP_FLUSH };
struct pdio_req;
struct pdio_req_private {
  struct pdio_req *next;
  int err;
};
struct pdio_req {
  enum pdio_op op;
  unsigned flags;
  uint64_t offset;
  size_t count;
  void *buf;
  void (*done) (struct pdio_req *r, int err);
  struct pdio_req_private priv;
};
extern void pdio_submit (struct pdio_thread *t, struct pdio_req *r);

#endif /* PDIO_SERVER_ENGINE_SHIM_H */
