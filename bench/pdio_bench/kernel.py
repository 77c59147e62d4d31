# SPDX-License-Identifier: BSD-3-Clause
"""bench/kernel.sh's table: the kernel path (loop, pdio attach, qemu-nbd
and nbdkit through nbd-client, and the remote rows over TLS) from the
guest's rows.tsv and fio's JSON,
one or more runs; medians with [min–max] over runs, ratios computed
within each run (report.spread, as summary.md does).

python3 -m pdio_bench.kernel RUN_DIR...
"""

import os
import sys

from .fio import parse_fio
from .report import fmt_value, spread

JOBS = [
    ("rr4k-qd1", "4k randread QD1", "iops"),
    ("rr4k-qd32", "4k randread QD32", "iops"),
    ("rw4k-qd32", "4k randwrite QD32", "iops"),
    ("sr1m-qd8", "1M seqread QD8", "mbps"),
    ("sw1m-qd8", "1M seqwrite QD8", "mbps"),
    ("untar", "untar + sync on ext4", "mbps"),
]
USER_HZ = 100
# The rows the ratios are taken of, and against.
REFS = ["loop", "qemu-nbd"]
# The remote rows (one pdio serve --tls-certificates), against nbd-client's
# own TLS.
REMOTE = ["remote-ktls", "remote-relay"]
REMOTE_REF = "nbd-client-tls"


def load_run(d):
    """{(config, job): {"value", "guest_us", "server_us"}}, and the run's
    notes (host.txt, the guest's guest.txt and configs.tsv)."""
    g = os.path.join(d, "guest")
    cells = {}
    with open(os.path.join(g, "rows.tsv")) as f:
        for line in f:
            w = line.split()
            if len(w) != 11:
                continue
            conf, job = w[0], w[1]
            t_a, busy_a, srv_a, ios_a, t_b, busy_b, srv_b, ios_b = \
                map(int, w[2:10])
            secs = (t_b - t_a) / 100.0
            if job == "untar":
                value = int(w[10]) / secs / 1e6 if secs > 0 else None
                ios = ios_b - ios_a
            else:
                fio = parse_fio(os.path.join(g, "%s-%s.json" % (conf, job)))
                metric = dict((j[0], j[2]) for j in JOBS).get(job, "iops")
                value = fio[metric]
                # fio's mean rate over its window, times the CPU window.
                ios = fio["iops"] * secs
            per_io = lambda ticks: (ticks * 1e6 / USER_HZ / ios) if ios else None
            cells[(conf, job)] = {
                "value": value,
                "guest_us": per_io(busy_b - busy_a),
                "server_us": per_io(srv_b - srv_a) if conf != "loop" else None,
            }
    notes = []
    for name in ("host.txt", os.path.join("guest", "guest.txt"),
                 os.path.join("guest", "configs.tsv")):
        p = os.path.join(d, name)
        if os.path.exists(p):
            with open(p) as f:
                notes += [l.rstrip("\n") for l in f if l.strip()]
    return cells, notes


# A remote row's traffic per request, from the client's veth (net.tsv),
# and for the read jobs the TLS records per request the client sends:
# its bytes beyond the frames' headers (Ethernet 14, IPv4 20, TCP 20 +
# 12 of timestamps) and the 28-byte NBD requests, over a TLS 1.3 AES-GCM
# record's 22 (header 5, inner content type 1, tag 16).  Only there: the
# directions that carry 4 KiB of data come out up to 30 bytes a request
# short of what these sizes add up to, for a reason not found, so no
# record count is claimed for them.
FRAME = 66
RECORD = 22
REQUEST = {"rr4k-qd1": 28, "rr4k-qd32": 28}


def load_net(d):
    """{(config, job): (tx bytes, tx packets, rx bytes, rx packets, requests)}
    over the measured window, tx being the client's sends."""
    cells = {}
    p = os.path.join(d, "guest", "net.tsv")
    if not os.path.exists(p):
        return cells
    with open(p) as f:
        for line in f:
            w = line.split()
            if len(w) != 12:
                continue
            a, b = list(map(int, w[2:7])), list(map(int, w[7:12]))
            cells[(w[0], w[1])] = tuple(y - x for x, y in zip(a, b))
    return cells


