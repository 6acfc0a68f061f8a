package bench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"github.com/vmsan/vmsan/internal/backend"
)

// Target is something a benchmark reads and writes: a file, a block device,
// an NBD export, an iSCSI LUN.
//
// Queue depth: the runner keeps QD requests in flight by calling ReadAt and
// WriteAt from QD goroutines at once. Every Target must be safe for that and
// must not serialise the calls (the file target issues concurrent
// pread/pwrite; the NBD target pipelines them on its connections).
type Target interface {
	// ReadAt and WriteAt transfer exactly len(p) bytes at off or fail.
	// REQUIRES: off and len(p) are multiples of Align(), and, when Align() > 1,
	// p starts at an Align()-aligned address (use AlignedBuf).
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// Flush makes every completed write durable (fsync / NBD_CMD_FLUSH).
	Flush() error
	// Size is the usable size in bytes.
	Size() int64
	// Align is the required alignment of offsets, lengths and buffers (1 = none).
	Align() int
	// MaxIO is the largest single request the target accepts (0 = no limit).
	MaxIO() int
	// Info describes the target for the result's environment section.
	Info() TargetInfo
	// Close releases the target (and removes a scratch file it created).
	Close() error
}

// TargetInfo is recorded in every result: it is what explains the numbers.
type TargetInfo struct {
	URI      string `json:"uri"`
	Kind     string `json:"kind"` // file, blockdev, nbd, iscsi
	Size     int64  `json:"size_bytes"`
	Direct   bool   `json:"o_direct"`
	ReadOnly bool   `json:"read_only"`
	// Created is true when the benchmark created the file (it then holds no
	// user data and is removed afterwards unless --keep).
	Created    bool   `json:"created,omitempty"`
	Filesystem string `json:"filesystem,omitempty"`
	Device     string `json:"device,omitempty"`
	// Queue holds /sys/block/<dev>/queue settings of the device under the
	// target: rotational, scheduler, read_ahead_kb, max_sectors_kb, ...
	Queue map[string]string `json:"block_queue,omitempty"`
	NBD   *NBDInfo          `json:"nbd,omitempty"`
	ISCSI *ISCSIInfo        `json:"iscsi,omitempty"`
}

// NBDInfo is what was negotiated with an NBD server.
type NBDInfo struct {
	Export            string   `json:"export"`
	Flags             []string `json:"transmission_flags"`
	Connections       int      `json:"connections"`
	TLS               bool     `json:"tls"`
	StructuredReplies bool     `json:"structured_replies"`
	MinBlock          uint32   `json:"min_block"`
	PrefBlock         uint32   `json:"pref_block"`
	MaxBlock          uint32   `json:"max_block"`
}

// TargetOptions control how a target is opened.
type TargetOptions struct {
	Direct   bool  // O_DIRECT for files and devices
	ReadOnly bool  // open read-only; write tests are refused
	Force    bool  // allow writes over existing data / mounted-check override is never allowed
	Size     int64 // size of a scratch file to create (files only)
	Keep     bool  // keep a created scratch file
	// Connections is the number of NBD connections (0: as many as useful
	// when the server advertises CAN_MULTI_CONN, else 1).
	Connections int
	// TLS material for nbds:// (paths); empty CA means system roots.
	TLSCA, TLSCert, TLSKey string
	TLSInsecure            bool
}

// Opener opens a target for a URI of one scheme.
type Opener func(ctx context.Context, u *url.URL, raw string, o TargetOptions) (Target, error)

var (
	schemesMu sync.RWMutex
	schemes   = map[string]Opener{}
)

// RegisterScheme plugs a target kind in (nbd, nbds, iscsi, ...). Later
// registrations replace earlier ones. Safe for concurrent use.
func RegisterScheme(scheme string, op Opener) {
	schemesMu.Lock()
	defer schemesMu.Unlock()
	schemes[scheme] = op
}

// ErrNeedForce is returned when a write benchmark would overwrite data.
var ErrNeedForce = errors.New("bench: target holds data; refusing to write without --force")

// OpenTarget opens spec, which is a path (file, directory or block device)
// or a URI with a registered scheme.
func OpenTarget(ctx context.Context, spec string, o TargetOptions) (Target, error) {
	if i := strings.Index(spec, "://"); i > 0 {
		scheme := strings.ToLower(spec[:i])
		schemesMu.RLock()
		op := schemes[scheme]
		schemesMu.RUnlock()
		if op == nil {
			return nil, fmt.Errorf("bench: unsupported target scheme %q (have: file paths, nbd://, nbds://, nbd+unix://, nbds+unix://, iscsi://)", scheme)
		}
		u, err := url.Parse(spec)
		if err != nil {
			if scheme != "iscsi" {
				return nil, fmt.Errorf("bench: bad target URI: %w", err)
			}
			// libiscsi's iscsi://user%secret@host/... is not RFC 3986
			// (a bare '%'); the iscsi opener parses the raw string.
			u = &url.URL{Scheme: scheme}
		}
		return op(ctx, u, spec, o)
	}
	return openFile(spec, o)
}

// checkWritable refuses a write benchmark on a target that holds data.
// probe reads the first bytes of the target; any non-zero byte counts as
// data (a filesystem superblock, a partition table, a VM's boot sector).
func checkWritable(t Target, force bool) error {
	in := t.Info()
	if in.ReadOnly {
		return errors.New("bench: target is read-only; this test writes (drop --read-only or pick read tests)")
	}
	if in.Created || force {
		return nil
	}
	n := int64(1 << 20)
	if n > t.Size() {
		n = t.Size()
	}
	if n <= 0 {
		return nil
	}
	al := int64(t.Align())
	n = n / al * al
	if n == 0 {
		return nil
	}
	buf := backend.AlignedBuf(int(n), int(al))
	if mx := int64(t.MaxIO()); mx > 0 && mx < n {
		buf = buf[:mx/al*al]
	}
	if _, err := t.ReadAt(buf, 0); err != nil {
		return fmt.Errorf("bench: probing target for existing data: %w", err)
	}
	for _, b := range buf {
		if b != 0 {
			return ErrNeedForce
		}
	}
	return nil
}
