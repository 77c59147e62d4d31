#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
# bench/run.sh — pdio against its peers, one command (run as root, by hand;
# never part of "make check"):
#
#   bench/run.sh                     the whole matrix once (BENCH_RUNTIME=10 s a job)
#   bench/run.sh --repeat 2          the matrix twice; tables show median and min–max
#   bench/run.sh --smoke             2 s jobs with 1 s ramp: a quick sanity run
#   bench/run.sh --repeat 2 --publish   ... and write docs/performance.md + chart
#   bench/run.sh --check [RESULTS]   the targets, PASS/MISS with margins,
#                                    from a results.json (default: the latest run)
#   bench/run.sh --report [RESULTS]  re-render summary.md and the chart
#   bench/run.sh --help              every option (--servers, --jobs, --runtime ...)
#
# Environment: BENCH_RUNTIME (s, default 10), BENCH_RAMP (s, default 2),
# BENCH_SIZE (image size, default 4G), BENCH_DIR (default /var/tmp/pdio-bench,
# must be a real filesystem, not tmpfs).  Results go to
# bench/results/<run-id>/ (results.json, results.tsv, summary.md, ratios.png,
# fio/ and logs/); bench/results/latest points at the newest run.
#
# Needs the plugin built (scripts/bootstrap build) and the peers installed
# (scripts/bootstrap deps installs them).  The code is the Python package
# bench/pdio_bench/.  See bench/README.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH
exec "$py" -m pdio_bench "$@"
