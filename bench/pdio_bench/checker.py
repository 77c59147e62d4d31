# SPDX-License-Identifier: BSD-3-Clause
"""The tally the target checks write into: per-repetition values from a
run's cells, PASS/MISS verdicts with margins, and the ratios the targets
are made of.

A target line reads "TAG  NAME  VALUE (need ...; per repetition: ...)".
TAG is PASS (every repetition met it), MISS (none did), MIXD (some did),
n/a (not measured), TODO (cannot be checked: something is missing, named
on the line), INFO or WARN (stated, not a target).  n/a and TODO count as
not met."""

import statistics

from .results import index, reps_of
from .servers import QEMU_ROWS

# The 4k jobs whose throughput the targets compare with the peers, and the
# 1M sequential ones compared with raw.
SPEED_JOBS = ("rr4k-qd32", "rw4k-qd32", "rr4k-4x8")
SEQ_JOBS = ("sr1m-qd8", "sw1m-qd8")
# The nbdkit front end, "no regression": these ratios of the pdio row
# against a baseline.  The names are those of the front end's own target
# lines, so the baseline parser reads published check outputs of every
# vintage alike.
REGRESSION = [("pdio / better qemu-nbd cache=none, %s" % j, j, "qemu")
              for j in SPEED_JOBS] + \
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
        # name -> (tag, per-repetition met or not, cell text).
        self.records = {}
        # Counted targets met and counted, by group (None: ungrouped), so
        # that the misses of one group do not hide how the others did.
        self.groups = {}

    def emit(self, tag, name, text, counted=True, cell=None, vals=None,
             group=None):
        if counted and tag not in ("PASS", "INFO"):
            self.all_ok = False
        if counted and tag != "INFO":
            met_total = self.groups.setdefault(group, [0, 0])
            met_total[0] += tag == "PASS"
            met_total[1] += 1
        if counted:
            self.records[name.strip()] = (tag, vals or [],
                                          cell if cell is not None else text)
        self.lines.append("%-4s %-62s %s" % (tag, name, text))

    def verdict(self, name, vals, thr, higher=True, unit="x", counted=True,
                note="", group=None):
        """vals: per-repetition measured values vs threshold thr."""
        if not vals:
            self.emit("n/a", name, "not measured in this run", counted,
                      group=group)
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
                  vals=ok, group=group)

    def tally(self):
        """How many counted targets were met, per group when there are
        several (the ungrouped ones last, as "the other targets")."""
        if not self.groups:
            return "no counted target"
        parts = ["%s targets: %d of %d met" % (g, m, t)
                 for g, (m, t) in self.groups.items() if g is not None]
        if None in self.groups:
            m, t = self.groups[None]
            parts.append("%s: %d of %d met" % (
                "the other targets" if parts else "counted targets", m, t))
        return "; ".join(parts)

    def info(self, name, text):
        self.emit("INFO", name, text, counted=False)

    def per_rep(self, fn):
        """fn(rep) for every repetition where it could be computed."""
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

    def ratio(self, server, j, ref):
        """server's throughput over ref's at job j, per repetition; ref
        "qemu" is the better qemu-nbd row of each repetition."""
        if ref == "qemu":
            return self.per_rep(lambda r: self.val(r, server, j) /
                                self.best_qemu(r, j))
        return self.per_rep(lambda r: self.val(r, server, j) /
                            self.val(r, ref, j))

    def has(self, server):
        return any(r["server"] == server for r in self.doc["results"])
