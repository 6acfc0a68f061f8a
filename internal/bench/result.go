package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"golang.org/x/sys/unix"
)

// Units. Throughput is reported in decimal megabytes per second
// (1 MB = 1,000,000 bytes) as CrystalDiskMark, fio's "MB/s" and GNOME Disks
// do; MiB/s (1,048,576 bytes) is carried alongside. bonnie++ tables use
// K/sec with K = 1024 bytes, as bonnie++ itself does.
const (
	MB  = 1000 * 1000
	MiB = 1024 * 1024
	KiB = 1024
)

// Metric says which number of a row is its headline, for compare and plots.
const (
	MetricMBps = "MB/s" // decimal megabytes per second, higher is better
	MetricIOPS = "IOPS" // operations per second, higher is better
	MetricMs   = "ms"   // mean latency in milliseconds, lower is better
)

// Latency summarises an HDR histogram, in microseconds.
type Latency struct {
	MeanUs float64 `json:"mean_us"`
	P50Us  float64 `json:"p50_us"`
	P99Us  float64 `json:"p99_us"`
	P999Us float64 `json:"p99_9_us"`
	MaxUs  float64 `json:"max_us"`
}

// OpResult is one row: one direction of one test.
type OpResult struct {
	Name    string  `json:"name"`
	Dir     string  `json:"dir"` // read or write
	RW      string  `json:"rw,omitempty"`
	BS      int     `json:"bs,omitempty"`
	QD      int     `json:"qd,omitempty"`
	Jobs    int     `json:"jobs,omitempty"`
	Ops     int64   `json:"ops"`
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
	MBps    float64 `json:"mb_per_s"`  // decimal: bytes / 1e6 / s
	MiBps   float64 `json:"mib_per_s"` // binary: bytes / 2^20 / s
	IOPS    float64 `json:"iops"`
	Lat     Latency `json:"latency"`
	CPU     float64 `json:"cpu_percent"`
	Metric  string  `json:"metric"`
	// Cached is set when the row most likely measured the page cache, not
	// the storage (a buffered read of a region smaller than RAM).
	Cached bool   `json:"served_from_cache,omitempty"`
	Note   string `json:"note,omitempty"`
}

func (r *OpResult) fill(h *hdrhistogram.Histogram) {
	if r.Seconds > 0 {
		r.MBps = float64(r.Bytes) / MB / r.Seconds
		r.MiBps = float64(r.Bytes) / MiB / r.Seconds
		r.IOPS = float64(r.Ops) / r.Seconds
	}
	if h != nil && h.TotalCount() > 0 {
		r.Lat = Latency{
			MeanUs: h.Mean() / 1e3,
			P50Us:  float64(h.ValueAtQuantile(50)) / 1e3,
			P99Us:  float64(h.ValueAtQuantile(99)) / 1e3,
			P999Us: float64(h.ValueAtQuantile(99.9)) / 1e3,
			MaxUs:  float64(h.Max()) / 1e3,
		}
	}
}

// Headline returns the row's main number and unit.
func (r OpResult) Headline() (float64, string) {
	switch r.Metric {
	case MetricIOPS:
		return r.IOPS, MetricIOPS
	case MetricMs:
		return r.Lat.MeanUs / 1e3, MetricMs
	}
	return r.MBps, MetricMBps
}

// Key identifies a row across results for compare.
func (r OpResult) Key() string { return r.Name + " " + r.Dir }

// GnomeSample is one point of the GNOME Disks transfer-rate curve.
type GnomeSample struct {
	Offset    int64   `json:"offset"`
	ReadMBps  float64 `json:"read_mb_per_s"`
	WriteMBps float64 `json:"write_mb_per_s,omitempty"`
}

// GnomeResult is the GNOME Disks summary (the summary rows GNOME Disks shows), rates
// in decimal MB/s.
type GnomeResult struct {
	Samples    []GnomeSample `json:"samples"`
	SampleSize int64         `json:"sample_size"`
	MinRead    float64       `json:"min_read_mb_per_s"`
	MaxRead    float64       `json:"max_read_mb_per_s"`
	AvgRead    float64       `json:"avg_read_mb_per_s"`
	MinWrite   float64       `json:"min_write_mb_per_s,omitempty"`
	MaxWrite   float64       `json:"max_write_mb_per_s,omitempty"`
	AvgWrite   float64       `json:"avg_write_mb_per_s,omitempty"`
	AccessMs   float64       `json:"avg_access_ms"`
	// Access holds every access-time read (position, latency) for the
	// scatter GNOME Disks draws under the rate line.
	Access []GnomeAccessPoint `json:"access,omitempty"`
}

// GnomeAccessPoint is one random access-time read.
type GnomeAccessPoint struct {
	Offset int64   `json:"offset"`
	Ms     float64 `json:"ms"`
}

// Env is the machine and software a result was measured on.
type Env struct {
	Kernel    string `json:"kernel"`
	Hostname  string `json:"hostname"`
	OS        string `json:"os"`
	Arch      string `json:"arch"`
	CPUs      int    `json:"cpus"`
	MemTotal  int64  `json:"mem_total_bytes"`
	GoVersion string `json:"go_version"`
	Args      string `json:"args,omitempty"`
}

// Result is one `vmsan bench` run, as written to JSON.
type Result struct {
	Schema   int            `json:"schema"`
	Tool     string         `json:"tool"`
	Profile  string         `json:"profile"`
	Started  time.Time      `json:"started"`
	Seconds  float64        `json:"seconds"`
	Target   TargetInfo     `json:"target"`
	Env      Env            `json:"env"`
	Params   map[string]any `json:"params,omitempty"`
	Ops      []OpResult     `json:"ops"`
	Gnome    *GnomeResult   `json:"gnome_disks,omitempty"`
	BonnieCS string         `json:"bonnie_csv,omitempty"`
	Notes    []string       `json:"notes,omitempty"`
	// Totals counts all I/O of the run, including unmeasured preparation.
	Totals Totals `json:"io_totals"`
}

// Row returns the row with the given key.
func (r *Result) Row(key string) (OpResult, bool) {
	for _, o := range r.Ops {
		if o.Key() == key {
			return o, true
		}
	}
	return OpResult{}, false
}

// CollectEnv describes this machine.
func CollectEnv() Env {
	e := Env{OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), MemTotal: MemTotal()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		e.Kernel = cstr(u.Sysname[:]) + " " + cstr(u.Release[:]) + " " + cstr(u.Version[:])
	}
	e.Hostname, _ = os.Hostname()
	e.Args = strings.Join(os.Args, " ")
	return e
}

func cstr(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// MemTotal is the machine's RAM in bytes (from /proc/meminfo), 0 if unknown.
func MemTotal() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && fs[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(fs[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

// Save writes r as indented JSON.
func (r *Result) Save(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// LoadResult reads a result written by Save.
func LoadResult(path string) (*Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("bench: %s: %w", path, err)
	}
	if r.Tool != ToolName {
		return nil, fmt.Errorf("bench: %s is not a vmsan bench result", path)
	}
	return &r, nil
}

// ToolName marks result files.
const ToolName = "vmsan bench"