def net_lines(dirs, confs, jobs):
    """Per request, each way: bytes and frames; for reads, the TLS
    records the client sends."""
    nets = [load_net(d) for d in dirs]
    lines = []
    for conf in confs:
        for job, _, _ in jobs:
            for d, net in zip(dirs, nets):
                c = net.get((conf, job))
                if not c or c[4] <= 0:
                    continue
                txb, txp, rxb, rxp, n = c
                cells = ["%.0f B, %.2f frames" % (b / n, p / n)
                         for b, p in ((txb, txp), (rxb, rxp))]
                if job in REQUEST:
                    cells[0] += ", %.2f records" % (
                        ((txb - FRAME * txp) / n - REQUEST[job]) / RECORD)
                lines.append("| %s | %s | %s | %s | %s |" %
                             (conf, job, os.path.basename(d.rstrip("/")),
                              cells[0], cells[1]))
    if not lines:
        return []
    return ["", "### On the wire per request (the client's veth; for reads, "
            "the TLS records the client sends, estimated)", "",
            "| row | job | run | client to server | server to client |",
            "|---|---|---|---|---|"] + lines


def configs_of(runs):
    seen = []
    for cells, _ in runs:
        for conf, _job in cells:
            if conf not in seen:
                seen.append(conf)
    # The run order may be reversed: print in a fixed order.
    order = ["loop", "pdio", "pdio-c2", "pdio-c4", "qemu-nbd", "nbdkit-file",
             "remote-ktls", "remote-relay", "nbd-client-tls"]
    return sorted(seen, key=lambda c: (order.index(c) if c in order
                                       else len(order), c))


def column(runs, conf, job, fn):
    out = []
    for cells, _ in runs:
        try:
            v = fn(cells, conf, job)
        except (KeyError, TypeError, ZeroDivisionError):
            v = None
        if v is not None:
            out.append(v)
    return out


def table(runs, confs, jobs, title, fn, fmt):
    lines = ["", "### " + title, "",
             "| row | " + " | ".join(j[0] for j in jobs) + " |",
             "|---|" + "---|" * len(jobs)]
    for conf in confs:
        cols = [spread(column(runs, conf, j[0], fn), fmt(j)) for j in jobs]
        if all(c == "–" for c in cols):
            continue
        lines.append("| %s | %s |" % (conf, " | ".join(cols)))
    return lines


def main(argv):
    dirs = [d for a in argv for d in a.split()]
    if not dirs:
        print("usage: python3 -m pdio_bench.kernel RUN_DIR...", file=sys.stderr)
        return 2
    runs = [load_run(d) for d in dirs]
    confs = configs_of(runs)
    jobs = [j for j in JOBS if any((c, j[0]) in r[0] for r in runs
                                   for c in confs)]
    out = ["## Kernel path: %s" % ", ".join(os.path.basename(d.rstrip("/"))
                                          for d in dirs)]
    for d, (_, notes) in zip(dirs, runs):
        out += ["", "%s:" % os.path.basename(d.rstrip("/"))] + \
            ["    " + n for n in notes]
    out += table(runs, confs, jobs,
                 "IOPS (4k) or MB/s (1M, untar); median [min–max] over runs",
                 lambda c, conf, job: c[(conf, job)]["value"],
                 lambda j: fmt_value(j[2]))
    ratio_rows = []
    for conf in confs:
        if not conf.startswith("pdio"):
            continue
        for ref in REFS:
            ratio_rows.append((conf, ref))
    ratio_rows += [(conf, REMOTE_REF) for conf in REMOTE if conf in confs]
    out += ["", "### Ratios within each run (pdio row / reference row)", "",
            "| row | " + " | ".join(j[0] for j in jobs) + " |",
            "|---|" + "---|" * len(jobs)]
    for conf, ref in ratio_rows:
        cols = [spread(column(runs, conf, j[0],
                              lambda c, cf, job: c[(cf, job)]["value"] /
                              c[(ref, job)]["value"]),
                       lambda v: "%.2f" % v) for j in jobs]
        if all(c == "–" for c in cols):
            continue
        out.append("| %s / %s | %s |" % (conf, ref, " | ".join(cols)))
    out += table(runs, confs, jobs,
                 "Guest CPU per I/O, µs (all of the guest's busy time: fio, "
                 "kernel, server; untar: per block-layer request)",
                 lambda c, conf, job: c[(conf, job)]["guest_us"],
                 lambda j: (lambda v: "%.0f" % v))
    out += table(runs, confs, jobs,
                 "Server CPU per I/O, µs (utime+stime of the server's "
                 "processes, for the remote rows with the client's "
                 "user-space end: pdio's supervisor, nbd-client; loop has "
                 "none)",
                 lambda c, conf, job: c[(conf, job)]["server_us"],
                 lambda j: (lambda v: "%.0f" % v))
    out += net_lines(dirs, confs, jobs)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
