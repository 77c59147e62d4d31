# SPDX-License-Identifier: BSD-3-Clause
"""One benchmark run: every selected server through every selected job,
for each repetition, with the server watched while fio runs."""

import datetime
import math
import os
import shutil
import signal
import subprocess
import time

from .baseline import load_baseline
from .checks import print_check
from .fio import JOB_BY_NAME, JOBS, fio_cmd, parse_fio
from .image import ensure_image, evict
from .metadata import metadata
from .procfs import (CsCounter, Monitor, cpu_jiffies, descendants, fincore,
                     loadavg, mem_snapshot, proc_status_kib, reset_peak_rss)
from .publish import publish
from .report import report
from .results import ROW_NAMES, save
from .servers import (client_env, fmt_session, is_native_row, is_nbdkit_row,
                      native_session, rows, selected_rows, sessions_of,
                      start_server, stop_server, wanted)
from .util import die, log, parse_size


def run_job(job, srv, running, cfg, img, size, fiodir):
    out = os.path.join(fiodir, "%s.%s.json" % (srv.name, job.name))
    cmd = fio_cmd(job, srv, cfg, img, size, out,
                  running.uri if running else None)
    load = loadavg()
    steal0 = cpu_jiffies()
    mon = cs = None
    hwm_reset = False
    if running is not None:
        # VmHWM never goes down by itself: reset it, so that the job's
        # peak is the job's and not the server's since it started.
        hwm_reset = reset_peak_rss([running.pid] + descendants(running.pid))
        mon = Monitor(running.pid, running.tree)
        mon.sample()
        mon.start()
        if cfg.perf and cfg.runtime >= 2:
            # nbdkit's and qemu's threads exist once fio has connected;
            # nbd-server's per-connection processes are its children.
            pid = running.pid
            cs = CsCounter(lambda: [pid] + descendants(pid),
                           cfg.ramp + 0.5, cfg.runtime - 1,
                           out + ".perf")
    t0 = time.monotonic()
    with open(out + ".log", "w") as lf:
        lf.write("# %s\n" % " ".join(cmd))
        lf.flush()
        try:
            rc = subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT,
                                timeout=cfg.runtime + cfg.ramp + 120,
                                env=client_env(srv)
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
        cpu = mon.cpu_seconds(max(t0, t1 - cfg.runtime), t1)
        row["cpu_s"] = cpu
        if cpu is not None and row.get("ios"):
            row["cpu_us_per_io"] = cpu * 1e6 / row["ios"]
        row["rss_peak_kib"] = mon.rss_peak_kib
        row["rss_peak_sampled_kib"] = mon.rss_sampled_peak_kib
        row["hwm_reset"] = hwm_reset
        row["pin_peak_kib"] = mon.pin_peak_kib
        row["lck_peak_kib"] = mon.lck_peak_kib
        row["rss_kib"] = proc_status_kib(running.pid, "VmRSS")
    row["cs_per_io"] = None
    if cs_rate is not None and row.get("iops"):
        row["cs_per_io"] = cs_rate / row["iops"]
    row["cache_pages"], row["cache_bytes"] = fincore(img)
    return row


def fmt_row(r):
    """A job's progress line."""
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
    if r.get("pin_peak_kib"):
        s += " pin %.1f MiB" % (r["pin_peak_kib"] / 1024)
    s += "  cached %s pg  steal %.0f%%" % (r["cache_pages"], r["steal_pct"])
    return s


def require_tools():
    if os.geteuid() != 0:
        die("run as root (page-cache eviction, nbd-server, fincore)")
    for tool in ("fio", "nbdkit", "qemu-nbd", "nbd-server", "nbdinfo",
                 "fincore", "fallocate"):
        if shutil.which(tool) is None:
            die("%s is missing: run scripts/bootstrap deps" % tool)


def require_builds(cfg, chosen):
    """The builds the chosen rows run, checked before the image is made.
    The baseline row runs only when named (it needs --base-plugin)."""
    if "pdio-nbdkit-base" in chosen and not (cfg.base_plugin and
                                      os.path.exists(cfg.base_plugin)):
        die("the pdio-nbdkit-base row needs --base-plugin PATH (PDIO_BASE_PLUGIN): "
            "another build's pdio.so (%s)" % (cfg.base_plugin or "unset"))
    if any(w == "pdio-nbdkit" or is_nbdkit_row(w) for w in chosen) and \
            not os.path.exists(cfg.plugin):
        die("%s is missing: run scripts/bootstrap build (or --plugin, "
            "PDIO_PLUGIN)" % cfg.plugin)
    if any(is_native_row(w) for w in chosen):
        if not os.access(cfg.pdio_cli, os.X_OK):
            die("%s is missing: build pdio (or --pdio, PDIO_CLI; or leave "
                "the pdio rows out with --servers)" % cfg.pdio_cli)
        # Before the native server, pdio serve ran nbdkit and had no
        # --threads: say so now rather than after the rows before it ran.
        r = subprocess.run([cfg.pdio_cli, "serve", "--help"],
                           capture_output=True, text=True)
        if "--threads" not in r.stdout + r.stderr:
            die("%s serve has no --threads: not a build with pdio's own "
                "server (--pdio, PDIO_CLI; or leave the pdio rows "
                "out with --servers)" % cfg.pdio_cli)


