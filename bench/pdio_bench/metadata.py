# SPDX-License-Identifier: BSD-3-Clause
"""What a run records about itself: the machine, the packages, the
builds under test (path, hash, mtime, git tree) and the run's settings."""

import datetime
import hashlib
import os
import platform
import socket

from .image import fs_type
from .util import read_file, run_out


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def short_sha256(path):
    return file_sha256(path)[:16] if path and os.path.exists(path) else None


def mtime(path):
    try:
        return datetime.datetime.fromtimestamp(
            os.path.getmtime(path)).strftime("%Y-%m-%d %H:%M:%S")
    except OSError:
        return None


def build_tree(path):
    """The git checkout a binary was built in: its commit, and whether its
    src/ or plugin/ differ from it (the build may then not match it)."""
    d = os.path.dirname(os.path.abspath(path))
    top = run_out(["git", "-C", d, "rev-parse", "--show-toplevel"])
    if not top:
        return None
    return {"dir": top,
            "commit": run_out(["git", "-C", top, "rev-parse", "--short",
                               "HEAD"]),
            "branch": run_out(["git", "-C", top, "rev-parse",
                               "--abbrev-ref", "HEAD"]),
            "src_dirty": bool(run_out(["git", "-C", top, "status",
                                       "--porcelain", "--", "src",
                                       "plugin"]))}


def pkg_version(p):
    return run_out(["dpkg-query", "-W", "-f=${Version}", p]) or None


def first_field(path, prefix, sep=":"):
    """The value of path's first line starting with prefix, or ""."""
    for line in read_file(path).splitlines():
        if line.startswith(prefix):
            return line.split(sep, 1)[1]
    return ""


def metadata(cfg, img, size):
    cpu = first_field("/proc/cpuinfo", "model name").strip()
    memtotal = int(first_field("/proc/meminfo", "MemTotal:").split()[0])
    try:
        osname = first_field("/etc/os-release", "PRETTY_NAME=",
                             "=").strip('"')
    except OSError:
        osname = ""
    git = lambda *a: run_out(["git", "-C", cfg.top] + list(a))  # noqa
    dirty = git("status", "--porcelain", "--", "src", "plugin")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc)
                        .strftime("%Y-%m-%d %H:%M UTC"),
        "host": socket.gethostname(),
        "cpu": cpu,
        "ncpu": os.cpu_count(),
        "mem_gib": round(memtotal / 1024 / 1024, 1),
        "os": osname,
        "kernel": platform.release(),
        "packages": {p: pkg_version(p) for p in
                     ("nbdkit", "qemu-utils", "nbd-server", "fio",
                      "libnbd0", "liburing2", "util-linux")},
        "pdio_commit": git("rev-parse", "--short", "HEAD"),
        "pdio_src_dirty": bool(dirty),
        # The engine changes under a long session: say which build ran.
        "plugin": cfg.plugin,
        "plugin_sha256": short_sha256(cfg.plugin),
        "plugin_mtime": mtime(cfg.plugin),
        "plugin_tree": build_tree(cfg.plugin),
        "base_plugin": cfg.base_plugin or None,
        "base_plugin_sha256": short_sha256(cfg.base_plugin),
        "base_plugin_tree": build_tree(cfg.base_plugin)
        if cfg.base_plugin else None,
        "pdio_cli": cfg.pdio_cli,
        "pdio_cli_sha256": short_sha256(cfg.pdio_cli),
        "pdio_cli_mtime": mtime(cfg.pdio_cli),
        "pdio_cli_tree": build_tree(cfg.pdio_cli),
        "native_threads_default": os.cpu_count(),
        "image": img,
        "image_size": size,
        "image_fs": run_out(["findmnt", "-n", "-o", "FSTYPE", "-T", img])
                    or fs_type(os.path.dirname(img)),
        "image_dev": run_out(["findmnt", "-n", "-o", "SOURCE", "-T", img]),
        "runtime_s": cfg.runtime,
        "ramp_s": cfg.ramp,
        "repeat": cfg.repeat,
        "nbdkit_threads": 16,
    }
