# SPDX-License-Identifier: BSD-3-Clause
"""The server rows: what each one runs, which rows a run takes, and how a
server is started, waited for, and stopped by PID."""

import os
import re
import signal
import socket
import subprocess
import time

from .procfs import descendants, pid_alive, thread_count
from .util import die, log, read_file


class Server:
    """kind: raw (fio on the image), nbdkit, qemu, nbd-server, native."""

    def __init__(self, name, label, kind, args=(), jobs=None, export="",
                 tls=False):
        self.name, self.label, self.kind = name, label, kind
        self.args = list(args)
        self.jobs = jobs              # None: every job
        self.export = export
        self.tls = tls                # x509 over loopback TCP (tls_setup)


def pdio_threads_server(cfg, img, threads):
    return Server("pdio-nbdkit-t%d" % threads,
                  "pdio backend=io_uring, nbdkit --threads=%d" % threads,
                  "nbdkit", ["--threads=%d" % threads, cfg.plugin,
                             "file=" + img, "backend=io_uring"])


# The native -tN rows compare --threads 1 with --threads 2, so they run
# only the jobs that say something about scaling: connections are spread
# over the threads, a single connection stays on one thread, and rr4k-4x8
# is the one that can scale.
NATIVE_SCALING_JOBS = ["rr4k-qd32", "rw4k-qd32", "rr4k-4x8"]


def native_server(img, threads=None):
    if threads is None:
        return Server("pdio",
                      "pdio serve (own NBD server), io_uring, threads = one "
                      "per CPU (%d)" % (os.cpu_count() or 1), "native",
                      ["--backend", "io_uring"])
    return Server("pdio-t%d" % threads,
                  "pdio serve (own NBD server), io_uring, --threads %d"
                  % threads, "native",
                  ["--backend", "io_uring", "--threads", str(threads)],
                  jobs=NATIVE_SCALING_JOBS)


# What the device's counters (pdio serve --stats) cost: the same server
# counting into a file on tmpfs, as an attached one does, against the
# pdio row, which counts nothing.
STATS_JOBS = ["rr4k-qd32"]
STATS_FILE = "/dev/shm/pdio-bench.stats"


def native_stats_server():
    return Server("pdio-stats", "pdio serve --stats (the device's counters "
                  "kept), io_uring, threads = one per CPU", "native",
                  ["--backend", "io_uring", "--stats", STATS_FILE],
                  jobs=STATS_JOBS)


# The TLS rows: what TLS costs each server that has it, on the jobs of
# the issue that asked for them (a 4k and a 1M one).
TLS_JOBS = ["rr4k-qd32", "sr1m-qd8"]


def rows(cfg, img, size):
    return [
        Server("raw", "fio io_uring direct=1 on the image (no NBD)", "raw"),
        Server("null", "nbdkit null (no I/O)", "nbdkit",
               ["null", "size=%d" % size]),
        Server("pdio-nbdkit", "pdio backend=io_uring", "nbdkit",
               [cfg.plugin, "file=" + img, "backend=io_uring"]),
        Server("pdio-nbdkit-psync", "pdio backend=psync", "nbdkit",
               [cfg.plugin, "file=" + img, "backend=psync"]),
        Server("pdio-nbdkit-base", "pdio backend=io_uring, baseline build "
               "(--base-plugin %s)" % (cfg.base_plugin or "unset"), "nbdkit",
               [cfg.base_plugin, "file=" + img, "backend=io_uring"]),
        # nbdkit's callbacks are synchronous: each read in flight holds a
        # worker thread, 16 per connection by default, so a single
        # connection at QD32 keeps only 16 at the disk.  This row shows
        # what twice the threads buys.
        pdio_threads_server(cfg, img, 32),
        # pdio advertises minimum=align, and libnbd (fio's nbd engine)
        # refuses requests below the advertised minimum, so the
        # blocksize-policy filter advertises 512 instead: the misaligned
        # writes reach pdio, which does the read-modify-write.  Both jobs on
        # this server go through the filter.
        Server("pdio-nbdkit-a4k", "pdio io_uring align=4096 (+blocksize-policy min=512)",
               "nbdkit",
               ["--filter=blocksize-policy", cfg.plugin, "file=" + img,
                "backend=io_uring", "align=4096", "blocksize-minimum=512",
                "blocksize-preferred=4096"],
               jobs=["rw4k-qd32", "rw4k-mis-qd32"]),
        native_server(img),
        native_server(img, 1),
        native_server(img, 2),
        native_stats_server(),
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
        # TLS (x509, TLS 1.3) over loopback TCP; pdio-tcp is the
        # same server in plain text over the same transport, the ratio's
        # other half.
        Server("pdio-tcp", "pdio serve over loopback TCP, no TLS",
               "native", ["--backend", "io_uring"], jobs=TLS_JOBS,
               tls=None),
        Server("pdio-tls", "pdio serve, TLS x509 (--tls-certificates)",
               "native", ["--backend", "io_uring"], jobs=TLS_JOBS, tls=True),
        Server("nbdkit-file-tls", "nbdkit file cache=none --tls=require (x509)",
               "nbdkit", ["file", "file=" + img, "cache=none"],
               jobs=TLS_JOBS, tls=True),
        Server("qemu-uring-tls", "qemu-nbd cache=none aio=io_uring, "
               "tls-creds-x509", "qemu", ["--aio=io_uring"], jobs=TLS_JOBS,
               tls=True),
    ]


