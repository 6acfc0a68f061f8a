package ioengine

import (
	"math/bits"
	"time"
)

// OpCounts is a counter per request kind.
type OpCounts struct {
	Read        uint64 `json:"read"`
	Write       uint64 `json:"write"`
	Flush       uint64 `json:"flush"`
	Trim        uint64 `json:"trim"`
	WriteZeroes uint64 `json:"write_zeroes"`
	Cache       uint64 `json:"cache"`
}

func (c *OpCounts) add(op Op, n uint64) {
	switch op {
	case OpRead:
		c.Read += n
	case OpWrite, OpWriteRepeat, OpCompareWrite, OpOrWrite:
		c.Write += n
	case OpFlush, OpBarrier:
		// A barrier's backend call is a flush.
		c.Flush += n
	case OpTrim:
		c.Trim += n
	case OpWriteZeroes:
		c.WriteZeroes += n
	case OpCache:
		c.Cache += n
	}
}

// Total is the sum over all kinds.
func (c OpCounts) Total() uint64 {
	return c.Read + c.Write + c.Flush + c.Trim + c.WriteZeroes + c.Cache
}

// Stats is a snapshot of an Engine's counters. Counters are cumulative since
// New; QueueDepth and InFlight are instantaneous. It is a plain struct so
// that a metrics exporter can map it to Prometheus without this package
// depending on a metrics library.
type Stats struct {
	// Requests counts requests accepted by Submit (including those that
	// then failed in the backend; excluding those rejected up front).
	Requests OpCounts `json:"requests"`
	// Rejected counts requests failed by Submit without reaching the queue
	// (invalid, out of range, engine closed).
	Rejected uint64 `json:"rejected"`
	// BackendOps counts backend calls: a merged run of N requests is 1 op.
	BackendOps OpCounts `json:"backend_ops"`
	// Errors counts requests completed with an error.
	Errors uint64 `json:"errors"`
	// NoSpaceErrors counts those whose error was ENOSPC or EDQUOT from
	// the backend (the host filesystem under a thin volume is full).
	NoSpaceErrors uint64 `json:"no_space_errors"`
	// BytesRead and BytesWritten are payload bytes moved by backend
	// ReadvAt/WritevAt calls.
	BytesRead    uint64 `json:"bytes_read"`
	BytesWritten uint64 `json:"bytes_written"`
	// Merged counts requests that did not need a backend call of their
	// own: a merged run of N requests adds N-1.
	Merged uint64 `json:"merged"`
	// Held counts writes that the gathering policy delayed.
	Held uint64 `json:"held"`
	// GatherTimeouts counts runs of held writes released by their timed
	// backstop (GatherDelay, stretched by measurement or More, capped by
	// MaxGatherDelay) rather than because the submitters' queue or the
	// run was full, something waited for them, or Close.
	GatherTimeouts uint64 `json:"gather_timeouts"`
	// GatherHold is the current backstop for newly held writes (see the
	// package doc: twice the recent largest inter-arrival gap, within
	// [GatherDelay, MaxGatherDelay]); instantaneous.
	GatherHold time.Duration `json:"gather_hold_ns"`
	// Inlined counts Inline requests executed on the submitting goroutine
	// (no hand-off to a worker).
	Inlined uint64 `json:"inlined"`
	// QueueDepth is the number of requests submitted and not yet completed;
	// MaxQueueDepth the highest value seen.
	QueueDepth    int `json:"queue_depth"`
	MaxQueueDepth int `json:"max_queue_depth"`
	// InFlight is the number of backend calls running now; MaxInFlight the
	// highest seen (never above Config.Workers).
	InFlight    int `json:"in_flight"`
	MaxInFlight int `json:"max_in_flight"`
	// Latency is submit-to-completion time in nanoseconds, per request;
	// ReadLatency, WriteLatency and FlushLatency split it by kind.
	Latency      Histogram `json:"latency_ns"`
	ReadLatency  Histogram `json:"read_latency_ns"`
	WriteLatency Histogram `json:"write_latency_ns"`
	FlushLatency Histogram `json:"flush_latency_ns"`
	// WriteSizes and ReadSizes are bytes per backend call.
	WriteSizes Histogram `json:"write_sizes"`
	ReadSizes  Histogram `json:"read_sizes"`
}

