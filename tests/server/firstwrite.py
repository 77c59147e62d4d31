#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
# The first writes after an idle give-back, for server/reserve.tap: one
# connection to pdio serve warms the server up (a 4 KiB write, a
# maximum-size write, then writes and reads in flight together, which
# make more pool chunks live than the reserve), stays open while the
# server gives its pool back, then writes 4 KiB and the maximum size
# again, reading the server's page faults (/proc/PID/stat: minflt and
# majflt, summed over its threads) around each; and again, the other way
# round, after another idle period.  Then fresh connections
# do the same, for the figures.  Everything written is kept in a shadow
# of the image and read back.  The results go to OUT as JSON; the test
# judges them.
#
#   firstwrite.py SOCKET PID LOG IMAGE OUT
import json
import os
import re
import sys
import time

import nbd

sock, pid, log, image, out = sys.argv[1:6]
DEADLINE = 120          # seconds for the give-back (it takes about 6)
IDLE = 8                # seconds: the server gives back after 5
res = {}


def faults():
    """minflt and majflt of the whole process (fields 10 and 12)."""
    with open("/proc/%s/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[7]), int(fields[9])


def status(key):
    with open("/proc/%s/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def gave_back():
    with open(log) as f:
        return f.read().count("gave back")


shadow = bytearray(open(image, "rb").read())


def write(h, off, data):
    h.pwrite(data, off)
    shadow[off:off + len(data)] = data


def counted(h, off, data):
    """Faults of the server across one write (its reply in, and a moment
    for what the worker does after the reply)."""
    f0 = faults()
    write(h, off, data)
    time.sleep(0.2)
    f1 = faults()
    return [f1[0] - f0[0], f1[1] - f0[1]]


h = nbd.NBD()
h.connect_unix(sock)
big = h.get_block_size(nbd.SIZE_MAXIMUM)
res["block_max"] = big
small = 4096
rng = os.urandom

# Warm up: the code of both writes runs once, then a load that makes
# more chunks live than the reserve (streamed writes and reads in
# flight together).
given0 = gave_back()
write(h, 0, rng(small))
write(h, 8 << 20, rng(big))
held = []
for i in range(4):
    data = rng(big)
    held += [data, nbd.Buffer(big), nbd.Buffer(1 << 20)]
    h.aio_pwrite(data, (40 << 20) + i * big)
    shadow[(40 << 20) + i * big:(40 << 20) + (i + 1) * big] = data
    h.aio_pread(held[-2], 176 << 20)
    h.aio_pread(held[-1], (1 << 20) * (i + 1))
while h.aio_in_flight() > 0:
    h.poll(-1)
res["peak_pin_kib"] = status("VmPin")

# Idle until the server gave pool memory back (its log says so), and a
# moment more for its once-per-idle-period work.
end = time.time() + DEADLINE
while time.time() < end and gave_back() == given0:
    time.sleep(0.5)
time.sleep(1.5)
res["gave_back"] = gave_back() - given0
# Worker 0 makes its pool at start, the others with their first
# connection (nbdinfo's, this one's): each has a reserve.
with open(log) as f:
    res["pools"] = len({0} | {int(m) for m in
                              re.findall(r"accepted by worker (\d+)",
                                         f.read())})
res["idle_pin_kib"] = status("VmPin")
res["idle_lck_kib"] = status("VmLck")
res["idle_rss_kib"] = status("VmRSS")

# The first writes after idle, on the connection kept open: 4 KiB then
# the maximum; idle again (longer than the server's 5 s), the other way
# round.
res["small_big"] = counted(h, 12 * 4096, rng(small)) + \
    counted(h, 3 << 20, rng(big))
time.sleep(IDLE)
res["big_small"] = counted(h, 5 << 20, rng(big)) + \
    counted(h, 13 * 4096, rng(small))
res["pin_after_kib"] = status("VmPin")

# Fresh connections: the next worker (which makes its ring and its
# reserve for it), then the first one again.
res["fresh"] = []
for n in range(2):
    f0 = faults()
    c = nbd.NBD()
    c.connect_unix(sock)
    time.sleep(0.2)
    f1 = faults()
    res["fresh"].append({
        "connect": [f1[0] - f0[0], f1[1] - f0[1]],
        "small": counted(c, (100 << 20) + n * 4096, rng(small)),
        "big": counted(c, (90 << 20) - n * (1 << 20), rng(big)),
    })
    c.shutdown()

# Everything reads back as the shadow.
size = h.get_size()
same = True
for off in range(0, size, big):
    n = min(big, size - off)
    if h.pread(n, off) != shadow[off:off + n]:
        same = False
        res["first_difference_mib"] = off >> 20
        break
res["read_back"] = same
res["image_mib"] = size >> 20
h.shutdown()
with open(out, "w") as f:
    json.dump(res, f)
print(json.dumps(res))