# Other names --servers takes for a row.
SERVER_ALIASES = {"qemu-nbd-native": "qemu-native",
                  "qemu-nbd-uring": "qemu-uring", "native": "pdio"}

# Names --servers takes for a set of rows.  native-targets: the rows the
# native server's targets compare, for a run shorter than the matrix.
SERVER_SETS = {
    "native-targets": ["raw", "null", "pdio", "pdio-t1",
                       "pdio-t2", "pdio-nbdkit", "qemu-native", "qemu-uring"],
    "stats": ["pdio", "pdio-stats"],
    "tls": ["pdio-tcp", "pdio-tls", "nbdkit-file-tls",
            "qemu-uring-tls"],
}

QEMU_ROWS = ("qemu-native", "qemu-uring")
NBDKIT_ROWS = ("pdio-nbdkit", "pdio-nbdkit-psync", "pdio-nbdkit-t32", "pdio-nbdkit-a4k")
NATIVE = "pdio"
SWEPT_ROW = re.compile(r"pdio-(native-)?t(\d+)")


def is_nbdkit_row(name):
    """The nbdkit + pdio.so rows."""
    return name in NBDKIT_ROWS or re.fullmatch(r"pdio-nbdkit-t\d+", name) is not None


def is_native_row(name):
    return name == NATIVE or re.fullmatch(r"pdio-t\d+", name) \
        is not None


def wanted(spec, names):
    """The row names --servers asks for (None: all but pdio-nbdkit-base), aliases
    and sets expanded; dies on a name it does not know."""
    if not spec:
        return None
    want = []
    for w in spec.split(","):
        w = SERVER_ALIASES.get(w, w)
        want += SERVER_SETS.get(w, [w])
    bad = [w for w in want if w not in names and not SWEPT_ROW.fullmatch(w)]
    if bad:
        die("unknown server(s) %s; known: %s, pdio-nbdkit-tN, pdio-tN, %s"
            % (bad, ", ".join(names), ", ".join(SERVER_SETS)))
    return want


def selected_rows(cfg, img, size, want):
    """The rows to run, in matrix order: all of them, or those in want,
    which may add thread sweeps: pdio-nbdkit-tN (nbdkit --threads=N, any N) and
    pdio-tN (pdio serve --threads N)."""
    all_rows = rows(cfg, img, size)
    if not want:
        return all_rows
    names = [s.name for s in all_rows]
    for w in want:
        m = SWEPT_ROW.fullmatch(w)
        if m and w not in names:
            threads = int(m.group(2))
            all_rows.append(native_server(img, threads) if m.group(1)
                            else pdio_threads_server(cfg, img, threads))
            names.append(w)
    return [s for s in all_rows if s.name in want]


class Running:
    def __init__(self, server, pid, popen, uri, tree):
        self.server, self.pid, self.popen = server, pid, popen
        self.uri, self.tree = uri, tree
        self.log, self.log_offset = None, 0
        self.threads = None


_tls_home = None


