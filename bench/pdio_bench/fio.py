# SPDX-License-Identifier: BSD-3-Clause
"""The jobs: what each one asks of fio, fio's command line for a job on a
server, and the figures taken from fio's JSON output."""

import json

from .util import parse_size, read_file


class Job:
    def __init__(self, name, label, metric, fio):
        self.name, self.label, self.metric, self.fio = name, label, metric, fio

    def _size_option(self, key, default):
        opt = dict(a[2:].split("=", 1) for a in self.fio if "=" in a)
        return parse_size(opt.get(key, default))

    @property
    def bs(self):
        return self._size_option("bs", "4k")

    @property
    def offset(self):
        return self._size_option("offset", "0")

    def aligned(self, n):
        """Every request of this job starts and ends on a multiple of n
        (fio's blockalign defaults to bs, and offset shifts them all)."""
        return self.bs % n == 0 and self.offset % n == 0


JOBS = [
    Job("rr4k-qd1", "4k randread QD1", "iops",
        ["--rw=randread", "--bs=4k", "--iodepth=1"]),
    Job("rr4k-qd32", "4k randread QD32", "iops",
        ["--rw=randread", "--bs=4k", "--iodepth=32"]),
    Job("rw4k-qd32", "4k randwrite QD32", "iops",
        ["--rw=randwrite", "--bs=4k", "--iodepth=32"]),
    Job("rrw64k-qd16", "64k randrw 70/30 QD16", "mbps",
        ["--rw=randrw", "--rwmixread=70", "--bs=64k", "--iodepth=16"]),
    Job("sr1m-qd8", "1M seqread QD8", "mbps",
        ["--rw=read", "--bs=1M", "--iodepth=8"]),
    Job("sw1m-qd8", "1M seqwrite QD8", "mbps",
        ["--rw=write", "--bs=1M", "--iodepth=8"]),
    # fio's nbd engine opens one connection per job process.
    Job("rr4k-4x8", "4k randread 4 conn x QD8", "iops",
        ["--rw=randread", "--bs=4k", "--iodepth=8", "--numjobs=4"]),
    # offset=512 with bs=4k (blockalign defaults to bs): every write starts
    # at 512 mod 4096 (checked with nbdkit's log filter, see bench/README).
    Job("rw4k-mis-qd32", "4k randwrite QD32, 512-misaligned", "iops",
        ["--rw=randwrite", "--bs=4k", "--iodepth=32", "--offset=512"]),
]
JOB_BY_NAME = {j.name: j for j in JOBS}


def fio_cmd(job, srv, cfg, img, size, out, uri):
    # fio's region is [offset, offset + size): with offset=512 and the whole
    # image's size, the last block would cross the end, which grows the
    # image under the raw row (and then qemu-nbd refuses an image whose
    # size is not a multiple of 512) and fails with ENOSPC under a server.
    # So the region ends at the last whole block inside the image.
    region = (size - job.offset) // job.bs * job.bs
    cmd = ["fio", "--name=" + job.name, "--output-format=json",
           "--output=" + out, "--time_based",
           "--runtime=%g" % cfg.runtime, "--ramp_time=%g" % cfg.ramp,
           "--lat_percentiles=1", "--norandommap", "--group_reporting",
           "--size=%d" % region] + job.fio
    if srv.kind == "raw":
        cmd += ["--ioengine=io_uring", "--direct=1", "--filename=" + img]
    else:
        cmd += ["--ioengine=nbd", "--uri=" + uri]
    return cmd


def parse_fio(path):
    text = read_file(path)
    d = json.loads(text[text.index("{"):])
    j = d["jobs"][0]
    ios = iops = bw = 0.0
    lat_sum = 0.0
    p99 = 0.0
    for ddir in ("read", "write"):
        x = j[ddir]
        if x["total_ios"] == 0:
            continue
        ios += x["total_ios"]
        iops += x["iops"]
        bw += x["bw_bytes"]
        lat_sum += x["lat_ns"]["mean"] * x["total_ios"]
        pct = x["lat_ns"].get("percentile", {})
        p99 = max(p99, pct.get("99.000000", 0))
    return {
        "fio_error": j["error"],
        "ios": int(ios),
        "iops": iops,
        "mbps": bw / 1e6,
        "lat_mean_us": lat_sum / ios / 1000 if ios else None,
        "lat_p99_us": p99 / 1000 if ios else None,
        "runtime_ms": j["job_runtime"],
    }
