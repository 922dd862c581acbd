#!/usr/bin/env bash
# Choosing runjobs' defaults by measurement: drain rate of no-op jobs and wall time of
# 2,000 jobs of 10 ms and of 100 ms (sync), 2 worker processes, for each
# --concurrency (and --batch) given. Run after bench/run has prepared $BENCH_WORK.
#
#   bench/sweep.sh "4 8 16 32" "100"        concurrency values, batch values
set -euo pipefail
work=${BENCH_WORK:-/tmp/pgjobs-bench}
conc=${1:-"4 8 16 32"}
batches=${2:-"100"}
cd "$work"
for b in $batches; do
  for c in $conc; do
    export BENCH_PGJOBS_CONCURRENCY=$c BENCH_PGJOBS_BATCH=$b
    stamp="sweep-c$c-b$b"
    python3 driver.py --peers django_pgjobs --modes drain --reps 1 --n 20000 --stamp "$stamp-noop" >/dev/null 2>&1
    python3 driver.py --peers django_pgjobs --modes io --io-kind sync --io-n 2000 --io-sleep-ms 10 --reps 1 --stamp "$stamp-10" >/dev/null 2>&1
    python3 driver.py --peers django_pgjobs --modes io --io-kind sync --io-n 1000 --io-sleep-ms 100 --reps 1 --stamp "$stamp-100" >/dev/null 2>&1
    python3 - "$stamp" <<'PY'
import json, sys
s = sys.argv[1]
noop = json.load(open(f"out/results-{s}-noop.json"))[0]
t10 = json.load(open(f"out/results-{s}-10.json"))[0]
t100 = json.load(open(f"out/results-{s}-100.json"))[0]
print(f"{s}: no-op drain {noop.get('jobs_per_s', float('nan')):,.0f} jobs/s | "
      f"10 ms: {t10.get('jobs_per_s', float('nan')):,.0f} jobs/s ({t10.get('wall_over_ideal', float('nan')):.2f}x ideal) | "
      f"100 ms: {t100.get('jobs_per_s', float('nan')):,.0f} jobs/s ({t100.get('wall_over_ideal', float('nan')):.2f}x ideal) | "
      f"foreign {max(noop.get('foreign_cores') or 0, t10.get('foreign_cores') or 0):.2f}")
PY
  done
done
