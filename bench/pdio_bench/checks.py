# SPDX-License-Identifier: BSD-3-Clause
"""The targets a run is checked against, one check a target, and the two
sets they form: the native server's (pdio serve against qemu-nbd and raw)
and the nbdkit front end's (pdio.so), the latter counted only in runs
without a native row."""

import os
import statistics

from .baseline import load_baseline
from .checker import (REGRESSION, REGRESSION_TOLERANCE, SEQ_JOBS, SPEED_JOBS,
                      Checker)
from .fio import JOB_BY_NAME, JOBS
from .results import has_memory, has_native, memory_of, peak_rss_mib
from .servers import (ALIGN_CHECK, NATIVE, NATIVE_SCALING_JOBS, NBDKIT_ROWS,
                      STATS_JOBS,
                      is_native_row, is_nbdkit_row)

# The 4k jobs the CPU-per-I/O target covers, and the QD32 ones the
# context-switch target covers.
CPU_4K_JOBS = ("rr4k-qd1", "rr4k-qd32", "rw4k-qd32", "rr4k-4x8")
QD32_JOBS = ("rr4k-qd32", "rw4k-qd32")
# The native server's memory targets (memory that follows the load): PSS
# of an idle pdio serve after load and IDLE_AFTER_S seconds without a
# client, beside its reserves; VmPin while idle, its reserves and nothing
# more; peak RSS on every job.  Counted in a group of their own, so that
# the tally shows the other targets apart.
IDLE_PSS_MIB = 4.0
IDLE_AFTER_S = 30
PEAK_RSS_MIB = 48.0
MEMORY = "memory"
# A worker's reserve: pdio serve keeps one 2 MiB pool chunk of each
# worker with a pool (worker 0 from the start, the others from their
# first connection) resident, registered with its ring (VmPin) and
# locked (VmLck) with the two pages of its allocator bookkeeping, so
# that the first write after idle allocates nothing (docs/design.md).
RESERVE_PIN_KIB = 2048
RESERVE_LCK_KIB = RESERVE_PIN_KIB + 8


def per_rep_text(vals):
    return " ".join("%.2f" % x for x in vals)


def check_speed_vs_peers(c):
    """The native server's throughput: >= 1.25x the better qemu-nbd, or
    >= 0.9x raw where that is the lower bar; per repetition the bar is the
    lower of the two."""
    N = NATIVE
    for j in SPEED_JOBS:
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
        q = c.ratio(N, j, "qemu")
        w = c.ratio(N, j, "raw")
        c.info("  native / better qemu-nbd, / raw, %s" % j,
               "%s / %s (per repetition: %s / %s)"
               % ("%.2fx" % statistics.median(q) if q else "-",
                  "%.2fx" % statistics.median(w) if w else "-",
                  per_rep_text(q) or "-", per_rep_text(w) or "-"))


def check_speed_vs_qemu(c, counted):
    """The nbdkit front end: >= 1.2x the better qemu-nbd."""
    for j in SPEED_JOBS:
        c.verdict("pdio / better qemu-nbd cache=none, %s" % j,
                  c.ratio("pdio-nbdkit", j, "qemu"), 1.2, counted=counted)


def check_speed_vs_null(c, counted):
    """The nbdkit front end keeps most of what nbdkit itself can do."""
    c.verdict("pdio / nbdkit null, rr4k-qd32",
              c.ratio("pdio-nbdkit", "rr4k-qd32", "null"), 0.8, counted=counted)


def check_sequential_vs_raw(c, server, who, counted=True):
    for j in SEQ_JOBS:
        c.verdict("%s / raw, %s" % (who, j), c.ratio(server, j, "raw"), 0.9,
                  counted=counted)


def check_misaligned_writes(c, counted):
    """512-misaligned writes on a 4096-aligned pdio cost at most half."""
    c.verdict("misaligned / aligned 4k randwrite QD32 on pdio align=4096",
              c.per_rep(lambda r: c.val(r, "pdio-nbdkit-a4k", "rw4k-mis-qd32") /
                        c.val(r, "pdio-nbdkit-a4k", "rw4k-qd32")), 0.5,
              counted=counted)