// MergeRatio is data requests per data backend op (reads and writes only);
// 1 means no merging. It is 0 before any data op.
func (s Stats) MergeRatio() float64 {
	ops := s.BackendOps.Read + s.BackendOps.Write
	if ops == 0 {
		return 0
	}
	return float64(s.Requests.Read+s.Requests.Write) / float64(ops)
}

// MeanWriteSize is the mean size in bytes of backend write calls.
func (s Stats) MeanWriteSize() float64 {
	if s.BackendOps.Write == 0 {
		return 0
	}
	return float64(s.BytesWritten) / float64(s.BackendOps.Write)
}

// Histogram is a snapshot of a histogram with power-of-two bucket bounds.
//
// A fixed log2-bucket histogram is used rather than HdrHistogram because it
// records with one bits.Len64 and an increment (no allocation, cheap under
// the engine lock), and its buckets map one-to-one onto Prometheus
// histogram buckets. Precision is a factor of two, which is enough to see
// "4 KiB writes vs 1 MiB writes" or "µs vs ms latency".
type Histogram struct {
	// UpperBounds[i] is the inclusive upper bound of Counts[i]; Counts has
	// one more element, the +Inf bucket. Counts are not cumulative.
	UpperBounds []int64  `json:"upper_bounds"`
	Counts      []uint64 `json:"counts"`
	Count       uint64   `json:"count"`
	Sum         int64    `json:"sum"`
}

// Mean returns Sum/Count (0 if empty).
func (h Histogram) Mean() float64 {
	if h.Count == 0 {
		return 0
	}
	return float64(h.Sum) / float64(h.Count)
}

// Quantile returns the upper bound of the bucket holding quantile q (0..1):
// an overestimate by at most a factor of two. The +Inf bucket reports the
// largest finite bound.
func (h Histogram) Quantile(q float64) int64 {
	if h.Count == 0 || len(h.UpperBounds) == 0 {
		return 0
	}
	target := uint64(q * float64(h.Count))
	if target >= h.Count {
		target = h.Count - 1
	}
	var seen uint64
	for i, c := range h.Counts {
		seen += c
		if seen > target {
			if i < len(h.UpperBounds) {
				return h.UpperBounds[i]
			}
			break
		}
	}
	return h.UpperBounds[len(h.UpperBounds)-1]
}

// logHist is the recording side: bucket i holds values in
// (2^(minShift+i-1), 2^(minShift+i)], bucket 0 everything <= 2^minShift.
type logHist struct {
	minShift, n int // n finite buckets
	counts      [48]uint64
	count       uint64
	sum         int64
}

func newLogHist(minShift, maxShift int) logHist {
	return logHist{minShift: minShift, n: maxShift - minShift + 1}
}

func (h *logHist) record(v int64) {
	if v < 0 {
		v = 0
	}
	i := 0
	if v > 1 {
		i = bits.Len64(uint64(v-1)) - h.minShift
	}
	if i < 0 {
		i = 0
	}
	if i > h.n {
		i = h.n
	}
	h.counts[i]++
	h.count++
	h.sum += v
}

func (h *logHist) snapshot() Histogram {
	out := Histogram{
		UpperBounds: make([]int64, h.n),
		Counts:      make([]uint64, h.n+1),
		Count:       h.count,
		Sum:         h.sum,
	}
	for i := 0; i < h.n; i++ {
		out.UpperBounds[i] = 1 << (h.minShift + i)
	}
	copy(out.Counts, h.counts[:h.n+1])
	return out
}
