# SPDX-License-Identifier: BSD-3-Clause
"""pdio benchmark: the same fio matrix against pdio and its peers.

Run through bench/run.sh (python3 -m pdio_bench with bench/ on
PYTHONPATH); bench/README says what it measures and how.  Standard
library only: Debian 12's python3 is enough.
"""
