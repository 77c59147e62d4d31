# SPDX-License-Identifier: BSD-3-Clause
"""bench/run.sh's command line: a run, or --check / --report of finished
runs."""

import argparse
import os

from .baseline import load_baseline
from .checks import print_check, targets_table
from .config import Config
from .fio import JOB_BY_NAME
from .publish import publish
from .report import report
from .results import load_results
from .run import do_run
from .servers import SERVER_SETS, rows
from .util import die


def parser():
    p = argparse.ArgumentParser(
        prog="bench/run.sh",
        description="pdio against its peers with fio's nbd engine; "
                    "see bench/README.")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the whole matrix N times (spread = min/max)")
    p.add_argument("--runtime", type=float, default=None,
                   help="measured seconds per job (BENCH_RUNTIME, 10)")
    p.add_argument("--ramp", type=float, default=None,
                   help="ramp seconds per job (BENCH_RAMP, 2)")
    p.add_argument("--idle", type=float, default=None, metavar="S",
                   help="seconds each server sits without a client after "
                        "its jobs before its idle-after-load memory (RSS, "
                        "PSS, VmPin) is taken (BENCH_IDLE, 30; --smoke: 5)")
    p.add_argument("--smoke", action="store_true",
                   help="quick sanity run: --runtime 2 --ramp 1 --idle 5")
    p.add_argument("--size", help="image size (BENCH_SIZE, 4G)")
    p.add_argument("--dir", help="where the image lives (BENCH_DIR)")
    p.add_argument("--servers", help="comma list (default: all): " +
                   ", ".join(s.name for s in rows(Config(), "IMG", 0)) +
                   "; also pdio-nbdkit-tN, pdio-tN, and " +
                   ", ".join("%s (= %s)" % (k, ",".join(v))
                             for k, v in SERVER_SETS.items()))
    p.add_argument("--jobs", help="comma list (default: all): " +
                   ", ".join(JOB_BY_NAME))
    p.add_argument("--pdio", metavar="PATH",
                   help="the pdio CLI whose 'pdio serve' the pdio rows "
                        "run (PDIO_CLI; default: this tree's src/cli/pdio)")
    p.add_argument("--plugin", metavar="PATH",
                   help="the nbdkit plugin of the pdio rows (PDIO_PLUGIN; "
                        "default: this tree's plugin/.libs/pdio.so)")
    p.add_argument("--base-plugin", metavar="PATH",
                   help="the pdio.so of a baseline build for the pdio-nbdkit-base "
                        "row (PDIO_BASE_PLUGIN; e.g. the build before a "
                        "change): 'no regression' is then also checked as "
                        "pdio / pdio-nbdkit-base in the same repetition")
    p.add_argument("--baseline", metavar="FILE",
                   help="the nbdkit front end's published ratios for 'no "
                        "regression': a docs/performance.md or a results.json"
                        " / run directory (default: docs/performance.md, "
                        "read when the run starts)")
    p.add_argument("--no-perf", dest="perf", action="store_false",
                   help="do not count server context switches with perf")
    p.add_argument("--publish", action="store_true",
                   help="write the summary into docs/performance.md "
                        "(and the chart into docs/ for final runs: 10 s "
                        "jobs, 2+ repetitions)")
    p.add_argument("--check", nargs="?", const="", metavar="RESULTS",
                   help="evaluate the targets from a results.json or run "
                        "directory (default: the latest run; several, "
                        "comma-separated, also get a markdown table of the "
                        "targets side by side); no benchmark")
    p.add_argument("--report", nargs="?", const="", metavar="RESULTS",
                   help="re-render summary.md and the chart from results "
                        "(several runs, comma-separated: with --publish, "
                        "all of them go into docs/performance.md)")
    return p


def results_args(spec):
    """--check/--report's RESULTS: several comma-separated, or the latest."""
    return spec.split(",") if spec else [None]


def check_runs(cfg):
    """Each run's check, then (several runs) the targets of all of them
    side by side; 3 unless every counted target of every run is met."""
    docs, ok = [], True
    for one in results_args(cfg.check):
        doc, _ = load_results(one, cfg)
        if cfg.baseline:
            doc["meta"]["baseline"] = load_baseline(
                os.path.abspath(cfg.baseline), cfg.top)
            doc["meta"]["baseline"]["given"] = True
        ok = print_check(doc, cfg) and ok
        docs.append(doc)
        print()
    if len(docs) > 1:
        print("Targets of the %d runs (markdown):\n" % len(docs))
        print(targets_table(docs, cfg))
    return 0 if ok else 3


def report_runs(cfg):
    """Re-renders each run's summary; with --publish, all of them go into
    docs/performance.md in the order given."""
    outdirs = []
    for one in results_args(cfg.report):
        doc, outdir = load_results(one, cfg)
        report(doc, outdir, cfg)
        outdirs.append(outdir)
    if cfg.publish:
        publish(outdirs, cfg)
    return 0


def main(argv=None):
    cfg = Config.from_args(parser().parse_args(argv))
    if cfg.check is not None:
        return check_runs(cfg)
    if cfg.report is not None:
        return report_runs(cfg)
    if cfg.repeat < 1:
        die("--repeat must be at least 1")
    return do_run(cfg)
