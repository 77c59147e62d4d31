# SPDX-License-Identifier: BSD-3-Clause
"""docs/performance.md's results block and chart, from finished runs."""

import json
import os
import shutil

from .results import current_names, reps_of
from .util import log, read_file

BEGIN = "<!-- bench:begin (bench/run.sh --publish rewrites this block) -->"
END = "<!-- bench:end -->"


def publish(outdirs, cfg):
    """Rewrites the results block of docs/performance.md with the summary
    of each run in outdirs, in order.  Only a final run (jobs of 10 s or
    more, at least two repetitions) also replaces the chart in docs/ (the
    last final run's); a shorter one is labelled provisional."""
    block = BEGIN + "\n\n"
    chart_png = None
    for outdir in outdirs:
        with open(os.path.join(outdir, "results.json")) as f:
            doc = current_names(json.load(f))
        m = doc["meta"]
        final = m["runtime_s"] >= 10 and len(reps_of(doc)) >= 2
        md = read_file(os.path.join(outdir, "summary.md"))
        png = os.path.join(outdir, "ratios.png")
        if not final:
            block += ("**Provisional** (%gs jobs, %d repetition(s), on a "
                      "busy machine): not one of the final runs; the chart "
                      "in docs/ is not updated for it.  Chart of this run: "
                      "bench/results/%s/ratios.png (not committed).\n\n"
                      % (m["runtime_s"], len(reps_of(doc)), m["run_id"]))
        block += md.rstrip() + "\n\n"
        if final and os.path.exists(png):
            chart_png = png
    if chart_png:
        shutil.copyfile(chart_png, cfg.perf_png)
        block += "![ratios of the last run above](%s)\n\n" \
            % os.path.basename(cfg.perf_png)
    block += END
    text = read_file(cfg.perf_md) if os.path.exists(cfg.perf_md) else \
        "# pdio performance\n\n"
    if BEGIN in text and END in text:
        a = text.index(BEGIN)
        b = text.index(END) + len(END)
        text = text[:a] + block + text[b:]
    else:
        text = text.rstrip() + "\n\n## Results\n\n" + block + "\n"
    with open(cfg.perf_md, "w") as f:
        f.write(text)
    log("published %d run(s) to %s%s" % (
        len(outdirs), cfg.perf_md, " and " + cfg.perf_png if chart_png
        else " (provisional: chart not copied)"))