def check_cpu_per_io(c, server, who, jobs, bar, counted=True,
                     list_unmeasured=True):
    """server's CPU time per I/O against the cheaper qemu-nbd row's."""
    for j in jobs:
        vals = c.per_rep(lambda r: c.val(r, server, j, "cpu_us_per_io") /
                         c.best_qemu(r, j, "cpu_us_per_io", lower=True))
        if vals or list_unmeasured:
            c.verdict("%s CPU us/IO / cheaper qemu-nbd's, %s" % (who, j),
                      vals, bar, higher=False, counted=counted)


def check_context_switches(c):
    """The native server's context switches per I/O at QD32 (perf; a
    count, which steal time does not inflate)."""
    N = NATIVE
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
               "%.2f (per repetition: %s)" % (statistics.median(vals),
                                              per_rep_text(vals)))


def check_no_bounce(c):
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


def check_no_page_cache(c, what, pred, counted=True):
    """0 image pages cached after every job of the rows pred names: the
    servers under test do O_DIRECT I/O."""
    name = "0 image pages cached after every %s job" % what
    rows = [r for r in c.doc["results"] if pred(r["server"])]
    if not rows:
        c.emit("n/a", name, "no %s job in this run" % what, counted)
        return
    cached = [r for r in rows if r.get("cache_pages") != 0]
    c.emit("PASS" if not cached else "MISS", name,
           "%d of %d %s jobs left pages cached%s"
           % (len(cached), len(rows), what, "" if not cached else ": " +
              ", ".join("%s/%s rep %d: %s" % (r["server"], r["job"], r["rep"],
                                              r.get("cache_pages"))
                        for r in cached[:6])), counted)


def state_peak_rss(c):
    """The native and nbdkit pdio rows' peak RSS: stated, and recorded for
    the table over several runs."""
    for s in sorted({r["server"] for r in c.doc["results"]
                     if is_native_row(r["server"]) or
                     is_nbdkit_row(r["server"])}):
        rss = peak_rss_mib(c.doc, s)
        if rss:
            c.info("peak RSS of " + s,
                   "%.1f MiB (VmHWM; max over jobs and repetitions)" % rss)
            c.records["peak RSS of " + s] = ("INFO", [], "%.1f MiB" % rss)


def check_reserve_only(c, name, mem, group):
    """VmPin while idle (at start and after load) is the reserves and
    nothing more: VmLck holds a whole number k >= 1 of reserves and VmPin
    is k chunks.  mem: memory_of per repetition."""
    ok, per = [], []
    for m in mem:
        good = True
        for w in ("idle_start", "idle_after"):
            pin, lck = m["%s_pin_kib" % w], m["%s_lck_kib" % w]
            if pin is None or lck is None:
                continue
            k = lck // RESERVE_LCK_KIB
            good &= (k >= 1 and lck == k * RESERVE_LCK_KIB and
                     pin == k * RESERVE_PIN_KIB)
            per.append("%s %.1f/%.2f" % (w.replace("idle_", ""), pin / 1024,
                                          lck / 1024))
        ok.append(good)
    if not per:
        c.emit("n/a", name, "not measured in this run", group=group)
        return
    tag = "PASS" if all(ok) else ("MISS" if not any(ok) else "MIXD")
    need = ("need VmPin %d KiB and VmLck %d KiB a worker with a pool"
            % (RESERVE_PIN_KIB, RESERVE_LCK_KIB))
    c.emit(tag, name, "VmPin/VmLck MiB %s (%s)" % (", ".join(per), need),
           cell="%s (%s)" % (", ".join(per), need), vals=ok, group=group)


