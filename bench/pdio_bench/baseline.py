# SPDX-License-Identifier: BSD-3-Clause
"""The nbdkit front end's published ratios, the bar of "no regression":
read from the results block of docs/performance.md (every published run
pooled), or computed from a results.json or run directory."""

import json
import os
import re

from .checker import REGRESSION, Checker
from .publish import BEGIN, END
from .results import current_names, peak_rss_mib
from .util import read_file

RSS_LINE = re.compile(r"^INFO\s+peak RSS of pdio\s+([\d.]+) MiB", re.M)
TARGET_LINE = re.compile(
    r"^(?:PASS|MISS|MIXD|INFO)\s+(?:no regression: )?"
    r"(pdio / (?:better qemu-nbd cache=none|raw), [\w-]+)\s+[\d.]+x .*?"
    r"per repetition: ([\d. ]+)\)")


def load_baseline(path, top):
    """{"source", "runs", "ratios": {target name: per-repetition values},
    "pdio_rss_mib", "cpus"}, or {"error"}; top: paths under it are
    recorded relative to it."""
    if path and os.path.isdir(path):
        path = os.path.join(path, "results.json")
    if not path or not os.path.exists(path):
        return {"error": "%s does not exist" % path}
    source = os.path.relpath(path, top) if path.startswith(top) else path
    if path.endswith(".json"):
        with open(path) as f:
            doc = current_names(json.load(f))
        c = Checker(doc)
        ratios = {}
        for name, j, ref in REGRESSION:
            v = c.ratio("pdio-nbdkit", j, ref)
            if v:
                ratios[name] = v
        return {"source": source, "runs": [doc["meta"]["run_id"]],
                "ratios": ratios, "pdio_rss_mib": peak_rss_mib(doc, "pdio-nbdkit"),
                "cpus": [doc["meta"].get("cpu")]}
    text = read_file(path)
    if BEGIN in text and END in text:
        text = text[text.index(BEGIN):text.index(END)]
    ratios, runs, rss, cpus = {}, [], [], []
    for part in re.split(r"^### Run ", text, flags=re.M)[1:]:
        runs.append(part.split()[0])
        m = re.search(r"^- Machine: (.*?), \d+ CPUs", part, re.M)
        if m and m[1] not in cpus:
            cpus.append(m[1])
        # A run's first line of each name: the native server's check
        # repeats the front end's targets after its own, for reference.
        seen = {}
        for line in part.splitlines():
            m = TARGET_LINE.match(line.strip())
            if m and m[1] not in seen:
                seen[m[1]] = [float(x) for x in m[2].split()]
        for k, v in seen.items():
            ratios.setdefault(k, []).extend(v)
        m = RSS_LINE.search(part)
        if m:
            rss.append(float(m[1]))
    return {"source": source, "runs": runs, "ratios": ratios,
            "pdio_rss_mib": max(rss) if rss else None, "cpus": cpus}
