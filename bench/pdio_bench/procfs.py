# SPDX-License-Identifier: BSD-3-Clause
"""What the kernel says about a server: its processes, CPU time and memory
from /proc, the image's page-cache residency, the machine's load and
steal time, and the server's context switches (perf)."""

import os
import subprocess
import threading
import time

from .util import read_file, run_out

CLK_TCK = os.sysconf("SC_CLK_TCK")


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


def thread_count(pid):
    try:
        return len(os.listdir("/proc/%d/task" % pid))
    except OSError:
        return None


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


# The memory figures of /proc/PID/status the sampler and the snapshots
# read: resident, its high-water mark, pinned (io_uring's registered
# buffers, RDMA, ...) and mlock()ed.
MEM_KEYS = ("VmRSS", "VmHWM", "VmPin", "VmLck")


def proc_status(pid, keys=MEM_KEYS):
    """The kB figures of keys in /proc/PID/status in one read; {} once the
    process is gone (a kernel thread has no Vm lines: 0)."""
    try:
        text = read_file("/proc/%d/status" % pid)
    except OSError:
        return {}
    out = dict.fromkeys(keys, 0)
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k in out:
            out[k] = int(v.split()[0])
    return out


def proc_status_kib(pid, key):
    return proc_status(pid, (key,)).get(key, 0)


def proc_pss_kib(pid):
    """Pss of a process (/proc/PID/smaps_rollup), or None.  It walks the
    page tables under the mm's lock: read it while the server is idle,
    not in the sampler."""
    try:
        for line in read_file("/proc/%d/smaps_rollup" % pid).splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def reset_peak_rss(pids):
    """Resets VmHWM to the current VmRSS ("5" into /proc/PID/clear_refs,
    Linux 4.0 and later), so that VmHWM at the end of a job is that job's
    peak.  False if it could not be reset for the first pid."""
    ok = []
    for p in pids:
        try:
            with open("/proc/%d/clear_refs" % p, "w") as f:
                f.write("5")
            ok.append(True)
        except OSError:
            ok.append(False)
    return bool(ok) and ok[0]


def mem_snapshot(pid):
    """The memory of a server and its descendants now, in KiB: VmRSS, Pss,
    VmPin, VmLck summed over the processes (threads share their process's
    figures, so only processes are added up); None if the server is
    gone."""
    snap = {"rss_kib": 0, "pss_kib": 0, "pin_kib": 0, "lck_kib": 0,
            "procs": 0}
    for i, p in enumerate([pid] + descendants(pid)):
        st = proc_status(p)
        pss = proc_pss_kib(p)
        if not st or pss is None:
            if i == 0:
                return None
            continue            # a connection process that just exited
        snap["rss_kib"] += st["VmRSS"]
        snap["pss_kib"] += pss
        snap["pin_kib"] += st["VmPin"]
        snap["lck_kib"] += st["VmLck"]
        snap["procs"] += 1
    return snap


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


class Monitor(threading.Thread):
    """Samples the server's CPU time (ticks) and memory every `interval`,
    so that the CPU time of fio's measured window can be interpolated.
    tree: the server forks per connection, and its children count too.

    rss_peak_kib: the larger of the server's VmHWM (since the start, or
    since reset_peak_rss) and the largest sampled VmRSS sum over its
    processes; rss_sampled_peak_kib: that sampled sum alone; pin_peak_kib,
    lck_peak_kib: the largest sampled VmPin and VmLck sums."""

    def __init__(self, pid, tree, interval=0.05):
        super().__init__(daemon=True)
        self.pid, self.tree, self.interval = pid, tree, interval
        self.samples = []           # (monotonic, cpu ticks)
        self.rss_peak_kib = self.rss_sampled_peak_kib = 0
        self.pin_peak_kib = self.lck_peak_kib = 0
        self.stop_ev = threading.Event()

    def sample(self):
        t = time.monotonic()
        cpu = proc_cpu_ticks(self.pid)
        st = proc_status(self.pid)
        if cpu is None or not st:
            return
        rss, pin, lck = st["VmRSS"], st["VmPin"], st["VmLck"]
        if self.tree:
            for c in descendants(self.pid):
                ct = proc_cpu_ticks(c, with_children=True)
                if ct is not None:
                    cpu += ct
                cs = proc_status(c)
                if cs:
                    rss += cs["VmRSS"]
                    pin += cs["VmPin"]
                    lck += cs["VmLck"]
        self.samples.append((t, cpu))
        self.rss_sampled_peak_kib = max(self.rss_sampled_peak_kib, rss)
        self.rss_peak_kib = max(self.rss_peak_kib, rss, st["VmHWM"])
        self.pin_peak_kib = max(self.pin_peak_kib, pin)
        self.lck_peak_kib = max(self.lck_peak_kib, lck)

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


class CsCounter:
    """Server context switches over the middle of the measured window,
    counted by `perf stat` (optional: no perf, no figure).  pids is a
    function: the server's threads and connection processes exist only
    once fio has connected."""

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
