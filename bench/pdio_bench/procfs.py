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


class Monitor(threading.Thread):
    """Samples the server's CPU time (ticks) and RSS every `interval`, so
    that the CPU time of fio's measured window can be interpolated.  tree:
    the server forks per connection, and its children count too."""

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