def check_memory_follows_load(c, counted=True):
    """The native server's memory targets: PSS beside its reserves
    (PSS - VmLck) <= IDLE_PSS_MIB when idle after load and IDLE_AFTER_S s
    without a client, VmPin while idle (at start and after load) its
    reserves and nothing more, peak RSS <= PEAK_RSS_MIB on every job.
    Judged on the pdio row (pdio serve alone; per repetition, the
    worst of its server processes and jobs); stated, not judged, in a run
    without it."""
    N = NATIVE
    pss_name = ("native idle PSS after load and %d s idle, beside its "
                "reserves" % IDLE_AFTER_S)
    pin_name = "native VmPin while idle: its reserves only"
    peak_name = "native peak RSS, every job"
    if not counted or not c.has(N):
        for name, need in ((pss_name, "<= %.0f MiB" % IDLE_PSS_MIB),
                           (pin_name, "2 MiB a worker with a pool"),
                           (peak_name, "<= %.0f MiB" % PEAK_RSS_MIB)):
            c.emit("n/a", name, "need %s; not judged: no %s row in this run"
                   % (need, N), counted=False)
        return
    mem = [memory_of(c.doc, N, rep) for rep in c.reps]
    if not has_memory(c.doc):
        for name in (pss_name, pin_name):
            c.emit("TODO", name, "not recorded: results from before the "
                   "memory columns", group=MEMORY)
    else:
        short = [m["idle_s"] for m in mem
                 if m["idle_s"] is not None and m["idle_s"] < IDLE_AFTER_S]
        c.verdict(pss_name, [(m["idle_after_pss_kib"] -
                              (m["idle_after_lck_kib"] or 0)) / 1024
                             for m in mem
                             if m["idle_after_pss_kib"] is not None],
                  IDLE_PSS_MIB, higher=False, unit=" MiB", group=MEMORY,
                  note="; after only %g s idle (--idle), not %d"
                  % (min(short), IDLE_AFTER_S) if short else "")
        check_reserve_only(c, pin_name, mem, MEMORY)
        lck = [m[k] for m in mem for k in ("lck_idle_kib", "lck_peak_kib")
               if m[k]]
        if lck:
            c.info("  native VmLck", "up to %.1f MiB locked (mlock)"
                   % (max(lck) / 1024))
    peaks = [m for m in mem if m["peak_rss_kib"] is not None]
    c.verdict(peak_name, [m["peak_rss_kib"] / 1024 for m in peaks],
              PEAK_RSS_MIB, higher=False, unit=" MiB", group=MEMORY,
              note="; worst job per repetition: %s%s" % (
                  ", ".join(m["peak_job"] for m in peaks),
                  "" if all(m["hwm_reset"] for m in peaks) else
                  " (VmHWM not reset per job: the peak since the server "
                  "started)"))


def state_front_end_rss(c):
    for s in NBDKIT_ROWS:
        rss = peak_rss_mib(c.doc, s)
        if rss:
            c.info("peak RSS of " + s,
                   "%.1f MiB (max over jobs and repetitions; the engine's "
                   "bound: a 2 MiB bounce arena per worker thread, nbdkit "
                   "runs 16 per connection)" % rss)


def check_no_regression(c, cfg):
    """The nbdkit front end against the published baseline."""
    base = c.doc["meta"].get("baseline")
    src = "given with --baseline" if base and base.get("given") else \
        "recorded when the run started"
    if not base:
        base = load_baseline(cfg.perf_md, cfg.top)
        src = "read now from %s (the run recorded none)" % \
            os.path.relpath(cfg.perf_md, cfg.top)
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
        c.verdict("no regression: " + name, c.ratio("pdio-nbdkit", j, ref),
                  REGRESSION_TOLERANCE * bm,
                  note="; published %.2fx [%s]" % (bm, per_rep_text(b)))
    # Memory: stated against the published figure (WARN above 1.5x; not a
    # target of its own, but the engine's per-thread pools multiply by
    # nbdkit's 16 threads per connection).
    rss = peak_rss_mib(c.doc, "pdio-nbdkit")
    if rss and base.get("pdio_rss_mib"):
        c.emit("WARN" if rss > 1.5 * base["pdio_rss_mib"] else "INFO",
               "nbdkit front end: peak RSS of pdio against published",
               "%.1f MiB, published %.1f MiB (%.2fx)"
               % (rss, base["pdio_rss_mib"], rss / base["pdio_rss_mib"]),
               counted=False)