def tls_setup(workdir):
    """A CA and a server certificate for localhost (certtool), made once
    in workdir/pki: server/ for the servers, home/.pki/libnbd/ for libnbd
    (fio's nbd engine takes no file names in its URI, nbdinfo is run the
    same way).  Returns (server dir, HOME for the clients)."""
    pki = os.path.join(workdir, "pki")
    sdir = os.path.join(pki, "server")
    home = os.path.join(pki, "home")
    cdir = os.path.join(home, ".pki", "libnbd")
    global _tls_home
    _tls_home = home
    if os.path.exists(os.path.join(cdir, "ca-cert.pem")):
        return sdir, home
    os.makedirs(sdir, exist_ok=True)
    os.makedirs(cdir, exist_ok=True)

    def certtool(*args):
        subprocess.run(["certtool"] + list(args), check=True,
                       capture_output=True)

    def template(name, text):
        path = os.path.join(pki, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    cakey = os.path.join(pki, "ca-key.pem")
    ca = os.path.join(sdir, "ca-cert.pem")
    key = os.path.join(sdir, "server-key.pem")
    certtool("--generate-privkey", "--outfile", cakey)
    certtool("--generate-self-signed", "--load-privkey", cakey, "--template",
             template("ca.info", "cn = bench CA\nca\ncert_signing_key\n"),
             "--outfile", ca)
    certtool("--generate-privkey", "--outfile", key)
    certtool("--generate-certificate", "--load-ca-certificate", ca,
             "--load-ca-privkey", cakey, "--load-privkey", key, "--template",
             template("server.info", "cn = localhost\ndns_name = localhost\n"
                      "ip_address = 127.0.0.1\ntls_www_server\n"
                      "encryption_key\nsigning_key\n"),
             "--outfile", os.path.join(sdir, "server-cert.pem"))
    with open(ca) as f, open(os.path.join(cdir, "ca-cert.pem"), "w") as g:
        g.write(f.read())
    return sdir, home


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def tcp_args(srv, port, sdir):
    """The command line's transport for a TCP row, TLS or not."""
    p = str(port)
    if srv.kind == "native":
        a = ["--port", p]
        return a + ["--tls-certificates", sdir] if srv.tls else a
    if srv.kind == "nbdkit":
        return ["-p", p, "-i", "127.0.0.1", "--tls=require",
                "--tls-certificates", sdir]
    if srv.kind == "qemu":
        return ["-b", "127.0.0.1", "-p", p, "--object",
                "tls-creds-x509,id=tls0,dir=%s,endpoint=server,"
                "verify-peer=off" % sdir, "--tls-creds", "tls0"]
    raise ValueError(srv.kind)


def client_env(srv):
    """The environment fio and nbdinfo need for srv (once start_server
    has made the certificates): None but for TLS."""
    if not srv.tls:
        return None
    return dict(os.environ, HOME=_tls_home)


def start_server(srv, cfg, img, workdir, logdir):
    sock = os.path.join(workdir, srv.name + ".sock")
    if os.path.exists(sock):
        os.unlink(sock)
    tcp = None
    if srv.tls is not False:
        # None: plain TCP; True: TLS.
        tcp = tcp_args(srv, free_port(), tls_setup(workdir)[0])
    logpath = os.path.join(logdir, srv.name + ".log")
    logf = open(logpath, "a")
    log_offset = logf.tell()
    uri = "nbd+unix:///%s?socket=%s" % (srv.export, sock)
    if tcp is not None:
        port = tcp[tcp.index("-p" if srv.kind != "native" else "--port") + 1]
        uri = "nbd%s://localhost:%s/" % ("s" if srv.tls else "", port)
    popen, pid, tree = None, None, False
    if srv.kind == "nbdkit":
        cmd = ["nbdkit", "-f", "--exit-with-parent"] + \
            (tcp if tcp is not None else ["-U", sock]) + srv.args
    elif srv.kind == "qemu":
        # -t: keep serving after the first client; -e: parallel clients.
        cmd = ["qemu-nbd", "-f", "raw", "--cache=none", "-t", "-e", "16"] + \
            (tcp if tcp is not None else ["-k", sock]) + srv.args + [img]
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
        # --exit-with-parent: the SIGTERM also comes if the benchmark dies.
        cmd = [cfg.pdio_cli, "serve"] + \
            (tcp if tcp is not None else ["--socket", sock]) + \
            ["--exit-with-parent"] + srv.args + [img]
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
                          timeout=10,
                          env=client_env(srv)).returncode == 0:
            r.threads = thread_count(pid)
            if srv.kind == "native" and descendants(pid):
                # An older pdio whose serve runs nbdkit as a child: the row
                # would measure the wrong front end under the native name.
                stop_server(r)
                die("%s: %s serve started a child process (nbdkit?), not "
                    "pdio's own server; point --pdio/PDIO_CLI at a build "
                    "with the native server" % (srv.name, cfg.pdio_cli))
            return r
        if time.monotonic() > deadline:
            stop_server(r)
            die("%s does not answer on %s" % (srv.name, uri))
        time.sleep(0.1)


def stop_server(r, timeout=20):
    """SIGTERM by PID, then wait until it and its children are gone: pdio
    and qemu-nbd hold OFD locks on the image, so the next server could not
    open it before."""
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


# The native server's engine counts what it did over the whole process and
# prints the counts when it exits ("pdio serve: stats: reads=...
# bounced_bytes=N ..." on stderr), so one server process must serve either
# only aligned jobs or only misaligned ones for "bytes bounced for aligned
# requests = 0" to be checkable.  ALIGN_CHECK is the alignment the split
# assumes (the preferred block size pdio advertises on a 4K-sector or
# 4K-dio file system); the check re-judges each session against the block
# size the server printed.
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
