/* Bounce arena; see bounce.h. */
#include <config.h>

#include <assert.h>
#include <errno.h>
#include <sys/mman.h>

#include "bounce.h"

int
bounce_reserve (struct bounce *b, size_t len)
{
  size_t size = b->size ? b->size : BOUNCE_MIN;
  void *mem;

  assert (len <= BOUNCE_CAP);
  if (b->mem && b->size >= len)
    return 0;
  while (size < len)
    size *= 2;
  if (size > BOUNCE_CAP)
    size = BOUNCE_CAP;

  mem = mmap (NULL, size, PROT_READ | PROT_WRITE,
              MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED)
    return -errno;
  bounce_free (b);
  b->mem = mem;
  b->size = size;
  return 1;
}

void
bounce_free (struct bounce *b)
{
  if (b->mem)
    munmap (b->mem, b->size);
  b->mem = NULL;
  b->size = 0;
}