def check_no_regression_same_run(c):
    """The nbdkit front end against a baseline build's pdio.so run in the
    same repetitions (the pdio-nbdkit-base row): the same host, the same minutes."""
    if not c.has("pdio-nbdkit-base"):
        return
    c.info("nbdkit front end: same-run baseline",
           "pdio-nbdkit-base is %s; a repetition regresses below %.0f%% of it"
           % (c.doc["meta"].get("base_plugin", "?"),
              REGRESSION_TOLERANCE * 100))
    for j in SPEED_JOBS + SEQ_JOBS:
        c.verdict("no regression (same run): pdio-nbdkit / pdio-nbdkit-base, %s" % j,
                  c.ratio("pdio-nbdkit", j, "pdio-nbdkit-base"), REGRESSION_TOLERANCE)


def check_stats_cost(c):
    """The device's counters: pdio serve --stats against the same server
    counting nothing, in the same repetitions: at most 2 % apart."""
    if not c.has("pdio-stats"):
        return
    for j in STATS_JOBS:
        c.verdict("counters cost: pdio-stats / pdio, %s" % j,
                  c.ratio("pdio-stats", j, "pdio"), 0.98)


def state_thread_scaling(c):
    """--threads 2 against --threads 1: stated, not a target (on 2 vCPUs
    fio shares the CPUs with the server)."""
    for j in NATIVE_SCALING_JOBS:
        vals = c.ratio("pdio-t2", j, "pdio-t1")
        if vals:
            c.info("scaling: native --threads 2 / --threads 1, %s" % j,
                   "%.2fx (per repetition: %s)%s" % (
                       statistics.median(vals), per_rep_text(vals),
                       " <- the one that can scale: a connection stays "
                       "on one thread" if j == "rr4k-4x8" else ""))


def check_clean_exit(c):
    """The native server's orderly stop: exit 0 after SIGTERM (stated)."""
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


def native_server_targets(c, cfg):
    check_speed_vs_peers(c)
    check_cpu_per_io(c, NATIVE, "native", CPU_4K_JOBS, 0.7)
    check_context_switches(c)
    check_sequential_vs_raw(c, NATIVE, "native")
    check_no_bounce(c)
    check_no_page_cache(c, "native", is_native_row)
    check_no_page_cache(c, "nbdkit pdio", is_nbdkit_row)
    state_peak_rss(c)
    check_memory_follows_load(c)
    check_no_regression(c, cfg)
    check_no_regression_same_run(c)
    check_stats_cost(c)
    state_thread_scaling(c)
    check_clean_exit(c)


def front_end_targets(c, counted):
    check_speed_vs_qemu(c, counted)
    check_speed_vs_null(c, counted)
    check_sequential_vs_raw(c, "pdio-nbdkit", "pdio-nbdkit", counted)
    check_misaligned_writes(c, counted)
    check_no_page_cache(c, "pdio-nbdkit", is_nbdkit_row, counted)
    check_cpu_per_io(c, "pdio-nbdkit", "pdio-nbdkit", [j.name for j in JOBS], 1.0,
                     counted, list_unmeasured=False)
    state_front_end_rss(c)


def counted_targets(doc, cfg):
    """A Checker over the targets that decide the run: the native server's
    when it ran, the front end's otherwise."""
    c = Checker(doc)
    if has_native(doc):
        native_server_targets(c, cfg)
    else:
        front_end_targets(c, counted=True)
        check_memory_follows_load(c, counted=False)
    return c


def check_lines(doc, cfg):
    """(target lines, all counted targets met)."""
    c = counted_targets(doc, cfg)
    c.lines.append("---- %s ----" % c.tally())
    if has_native(doc):
        c.lines.append("---- the nbdkit front end's targets, for reference "
                       "(not counted) ----")
        front_end_targets(c, counted=False)
    return c.lines, c.all_ok


def check_title(doc):
    return "native server" if has_native(doc) else "nbdkit front end"


def print_check(doc, cfg):
    lines, ok = check_lines(doc, cfg)
    print("Targets (%s), run %s:" % (check_title(doc), doc["meta"]["run_id"]))
    for line in lines:
        print("  " + line)
    return ok


def targets_table(docs, cfg):
    """The counted targets of several runs side by side, in markdown: one
    column per run (median, per-repetition values, the bar), and how many
    repetitions met each (for docs/performance.md's targets section)."""
    recs = [counted_targets(doc, cfg).records for doc in docs]
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
