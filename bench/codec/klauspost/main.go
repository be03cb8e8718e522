// klauspost-bench measures github.com/klauspost/reedsolomon for sbod's codec benchmark
// (bench/codec, run by scripts/bench-codec.sh). It serves one JSON request per stdin
// line, each asking for one measuring round of one row, and answers one JSON line, so
// the harness can alternate rounds between sbod, ISA-L and klauspost on a noisy machine.
// Single goroutine, Cauchy matrix, buffers laid out like sbod's StripeSet, timed by the
// locked OS thread's CPU time, with the same batching as sbod_codec::bench::Meter.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"
	"unsafe"

	"github.com/klauspost/reedsolomon"
)

type request struct {
	K           int    `json:"k"`
	M           int    `json:"m"`
	Op          string `json:"op"` // encode, decode1, decode2
	Shard       int    `json:"shard_bytes"`
	StreamBytes int    `json:"stream_bytes"` // 0: one stripe, reused
	Skew        int    `json:"skew"`
	BudgetUs    int64  `json:"budget_us"`
}

type reply struct {
	Gbps  float64 `json:"gbps"`
	Wall  float64 `json:"wall_gbps"`
	Error string  `json:"error,omitempty"`
}

// threadCPU is CLOCK_THREAD_CPUTIME_ID (3) for the calling OS thread.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	_, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 3, uintptr(unsafe.Pointer(&ts)), 0)
	if e != 0 {
		panic(e)
	}
	return time.Duration(ts.Nano())
}

// pool is one page-aligned buffer of pseudo-random bytes, laid out like sbod's StripeSet.
var pool []byte

func stripes(n, shards, shardBytes, skew int) [][][]byte {
	stride := (shardBytes+4095)/4096*4096 + skew
	stripeStride := (stride*shards + 4095) / 4096 * 4096
	need := stripeStride * n
	if len(pool) < need {
		raw := make([]byte, need+4096)
		off := int((4096 - uintptr(unsafe.Pointer(&raw[0]))%4096) % 4096)
		pool = raw[off : off+need]
		x := uint64(0x2545f4914f6cdd1d)
		for i := 0; i+8 <= len(pool); i += 8 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			*(*uint64)(unsafe.Pointer(&pool[i])) = x
		}
	}
	out := make([][][]byte, n)
	for s := range out {
		out[s] = make([][]byte, shards)
		for j := range out[s] {
			b := s*stripeStride + j*stride
			out[s][j] = pool[b : b+shardBytes : b+shardBytes]
		}
	}
	return out
}

// row is the prepared state for one request shape.
type row struct {
	key   request
	f     func(i int)
	i     int
	batch int
	bytes int
}

func prepare(req request) (*row, error) {
	rs, err := reedsolomon.New(req.K, req.M, reedsolomon.WithMaxGoroutines(1), reedsolomon.WithCauchyMatrix())
	if err != nil {
		return nil, err
	}
	n := req.StreamBytes / ((req.K + req.M) * req.Shard)
	if n < 1 {
		n = 1
	}
	st := stripes(n, req.K+req.M, req.Shard, req.Skew)
	r := &row{key: req, batch: 1, bytes: req.K * req.Shard}
	switch req.Op {
	case "encode":
		r.f = func(i int) {
			if err := rs.Encode(st[i%n]); err != nil {
				panic(err)
			}
		}
	case "decode1", "decode2":
		lost := int(req.Op[len(req.Op)-1] - '0')
		r.f = func(i int) {
			s := st[i%n]
			for j := 0; j < lost; j++ {
				s[j] = s[j][:0] // missing, but its capacity is reused
			}
			if err := rs.ReconstructData(s); err != nil {
				panic(err)
			}
		}
	default:
		return nil, fmt.Errorf("unknown op %q", req.Op)
	}
	warm := n
	if warm > 2 {
		warm = 2
	}
	for ; r.i < warm; r.i++ {
		r.f(r.i)
	}
	return r, nil
}

// round mirrors sbod_codec::bench::Meter::round.
func (r *row) round(budget time.Duration) reply {
	c0, w0 := threadCPU(), time.Now()
	calls := 0
	for {
		b0 := threadCPU()
		for j := 0; j < r.batch; j++ {
			r.f(r.i)
			r.i++
		}
		calls += r.batch
		now := threadCPU()
		if (now-b0)*16 < budget {
			r.batch *= 2
		}
		if now-c0 >= budget {
			break
		}
	}
	bytes := float64(calls * r.bytes)
	return reply{Gbps: bytes / (threadCPU() - c0).Seconds() / 1e9, Wall: bytes / time.Since(w0).Seconds() / 1e9}
}

func main() {
	runtime.LockOSThread()
	in := bufio.NewScanner(os.Stdin)
	out := json.NewEncoder(os.Stdout)
	var cur *row
	for in.Scan() {
		var req request
		var rep reply
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			rep.Error = err.Error()
		} else {
			budget := time.Duration(req.BudgetUs) * time.Microsecond
			req.BudgetUs = 0
			if cur == nil || cur.key != req {
				cur, err = prepare(req)
			}
			if err != nil {
				rep.Error = err.Error()
				cur = nil
			} else {
				rep = cur.round(budget)
			}
		}
		if err := out.Encode(rep); err != nil {
			os.Exit(1)
		}
	}
}
