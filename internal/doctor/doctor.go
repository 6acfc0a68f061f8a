// Package doctor checks a host for the settings that decide how well (and
// how safely) it serves VM disks: the block device under the data
// directory, the filesystem, the volume files, thin provisioning, the
// network used by clients and the replication peer, and, on client hosts,
// dm-multipath and open-iscsi. `vmsan doctor` is a thin wrapper around Run.
//
// Simplest use:
//
//	rs := doctor.Run(doctor.RealHost(), doctor.Options{DataDir: "/var/lib/vmsan"})
//	doctor.WriteTable(os.Stdout, rs, 0)
//	if doctor.Failed(rs) { os.Exit(1) }
//
// Every check reads the kernel's view through Host: sysfs, procfs and /etc
// are read below Host.Root (so tests point it at a fake tree under
// testdata/), and the few things that need system calls (stat, statfs,
// FIEMAP, an O_DIRECT open, a TCP connect, the interface list) are function
// fields, replaced by fakes in tests. RealHost wires them to the running
// machine. The checks only read, with two exceptions: the O_DIRECT probe
// creates and removes a small temporary file in the data directory when no
// volume file exists to probe, and Options.History appends one free-space
// sample to <data_dir>/doctor-history.json.
//
// A check never panics or stops the run on an unreadable file: it reports
// what it could not read as its evidence (status warn), because a doctor
// that dies on the first odd host is no help on that host.
//
// Concurrency: Run is not meant to be called concurrently on one Host with
// fakes that share state; a Host built by RealHost is safe to share.
package doctor

import (
	"net"
	"path/filepath"
	"strings"
	"time"
)

// Status is a check's verdict.
type Status string

// The three statuses. Fail means "this loses data or will not work";
// warn means "this works but is slower or riskier than it should be, or
// could not be checked"; ok means the evidence shows nothing to fix.
const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "fail"
)

// Valid reports whether s is one of the three statuses.
func (s Status) Valid() bool { return s == OK || s == Warn || s == Fail }

// Result is one row of the report. Check is a stable identifier (e.g.
// "block.scheduler"); Subject names what was checked (a disk, a volume, an
// interface, a file) and may be empty. Fix is empty when Status is ok.
type Result struct {
	Check    string `json:"check"`
	Subject  string `json:"subject"`
	Status   Status `json:"status"`
	Evidence string `json:"evidence"`
	Fix      string `json:"fix"`
}

// Failed reports whether any result has status fail (`vmsan doctor` then
// exits 1).
func Failed(rs []Result) bool {
	for _, r := range rs {
		if r.Status == Fail {
			return true
		}
	}
	return false
}

// FileStat is what the checks need from stat(2).
type FileStat struct {
	Major, Minor uint32 // st_dev of the file (the filesystem's device)
	Size         int64  // apparent size
	Allocated    int64  // st_blocks * 512: bytes really allocated (sparse files)
	IsDir        bool
}

// FSStat is what the checks need from statfs(2).
type FSStat struct {
	Type   int64 // f_type magic
	Bsize  int64
	Blocks uint64 // total blocks
	Bavail uint64 // blocks available to unprivileged users
}

// Interface is a network interface as net.Interfaces reports it.
type Interface struct {
	Name     string
	MTU      int
	Up       bool
	Loopback bool
	Addrs    []net.IP
}

// Host is the machine under examination. Paths under /sys, /proc and /etc
// are read as filepath.Join(Root, path); the function fields do what needs
// a system call. A nil function field makes the checks that need it report
// warn ("not available"), never panic.
type Host struct {
	Root string

	Stat   func(path string) (FileStat, error)
	Statfs func(path string) (FSStat, error)
	// Extents counts the extents of a file (FIEMAP).
	Extents func(path string) (int, error)
	// NoCOW reports whether a file has the no-copy-on-write attribute
	// (chattr +C, meaningful on btrfs).
	NoCOW func(path string) (bool, error)
	// DirectIO checks that path can be opened with O_DIRECT and read (an
	// existing file) or, with create, that a new file in the directory
	// path can be created, written and read with O_DIRECT.
	DirectIO func(path string, create bool) error
	// Connect opens a TCP connection to addr and returns how long the
	// handshake took (a round-trip time).
	Connect func(addr string, timeout time.Duration) (time.Duration, error)
	// Interfaces lists network interfaces with their addresses.
	Interfaces func() ([]Interface, error)
	// SourceIP returns the local address the kernel would use to reach
	// addr (a route lookup).
	SourceIP func(addr string) (net.IP, error)
	Now      func() time.Time
}

// path maps an absolute host path (e.g. "/sys/block") below Root.
func (h Host) path(p string) string {
	if h.Root == "" {
		return p
	}
	return filepath.Join(h.Root, p)
}

// readFile reads a small host file below Root, trimmed. Files in sysfs and
// procfs are a page at most; the bound keeps a fake tree from making us
// read a huge file.
func (h Host) readFile(p string) (string, error) {
	s, err := h.readFileN(p, 64<<10)
	return strings.TrimSpace(s), err
}

func (h Host) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

// Repl is one replicated volume's link settings, from
// <data_dir>/repl/<volume>/config.json or from the configuration file.
type Repl struct {
	Volume      string
	Listen      string
	Peer        string
	Protocol    string
	PingTimeout time.Duration
	KoTimeout   time.Duration
	ResyncRate  int64 // bytes per second, 0 = unlimited
}

// Options says what to check.
type Options struct {
	// DataDir is the vmsan data directory (volumes, replication settings).
	DataDir string
	// DataDirGiven: the user named DataDir (--data-dir, a config's
	// data_dir), so it not existing fails the datadir check; the default
	// one may not exist yet (checking a host before the first serve).
	DataDirGiven bool
	// Peer, when set (HOST:PORT), is the replication peer to measure.
	Peer string
	// Listen are the daemon's client listen addresses (from its
	// configuration); "unix:" addresses are ignored.
	Listen []string
	// Repl are replication settings from the configuration file, in
	// addition to those found in DataDir.
	Repl []Repl
	// History records a free-space sample in DataDir and reports the
	// trend over the samples recorded by earlier runs.
	History bool
	// OvercommitWarn is the ratio of possible growth of the thin volumes
	// to free space above which thin.overcommit warns (0: 1.0).
	OvercommitWarn float64
	// Probes is the number of TCP connects to the peer (0: 5).
	Probes int
}

// Run runs every check and returns one or more results per check, in a
// stable order.
func Run(h Host, o Options) []Result {
	if o.OvercommitWarn <= 0 {
		o.OvercommitWarn = 1.0
	}
	if o.Probes <= 0 {
		o.Probes = 5
	}
	e := newEnv(h, o)
	var rs []Result
	rs = append(rs, e.dataDirCheck())
	rs = append(rs, e.blockChecks()...)
	rs = append(rs, e.fsChecks()...)
	rs = append(rs, e.volumeChecks()...)
	rs = append(rs, e.thinChecks()...)
	rs = append(rs, e.netChecks()...)
	rs = append(rs, e.replChecks()...)
	rs = append(rs, e.multipathCheck(), e.iscsiCheck())
	return rs
}
