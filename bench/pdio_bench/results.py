# SPDX-License-Identifier: BSD-3-Clause
"""A run's results: results.json and results.tsv written and read back,
and the rows indexed by repetition, server and job."""

import json
import os
import re

from .servers import is_native_row
from .util import die

# The memory snapshots of a server process (doc["memory"]: one record a
# server process, "session") and the figures each holds, in KiB.
SNAPSHOTS = ("idle_start", "after_jobs", "idle_after")
SNAP_FIELDS = ("rss_kib", "pss_kib", "pin_kib", "lck_kib")

TSV_COLS = ["rep", "server", "job", "metric", "value", "iops", "mbps",
            "lat_mean_us", "lat_p99_us", "ios", "cpu_s", "cpu_us_per_io",
            "cs_per_io", "rss_peak_kib", "rss_peak_sampled_kib", "hwm_reset",
            "pin_peak_kib", "lck_peak_kib", "cache_pages", "cache_bytes",
            "cache_pages_at_start", "loadavg", "steal_pct", "fio_error"]
# Row names before pdio serve was the row called "pdio": runs recorded
# then (no "row_names" in the document) are read with today's names.
ROW_NAMES = 2
LEGACY_ROWS = {"pdio": "pdio-nbdkit", "pdio-psync": "pdio-nbdkit-psync",
               "pdio-base": "pdio-nbdkit-base", "pdio-a4k": "pdio-nbdkit-a4k",
               "pdio-native": "pdio", "pdio-native-tcp": "pdio-tcp",
               "pdio-native-tls": "pdio-tls"}


def legacy_row(name):
    if name in LEGACY_ROWS:
        return LEGACY_ROWS[name]
    m = re.fullmatch(r"pdio-(native-)?t(\d+)", name)
    if m:
        return ("pdio-t%s" if m.group(1) else "pdio-nbdkit-t%s") % m.group(2)
    return name


def current_names(doc):
    """doc with today's row names, whenever it was recorded."""
    if doc.get("row_names") == ROW_NAMES:
        return doc
    doc["servers"] = {legacy_row(k): v for k, v in doc["servers"].items()}
    for key in ("results", "sessions", "memory"):
        for r in doc.get(key, []):
            r["server"] = legacy_row(r["server"])
    doc["row_names"] = ROW_NAMES
    return doc


# Flat: every job row also carries its server process's idle figures.
TSV_SESSION_COLS = ["idle_s"] + ["%s_%s" % (w, f) for w in
                                 ("idle_start", "idle_after")
                                 for f in SNAP_FIELDS]


def memory_session(doc, rep, server, job):
    """The memory record of the server process that served job, or None
    (the raw row; results from before the memory records)."""
    for m in doc.get("memory", []):
        if m["rep"] == rep and m["server"] == server and job in m["jobs"]:
            return m
    return None


def session_cols(m):
    out = {"idle_s": m.get("idle_s")} if m else {}
    for w in ("idle_start", "idle_after"):
        for f in SNAP_FIELDS:
            out["%s_%s" % (w, f)] = (m.get(w) or {}).get(f) if m else None
    return out


def save(doc, outdir):
    """Rewritten after every server, so an interrupted run leaves what
    ran; results.json by rename, so a reader never sees half of it."""
    with open(os.path.join(outdir, "results.json.tmp"), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    os.replace(os.path.join(outdir, "results.json.tmp"),
               os.path.join(outdir, "results.json"))
    with open(os.path.join(outdir, "results.tsv"), "w") as f:
        f.write("\t".join(TSV_COLS + TSV_SESSION_COLS) + "\n")
        for r in doc["results"]:
            r = dict(r, **session_cols(memory_session(doc, r["rep"],
                                                      r["server"], r["job"])))
            vals = []
            for c in TSV_COLS + TSV_SESSION_COLS:
                v = r.get(c)
                if isinstance(v, float):
                    v = "%.6g" % v
                vals.append("" if v is None else str(v))
            f.write("\t".join(vals) + "\n")


def load_results(path, cfg):
    """(doc, run directory) of a results.json or run directory; None: the
    latest run."""
    if path is None:
        path = os.path.join(cfg.results, "latest")
    if os.path.isdir(path):
        path = os.path.join(path, "results.json")
    if not os.path.exists(path):
        die("no results at %s" % path)
    with open(path) as f:
        return (current_names(json.load(f)),
                os.path.dirname(os.path.abspath(path)))


def index(doc):
    """cell[(rep, server, job)] = row, for rows without errors."""
    cell = {}
    for r in doc["results"]:
        if not r.get("fio_error") and r.get("value"):
            cell[(r["rep"], r["server"], r["job"])] = r
    return cell


def reps_of(doc):
    return sorted({r["rep"] for r in doc["results"]})


def has_native(doc):
    return any(is_native_row(r["server"]) for r in doc["results"])


def has_memory(doc):
    """Whether the run recorded the servers' idle memory."""
    return "memory" in doc


def memory_of(doc, server, rep):
    """A row's memory in one repetition, in KiB (None: not recorded):
    idle_start_* and idle_after_* the largest over the row's server
    processes that repetition, pin_idle_kib / lck_idle_kib the largest of
    both idle moments; peak_rss_kib, pin_peak_kib, lck_peak_kib the largest
    over its jobs (peak_job: the job of peak_rss_kib); idle_s the idle
    period; hwm_reset whether every job's VmHWM was reset at its start."""
    out = {}
    ses = [m for m in doc.get("memory", [])
           if m["rep"] == rep and m["server"] == server]
    for w in ("idle_start", "idle_after"):
        for f in SNAP_FIELDS:
            v = [m[w][f] for m in ses if m.get(w)]
            out["%s_%s" % (w, f)] = max(v) if v else None
    for f in ("pin", "lck"):
        v = [out["%s_%s_kib" % (w, f)] for w in ("idle_start", "idle_after")
             if out["%s_%s_kib" % (w, f)] is not None]
        out["%s_idle_kib" % f] = max(v) if v else None
    out["idle_s"] = max((m.get("idle_s", 0) for m in ses), default=None)
    rows = [r for r in doc["results"] if r["rep"] == rep and
            r["server"] == server and r.get("rss_peak_kib") is not None]
    out["peak_rss_kib"] = out["peak_job"] = None
    if rows:
        top = max(rows, key=lambda r: r["rss_peak_kib"])
        out["peak_rss_kib"], out["peak_job"] = top["rss_peak_kib"], top["job"]
    out["hwm_reset"] = bool(rows) and all(r.get("hwm_reset") for r in rows)
    for f in ("pin_peak_kib", "lck_peak_kib"):
        v = [r[f] for r in rows if r.get(f) is not None]
        out[f] = max(v) if v else None
    return out


def peak_rss_mib(doc, server):
    """The largest peak RSS of server over jobs and repetitions, or None."""
    rss = [r["rss_peak_kib"] for r in doc["results"]
           if r["server"] == server and r.get("rss_peak_kib")]
    return max(rss) / 1024 if rss else None
