/* SPDX-License-Identifier: BSD-3-Clause */
/* The struct of the given type whose member is at ptr: a completion or a
 * work item embedded in a bigger struct finds its owner back.
 */
#ifndef PDIO_CONTAINER_OF_H
#define PDIO_CONTAINER_OF_H

#include <stddef.h>

#define container_of(ptr, type, member) \
  ((type *) ((char *) (ptr) - offsetof (type, member)))

#endif /* PDIO_CONTAINER_OF_H */
