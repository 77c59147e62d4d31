#!/usr/bin/env python3
"""pdio benchmark: the same fio matrix against pdio and its peers.

Run through bench/run.sh (see bench/README for what it measures and how).
Standard library only: Debian 12's python3 is enough.
"""

import argparse
import datetime
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(BENCH)
RESULTS = os.path.join(BENCH, "results")
# The two front ends under test.  Both default to this tree's build and
# can be pointed elsewhere (--plugin/PDIO_PLUGIN, --pdio/PDIO_CLI), e.g. at
# a server branch's build before it is merged.  main() may reassign them.
PLUGIN = os.environ.get("PDIO_PLUGIN") or \
    os.path.join(TOP, "plugin", ".libs", "pdio.so")
PDIO_CLI = os.environ.get("PDIO_CLI") or os.path.join(TOP, "src", "cli", "pdio")
# The pdio-base row: another build's pdio.so (--base-plugin), for "no
# regression" measured in the same run rather than against published
# figures from another day (or another machine).
BASE_PLUGIN = os.environ.get("PDIO_BASE_PLUGIN") or ""
PERF_MD = os.path.join(TOP, "docs", "performance.md")
PERF_PNG = os.path.join(TOP, "docs", "performance-ratios.png")
CLK_TCK = os.sysconf("SC_CLK_TCK")

# --------------------------------------------------------------------------
# The matrix


class Job:
    def __init__(self, name, label, metric, fio):
        self.name, self.label, self.metric, self.fio = name, label, metric, fio

    def aligned(self, n):
        """Every request of this job starts and ends on a multiple of n
        (fio's blockalign defaults to bs, and offset shifts them all)."""
        opt = dict(a[2:].split("=", 1) for a in self.fio if "=" in a)
        bs = parse_size(opt.get("bs", "4k"))
        offset = parse_size(opt.get("offset", "0"))
        return bs % n == 0 and offset % n == 0


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


class Server:
    """kind: raw (fio on the image), nbdkit, qemu, nbd-server."""

    def __init__(self, name, label, kind, args=(), jobs=None, export=""):
        self.name, self.label, self.kind = name, label, kind
        self.args = list(args)
        self.jobs = jobs              # None: every job
        self.export = export


def pdio_threads_server(img, threads):
    return Server("pdio-t%d" % threads,
                  "pdio backend=io_uring, nbdkit --threads=%d" % threads,
                  "nbdkit", ["--threads=%d" % threads, PLUGIN, "file=" + img,
                             "backend=io_uring"])


# pdio's own NBD server (pdio serve).  The -tN rows exist for the issue's
# "--threads 1 against --threads 2": they run only the jobs that say
# something about scaling (connections are spread over the threads, so a
# single connection stays on one thread; rr4k-4x8 is the one that can
# scale).
NATIVE_SCALING_JOBS = ["rr4k-qd32", "rw4k-qd32", "rr4k-4x8"]


def native_server(img, threads=None):
    if threads is None:
        return Server("pdio-native",
                      "pdio serve (own NBD server), io_uring, threads = one "
                      "per CPU (%d)" % (os.cpu_count() or 1), "native",
                      ["--backend", "io_uring"])
    return Server("pdio-native-t%d" % threads,
                  "pdio serve (own NBD server), io_uring, --threads %d"
                  % threads, "native",
                  ["--backend", "io_uring", "--threads", str(threads)],
                  jobs=NATIVE_SCALING_JOBS)


# Other names --servers takes for a row.
SERVER_ALIASES = {"qemu-nbd-native": "qemu-native",
                  "qemu-nbd-uring": "qemu-uring", "native": "pdio-native"}

# The rows issue 11 needs, for a shorter run: --servers issue11.
ISSUE11_SERVERS = ["raw", "null", "pdio-native", "pdio-native-t1",
                   "pdio-native-t2", "pdio", "qemu-native", "qemu-uring"]


def servers(img, size):
    return [
        Server("raw", "fio io_uring direct=1 on the image (no NBD)", "raw"),
        Server("null", "nbdkit null (no I/O)", "nbdkit",
               ["null", "size=%d" % size]),
        Server("pdio", "pdio backend=io_uring", "nbdkit",
               [PLUGIN, "file=" + img, "backend=io_uring"]),
        Server("pdio-psync", "pdio backend=psync", "nbdkit",
               [PLUGIN, "file=" + img, "backend=psync"]),
        Server("pdio-base", "pdio backend=io_uring, baseline build "
               "(--base-plugin %s)" % (BASE_PLUGIN or "unset"), "nbdkit",
               [BASE_PLUGIN, "file=" + img, "backend=io_uring"]),
        # nbdkit's callbacks are synchronous: each read in flight holds a
        # worker thread, 16 per connection by default, so a single
        # connection at QD32 keeps only 16 at the disk.  This row shows
        # what twice the threads buys.
        pdio_threads_server(img, 32),
        # pdio advertises minimum=align, and libnbd (fio's nbd engine)
        # refuses requests below the advertised minimum, so the
        # blocksize-policy filter advertises 512 instead: the misaligned
        # writes reach pdio, which does the read-modify-write.  Both jobs on
        # this server go through the filter.
        Server("pdio-a4k", "pdio io_uring align=4096 (+blocksize-policy min=512)",
               "nbdkit",
               ["--filter=blocksize-policy", PLUGIN, "file=" + img,
                "backend=io_uring", "align=4096", "blocksize-minimum=512",
                "blocksize-preferred=4096"],
               jobs=["rw4k-qd32", "rw4k-mis-qd32"]),
        native_server(img),
        native_server(img, 1),
        native_server(img, 2),
        Server("qemu-native", "qemu-nbd cache=none aio=native", "qemu",
               ["--aio=native"]),
        Server("qemu-uring", "qemu-nbd cache=none aio=io_uring", "qemu",
               ["--aio=io_uring"]),
        Server("file", "nbdkit file (page cache)", "nbdkit",
               ["file", "file=" + img]),
        Server("file-nocache", "nbdkit file cache=none", "nbdkit",
               ["file", "file=" + img, "cache=none"]),
        Server("nbd-server", "nbd-server (page cache)", "nbd-server",
               export="bench"),
    ]


QEMU_ROWS = ("qemu-native", "qemu-uring")
PDIO_ROWS = ("pdio", "pdio-psync", "pdio-t32", "pdio-a4k")
NATIVE = "pdio-native"


def is_pdio_row(name):
    """The nbdkit + pdio.so rows."""
    return name in PDIO_ROWS or re.fullmatch(r"pdio-t\d+", name) is not None


def is_native_row(name):
    return name == NATIVE or re.fullmatch(r"pdio-native-t\d+", name) \
        is not None

# --------------------------------------------------------------------------
# Small helpers


def log(msg):
    print("bench: " + msg, flush=True)


def die(msg):
    print("bench: error: " + msg, file=sys.stderr, flush=True)
    sys.exit(1)


def run_out(cmd, **kw):
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


def pid_alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        stat = read_file("/proc/%d/stat" % pid)
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def children(pid):
    out = []
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            out += [int(c) for c in
                    read_file("/proc/%d/task/%s/children" % (pid, tid)).split()]
    except OSError:
        pass
    return out


def descendants(pid):
    out, todo = [], children(pid)
    while todo:
        c = todo.pop()
        out.append(c)
        todo += children(c)
    return out


def proc_cpu_ticks(pid, with_children=True):
    """utime+stime (+ reaped children's) of a process, in clock ticks."""
    try:
        f = read_file("/proc/%d/stat" % pid)
    except OSError:
        return None
    v = f[f.rindex(")") + 2:].split()
    t = int(v[11]) + int(v[12])
    if with_children:
        t += int(v[13]) + int(v[14])
    return t


def proc_status_kib(pid, key):
    try:
        for line in read_file("/proc/%d/status" % pid).splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def fincore(path):
    """(pages, bytes) of path in the page cache."""
    out = run_out(["fincore", "--bytes", "--noheadings", "--raw",
                   "--output", "PAGES,RES", path])
    try:
        pages, res = out.split()[:2]
        return int(pages), int(res)
    except ValueError:
        return None, None


def loadavg():
    return float(read_file("/proc/loadavg").split()[0])


def cpu_jiffies():
    """(steal, total) jiffies over all CPUs from /proc/stat."""
    v = [int(x) for x in read_file("/proc/stat").splitlines()[0].split()[1:]]
    # user nice system idle iowait irq softirq steal (guest* are in user)
    return v[7], sum(v[:8])


