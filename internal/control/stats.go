package control

import (
	"github.com/vmsan/vmsan/internal/ioengine"
)

// EngineStats is a volume's I/O engine counters as the control API reports
// them: the raw snapshot plus the derived figures people look at first.
type EngineStats struct {
	Requests     uint64 `json:"requests"`
	BackendOps   uint64 `json:"backend_ops"`
	Merged       uint64 `json:"merged"`
	Errors       uint64 `json:"errors"`
	BytesRead    uint64 `json:"bytes_read"`
	BytesWritten uint64 `json:"bytes_written"`
	// MergeRatio is data requests per data backend op (1 = no merging).
	MergeRatio float64 `json:"merge_ratio"`
	// MeanWriteBytes is the mean backend write size (for small sequential writes it should be far
	// above the 4 KiB a guest sends).
	MeanWriteBytes float64 `json:"mean_write_bytes"`
	QueueDepth     int     `json:"queue_depth"`
	InFlight       int     `json:"in_flight"`
	// Latency percentiles in microseconds (bucket upper bounds: within 2x).
	LatencyP50us  float64        `json:"latency_p50_us"`
	LatencyP99us  float64        `json:"latency_p99_us"`
	LatencyMeanus float64        `json:"latency_mean_us"`
	Raw           ioengine.Stats `json:"raw"`
}

// EngineStatsOf derives the API figures from an engine snapshot.
func EngineStatsOf(s ioengine.Stats) EngineStats {
	return EngineStats{
		Requests:       s.Requests.Total(),
		BackendOps:     s.BackendOps.Total(),
		Merged:         s.Merged,
		Errors:         s.Errors,
		BytesRead:      s.BytesRead,
		BytesWritten:   s.BytesWritten,
		MergeRatio:     s.MergeRatio(),
		MeanWriteBytes: s.MeanWriteSize(),
		QueueDepth:     s.QueueDepth,
		InFlight:       s.InFlight,
		LatencyP50us:   float64(s.Latency.Quantile(0.5)) / 1e3,
		LatencyP99us:   float64(s.Latency.Quantile(0.99)) / 1e3,
		LatencyMeanus:  s.Latency.Mean() / 1e3,
		Raw:            s,
	}
}
