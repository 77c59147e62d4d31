# SPDX-License-Identifier: BSD-3-Clause
"""Messages, sizes, files and commands: what every other module uses."""

import re
import subprocess
import sys


def log(msg):
    print("bench: " + msg, flush=True)


def die(msg):
    print("bench: error: " + msg, file=sys.stderr, flush=True)
    sys.exit(1)


def run_out(cmd, **kw):
    """A command's stdout, stripped; "" when it fails or is missing (the
    callers record what they can rather than stop a long run)."""
    try:
        return subprocess.run(cmd, check=True, capture_output=True, text=True,
                              **kw).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def parse_size(s):
    m = re.fullmatch(r"(\d+)([KMGT]?)(i?B)?", s.strip(), re.I)
    if not m:
        die("bad size %r" % s)
    return int(m[1]) * 1024 ** ("KMGT".find(m[2].upper()) + 1) \
        if m[2] else int(m[1])


def read_file(path):
    with open(path) as f:
        return f.read()