class CsCounter:
    """Server context switches over the middle of the measured window,
    counted by `perf stat` (optional: no perf, no figure)."""

    def __init__(self, pids, start_after, duration, path):
        self.pids, self.path = pids, path
        self.duration = duration
        self.proc = None
        self.timer = threading.Timer(start_after, self._start)
        self.timer.start()

    def _start(self):
        pids = [p for p in self.pids() if pid_alive(p)]
        if not pids:
            return
        try:
            self.proc = subprocess.Popen(
                ["perf", "stat", "-x", ",", "-e", "context-switches",
                 "-o", self.path, "-p", ",".join(map(str, pids)),
                 "--", "sleep", "%.2f" % self.duration],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except OSError:
            self.proc = None

    def result(self):
        """Context switches per second, or None."""
        self.timer.cancel()
        self.timer.join()
        if self.proc is None:
            return None
        try:
            self.proc.wait(timeout=self.duration + 10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None
        try:
            for line in read_file(self.path).splitlines():
                f = line.split(",")
                if len(f) > 2 and f[2].startswith("context-switches"):
                    return float(f[0]) / self.duration
        except (OSError, ValueError):
            pass
        return None


# --------------------------------------------------------------------------
# The test image


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


# --------------------------------------------------------------------------
# Servers: start, wait until they answer, stop by PID


class Running:
    def __init__(self, server, pid, popen, uri, tree):
        self.server, self.pid, self.popen = server, pid, popen
        self.uri, self.tree = uri, tree
        self.log, self.log_offset = None, 0
        self.threads = None


def start_server(srv, img, workdir, logdir):
    sock = os.path.join(workdir, srv.name + ".sock")
    if os.path.exists(sock):
        os.unlink(sock)
    logpath = os.path.join(logdir, srv.name + ".log")
    logf = open(logpath, "a")
    log_offset = logf.tell()
    uri = "nbd+unix:///%s?socket=%s" % (srv.export, sock)
    popen, pid, tree = None, None, False
    if srv.kind == "nbdkit":
        cmd = ["nbdkit", "-f", "--exit-with-parent", "-U", sock] + srv.args
    elif srv.kind == "qemu":
        # -t: keep serving after the first client; -e: parallel clients.
        cmd = ["qemu-nbd", "-f", "raw", "--cache=none", "-t", "-e", "16",
               "-k", sock] + srv.args + [img]
    elif srv.kind == "nbd-server":
        conf = os.path.join(workdir, "nbd-server.conf")
        pidfile = os.path.join(workdir, "nbd-server.pid")
        with open(conf, "w") as f:
            f.write("[generic]\nunixsock = %s\nallowlist = false\n"
                    "[%s]\nexportname = %s\n" % (sock, srv.export, img))
        if os.path.exists(pidfile):
            os.unlink(pidfile)
        cmd = ["nbd-server", "-C", conf, "-p", pidfile]
        tree = True     # one child process per connection
    elif srv.kind == "native":
        # Foreground; SIGTERM is its orderly stop (it answers what is in
        # flight, prints the engine's stats on stderr and exits 0).
        # --exit-with-parent: the SIGTERM also comes if this script dies.
        cmd = [PDIO_CLI, "serve", "--socket", sock, "--exit-with-parent"] \
            + srv.args + [img]
    else:
        raise ValueError(srv.kind)
    logf.write("# %s\n" % " ".join(cmd))
    logf.flush()
    popen = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
    logf.close()
    if srv.kind == "nbd-server":
        # It daemonizes: the PID that serves is in the pid file.
        popen.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                pid = int(read_file(pidfile).strip())
                break
            except (OSError, ValueError):
                time.sleep(0.05)
        if pid is None:
            die("nbd-server wrote no pid file (see %s)" % logdir)
        popen = None
    else:
        pid = popen.pid
    r = Running(srv, pid, popen, uri, tree)
    r.log, r.log_offset = logpath, log_offset
    deadline = time.monotonic() + 30
    while True:
        if not pid_alive(pid):
            stop_server(r)
            die("%s exited while starting (see %s/%s.log)"
                % (srv.name, logdir, srv.name))
        if subprocess.run(["nbdinfo", "--size", uri], capture_output=True,
                          timeout=10).returncode == 0:
            try:
                r.threads = len(os.listdir("/proc/%d/task" % pid))
            except OSError:
                pass
            if srv.kind == "native" and descendants(pid):
                # An older pdio whose serve runs nbdkit as a child: the row
                # would measure the wrong front end under the native name.
                stop_server(r)
                die("%s: %s serve started a child process (nbdkit?), not "
                    "pdio's own server; point --pdio/PDIO_CLI at a build "
                    "with the native server" % (srv.name, PDIO_CLI))
            return r
        if time.monotonic() > deadline:
            stop_server(r)
            die("%s does not answer on %s" % (srv.name, sock))
        time.sleep(0.1)


def stop_server(r, timeout=20):
    """SIGTERM by PID, then wait until it and its children are gone."""
    pids = [r.pid] + descendants(r.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if r.popen is not None:
                try:
                    r.popen.wait(timeout=0.05)
                except subprocess.TimeoutExpired:
                    pass
            if not any(pid_alive(p) for p in pids):
                return
            time.sleep(0.05)
        log("warning: %s (pid %d) ignored %s" % (r.server.name, r.pid,
                                                   signal.Signals(sig).name))
    if any(pid_alive(p) for p in pids):
        die("%s (pid %d) will not exit" % (r.server.name, r.pid))


# The native server's sessions: its engine counts what it did and prints
# the counts when it exits ("pdio serve: stats: reads=... bounced_bytes=N
# ..." on stderr), so one server process must serve either only aligned
# jobs or only misaligned ones for "bytes bounced for aligned requests = 0"
# to be checkable.  ALIGN_CHECK is the alignment the split assumes (the
# preferred block size pdio advertises on a 4K-sector or 4K-dio file
# system); the check re-judges each session against the block size the
# server printed.
ALIGN_CHECK = 4096


def sessions_of(srv, sel):
    """The job lists one server process serves, in order: all of sel for
    every server but the native one, whose aligned and misaligned jobs get
    a server (and an eviction) each."""
    if not sel:
        return []
    if srv.kind != "native":
        return [sel]
    al = [j for j in sel if j.aligned(ALIGN_CHECK)]
    mis = [j for j in sel if not j.aligned(ALIGN_CHECK)]
    return [x for x in (al, mis) if x]


def native_session(r):
    """What pdio serve printed during one session: the block sizes it
    advertised, the engine's stats at exit, its exit status."""
    info = {"pid": r.pid, "threads": r.threads,
            "exit_status": r.popen.returncode if r.popen else None,
            "block_sizes": None, "stats": None}
    try:
        with open(r.log) as f:
            f.seek(r.log_offset)
            text = f.read()
    except OSError:
        return info
    m = re.search(r"block sizes (\d+)/(\d+)/(\d+)", text)
    if m:
        info["block_sizes"] = [int(x) for x in m.groups()]
    stats = [ln for ln in text.splitlines() if re.search(r"\bstats: ", ln)
             and "connection" not in ln]
    if stats:
        kv = re.findall(r"(\w+)=(\d+)", stats[-1].split("stats: ", 1)[1])
        info["stats"] = {k: int(v) for k, v in kv}
    return info


def fmt_session(info):
    st = info.get("stats")
    return "exit %s, %s threads, block sizes %s, %s" % (
        info.get("exit_status"), info.get("threads"),
        "/".join(map(str, info["block_sizes"])) if info.get("block_sizes")
        else "?",
        ("engine stats: bounced_bytes=%d direct=%d bounced=%d rmw_blocks=%d"
         % (st.get("bounced_bytes", -1), st.get("direct", -1),
            st.get("bounced", -1), st.get("rmw_blocks", -1))) if st
        else "no engine stats printed")


# --------------------------------------------------------------------------
# Watching the server during a job


class Monitor(threading.Thread):
    """Samples the server's CPU time (ticks) and RSS every `interval`."""

    def __init__(self, pid, tree, interval=0.05):
        super().__init__(daemon=True)
        self.pid, self.tree, self.interval = pid, tree, interval
        self.samples = []           # (monotonic, cpu ticks)
        self.rss_peak_kib = 0
        self.stop_ev = threading.Event()

    def sample(self):
        t = time.monotonic()
        cpu = proc_cpu_ticks(self.pid)
        if cpu is None:
            return
        rss = proc_status_kib(self.pid, "VmHWM")
        if self.tree:
            total = proc_status_kib(self.pid, "VmRSS")
            for c in descendants(self.pid):
                ct = proc_cpu_ticks(c, with_children=True)
                if ct is not None:
                    cpu += ct
                total += proc_status_kib(c, "VmRSS")
            rss = max(rss, total)
        self.samples.append((t, cpu))
        self.rss_peak_kib = max(self.rss_peak_kib, rss)

    def run(self):
        while not self.stop_ev.is_set():
            self.sample()
            self.stop_ev.wait(self.interval)

    def stop(self):
        self.stop_ev.set()
        self.join()
        self.sample()

    def cpu_at(self, t):
        s = self.samples
        if not s:
            return None
        if t <= s[0][0]:
            return s[0][1]
        for (t0, c0), (t1, c1) in zip(s, s[1:]):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 \
                    else c1
        return s[-1][1]

    def cpu_seconds(self, t0, t1):
        a, b = self.cpu_at(t0), self.cpu_at(t1)
        if a is None or b is None:
            return None
        return (b - a) / CLK_TCK


# --------------------------------------------------------------------------
# fio


def fio_cmd(job, srv, run, img, size, out, uri):
    # fio's region is [offset, offset + size): with offset=512 and the whole
    # image's size, the last block would cross the end, which grows the
    # image under the raw row (and then qemu-nbd refuses an image whose
    # size is not a multiple of 512) and fails with ENOSPC under a server.
    # So the region ends at the last whole block inside the image.
    opt = dict(a[2:].split("=", 1) for a in job.fio if "=" in a)
    off = parse_size(opt.get("offset", "0"))
    bs = parse_size(opt.get("bs", "4k"))
    region = (size - off) // bs * bs
    cmd = ["fio", "--name=" + job.name, "--output-format=json",
           "--output=" + out, "--time_based",
           "--runtime=%g" % run.runtime, "--ramp_time=%g" % run.ramp,
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


def run_job(job, srv, running, run, img, size, fiodir):
    out = os.path.join(fiodir, "%s.%s.json" % (srv.name, job.name))
    cmd = fio_cmd(job, srv, run, img, size, out,
                  running.uri if running else None)
    load = loadavg()
    steal0 = cpu_jiffies()
    mon = cs = None
    if running is not None:
        mon = Monitor(running.pid, running.tree)
        mon.sample()
        mon.start()
        if run.perf and run.runtime >= 2:
            # nbdkit's and qemu's threads exist once fio has connected;
            # nbd-server's per-connection processes are its children.
            pid = running.pid
            cs = CsCounter(lambda: [pid] + descendants(pid),
                           run.ramp + 0.5, run.runtime - 1,
                           out + ".perf")
    t0 = time.monotonic()
    with open(out + ".log", "w") as lf:
        lf.write("# %s\n" % " ".join(cmd))
        lf.flush()
        try:
            rc = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT,
                                timeout=run.runtime + run.ramp + 120
                                ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    t1 = time.monotonic()
    if mon:
        mon.stop()
    cs_rate = cs.result() if cs else None
    steal1 = cpu_jiffies()
    row = {"server": srv.name, "job": job.name, "metric": job.metric,
           "loadavg": load, "fio_rc": rc,
           "steal_pct": 100.0 * (steal1[0] - steal0[0]) /
           max(1, steal1[1] - steal0[1])}
    try:
        row.update(parse_fio(out))
    except (OSError, ValueError, KeyError, IndexError) as e:
        row.update({"fio_error": "unparsable: %s" % e, "ios": 0})
    row["value"] = row.get(job.metric)
    if rc != 0 and not row.get("fio_error"):
        row["fio_error"] = "fio exit %s" % rc
    # Server CPU over fio's measured window: the last `runtime` seconds
    # before fio exited (the ramp and the connection set-up are excluded).
    row["cpu_s"] = row["cpu_us_per_io"] = row["rss_peak_kib"] = None
    if mon:
        win = run.runtime
        cpu = mon.cpu_seconds(max(t0, t1 - win), t1)
        row["cpu_s"] = cpu
        if cpu is not None and row.get("ios"):
            row["cpu_us_per_io"] = cpu * 1e6 / row["ios"]
        row["rss_peak_kib"] = mon.rss_peak_kib
        row["rss_kib"] = proc_status_kib(running.pid, "VmRSS")
    row["cs_per_io"] = None
    if cs_rate is not None and row.get("iops"):
        row["cs_per_io"] = cs_rate / row["iops"]
    row["cache_pages"], row["cache_bytes"] = fincore(img)
    return row


# --------------------------------------------------------------------------
# Metadata


def file_sha256(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


def metadata(img, size, run):
    cpu = ""
    for line in read_file("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    memtotal = 0
    for line in read_file("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            memtotal = int(line.split()[1])
    osname = ""
    try:
        for line in read_file("/etc/os-release").splitlines():
            if line.startswith("PRETTY_NAME="):
                osname = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    git = lambda *a: run_out(["git", "-C", TOP] + list(a))  # noqa
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
        "plugin": PLUGIN,
        "plugin_sha256": file_sha256(PLUGIN)[:16]
        if os.path.exists(PLUGIN) else None,
        "plugin_mtime": mtime(PLUGIN),
        "plugin_tree": build_tree(PLUGIN),
        "base_plugin": BASE_PLUGIN or None,
        "base_plugin_sha256": file_sha256(BASE_PLUGIN)[:16]
        if BASE_PLUGIN and os.path.exists(BASE_PLUGIN) else None,
        "base_plugin_tree": build_tree(BASE_PLUGIN) if BASE_PLUGIN else None,
        "pdio_cli": PDIO_CLI,
        "pdio_cli_sha256": file_sha256(PDIO_CLI)[:16]
        if os.path.exists(PDIO_CLI) else None,
        "pdio_cli_mtime": mtime(PDIO_CLI),
        "pdio_cli_tree": build_tree(PDIO_CLI),
        "native_threads_default": os.cpu_count(),
        "image": img,
        "image_size": size,
        "image_fs": run_out(["findmnt", "-n", "-o", "FSTYPE", "-T", img])
                    or fs_type(os.path.dirname(img)),
        "image_dev": run_out(["findmnt", "-n", "-o", "SOURCE", "-T", img]),
        "runtime_s": run.runtime,
        "ramp_s": run.ramp,
        "repeat": run.repeat,
        "nbdkit_threads": 16,
    }


# --------------------------------------------------------------------------
# The run


def do_run(args):
    if os.geteuid() != 0:
        die("run as root (page-cache eviction, nbd-server, fincore)")
    for tool in ("fio", "nbdkit", "qemu-nbd", "nbd-server", "nbdinfo",
                 "fincore", "fallocate"):
        if shutil.which(tool) is None:
            die("%s is missing: run scripts/bootstrap deps" % tool)

    size = parse_size(args.size)
    all_servers = servers("IMG", size)
    names = [s.name for s in all_servers]
    want = None
    if args.servers:
        want = []
        for w in args.servers.split(","):
            # "issue11": the rows issue 11's targets need.
            w = SERVER_ALIASES.get(w, w)
            want += ISSUE11_SERVERS if w == "issue11" else [w]
        bad = [w for w in want if w not in names and
               not re.fullmatch(r"pdio-(native-)?t\d+", w)]
        if bad:
            die("unknown server(s) %s; known: %s, pdio-tN, pdio-native-tN, "
                "issue11" % (bad, ", ".join(names)))
    # Check what the chosen rows need before the image is made.  The
    # baseline row runs only when named (it needs --base-plugin).
    chosen = want or [n for n in names if n != "pdio-base"]
    if "pdio-base" in chosen and not (BASE_PLUGIN and
                                      os.path.exists(BASE_PLUGIN)):
        die("the pdio-base row needs --base-plugin PATH (PDIO_BASE_PLUGIN): "
            "another build's pdio.so (%s)" % (BASE_PLUGIN or "unset"))
    if any(w == "pdio" or is_pdio_row(w) for w in chosen) and \
            not os.path.exists(PLUGIN):
        die("%s is missing: run scripts/bootstrap build (or --plugin, "
            "PDIO_PLUGIN)" % PLUGIN)
    if any(is_native_row(w) for w in chosen):
        if not os.access(PDIO_CLI, os.X_OK):
            die("%s is missing: build pdio (or --pdio, PDIO_CLI; or leave "
                "the pdio-native rows out with --servers)" % PDIO_CLI)
        # Before the native server, pdio serve ran nbdkit and had no
        # --threads: say so now rather than after the rows before it ran.
        r = subprocess.run([PDIO_CLI, "serve", "--help"], capture_output=True,
                           text=True)
        if "--threads" not in r.stdout + r.stderr:
            die("%s serve has no --threads: not a build with pdio's own "
                "server (--pdio, PDIO_CLI; or leave the pdio-native rows "
                "out with --servers)" % PDIO_CLI)

    img = ensure_image(args.dir, size)
    all_servers = servers(img, size)
    if want:
        # pdio-tN (any N): pdio with nbdkit --threads=N, for thread sweeps;
        # pdio-native-tN: pdio serve --threads N.
        for w in want:
            m = re.fullmatch(r"pdio-t(\d+)", w)
            if m and w not in names:
                all_servers.append(pdio_threads_server(img, int(m.group(1))))
                names.append(w)
            m = re.fullmatch(r"pdio-native-t(\d+)", w)
            if m and w not in names:
                all_servers.append(native_server(img, int(m.group(1))))
                names.append(w)
        all_servers = [s for s in all_servers if s.name in want]
    jobs = JOBS
    if args.jobs:
        want = args.jobs.split(",")
        bad = [w for w in want if w not in JOB_BY_NAME]
        if bad:
            die("unknown job(s) %s; known: %s"
                % (bad, ", ".join(JOB_BY_NAME)))
        jobs = [j for j in JOBS if j.name in want]

    run_id = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    outdir = os.path.join(RESULTS, run_id)
    os.makedirs(outdir)
    latest = os.path.join(RESULTS, "latest")
    if os.path.islink(latest) or os.path.exists(latest):
        os.unlink(latest)
    os.symlink(run_id, latest)
    workdir = os.path.join(args.dir, "run")
    os.makedirs(workdir, exist_ok=True)
    logdir = os.path.join(outdir, "logs")
    os.makedirs(logdir)

    meta = metadata(img, size, args)
    meta["run_id"] = run_id
    meta["loadavg_start"] = loadavg()
    # Taken now: --publish rewrites docs/performance.md at the end.
    meta["baseline"] = load_baseline(os.path.abspath(args.baseline)
                                     if args.baseline else PERF_MD)
    doc = {"meta": meta, "jobs": {j.name: {"label": j.label,
                                           "metric": j.metric}
                                  for j in JOBS},
           "servers": {s.name: {"label": s.label, "kind": s.kind,
                                "args": s.args} for s in all_servers},
           "results": [], "sessions": []}
    njobs = sum(len([j for j in jobs if s.jobs is None or j.name in s.jobs])
                for s in all_servers)
    log("run %s: %d servers, %d jobs each repeat, %d repeat(s), "
        "%gs + %gs ramp a job: about %d min" %
        (run_id, len(all_servers), njobs, args.repeat, args.runtime,
         args.ramp,
         math.ceil(njobs * args.repeat * (args.runtime + args.ramp + 1.5)
                   / 60)))

    running = None
    interrupted = False
    st = os.stat(img)
    ident = (st.st_dev, st.st_ino, size)

    def same_image():
        # Something on these shared machines has removed /var/tmp/pdio-*
        # directories mid-run: numbers against a deleted image are void.
        # And a job that writes past the end grows it.
        try:
            st = os.stat(img)
        except OSError:
            return False
        return (st.st_dev, st.st_ino, st.st_size) == ident

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        for rep in range(1, args.repeat + 1):
            fiodir = os.path.join(outdir, "fio", "rep%d" % rep)
            os.makedirs(fiodir)
            # Alternate the order so slow drift of the machine's load does
            # not always favour the same servers.
            order = all_servers if rep % 2 else list(reversed(all_servers))
            for srv in order:
                sel = [j for j in jobs if srv.jobs is None or j.name in srv.jobs]
                for session in sessions_of(srv, sel):
                    if not same_image():
                        die("%s was removed, replaced or resized during the "
                            "run" % img)
                    pages = evict(img)
                    running = None
                    if srv.kind != "raw":
                        running = start_server(srv, img, workdir, logdir)
                    log("rep %d/%d  %-13s pid %-7s (image pages cached at "
                        "start: %s)" % (rep, args.repeat, srv.name,
                                        running.pid if running else "-",
                                        pages))
                    for job in session:
                        row = run_job(job, srv, running, args, img, size,
                                      fiodir)
                        if not same_image():
                            die("%s was removed, replaced or resized during "
                                "%s/%s; "
                                "results so far in %s" % (img, srv.name,
                                                          job.name, outdir))
                        row["rep"] = rep
                        row["cache_pages_at_start"] = pages
                        doc["results"].append(row)
                        log("    %-12s %-13s %s" % (srv.name, job.name,
                                                    fmt_row(row)))
                    if running:
                        stop_server(running)
                        if srv.kind == "native":
                            info = native_session(running)
                            info.update({"rep": rep, "server": srv.name,
                                         "jobs": [j.name for j in session]})
                            doc["sessions"].append(info)
                            log("    %-12s session: %s" % (
                                srv.name, fmt_session(info)))
                        running = None
                    save(doc, outdir)
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted; stopping the server and saving what ran")
    finally:
        if running:
            stop_server(running)
        evict(img, allow_drop_caches=False)
        meta["loadavg_end"] = loadavg()
        save(doc, outdir)
    report(doc, outdir)
    print()
    ok = check(doc)
    log("results in %s" % outdir)
    if interrupted:
        return 130
    if args.publish:
        publish([outdir])
    return 0 if ok else 3


def fmt_row(r):
    if r.get("fio_error"):
        return "ERROR %s" % r["fio_error"]
    v = r["value"]
    s = ("%8.0f IOPS" % v) if r["metric"] == "iops" else ("%8.1f MB/s" % v)
    s += "  lat %7.1f/%8.1f us" % (r["lat_mean_us"], r["lat_p99_us"])
    if r.get("cpu_us_per_io") is not None:
        s += "  cpu %6.1f us/io" % r["cpu_us_per_io"]
    if r.get("cs_per_io") is not None:
        s += " %4.2f cs/io" % r["cs_per_io"]
    if r.get("rss_peak_kib"):
        s += "  rss %5.1f MiB" % (r["rss_peak_kib"] / 1024)
    s += "  cached %s pg  steal %.0f%%" % (r["cache_pages"], r["steal_pct"])
    return s


TSV_COLS = ["rep", "server", "job", "metric", "value", "iops", "mbps",
            "lat_mean_us", "lat_p99_us", "ios", "cpu_s", "cpu_us_per_io",
            "cs_per_io", "rss_peak_kib", "cache_pages", "cache_bytes",
            "cache_pages_at_start", "loadavg", "steal_pct", "fio_error"]


def save(doc, outdir):
    with open(os.path.join(outdir, "results.json.tmp"), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    os.replace(os.path.join(outdir, "results.json.tmp"),
               os.path.join(outdir, "results.json"))
    with open(os.path.join(outdir, "results.tsv"), "w") as f:
        f.write("\t".join(TSV_COLS) + "\n")
        for r in doc["results"]:
            vals = []
            for c in TSV_COLS:
                v = r.get(c)
                if isinstance(v, float):
                    v = "%.6g" % v
                vals.append("" if v is None else str(v))
            f.write("\t".join(vals) + "\n")


# --------------------------------------------------------------------------
# Analysis: same-repetition ratios, spread across repetitions


def index(doc):
    """cell[(rep, server, job)] = row, for rows without errors."""
    cell = {}
    for r in doc["results"]:
        if not r.get("fio_error") and r.get("value"):
            cell[(r["rep"], r["server"], r["job"])] = r
    return cell


def reps_of(doc):
    return sorted({r["rep"] for r in doc["results"]})


def series(doc, server, job, fn):
    """fn(cell, rep) per repetition, Nones dropped."""
    cell = index(doc)
    out = []
    for rep in reps_of(doc):
        try:
            v = fn(cell, rep)
        except (KeyError, ZeroDivisionError, TypeError):
            v = None
        if v is not None:
            out.append(v)
    return out


def ratio_fn(server, job, ref, ref_job=None):
    def f(cell, rep):
        return cell[(rep, server, job)]["value"] / \
            cell[(rep, ref, ref_job or job)]["value"]
    return f


def qemu_ratio_fn(server, job):
    def f(cell, rep):
        qs = [cell[(rep, q, job)]["value"] for q in QEMU_ROWS
              if (rep, q, job) in cell]
        if not qs:
            raise KeyError(job)
        return cell[(rep, server, job)]["value"] / max(qs)
    return f


def field_fn(server, job, field):
    def f(cell, rep):
        return cell[(rep, server, job)][field]
    return f


def spread(vals, fmt):
    if not vals:
        return "–"
    m = statistics.median(vals)
    if len(vals) == 1:
        return fmt(m)
    return "%s [%s–%s]" % (fmt(m), fmt(min(vals)), fmt(max(vals)))


def fmt_value(metric):
    if metric == "iops":
        return lambda v: ("%.1fk" % (v / 1000)) if v >= 1000 else "%.0f" % v
    return lambda v: "%.0f" % v


def present(doc):
    """Servers and jobs in table order, as they appear in the results."""
    srv = [s for s in doc["servers"]
           if any(r["server"] == s for r in doc["results"])]
    jobs = [j.name for j in JOBS
            if any(r["job"] == j.name for r in doc["results"])]
    return srv, jobs


def table(doc, title, fn, fmt, note=""):
    srv, jobs = present(doc)
    lines = ["#### " + title, ""]
    if note:
        lines += [note, ""]
    lines.append("| server | " + " | ".join(jobs) + " |")
    lines.append("|---|" + "---|" * len(jobs))
    for s in srv:
        cells = []
        for j in jobs:
            cells.append(spread(series(doc, s, j, fn(s, j)), fmt(j)))
        lines.append("| %s | %s |" % (s, " | ".join(cells)))
    return lines + [""]


def summary_md(doc):
    m = doc["meta"]
    pk = m["packages"]
    reps = reps_of(doc)
    L = []
    L.append("### Run %s (%s)" % (m["run_id"], m["date"]))
    L.append("")
    L.append("- Machine: %s, %s CPUs, %s GiB RAM, %s, kernel %s; "
             "image %s on %s (%s), %d GiB."
             % (m["cpu"], m["ncpu"], m["mem_gib"], m["os"], m["kernel"],
                m["image"], m["image_fs"], m["image_dev"],
                m["image_size"] // 2**30))
    L.append("- Packages: " + ", ".join("%s %s" % (k, v)
                                         for k, v in pk.items() if v) + ".")
    L.append("- pdio %s%s (plugin built %s, sha256 %s); %d repetition(s) "
             "of the matrix, each job %gs "
             "after %gs ramp; load average %.1f at start, %.1f at end "
             "(shared machine: compare same-run ratios only)."
             % (m["pdio_commit"],
                " (src/ or plugin/ modified)" if m["pdio_src_dirty"] else "",
                m.get("plugin_mtime", "?"), m.get("plugin_sha256", "?"),
                len(reps), m["runtime_s"], m["ramp_s"],
                m["loadavg_start"], m.get("loadavg_end", float("nan"))))

    def tree(t):
        if not t:
            return "outside a git tree"
        return "%s %s%s" % (t.get("branch"), t.get("commit"),
                            ", src/ or plugin/ modified" if t.get("src_dirty")
                            else "")
    if any(is_pdio_row(s) for s in doc["servers"]) and m.get("plugin_tree"):
        L.append("- pdio.so: %s (%s)." % (m["plugin"], tree(m["plugin_tree"])))
    if any(is_native_row(s) for s in doc["servers"]):
        L.append("- pdio serve: %s (%s; built %s, sha256 %s); default "
                 "threads = %s (one per CPU)."
                 % (m.get("pdio_cli"), tree(m.get("pdio_cli_tree")),
                    m.get("pdio_cli_mtime"), m.get("pdio_cli_sha256"),
                    m.get("native_threads_default")))
    st = [r["steal_pct"] for r in doc["results"] if "steal_pct" in r]
    if st:
        L.append("- CPU steal time during the jobs (the hypervisor running "
                 "others): median %.0f%%, max %.0f%%."
                 % (statistics.median(st), max(st)))
    L.append("- Cells: median over repetitions [min–max]; ratios are "
             "computed within each repetition, then summarised.")
    L.append("")

    def val_fmt(j):
        return fmt_value(JOB_BY_NAME[j].metric)

    r2 = lambda j: (lambda v: "%.2f" % v)  # noqa
    L += table(doc, "Throughput (IOPS for 4k jobs, MB/s otherwise)",
               lambda s, j: field_fn(s, j, "value"), val_fmt)
    L += table(doc, "Ratio to the raw row (fio io_uring direct=1 on the "
               "image, same repetition)",
               lambda s, j: ratio_fn(s, j, "raw"), r2)
    L += table(doc, "Ratio to pdio (backend=io_uring, same repetition)",
               lambda s, j: ratio_fn(s, j, "pdio"), r2,
               note="pdio-a4k's rows are against pdio's same job.")
    if has_native(doc):
        L += table(doc, "Ratio to the better qemu-nbd cache=none row (same "
                   "repetition)", lambda s, j: qemu_ratio_fn(s, j), r2)
    L += table(doc, "Mean latency, µs",
               lambda s, j: field_fn(s, j, "lat_mean_us"),
               lambda j: (lambda v: "%.0f" % v))
    L += table(doc, "p99 latency, µs (worse of read/write)",
               lambda s, j: field_fn(s, j, "lat_p99_us"),
               lambda j: (lambda v: "%.0f" % v))
    L += table(doc, "Server CPU time per I/O, µs (utime+stime from "
               "/proc/PID/stat over the measured window)",
               lambda s, j: field_fn(s, j, "cpu_us_per_io"),
               lambda j: (lambda v: "%.1f" % v))
    L += table(doc, "Server context switches per I/O (perf stat over the "
               "middle of the window; counts, so less sensitive to steal "
               "than CPU time)",
               lambda s, j: field_fn(s, j, "cs_per_io"),
               lambda j: (lambda v: "%.2f" % v))
    L += table(doc, "Server peak RSS, MiB (VmHWM at the end of the job)",
               lambda s, j: field_fn(s, j, "rss_peak_kib"),
               lambda j: (lambda v: "%.1f" % (v / 1024)))
    L += table(doc, "Image pages in the page cache at the end of the job "
               "(fincore)",
               lambda s, j: field_fn(s, j, "cache_pages"),
               lambda j: (lambda v: "%d" % v))
    errs = [r for r in doc["results"] if r.get("fio_error")]
    if errs:
        L.append("Failed jobs: " + ", ".join(
            "%s/%s rep %d (%s)" % (r["server"], r["job"], r["rep"],
                                   r["fio_error"]) for r in errs))
        L.append("")
    L += ["#### Targets (%s)" % check_title(doc), "", "```"] + \
        check_lines(doc)[0] + \
        ["```", ""]
    return "\n".join(L)


# --------------------------------------------------------------------------
# Targets


# The target lines: "TAG  NAME  VALUE (need ...; per repetition: ...)".
# TAG is PASS (every repetition met it), MISS (none did), MIXD (some did),
# n/a (not measured), TODO (cannot be checked: something is missing, named
# on the line), INFO (stated, not a target).  n/a and TODO count as not met.

# Issue 11's throughput jobs, and the 4k ones its CPU target covers.
TARGET_JOBS = ("rr4k-qd32", "rw4k-qd32", "rr4k-4x8")
CPU_4K_JOBS = ("rr4k-qd1", "rr4k-qd32", "rw4k-qd32", "rr4k-4x8")
QD32_JOBS = ("rr4k-qd32", "rw4k-qd32")
SEQ_JOBS = ("sr1m-qd8", "sw1m-qd8")
# nbdkit front end, "no regression": these ratios of the pdio row against
# the published baseline (the same names as the issue 5 target lines, so
# the baseline parser reads old and new check outputs alike).
REGRESSION = [("pdio / better qemu-nbd cache=none, %s" % j, j, "qemu")
              for j in TARGET_JOBS] + \
             [("pdio / raw, %s" % j, j, "raw") for j in SEQ_JOBS]
# A repetition regresses when its ratio is below this share of the
# published median: the published repetitions of one ratio spread by
# 0.5-1.8x on this shared machine, so a tighter bound would flag noise.
REGRESSION_TOLERANCE = 0.9


class Checker:
    def __init__(self, doc):
        self.doc = doc
        self.cell = index(doc)
        self.reps = reps_of(doc)
        self.lines = []
        self.all_ok = True
        # Counted lines, for the table over several runs (--check A,B):
        # name -> (tag, median or None, per-repetition values, cell text).
        self.records = {}

    def emit(self, tag, name, text, counted=True, cell=None, vals=None):
        if counted and tag not in ("PASS", "INFO"):
            self.all_ok = False
        if counted:
            self.records[name.strip()] = (tag, vals or [],
                                          cell if cell is not None else text)
        self.lines.append("%-4s %-62s %s" % (tag, name, text))

    def verdict(self, name, vals, thr, higher=True, unit="x", counted=True,
                note=""):
        """vals: per-repetition measured values vs threshold thr."""
        if not vals:
            self.emit("n/a", name, "not measured in this run", counted)
            return
        ok = [(v >= thr) if higher else (v <= thr) for v in vals]
        v = statistics.median(vals)
        margin = (v / thr - 1) * 100 if higher else (1 - v / thr) * 100
        tag = "PASS" if all(ok) else ("MISS" if not any(ok) else "MIXD")
        per = " ".join(("%.2f" % x) for x in vals)
        self.emit(tag, name, "%.2f%s (need %s %.2f; margin %+.0f%%; "
                  "per repetition: %s)%s"
                  % (v, unit, ">=" if higher else "<=", thr, margin, per,
                     note), counted,
                  cell="%.2f%s (%s; need %s %.2f)" % (
                      v, unit, ", ".join("%.2f" % x for x in vals),
                      ">=" if higher else "<=", thr),
                  vals=ok)

    def info(self, name, text):
        self.emit("INFO", name, text, counted=False)

    def pdio_ratio(self, j, ref):
        """The pdio row over the better qemu-nbd (ref "qemu") or over raw,
        per repetition: what "no regression" compares."""
        if ref == "qemu":
            return self.per_rep(lambda r: self.val(r, "pdio", j) /
                                self.best_qemu(r, j))
        return self.per_rep(lambda r: self.val(r, "pdio", j) /
                            self.val(r, "raw", j))

    def per_rep(self, fn):
        out = []
        for rep in self.reps:
            try:
                out.append(fn(rep))
            except (KeyError, ZeroDivisionError, TypeError):
                pass
        return out

    def val(self, rep, s, j, f="value"):
        v = self.cell[(rep, s, j)][f]
        if v is None:
            raise TypeError
        return v

    def best_qemu(self, rep, j, f="value", lower=False):
        c = self.cell
        vs = [c[(rep, q, j)][f] for q in QEMU_ROWS
              if (rep, q, j) in c and c[(rep, q, j)][f] is not None]
        if not vs:
            raise KeyError
        return min(vs) if lower else max(vs)

    def has(self, server):
        return any(r["server"] == server for r in self.doc["results"])


def check_issue5(c, counted):
    """Issue 5's targets for the nbdkit front end (pdio.so)."""
    for j in TARGET_JOBS:
        c.verdict("pdio / better qemu-nbd cache=none, %s" % j,
                  c.per_rep(lambda r: c.val(r, "pdio", j) /
                            c.best_qemu(r, j)), 1.2, counted=counted)
    c.verdict("pdio / nbdkit null, rr4k-qd32",
              c.per_rep(lambda r: c.val(r, "pdio", "rr4k-qd32") /
                        c.val(r, "null", "rr4k-qd32")), 0.8, counted=counted)
    for j in SEQ_JOBS:
        c.verdict("pdio / raw, %s" % j,
                  c.per_rep(lambda r: c.val(r, "pdio", j) /
                            c.val(r, "raw", j)), 0.9, counted=counted)
    c.verdict("misaligned / aligned 4k randwrite QD32 on pdio align=4096",
              c.per_rep(lambda r: c.val(r, "pdio-a4k", "rw4k-mis-qd32") /
                        c.val(r, "pdio-a4k", "rw4k-qd32")), 0.5,
              counted=counted)
    check_cached(c, "pdio", is_pdio_row, counted)
    for j in [j.name for j in JOBS]:
        vals = c.per_rep(lambda r: c.val(r, "pdio", j, "cpu_us_per_io") /
                         c.best_qemu(r, j, "cpu_us_per_io", lower=True))
        if vals:
            c.verdict("pdio CPU us/IO / cheaper qemu-nbd's, %s" % j, vals,
                      1.0, higher=False, counted=counted)
    for s in PDIO_ROWS:
        rss = [r["rss_peak_kib"] for r in c.doc["results"]
               if r["server"] == s and r.get("rss_peak_kib")]
        if rss:
            c.info("peak RSS of " + s,
                   "%.1f MiB (max over jobs and repetitions; the engine's "
                   "bound: a 2 MiB bounce arena per worker thread, nbdkit "
                   "runs 16 per connection)" % (max(rss) / 1024))


def check_cached(c, what, pred, counted=True):
    rows = [r for r in c.doc["results"] if pred(r["server"])]
    if not rows:
        c.emit("n/a", "0 image pages cached after every %s job" % what,
               "no %s job in this run" % what, counted)
        return
    cached = [r for r in rows if r.get("cache_pages") != 0]
    c.emit("PASS" if not cached else "MISS",
           "0 image pages cached after every %s job" % what,
           "%d of %d %s jobs left pages cached%s"
           % (len(cached), len(rows), what, "" if not cached else ": " +
              ", ".join("%s/%s rep %d: %s" % (r["server"], r["job"], r["rep"],
                                              r.get("cache_pages"))
                        for r in cached[:6])), counted)


def check_issue11(c):
    N = NATIVE
    # Throughput: >= 1.25x the better qemu-nbd, or >= 0.9x raw where that
    # is the lower bar; per repetition the bar is the lower of the two.
    for j in TARGET_JOBS:
        vals, bars = [], []
        for rep in c.reps:
            try:
                v = c.val(rep, N, j)
            except (KeyError, TypeError):
                continue
            bar = []
            try:
                bar.append((1.25 * c.best_qemu(rep, j), "1.25x qemu"))
            except KeyError:
                pass
            try:
                bar.append((0.9 * c.val(rep, "raw", j), "0.9x raw"))
            except (KeyError, TypeError):
                pass
            if not bar:
                continue
            b = min(bar)
            vals.append(v / b[0])
            bars.append(b[1] + ("" if len(bar) == 2 else " (only one "
                                "measured)"))
        c.verdict("native / its bar (1.25x better qemu-nbd or 0.9x raw), %s"
                  % j, vals, 1.0,
                  note="; bar per repetition: %s" % ", ".join(bars)
                  if bars else "")
        q = c.per_rep(lambda r: c.val(r, N, j) / c.best_qemu(r, j))
        w = c.per_rep(lambda r: c.val(r, N, j) / c.val(r, "raw", j))
        c.info("  native / better qemu-nbd, / raw, %s" % j,
               "%s / %s (per repetition: %s / %s)"
               % ("%.2fx" % statistics.median(q) if q else "-",
                  "%.2fx" % statistics.median(w) if w else "-",
                  " ".join("%.2f" % x for x in q) or "-",
                  " ".join("%.2f" % x for x in w) or "-"))
    # Server CPU per 4k I/O.
    for j in CPU_4K_JOBS:
        c.verdict("native CPU us/IO / cheaper qemu-nbd's, %s" % j,
                  c.per_rep(lambda r: c.val(r, N, j, "cpu_us_per_io") /
                            c.best_qemu(r, j, "cpu_us_per_io", lower=True)),
                  0.7, higher=False)
    # Context switches per I/O at QD32 (perf; a count, not a time).
    for j in QD32_JOBS:
        vals = c.per_rep(lambda r: c.val(r, N, j, "cs_per_io"))
        if not vals and c.has(N):
            c.emit("TODO", "native context switches per I/O, %s" % j,
                   "no count: perf is missing or the run used --no-perf")
            continue
        c.verdict("native context switches per I/O, %s" % j, vals, 0.2,
                  higher=False, unit="")
    vals = c.per_rep(lambda r: c.val(r, N, "rr4k-4x8", "cs_per_io"))
    if vals:
        c.info("native context switches per I/O, rr4k-4x8 (4 x QD8)",
               "%.2f (per repetition: %s)" % (
                   statistics.median(vals), " ".join("%.2f" % x
                                                     for x in vals)))
    # 1M sequential.
    for j in SEQ_JOBS:
        c.verdict("native / raw, %s" % j,
                  c.per_rep(lambda r: c.val(r, N, j) / c.val(r, "raw", j)),
                  0.9)
    check_bounced(c)
    check_cached(c, "native", is_native_row)
    check_cached(c, "nbdkit pdio", is_pdio_row)
    # Peak RSS: stated.
    for s in sorted({r["server"] for r in c.doc["results"]
                     if is_native_row(r["server"]) or
                     is_pdio_row(r["server"])}):
        rss = [r["rss_peak_kib"] for r in c.doc["results"]
               if r["server"] == s and r.get("rss_peak_kib")]
        if rss:
            c.info("peak RSS of " + s,
                   "%.1f MiB (VmHWM; max over jobs and repetitions)"
                   % (max(rss) / 1024))
            c.records["peak RSS of " + s] = ("INFO", [], "%.1f MiB"
                                             % (max(rss) / 1024))
    check_regression(c)
    check_regression_same_run(c)
    # --threads 1 against --threads 2 (not in the targets table: stated).
    for j in NATIVE_SCALING_JOBS:
        vals = c.per_rep(lambda r: c.val(r, "pdio-native-t2", j) /
                         c.val(r, "pdio-native-t1", j))
        if vals:
            c.info("scaling: native --threads 2 / --threads 1, %s" % j,
                   "%.2fx (per repetition: %s)%s" % (
                       statistics.median(vals),
                       " ".join("%.2f" % x for x in vals),
                       " <- the one that can scale: a connection stays "
                       "on one thread" if j == "rr4k-4x8" else ""))
    # The server's orderly stop.
    ses = c.doc.get("sessions", [])
    bad = [s for s in ses if s.get("exit_status") != 0]
    if ses:
        c.emit("INFO" if not bad else "WARN",
               "native server exits 0 on SIGTERM",
               "%d of %d sessions did not%s" % (
                   len(bad), len(ses), "" if not bad else ": " + ", ".join(
                       "%s rep %d: %s" % (s["server"], s["rep"],
                                          s.get("exit_status"))
                       for s in bad[:6])), counted=False)


def check_bounced(c):
    """Bytes bounced for aligned requests = 0, from the engine's stats that
    pdio serve prints at exit, over the sessions that served only jobs
    aligned to the block size it advertised as preferred."""
    name = "0 bytes bounced for aligned requests (engine stats)"
    ses = [s for s in c.doc.get("sessions", []) if is_native_row(s["server"])]
    if not ses:
        if any(is_native_row(r["server"]) for r in c.doc["results"]):
            c.emit("TODO", name, "this run recorded no native server "
                   "sessions (results from before the sessions were kept)")
        else:
            c.emit("n/a", name, "no native server in this run")
        return
    nostats = [s for s in ses if not s.get("stats") or
               "bounced_bytes" not in s["stats"]]
    if nostats:
        c.emit("TODO", name, "%d of %d sessions printed no engine stats: "
               "the check needs pdio serve to print 'stats: ... "
               "bounced_bytes=N ...' (pdio_format_stats) on stderr when it "
               "exits, and its 'block sizes MIN/PREF/MAX' line at start"
               % (len(nostats), len(ses)))
        return
    aligned, mis = [], []
    for s in ses:
        pref = (s.get("block_sizes") or [0, ALIGN_CHECK])[1]
        if all(JOB_BY_NAME[j].aligned(pref) for j in s["jobs"]):
            aligned.append(s)
        else:
            mis.append(s)
    if not aligned:
        c.emit("n/a", name, "no session served only aligned jobs")
    else:
        bounced = [s for s in aligned if s["stats"]["bounced_bytes"]]
        c.emit("PASS" if not bounced else "MISS", name,
               "%d of %d aligned sessions bounced bytes%s (direct chunks: "
               "%d)" % (len(bounced), len(aligned), "" if not bounced else
                        ": " + ", ".join("%s rep %d: %d B" % (
                            s["server"], s["rep"],
                            s["stats"]["bounced_bytes"])
                            for s in bounced[:6]),
                        sum(s["stats"].get("direct", 0) for s in aligned)))
    for s in mis:
        c.info("  bounced in the misaligned session, %s rep %d"
               % (s["server"], s["rep"]),
               "%d B over %s (bounces only where the engine's direct-I/O "
               "alignment is above 512)"
               % (s["stats"]["bounced_bytes"], ",".join(s["jobs"])))


def check_regression_same_run(c):
    """The nbdkit front end against a baseline build's pdio.so run in the
    same repetitions (the pdio-base row): the same host, the same minutes."""
    if not any(r["server"] == "pdio-base" for r in c.doc["results"]):
        return
    c.info("nbdkit front end: same-run baseline",
           "pdio-base is %s; a repetition regresses below %.0f%% of it"
           % (c.doc["meta"].get("base_plugin", "?"),
              REGRESSION_TOLERANCE * 100))
    for j in TARGET_JOBS + SEQ_JOBS:
        c.verdict("no regression (same run): pdio / pdio-base, %s" % j,
                  c.per_rep(lambda r: c.val(r, "pdio", j) /
                            c.val(r, "pdio-base", j)),
                  REGRESSION_TOLERANCE)


def check_regression(c):
    """The nbdkit front end against the published baseline."""
    base = c.doc["meta"].get("baseline")
    src = "given with --baseline" if base and base.get("given") else \
        "recorded when the run started"
    if not base:
        base = load_baseline(PERF_MD)
        src = "read now from %s (the run recorded none)" % \
            os.path.relpath(PERF_MD, TOP)
    if not base or not base.get("ratios"):
        c.emit("TODO", "nbdkit front end: no regression",
               "no published baseline (%s): %s" % (
                   src, (base or {}).get("error", "no ratios found")))
        return
    c.info("nbdkit front end: baseline", "%s runs %s (%s); a repetition "
           "regresses below %.0f%% of the published median"
           % (base.get("source"), ", ".join(base.get("runs", [])) or "?",
              src, REGRESSION_TOLERANCE * 100))
    other = [x for x in base.get("cpus", []) if x != c.doc["meta"].get("cpu")]
    if other:
        c.emit("WARN", "nbdkit front end: baseline from another machine",
               "published on %s, this run on %s: the bar compares machines "
               "as well as builds (bench/syscalls.sh counts do not depend "
               "on the CPU as much)" % (" and ".join(other),
                                        c.doc["meta"].get("cpu")),
               counted=False)
    for name, j, ref in REGRESSION:
        b = base["ratios"].get(name)
        if not b:
            c.emit("n/a", "no regression: " + name,
                   "not in the published baseline")
            continue
        bm = statistics.median(b)
        vals = c.pdio_ratio(j, ref)
        c.verdict("no regression: " + name, vals,
                  REGRESSION_TOLERANCE * bm,
                  note="; published %.2fx [%s]" % (
                      bm, " ".join("%.2f" % x for x in b)))
    # Memory: stated against the published figure (WARN above 1.5x; not a
    # target of its own, but the engine's per-thread pools multiply by
    # nbdkit's 16 threads per connection).
    rss = [r["rss_peak_kib"] / 1024 for r in c.doc["results"]
           if r["server"] == "pdio" and r.get("rss_peak_kib")]
    if rss and base.get("pdio_rss_mib"):
        c.emit("WARN" if max(rss) > 1.5 * base["pdio_rss_mib"] else "INFO",
               "nbdkit front end: peak RSS of pdio against published",
               "%.1f MiB, published %.1f MiB (%.2fx)"
               % (max(rss), base["pdio_rss_mib"],
                  max(rss) / base["pdio_rss_mib"]), counted=False)


RSS_LINE = re.compile(r"^INFO\s+peak RSS of pdio\s+([\d.]+) MiB", re.M)
TARGET_LINE = re.compile(
    r"^(?:PASS|MISS|MIXD|INFO)\s+(?:no regression: )?"
    r"(pdio / (?:better qemu-nbd cache=none|raw), [\w-]+)\s+[\d.]+x .*?"
    r"per repetition: ([\d. ]+)\)")


def load_baseline(path):
    """The nbdkit front end's published ratios: the per-repetition values
    of the target lines in the results block of docs/performance.md (or
    of a results.json / run directory), every published run pooled."""
    if path and os.path.isdir(path):
        path = os.path.join(path, "results.json")
    if not path or not os.path.exists(path):
        return {"error": "%s does not exist" % path}
    if path.endswith(".json"):
        with open(path) as f:
            doc = json.load(f)
        c = Checker(doc)
        ratios = {}
        for name, j, ref in REGRESSION:
            v = c.pdio_ratio(j, ref)
            if v:
                ratios[name] = v
        rss = [r["rss_peak_kib"] / 1024 for r in doc["results"]
               if r["server"] == "pdio" and r.get("rss_peak_kib")]
        return {"source": os.path.relpath(path, TOP)
                if path.startswith(TOP) else path,
                "runs": [doc["meta"]["run_id"]], "ratios": ratios,
                "pdio_rss_mib": max(rss) if rss else None,
                "cpus": [doc["meta"].get("cpu")]}
    text = read_file(path)
    if BEGIN in text and END in text:
        text = text[text.index(BEGIN):text.index(END)]
    ratios, runs, rss, cpus = {}, [], [], []
    for part in re.split(r"^### Run ", text, flags=re.M)[1:]:
        runs.append(part.split()[0])
        m = re.search(r"^- Machine: (.*?), \d+ CPUs", part, re.M)
        if m and m[1] not in cpus:
            cpus.append(m[1])
        seen = {}       # a run's first line of each name (issue 11's check
        for line in part.splitlines():  # repeats issue 5's as reference)
            m = TARGET_LINE.match(line.strip())
            if m and m[1] not in seen:
                seen[m[1]] = [float(x) for x in m[2].split()]
        for k, v in seen.items():
            ratios.setdefault(k, []).extend(v)
        m = RSS_LINE.search(part)
        if m:
            rss.append(float(m[1]))
    return {"source": os.path.relpath(path, TOP) if path.startswith(TOP)
            else path, "runs": runs, "ratios": ratios,
            "pdio_rss_mib": max(rss) if rss else None, "cpus": cpus}


def has_native(doc):
    return any(is_native_row(r["server"]) for r in doc["results"])


def check_lines(doc):
    c = Checker(doc)
    if has_native(doc):
        check_issue11(c)
        c.lines.append("---- issue 5's targets for the nbdkit front end, "
                       "for reference (not counted) ----")
        check_issue5(c, counted=False)
    else:
        check_issue5(c, counted=True)
    return c.lines, c.all_ok


def check_title(doc):
    return "issue 11" if has_native(doc) else "issue 5"


def check(doc):
    lines, ok = check_lines(doc)
    print("Targets (%s), run %s:" % (check_title(doc), doc["meta"]["run_id"]))
    for line in lines:
        print("  " + line)
    return ok


def targets_table(docs):
    """The counted targets of several runs side by side, in markdown: one
    column per run (median, per-repetition values, the bar), and how many
    repetitions met each (for docs/performance.md's targets section)."""
    recs = []
    for doc in docs:
        c = Checker(doc)
        if has_native(doc):
            check_issue11(c)
        else:
            check_issue5(c, counted=True)
        recs.append(c.records)
    names = []
    for r in recs:
        names += [n for n in r if n not in names]
    L = ["| target | " + " | ".join("run %s" % d["meta"]["run_id"]
                                    for d in docs) + " | status |",
         "|---|" + "---|" * len(docs) + "---|"]
    for n in names:
        cells, met, total, other, info = [], 0, 0, [], 0
        for r in recs:
            if n not in r:
                cells.append("–")
                other.append("n/a")
                continue
            tag, oks, cell = r[n]
            cells.append(cell.replace("|", "/"))
            if oks:
                met += sum(1 for x in oks if x)
                total += len(oks)
            elif tag == "INFO":
                info += 1
            elif tag != "PASS":
                other.append(tag)
        if total:
            status = "met in all %d repetitions" % total if met == total \
                else ("**missed** in all %d repetitions" % total if not met
                      else "met in %d of %d repetitions" % (met, total))
        elif info and not [t for t in other if t != "n/a"]:
            status = "stated"
        else:
            status = "met in all runs" if not other else \
                "**%s**" % "/".join(sorted(set(other)))
        L.append("| %s | %s | %s |" % (n, " | ".join(cells), status))
    return "\n".join(L)


# --------------------------------------------------------------------------
# Chart


COLOURS = {
    "raw": "#555555", "null": "#bbbbbb",
    "pdio": "#08306b", "pdio-psync": "#2171b5", "pdio-t32": "#4292c6",
    "pdio-a4k": "#6baed6", "pdio-base": "#9ecae1",
    "pdio-native": "#7a0177", "pdio-native-t1": "#c51b8a",
    "pdio-native-t2": "#f768a1",
    "qemu-native": "#cb181d", "qemu-uring": "#fd8d3c",
    "file": "#238b45", "file-nocache": "#a1d99b", "nbd-server": "#6a51a3",
}


def chart(doc, outdir):
    if shutil.which("gnuplot") is None:
        log("gnuplot missing (apt-get install gnuplot-nox): no chart")
        return None
    srv, jobs = present(doc)
    panels = [("raw", "ratio to the raw row (fio io_uring direct=1)"),
              ("pdio", "ratio to pdio (backend=io_uring)")]
    datafiles = []
    for ref, _ in panels:
        path = os.path.join(outdir, "ratios-%s.dat" % ref)
        with open(path, "w") as f:
            f.write("# job " + " ".join("%s(med min max)" % s for s in srv)
                    + "\n")
            for j in jobs:
                cols = [j]
                for s in srv:
                    v = series(doc, s, j, ratio_fn(s, j, ref))
                    if v:
                        cols += ["%.4f" % statistics.median(v),
                                 "%.4f" % min(v), "%.4f" % max(v)]
                    else:
                        cols += ["-", "-", "-"]
                f.write(" ".join(cols) + "\n")
        datafiles.append(path)
    png = os.path.join(outdir, "ratios.png")
    gp = os.path.join(outdir, "ratios.gp")
    m = doc["meta"]
    with open(gp, "w") as f:
        f.write("""set terminal pngcairo size 1600,1100 font ',10' noenhanced
set output '%s'
set datafile missing '-'
set style data histogram
set style histogram errorbars gap 2 lw 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set logscale y 2
set yrange [0.0625:32]
set ytics ('1/16' 0.0625, '1/8' 0.125, '1/4' 0.25, '1/2' 0.5, '1' 1, '2' 2, '4' 4, '8' 8, '16' 16, '32' 32)
set grid ytics
set key outside right top vertical
set xtics nomirror
set multiplot layout 2,1 title 'pdio benchmark %s, %s (median over %d repetition(s), bars min-max)'
""" % (png, m["run_id"], m["date"], len(reps_of(doc))))
        for (ref, title), path in zip(panels, datafiles):
            f.write("set title '%s'\n" % title)
            f.write("set arrow 1 from graph 0, first 1 to graph 1, first 1 "
                    "nohead lw 2 dt 2 front\n")
            plots = []
            for i, s in enumerate(srv):
                c = 2 + 3 * i
                plots.append("'%s' using %d:%d:%d%s lc rgb '%s' title '%s'"
                             % (path, c, c + 1, c + 2,
                                ":xtic(1)" if i == 0 else "",
                                COLOURS.get(s, "#000000"), s))
            f.write("plot " + ", \\\n     ".join(plots) + "\n")
        f.write("unset multiplot\n")
    r = subprocess.run(["gnuplot", gp], capture_output=True, text=True)
    if r.returncode != 0:
        log("gnuplot failed: %s" % r.stderr.strip())
        return None
    return png


def report(doc, outdir):
    md = summary_md(doc)
    with open(os.path.join(outdir, "summary.md"), "w") as f:
        f.write(md + "\n")
    png = chart(doc, outdir)
    print(md)
    log("summary: %s/summary.md%s" % (outdir, ", chart: " + png if png
                                      else ""))


BEGIN = "<!-- bench:begin (bench/run.sh --publish rewrites this block) -->"
END = "<!-- bench:end -->"


def publish(outdirs):
    """Rewrites the results block of docs/performance.md with the summary
    of each run in outdirs, in order.  Only a final run (jobs of 10 s or
    more, at least two repetitions) also replaces the chart in docs/ (the
    last final run's); a shorter one is labelled provisional."""
    block = BEGIN + "\n\n"
    chart_png = None
    for outdir in outdirs:
        with open(os.path.join(outdir, "results.json")) as f:
            doc = json.load(f)
        m = doc["meta"]
        final = m["runtime_s"] >= 10 and len(reps_of(doc)) >= 2
        md = read_file(os.path.join(outdir, "summary.md"))
        png = os.path.join(outdir, "ratios.png")
        if not final:
            block += ("**Provisional** (%gs jobs, %d repetition(s), on a "
                      "busy machine): not one of the final runs; the chart "
                      "in docs/ is not updated for it.  Chart of this run: "
                      "bench/results/%s/ratios.png (not committed).\n\n"
                      % (m["runtime_s"], len(reps_of(doc)), m["run_id"]))
        block += md.rstrip() + "\n\n"
        if final and os.path.exists(png):
            chart_png = png
    if chart_png:
        shutil.copyfile(chart_png, PERF_PNG)
        block += "![ratios of the last run above](%s)\n\n" \
            % os.path.basename(PERF_PNG)
    block += END
    text = read_file(PERF_MD) if os.path.exists(PERF_MD) else \
        "# pdio performance\n\n"
    if BEGIN in text and END in text:
        a = text.index(BEGIN)
        b = text.index(END) + len(END)
        text = text[:a] + block + text[b:]
    else:
        text = text.rstrip() + "\n\n## Results\n\n" + block + "\n"
    with open(PERF_MD, "w") as f:
        f.write(text)
    log("published %d run(s) to %s%s" % (
        len(outdirs), PERF_MD,
        " and " + PERF_PNG if chart_png else " (provisional: chart not copied)"))


def load_results(path):
    if path is None:
        path = os.path.join(RESULTS, "latest")
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    if not os.path.exists(path):
        die("no results at %s" % path)
    with open(path) as f:
        return json.load(f), os.path.dirname(os.path.abspath(path))


def main():
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="bench/run.sh",
        description="pdio against its peers with fio's nbd engine; "
                    "see bench/README.")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the whole matrix N times (spread = min/max)")
    p.add_argument("--runtime", type=float,
                   default=float(env("BENCH_RUNTIME", 10)),
                   help="measured seconds per job (BENCH_RUNTIME, 10)")
    p.add_argument("--ramp", type=float, default=None,
                   help="ramp seconds per job (BENCH_RAMP, 2)")
    p.add_argument("--smoke", action="store_true",
                   help="quick sanity run: --runtime 2 --ramp 1")
    p.add_argument("--size", default=env("BENCH_SIZE", "4G"),
                   help="image size (BENCH_SIZE, 4G)")
    p.add_argument("--dir", default=env("BENCH_DIR", "/var/tmp/pdio-bench"),
                   help="where the image lives (BENCH_DIR)")
    p.add_argument("--servers", help="comma list (default: all): " +
                   ", ".join(s.name for s in servers("IMG", 0)) +
                   "; also pdio-tN, pdio-native-tN, and issue11 (= " +
                   ",".join(ISSUE11_SERVERS) + ")")
    p.add_argument("--jobs", help="comma list (default: all): " +
                   ", ".join(JOB_BY_NAME))
    p.add_argument("--pdio", metavar="PATH",
                   help="the pdio CLI whose 'pdio serve' the pdio-native rows "
                        "run (PDIO_CLI; default: this tree's src/cli/pdio)")
    p.add_argument("--plugin", metavar="PATH",
                   help="the nbdkit plugin of the pdio rows (PDIO_PLUGIN; "
                        "default: this tree's plugin/.libs/pdio.so)")
    p.add_argument("--base-plugin", metavar="PATH",
                   help="the pdio.so of a baseline build for the pdio-base "
                        "row (PDIO_BASE_PLUGIN; e.g. the build before a "
                        "change): 'no regression' is then also checked as "
                        "pdio / pdio-base in the same repetition")
    p.add_argument("--baseline", metavar="FILE",
                   help="the nbdkit front end's published ratios for 'no "
                        "regression': a docs/performance.md or a results.json"
                        " / run directory (default: docs/performance.md, "
                        "read when the run starts)")
    p.add_argument("--no-perf", dest="perf", action="store_false",
                   help="do not count server context switches with perf")
    p.add_argument("--publish", action="store_true",
                   help="write the summary into docs/performance.md "
                        "(and the chart into docs/ for final runs: 10 s "
                        "jobs, 2+ repetitions)")
    p.add_argument("--check", nargs="?", const="", metavar="RESULTS",
                   help="evaluate the targets from a results.json or run "
                        "directory (default: the latest run; several, "
                        "comma-separated, also get a markdown table of the "
                        "targets side by side); no benchmark")
    p.add_argument("--report", nargs="?", const="", metavar="RESULTS",
                   help="re-render summary.md and the chart from results "
                        "(several runs, comma-separated: with --publish, "
                        "all of them go into docs/performance.md)")
    args = p.parse_args()
    global PDIO_CLI, PLUGIN, BASE_PLUGIN
    if args.base_plugin:
        BASE_PLUGIN = os.path.abspath(args.base_plugin)
    if args.pdio:
        PDIO_CLI = os.path.abspath(args.pdio)
    if args.plugin:
        PLUGIN = os.path.abspath(args.plugin)

    if args.check is not None:
        # Several runs (comma-separated): each one's check, then the
        # targets of all of them side by side; exit 3 unless all pass.
        docs, ok = [], True
        for one in args.check.split(",") if args.check else [None]:
            doc, _ = load_results(one)
            if args.baseline:
                doc["meta"]["baseline"] = load_baseline(os.path.abspath(
                    args.baseline))
                doc["meta"]["baseline"]["given"] = True
            ok = check(doc) and ok
            docs.append(doc)
            print()
        if len(docs) > 1:
            print("Targets of the %d runs (markdown):\n" % len(docs))
            print(targets_table(docs))
        return 0 if ok else 3
    if args.report is not None:
        # RESULTS may name several runs (comma-separated): --publish puts
        # all of them in docs/performance.md, in that order.
        outdirs = []
        for one in (args.report or "").split(",") if args.report else [None]:
            doc, outdir = load_results(one)
            report(doc, outdir)
            outdirs.append(outdir)
        if args.publish:
            publish(outdirs)
        return 0
    if args.smoke:
        args.runtime, args.ramp = 2, 1
    if args.ramp is None:
        args.ramp = float(env("BENCH_RAMP", 2))
    if args.repeat < 1:
        die("--repeat must be at least 1")
    return do_run(args)


if __name__ == "__main__":
    sys.exit(main())
