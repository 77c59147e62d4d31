# SPDX-License-Identifier: BSD-3-Clause
"""The settings of one invocation, from the command line and the
environment: which builds run, how long each job runs, where the image,
the results and the published page live.  Built once by the CLI and
passed to whatever needs it."""

import os
from dataclasses import dataclass

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP = os.path.dirname(BENCH)


@dataclass
class Config:
    top: str = TOP
    results: str = os.path.join(BENCH, "results")
    perf_md: str = os.path.join(TOP, "docs", "performance.md")
    perf_png: str = os.path.join(TOP, "docs", "performance-ratios.png")
    # The two front ends under test.  Both default to this tree's build and
    # can be pointed elsewhere, e.g. at a branch's build before it is
    # merged.
    plugin: str = os.path.join(TOP, "plugin", ".libs", "pdio.so")
    pdio_cli: str = os.path.join(TOP, "src", "cli", "pdio")
    # The pdio-nbdkit-base row: another build's pdio.so, so that "no regression"
    # is measured in the same run rather than against figures published
    # on another day (or another machine).
    base_plugin: str = ""
    runtime: float = 10.0
    ramp: float = 2.0
    # Seconds each server sits without a client after its jobs before its
    # idle memory is taken again.
    idle: float = 30.0
    repeat: int = 1
    size: str = "4G"
    dir: str = "/var/tmp/pdio-bench"
    servers: str = None
    jobs: str = None
    perf: bool = True
    publish: bool = False
    baseline: str = None
    check: str = None
    report: str = None

    @classmethod
    def from_args(cls, args, env=os.environ):
        """args: the CLI's parsed options; an option given wins over its
        environment variable, which wins over the default."""
        c = cls()
        c.plugin = env.get("PDIO_PLUGIN") or c.plugin
        c.pdio_cli = env.get("PDIO_CLI") or c.pdio_cli
        c.base_plugin = env.get("PDIO_BASE_PLUGIN") or c.base_plugin
        if args.plugin:
            c.plugin = os.path.abspath(args.plugin)
        if args.pdio:
            c.pdio_cli = os.path.abspath(args.pdio)
        if args.base_plugin:
            c.base_plugin = os.path.abspath(args.base_plugin)
        c.runtime = args.runtime if args.runtime is not None else \
            float(env.get("BENCH_RUNTIME", c.runtime))
        c.ramp = args.ramp if args.ramp is not None else \
            float(env.get("BENCH_RAMP", c.ramp))
        c.idle = args.idle if args.idle is not None else \
            float(env.get("BENCH_IDLE", c.idle))
        if args.smoke:
            c.runtime, c.ramp = 2, 1
            if args.idle is None:
                c.idle = 5
        c.size = args.size or env.get("BENCH_SIZE", c.size)
        c.dir = args.dir or env.get("BENCH_DIR", c.dir)
        c.repeat = args.repeat
        c.servers, c.jobs = args.servers, args.jobs
        c.perf, c.publish = args.perf, args.publish
        c.baseline, c.check, c.report = args.baseline, args.check, args.report
        return c
