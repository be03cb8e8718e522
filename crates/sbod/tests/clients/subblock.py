"""Two NBD connections writing parts of the same 4 KiB blocks at once (libnbd).

Both connections skip the block-size negotiation and libnbd's alignment check, as a
client that does not know the export's block size would, so writes smaller than a
block reach the server. Three rounds, each over its own blocks:

  halves    connection A writes the first 2 KiB of each block, B the second
  quarters  A writes quarters 0 and 2, B quarters 1 and 3
  overlap   A writes bytes 0-1023; once that is acknowledged, B writes 512-1535

Many requests are in flight on both connections at once. Then every piece is read back
and the pieces that do not hold what was last written to them are counted. Prints one
JSON object: {"halves": lost, "quarters": lost, "overlap": lost, "pieces": total}.

usage: subblock.py URI BLOCKS
"""
import json
import sys

import nbd

URI, BLOCKS = sys.argv[1], int(sys.argv[2])
DEPTH = 64


def connect():
    h = nbd.NBD()
    h.set_request_block_size(False)
    h.set_strict_mode(h.get_strict_mode() & ~nbd.STRICT_ALIGN)
    h.connect_uri(URI)
    return h


def fill(tag, block, piece, length):
    # A byte pattern that names the round, the block and the piece.
    b = bytes([(tag * 37 + block * 7 + piece * 101 + i) % 251 + 1 for i in range(16)])
    return (b * (length // 16 + 1))[:length]


def drain(handles, limit):
    for h in handles:
        while h.aio_in_flight() > limit:
            h.poll(-1)


def write(h, data, offset, done=None):
    buf = nbd.Buffer.from_bytearray(bytearray(data))
    if done is None:
        return h.aio_pwrite(buf, offset)
    return h.aio_pwrite(buf, offset, completion=done)


a, b = connect(), connect()
size = a.get_size()
assert size >= 3 * BLOCKS * 4096, "export too small"
expect = {}  # offset -> bytes
pieces = {"halves": [], "quarters": [], "overlap": []}

# halves
base = 0
for i in range(BLOCKS):
    off = base + i * 4096
    for piece, (h, lo, hi) in enumerate([(a, 0, 2048), (b, 2048, 4096)]):
        d = fill(1, i, piece, hi - lo)
        write(h, d, off + lo)
        pieces["halves"].append((off + lo, d))
    drain([a, b], DEPTH)
drain([a, b], 0)

# quarters
base = BLOCKS * 4096
for i in range(BLOCKS):
    off = base + i * 4096
    for q in range(4):
        h = a if q % 2 == 0 else b
        d = fill(2, i, q, 1024)
        write(h, d, off + q * 1024)
        pieces["quarters"].append((off + q * 1024, d))
    drain([a, b], DEPTH)
drain([a, b], 0)

# overlap: B's write follows A's acknowledgement, block by block, many blocks at once
base = 2 * BLOCKS * 4096
ready = []
for i in range(BLOCKS):
    off = base + i * 4096
    first = fill(3, i, 0, 1024)
    second = fill(3, i, 1, 1024)

    def acked(err, off=off, second=second):
        ready.append((off, second))
        return 0

    write(a, first, off, acked)
    pieces["overlap"].append((off, first[:512]))
    pieces["overlap"].append((off + 512, second))
    while ready:
        o, d = ready.pop()
        write(b, d, o + 512)
    for h in (a, b):
        while h.aio_in_flight() > DEPTH:
            h.poll(-1)
    while ready:
        o, d = ready.pop()
        write(b, d, o + 512)
while a.aio_in_flight() > 0 or b.aio_in_flight() > 0 or ready:
    while ready:
        o, d = ready.pop()
        write(b, d, o + 512)
    for h in (a, b):
        if h.aio_in_flight() > 0:
            h.poll(-1)

a.flush()
out = {"pieces": 0}
for name, ps in pieces.items():
    lost = 0
    for off, d in ps:
        if a.pread(len(d), off) != d:
            lost += 1
    out[name] = lost
    out["pieces"] += len(ps)
a.shutdown()
b.shutdown()
print(json.dumps(out))
