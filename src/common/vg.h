/* SPDX-License-Identifier: BSD-3-Clause */
/* What valgrind's memcheck cannot see by itself: memory the kernel reads
 * or writes through io_uring.  When valgrind runs read(2) or recv(2) it
 * marks the bytes returned as defined, and it checks that what write(2)
 * or sendmsg(2) hands the kernel is defined; an SQE is only memory that
 * the kernel acts on later, invisibly.  So the ring's users say it
 * themselves, where they queue and complete such an operation:
 *
 *   vg_kernel_owns (buf, len)      a read or receive into buf is queued:
 *                                  its bytes are the kernel's to write,
 *                                  undefined until it says what it wrote
 *   vg_kernel_wrote (buf, res)     its completion: exactly the first res
 *                                  bytes (res > 0) are defined, no more
 *   vg_kernel_wrote_iov (iov, cnt, res)   the same across an iovec
 *   vg_kernel_owns_iov (iov, cnt)
 *   vg_check_iov (iov, cnt)        a write or send is queued: report any
 *                                  undefined byte it would hand over
 *
 * and the per-thread pool (pool.c), an allocator of its own inside one
 * mapping, tells it what malloc and free would:
 *
 *   vg_fresh (buf, len)            a block handed out: nothing in it is
 *                                  defined yet
 *   vg_gone (buf, len)             a block given back: not to be touched
 *
 * Without <valgrind/memcheck.h> (configure looks for it; Debian's valgrind
 * package has it) they are empty.  With it, outside valgrind, each is a
 * client request: a few instructions that do nothing natively.
 */
#ifndef PDIO_VG_H
#define PDIO_VG_H

#include <stddef.h>
#include <sys/uio.h>

#ifdef HAVE_VALGRIND_MEMCHECK_H
#include <valgrind/memcheck.h>

static inline void
vg_kernel_owns (void *buf, size_t len)
{
  (void) VALGRIND_MAKE_MEM_UNDEFINED (buf, len);
}

static inline void
vg_fresh (void *buf, size_t len)
{
  (void) VALGRIND_MAKE_MEM_UNDEFINED (buf, len);
}

static inline void
vg_gone (void *buf, size_t len)
{
  (void) VALGRIND_MAKE_MEM_NOACCESS (buf, len);
}

static inline void
vg_kernel_wrote (void *buf, int res)
{
  if (res > 0)
    (void) VALGRIND_MAKE_MEM_DEFINED (buf, (size_t) res);
}

static inline void
vg_kernel_owns_iov (const struct iovec *iov, int cnt)
{
  if (!RUNNING_ON_VALGRIND)
    return;
  for (int i = 0; i < cnt; i++)
    (void) VALGRIND_MAKE_MEM_UNDEFINED (iov[i].iov_base, iov[i].iov_len);
}

static inline void
vg_kernel_wrote_iov (const struct iovec *iov, int cnt, int res)
{
  size_t left = res > 0 ? (size_t) res : 0;

  if (!RUNNING_ON_VALGRIND)
    return;
  for (int i = 0; i < cnt && left; i++) {
    size_t n = iov[i].iov_len < left ? iov[i].iov_len : left;

    (void) VALGRIND_MAKE_MEM_DEFINED (iov[i].iov_base, n);
    left -= n;
  }
}

static inline void
vg_check_iov (const struct iovec *iov, size_t cnt)
{
  if (!RUNNING_ON_VALGRIND)
    return;
  for (size_t i = 0; i < cnt; i++)
    (void) VALGRIND_CHECK_MEM_IS_DEFINED (iov[i].iov_base, iov[i].iov_len);
}

/* Non-zero under valgrind. */
#define vg_running() (RUNNING_ON_VALGRIND != 0)

#else /* !HAVE_VALGRIND_MEMCHECK_H */

static inline void vg_kernel_owns (void *buf, size_t len)
{ (void) buf; (void) len; }
static inline void vg_fresh (void *buf, size_t len)
{ (void) buf; (void) len; }
static inline void vg_gone (void *buf, size_t len)
{ (void) buf; (void) len; }
static inline void vg_kernel_wrote (void *buf, int res)
{ (void) buf; (void) res; }
static inline void vg_kernel_owns_iov (const struct iovec *iov, int cnt)
{ (void) iov; (void) cnt; }
static inline void vg_kernel_wrote_iov (const struct iovec *iov, int cnt,
                                        int res)
{ (void) iov; (void) cnt; (void) res; }
static inline void vg_check_iov (const struct iovec *iov, size_t cnt)
{ (void) iov; (void) cnt; }
#define vg_running() 0

#endif /* HAVE_VALGRIND_MEMCHECK_H */

#endif /* PDIO_VG_H */
