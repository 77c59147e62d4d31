# SPDX-License-Identifier: BSD-3-Clause
"""A run's summary.md (the tables and the target check) and its ratio
chart: medians over repetitions with [min–max], ratios computed within
each repetition."""

import os
import shutil
import statistics
import subprocess

from .checks import check_lines, check_title
from .fio import JOB_BY_NAME, JOBS
from .results import has_memory, has_native, index, memory_of, reps_of
from .servers import QEMU_ROWS, is_native_row, is_nbdkit_row
from .util import log


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


def fixed(spec, scale=None):
    """A cell format that does not depend on the job."""
    return lambda j: (lambda v: spec % (v / scale if scale else v))


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


def field_table(doc, title, field, fmt):
    return table(doc, title, lambda s, j: field_fn(s, j, field), fmt)


def memory_table(doc):
    """One row per server: its memory idle before any job, idle again
    after its jobs and --idle seconds, and at its peak, in MiB (median
    over repetitions [min–max])."""
    L = ["#### Memory, MiB (server and its child processes)", ""]
    srv = [s for s in present(doc)[0] if doc["servers"][s]["kind"] != "raw"]
    if not has_memory(doc):
        return L + ["Not recorded: results from before the memory columns "
                    "(the per-job peak RSS table above has VmHWM since the "
                    "server started).", ""]
    reps = reps_of(doc)
    per = {s: [memory_of(doc, s, rep) for rep in reps] for s in srv}
    idle = sorted({m["idle_s"] for v in per.values() for m in v
                   if m["idle_s"] is not None})
    idle_txt = "/".join("%g" % x for x in idle) or "?"
    after = "after load + %s s idle" % idle_txt
    cols = [("idle RSS", "idle_start_rss_kib"),
            ("idle PSS", "idle_start_pss_kib"),
            ("RSS " + after, "idle_after_rss_kib"),
            ("PSS " + after, "idle_after_pss_kib"),
            ("peak RSS (max over jobs)", "peak_rss_kib"),
            ("VmPin idle", "idle_start_pin_kib"),
            ("VmPin " + after, "idle_after_pin_kib"),
            ("VmPin peak", "pin_peak_kib")]
    if any(m[k] for v in per.values() for m in v
           for k in ("lck_idle_kib", "lck_peak_kib")):
        cols += [("VmLck idle", "idle_start_lck_kib"),
                 ("VmLck " + after, "idle_after_lck_kib"),
                 ("VmLck peak", "lck_peak_kib")]
    L += ["Idle: started and answering, before any job; after load: the "
          "same server process after its last job and --idle seconds "
          "without a client (a row served by two processes, like the "
          "native server's aligned and misaligned jobs, shows the larger).  "
          "RSS and VmPin/VmLck from /proc/PID/status, PSS from "
          "/proc/PID/smaps_rollup, summed over the server's processes.  "
          "Peak RSS: VmHWM, reset at each job's start "
          "(/proc/PID/clear_refs), or the largest sampled VmRSS sum if "
          "larger; VmPin and VmLck peak: the largest sampled every 50 ms "
          "during the jobs.", "",
          "| server | " + " | ".join(c[0] for c in cols) + " |",
          "|---|" + "---|" * len(cols)]
    mib = fixed("%.1f", 1024)(None)
    for s in srv:
        L.append("| %s | %s |" % (s, " | ".join(
            spread([m[k] for m in per[s] if m[k] is not None], mib)
            for _, k in cols)))
    return L + [""]


def build_line(t):
    if not t:
        return "outside a git tree"
    return "%s %s%s" % (t.get("branch"), t.get("commit"),
                        ", src/ or plugin/ modified" if t.get("src_dirty")
                        else "")


def header(doc):
    m = doc["meta"]
    pk = m["packages"]
    L = ["### Run %s (%s)" % (m["run_id"], m["date"]), ""]
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
                len(reps_of(doc)), m["runtime_s"], m["ramp_s"],
                m["loadavg_start"], m.get("loadavg_end", float("nan"))))
    if any(is_nbdkit_row(s) for s in doc["servers"]) and m.get("plugin_tree"):
        L.append("- pdio.so: %s (%s)." % (m["plugin"],
                                          build_line(m["plugin_tree"])))
    if any(is_native_row(s) for s in doc["servers"]):
        L.append("- pdio serve: %s (%s; built %s, sha256 %s); default "
                 "threads = %s (one per CPU)."
                 % (m.get("pdio_cli"), build_line(m.get("pdio_cli_tree")),
                    m.get("pdio_cli_mtime"), m.get("pdio_cli_sha256"),
                    m.get("native_threads_default")))
    st = [r["steal_pct"] for r in doc["results"] if "steal_pct" in r]
    if st:
        L.append("- CPU steal time during the jobs (the hypervisor running "
                 "others): median %.0f%%, max %.0f%%."
                 % (statistics.median(st), max(st)))
    L.append("- Cells: median over repetitions [min–max]; ratios are "
             "computed within each repetition, then summarised.")
    return L + [""]