def fmt_mem(snap):
    if not snap:
        return "-"
    return "RSS %.1f PSS %.1f pin %.1f%s MiB" % (
        snap["rss_kib"] / 1024, snap["pss_kib"] / 1024,
        snap["pin_kib"] / 1024,
        " lck %.1f" % (snap["lck_kib"] / 1024) if snap["lck_kib"] else "")


def idle_memory(running, cfg):
    """The server's memory after its jobs: right away, and after cfg.idle
    seconds without a client (what a server that follows its load has
    given back by then)."""
    after_jobs = mem_snapshot(running.pid)
    if cfg.idle > 0:
        time.sleep(cfg.idle)
    return {"after_jobs": after_jobs, "idle_after": mem_snapshot(running.pid),
            "idle_s": cfg.idle}


def selected_jobs(spec):
    if not spec:
        return JOBS
    want = spec.split(",")
    bad = [w for w in want if w not in JOB_BY_NAME]
    if bad:
        die("unknown job(s) %s; known: %s" % (bad, ", ".join(JOB_BY_NAME)))
    return [j for j in JOBS if j.name in want]


def new_run_dirs(cfg):
    """(run id, its results directory, its logs directory); results/latest
    then points at it."""
    run_id = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    outdir = os.path.join(cfg.results, run_id)
    os.makedirs(outdir)
    latest = os.path.join(cfg.results, "latest")
    if os.path.islink(latest) or os.path.exists(latest):
        os.unlink(latest)
    os.symlink(run_id, latest)
    logdir = os.path.join(outdir, "logs")
    os.makedirs(logdir)
    return run_id, outdir, logdir


def do_run(cfg):
    require_tools()
    size = parse_size(cfg.size)
    names = [s.name for s in rows(cfg, "IMG", size)]
    want = wanted(cfg.servers, names)
    require_builds(cfg, want or [n for n in names if n != "pdio-nbdkit-base"])
    jobs = selected_jobs(cfg.jobs)

    img = ensure_image(cfg.dir, size)
    all_servers = selected_rows(cfg, img, size, want)

    run_id, outdir, logdir = new_run_dirs(cfg)
    workdir = os.path.join(cfg.dir, "run")
    os.makedirs(workdir, exist_ok=True)

    meta = metadata(cfg, img, size)
    meta["run_id"] = run_id
    meta["loadavg_start"] = loadavg()
    # Taken now: --publish rewrites docs/performance.md at the end.
    meta["baseline"] = load_baseline(os.path.abspath(cfg.baseline)
                                     if cfg.baseline else cfg.perf_md,
                                     cfg.top)
    doc = {"meta": meta, "jobs": {j.name: {"label": j.label,
                                           "metric": j.metric}
                                  for j in JOBS},
           "servers": {s.name: {"label": s.label, "kind": s.kind,
                                "args": s.args} for s in all_servers},
           "results": [], "sessions": [], "memory": [],
           "row_names": ROW_NAMES}
    njobs = sum(len([j for j in jobs if s.jobs is None or j.name in s.jobs])
                for s in all_servers)
    nsessions = sum(len(sessions_of(s, [j for j in jobs if s.jobs is None or
                                        j.name in s.jobs]))
                    for s in all_servers if s.kind != "raw")
    log("run %s: %d servers, %d jobs each repeat, %d repeat(s), "
        "%gs + %gs ramp a job, %gs idle after each of %d server processes: "
        "about %d min" %
        (run_id, len(all_servers), njobs, cfg.repeat, cfg.runtime,
         cfg.ramp, cfg.idle, nsessions,
         math.ceil(cfg.repeat * (njobs * (cfg.runtime + cfg.ramp + 1.5) +
                                 nsessions * cfg.idle) / 60)))

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
        for rep in range(1, cfg.repeat + 1):
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
                    running = mem = None
                    if srv.kind != "raw":
                        running = start_server(srv, cfg, img, workdir, logdir)
                        # Started and answering (nbdinfo connected once),
                        # before any job.
                        mem = {"rep": rep, "server": srv.name,
                               "jobs": [j.name for j in session],
                               "pid": running.pid,
                               "idle_start": mem_snapshot(running.pid)}
                    log("rep %d/%d  %-13s pid %-7s (image pages cached at "
                        "start: %s)%s" % (rep, cfg.repeat, srv.name,
                                          running.pid if running else "-",
                                          pages, "  idle: " +
                                          fmt_mem(mem["idle_start"])
                                          if mem else ""))
                    for job in session:
                        row = run_job(job, srv, running, cfg, img, size,
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
                        mem.update(idle_memory(running, cfg))
                        doc["memory"].append(mem)
                        log("    %-12s after %gs idle: %s" % (
                            srv.name, cfg.idle, fmt_mem(mem["idle_after"])))
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
    report(doc, outdir, cfg)
    print()
    ok = print_check(doc, cfg)
    log("results in %s" % outdir)
    if interrupted:
        return 130
    if cfg.publish:
        publish([outdir], cfg)
    return 0 if ok else 3
