# SPDX-License-Identifier: BSD-3-Clause
"""The test image: made and filled once, evicted from the page cache
before every server."""

import os
import subprocess
import time

from .procfs import fincore
from .util import die, log, read_file, run_out


def fs_type(path):
    return run_out(["stat", "-f", "-c", "%T", path])


def ensure_image(d, size):
    os.makedirs(d, exist_ok=True)
    t = fs_type(d)
    if t in ("tmpfs", "ramfs") or t == "":
        die("%s is on %r: the image must live on a real filesystem "
            "(set BENCH_DIR)" % (d, t))
    img = os.path.join(d, "disk.img")
    stamp = img + ".filled"
    if os.path.exists(stamp) and os.path.exists(img) and \
            read_file(stamp).strip() == str(size) and \
            os.path.getsize(img) == size:
        log("reusing %s (%d bytes, filled)" % (img, size))
        return img
    log("creating %s: %d bytes, preallocated, filled with random data "
        "(once; reused by later runs)" % (img, size))
    for p in (stamp, img):
        if os.path.exists(p):
            os.unlink(p)
    subprocess.run(["fallocate", "-l", str(size), img], check=True)
    # Write every block for real (O_DIRECT, so nothing stays cached):
    # reads then hit allocated, written blocks rather than unwritten extents.
    subprocess.run(["fio", "--name=fill", "--filename=" + img,
                    "--rw=write", "--bs=1M", "--direct=1",
                    "--ioengine=io_uring", "--iodepth=8",
                    "--size=%d" % size, "--output-format=terse"],
                   check=True, stdout=subprocess.DEVNULL)
    with open(stamp, "w") as f:
        f.write("%d\n" % size)
    return img


def evict(img, allow_drop_caches=True):
    """Write back and drop the image's pages; returns pages left."""
    if not os.path.exists(img):
        return None
    for attempt in range(10):
        fd = os.open(img, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        pages, _ = fincore(img)
        if pages == 0:
            return 0
        time.sleep(0.2)
    if allow_drop_caches:
        log("warning: %s pages of the image survive fadvise(DONTNEED); "
            "dropping the page cache" % pages)
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1\n")
        except OSError as e:
            log("warning: drop_caches: %s" % e)
    pages, _ = fincore(img)
    return pages
