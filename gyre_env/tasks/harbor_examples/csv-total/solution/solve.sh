#!/bin/bash
# Reference solution (Harbor's oracle): compute both files with Python.
set -euo pipefail
python3 - <<'PY'
import csv
from collections import defaultdict
from decimal import Decimal

rows = list(csv.DictReader(open("/app/sales.csv", newline="")))
total = sum(Decimal(r["amount"]) for r in rows)
open("/app/total.txt", "w").write(f"{total:.2f}\n")
by = defaultdict(Decimal)
for r in rows:
    by[r["region"]] += Decimal(r["amount"])
with open("/app/by_region.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["region", "total"])
    for region in sorted(by):
        w.writerow([region, f"{by[region]:.2f}"])
PY
