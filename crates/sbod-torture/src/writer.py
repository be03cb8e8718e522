"""One NBD client of the crash harness: a real libnbd connection doing random writes
(some FUA, some followed by FLUSH), flushes and read-backs on the blocks it owns, with
several commands in flight, logging every step to stdout until the server goes away.

Log lines (the harness parses them):
  W tag first n fua     a write is about to be issued
  A tag t_ns            it completed successfully (CLOCK_MONOTONIC)
  E tag                 it failed
  F id t_ns             a flush is about to be issued
  FA id                 it completed successfully
  R first n             a read-back of own blocks matched the last acknowledged writes
  BAD first msg         a read-back did not (the harness fails the run)
  X why                 the connection ended
"""
import os
import random
import struct
import sys
import time

import nbd

BLOCK = 4096


def content(tag, first, n):
    return b"".join(struct.pack("<QQ", tag, first + i) * (BLOCK // 16) for i in range(n))


def main():
    sock, proc_id, nprocs, unit, seed, qd, seconds, tag_base, win_lo, win_hi = sys.argv[1:11]
    proc_id, nprocs, unit, qd = int(proc_id), int(nprocs), int(unit), int(qd)
    tag_base, win_lo, win_hi = int(tag_base), int(win_lo), int(win_hi)
    rng = random.Random(int(seed))
    deadline = time.monotonic() + float(seconds)
    out = sys.stdout

    def log(s):
        out.write(s + "\n")
        out.flush()

    h = nbd.NBD()
    try:
        h.connect_unix(sock)
    except nbd.Error as e:
        log("X connect: %s" % e)
        return
    blocks = h.get_size() // BLOCK
    units = [u for u in range(win_lo, min(win_hi, blocks // unit)) if u % nprocs == proc_id]
    # The last acknowledged write of each block this client owns (0: never written by it
    # in this run; then its content is unknown here and read-backs skip it).
    last = {}
    busy = set()  # units with a command in flight
    inflight = {}  # cookie -> (kind, data)
    counter = 0
    flush_id = 0
    pending_flush = []  # writes that want a flush after them

    def issue_write(u):
        nonlocal counter
        counter += 1
        tag = tag_base + counter
        first = u * unit + rng.randrange(unit)
        n = 1 + rng.randrange(u * unit + unit - first)
        r = rng.randrange(100)
        fua = r < 30
        then_flush = 30 <= r < 50
        buf = nbd.Buffer.from_bytearray(bytearray(content(tag, first, n)))
        log("W %d %d %d %d" % (tag, first, n, int(fua)))
        c = h.aio_pwrite(buf, first * BLOCK, flags=nbd.CMD_FLAG_FUA if fua else 0)
        inflight[c] = ("w", (u, tag, first, n, then_flush, buf))
        busy.add(u)

    def issue_flush():
        nonlocal flush_id
        flush_id += 1
        log("F %d %d" % (flush_id, time.monotonic_ns()))
        c = h.aio_flush()
        inflight[c] = ("f", flush_id)

    def issue_read(u):
        first = u * unit
        known = [b for b in range(first, first + unit) if b in last]
        if not known:
            return False
        b0 = known[0]
        n = 1
        while b0 + n in last and n < unit and b0 + n < first + unit:
            n += 1
        buf = nbd.Buffer.from_bytearray(bytearray(n * BLOCK))
        c = h.aio_pread(buf, b0 * BLOCK)
        inflight[c] = ("r", (u, b0, n, buf))
        busy.add(u)
        return True

    try:
        while True:
            now = time.monotonic()
            while now < deadline and len(inflight) < qd:
                if pending_flush:
                    pending_flush.pop()
                    issue_flush()
                    continue
                free = [u for u in rng.sample(units, min(len(units), 8)) if u not in busy]
                if not free:
                    break
                r = rng.randrange(100)
                if r < 8:
                    issue_flush()
                elif r < 16 and issue_read(free[0]):
                    pass
                else:
                    issue_write(free[0])
            if not inflight:
                break
            h.poll(-1)
            while True:
                c = h.aio_peek_command_completed()
                if not c:
                    break
                kind, info = inflight.pop(c)
                try:
                    h.aio_command_completed(c)
                    ok = True
                except nbd.Error:
                    ok = False
                t = time.monotonic_ns()
                if kind == "w":
                    u, tag, first, n, then_flush, _ = info
                    busy.discard(u)
                    if ok:
                        log("A %d %d" % (tag, t))
                        for b in range(first, first + n):
                            last[b] = tag
                        if then_flush:
                            pending_flush.append(tag)
                    else:
                        log("E %d" % tag)
                        for b in range(first, first + n):
                            last.pop(b, None)
                elif kind == "f":
                    if ok:
                        log("FA %d" % info)
                else:
                    u, b0, n, buf = info
                    busy.discard(u)
                    if ok:
                        got = buf.to_bytearray()
                        want = b"".join(content(last[b], b, 1) for b in range(b0, b0 + n))
                        if bytes(got) != want:
                            log("BAD %d read-back differs from the last acknowledged writes" % b0)
                        else:
                            log("R %d %d" % (b0, n))
    except nbd.Error as e:
        log("X %s" % e)
        return
    log("X done")
    try:
        h.shutdown()
    except nbd.Error:
        pass


if __name__ == "__main__":
    main()
