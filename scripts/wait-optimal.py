#!/usr/bin/env python3
"""Wait until an array's `sbod status` says optimal (and, with --settled, no background
process runs): one process polling every 50 ms. The benches once started a python3 for
each poll, and a python3 start costs ~0.3 s of CPU on the 2-core machines here: a poll
every 50 ms took a whole core from the server being measured.

usage: wait-optimal.py SBOD NAME [--settled]
"""
import json
import subprocess
import sys
import time

sbod, name = sys.argv[1], sys.argv[2]
settled = "--settled" in sys.argv[3:]
while True:
    out = subprocess.run([sbod, "status", name, "--json"], capture_output=True, check=True).stdout
    s = json.loads(out)
    if s["state"] == "optimal" and not (settled and s.get("process")):
        break
    time.sleep(0.05)
