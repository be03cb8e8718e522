"""Write an NBD export until its members' file system fills, and check what reads back.

A journal (JSON file) remembers, per 64 KiB piece, what each 4 KiB block may hold: the
pattern of the last acknowledged write, and the patterns of writes that failed after it
(a failed write may have landed on some blocks and not others, never anything else).

  fill.py write URI JOURNAL START END GEN   write pieces [START, END) with generation GEN
  fill.py verify URI JOURNAL                read back every journalled piece

`write` prints {"ok": n, "enospc": n, "other": [messages]}; `verify` prints
{"checked": blocks, "wrong": [offsets]}.
"""
import errno
import json
import os
import sys

import nbd

PIECE = 65536
BLOCK = 4096


def pattern(off, gen):
    if gen == 0:
        return bytes(PIECE)
    seed = bytes([(off // PIECE * 13 + gen * 71 + i) % 253 + 1 for i in range(64)])
    return seed * (PIECE // 64)


def load(path):
    if os.path.exists(path):
        with open(path) as f:
            return {int(k): v for k, v in json.load(f).items()}
    return {}


def save(path, j):
    with open(path, "w") as f:
        json.dump(j, f)


def main():
    cmd, uri, journal = sys.argv[1], sys.argv[2], sys.argv[3]
    h = nbd.NBD()
    h.connect_uri(uri)
    j = load(journal)
    if cmd == "write":
        start, end, gen = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
        out = {"ok": 0, "enospc": 0, "other": []}
        for off in range(start, end, PIECE):
            cands = j.get(off, [0])
            try:
                h.pwrite(pattern(off, gen), off)
                j[off] = [gen]
                out["ok"] += 1
            except nbd.Error as e:
                # errnum is the number; errno its name (e.g. "ENOSPC").
                if e.errnum == errno.ENOSPC:
                    out["enospc"] += 1
                elif len(out["other"]) < 5:
                    out["other"].append(str(e))
                j[off] = cands + [gen]
        h.flush()
        save(journal, j)
        print(json.dumps(out))
    elif cmd == "verify":
        out = {"checked": 0, "wrong": []}
        for off, cands in sorted(j.items()):
            got = h.pread(PIECE, off)
            pats = [pattern(off, g) for g in cands]
            for b in range(0, PIECE, BLOCK):
                out["checked"] += 1
                if not any(got[b:b + BLOCK] == p[b:b + BLOCK] for p in pats):
                    out["wrong"].append(off + b)
        print(json.dumps(out))
    h.shutdown()


main()
