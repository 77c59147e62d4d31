"""A run's results: results.json and results.tsv written and read back,
and the rows indexed by repetition, server and job."""

import json
import os

from .servers import is_native_row
from .util import die

TSV_COLS = ["rep", "server", "job", "metric", "value", "iops", "mbps",
            "lat_mean_us", "lat_p99_us", "ios", "cpu_s", "cpu_us_per_io",
            "cs_per_io", "rss_peak_kib", "cache_pages", "cache_bytes",
            "cache_pages_at_start", "loadavg", "steal_pct", "fio_error"]


def save(doc, outdir):
    """Rewritten after every server, so an interrupted run leaves what
    ran; results.json by rename, so a reader never sees half of it."""
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
        return json.load(f), os.path.dirname(os.path.abspath(path))


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


def peak_rss_mib(doc, server):
    """The largest peak RSS of server over jobs and repetitions, or None."""
    rss = [r["rss_peak_kib"] for r in doc["results"]
           if r["server"] == server and r.get("rss_peak_kib")]
    return max(rss) / 1024 if rss else None