def summary_md(doc, cfg):
    L = header(doc)
    r2 = fixed("%.2f")
    L += table(doc, "Throughput (IOPS for 4k jobs, MB/s otherwise)",
               lambda s, j: field_fn(s, j, "value"),
               lambda j: fmt_value(JOB_BY_NAME[j].metric))
    L += table(doc, "Ratio to the raw row (fio io_uring direct=1 on the "
               "image, same repetition)",
               lambda s, j: ratio_fn(s, j, "raw"), r2)
    L += table(doc, "Ratio to pdio (backend=io_uring, same repetition)",
               lambda s, j: ratio_fn(s, j, "pdio-nbdkit"), r2,
               note="pdio-nbdkit-a4k's rows are against pdio-nbdkit's same job.")
    if has_native(doc):
        L += table(doc, "Ratio to the better qemu-nbd cache=none row (same "
                   "repetition)", qemu_ratio_fn, r2)
    L += field_table(doc, "Mean latency, µs", "lat_mean_us", fixed("%.0f"))
    L += field_table(doc, "p99 latency, µs (worse of read/write)",
                     "lat_p99_us", fixed("%.0f"))
    L += field_table(doc, "Server CPU time per I/O, µs (utime+stime from "
                     "/proc/PID/stat over the measured window)",
                     "cpu_us_per_io", fixed("%.1f"))
    L += field_table(doc, "Server context switches per I/O (perf stat over "
                     "the middle of the window; counts, so less sensitive "
                     "to steal than CPU time)", "cs_per_io", fixed("%.2f"))
    L += field_table(doc, "Server peak RSS, MiB (VmHWM at the end of the "
                     "job, reset at its start%s)" % (
                         "" if any(r.get("hwm_reset") for r in doc["results"])
                         else "; this run: since the server started"),
                     "rss_peak_kib",
                     fixed("%.1f", 1024))
    L += field_table(doc, "Server peak VmPin, MiB (pinned: io_uring's "
                     "registered buffers; the largest sampled every 50 ms "
                     "during the job)", "pin_peak_kib", fixed("%.1f", 1024))
    L += memory_table(doc)
    L += field_table(doc, "Image pages in the page cache at the end of the "
                     "job (fincore)", "cache_pages", fixed("%d"))
    errs = [r for r in doc["results"] if r.get("fio_error")]
    if errs:
        L.append("Failed jobs: " + ", ".join(
            "%s/%s rep %d (%s)" % (r["server"], r["job"], r["rep"],
                                   r["fio_error"]) for r in errs))
        L.append("")
    L += ["#### Targets (%s)" % check_title(doc), "", "```"] + \
        check_lines(doc, cfg)[0] + ["```", ""]
    return "\n".join(L)


COLOURS = {
    "raw": "#555555", "null": "#bbbbbb",
    "pdio-nbdkit": "#08306b", "pdio-nbdkit-psync": "#2171b5", "pdio-nbdkit-t32": "#4292c6",
    "pdio-nbdkit-a4k": "#6baed6", "pdio-nbdkit-base": "#9ecae1",
    "pdio": "#7a0177", "pdio-t1": "#c51b8a",
    "pdio-t2": "#f768a1",
    "qemu-native": "#cb181d", "qemu-uring": "#fd8d3c",
    "file": "#238b45", "file-nocache": "#a1d99b", "nbd-server": "#6a51a3",
}

GNUPLOT_HEAD = """set terminal pngcairo size 1600,1100 font ',10' noenhanced
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
"""


def chart(doc, outdir):
    """ratios.png: every row's ratio to raw and to pdio, per job (gnuplot,
    from the ratios-*.dat and ratios.gp it leaves beside the png)."""
    if shutil.which("gnuplot") is None:
        log("gnuplot missing (apt-get install gnuplot-nox): no chart")
        return None
    srv, jobs = present(doc)
    panels = [("raw", "ratio to the raw row (fio io_uring direct=1)"),
              ("pdio-nbdkit", "ratio to pdio-nbdkit (backend=io_uring)")]
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
        f.write(GNUPLOT_HEAD % (png, m["run_id"], m["date"],
                                len(reps_of(doc))))
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


def report(doc, outdir, cfg):
    """Writes summary.md and the chart into outdir, and prints the summary."""
    md = summary_md(doc, cfg)
    with open(os.path.join(outdir, "summary.md"), "w") as f:
        f.write(md + "\n")
    png = chart(doc, outdir)
    print(md)
    log("summary: %s/summary.md%s" % (outdir, ", chart: " + png if png
                                      else ""))
