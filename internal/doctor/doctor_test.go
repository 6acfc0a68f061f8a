package doctor

import (
	"encoding/json"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/repl/driver"
	"github.com/vmsan/vmsan/internal/replset"
	"github.com/vmsan/vmsan/internal/volume"
)

// fake is the syscall side of a test host; the file side is a tree copied
// from testdata.
type fake struct {
	major, minor uint32
	fs           FSStat
	extents      map[string]int   // by volume name
	alloc        map[string]int64 // by volume name
	nocow        map[string]bool  // by base name (volume name or "volumes")
	dio          error
	rtts         []time.Duration
	connErr      error
	ifs          []Interface
	src          net.IP
	now          time.Time
}

const tib = 1 << 40

func newFake() *fake {
	return &fake{
		major: 8, minor: 1,
		fs:      FSStat{Type: magicExt4, Bsize: 4096, Blocks: tib / 4096, Bavail: 500 * gib / 4096},
		extents: map[string]int{}, alloc: map[string]int64{}, nocow: map[string]bool{},
		now: time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC),
	}
}

func volName(p string) string { return strings.TrimSuffix(filepath.Base(p), ".raw") }

func (f *fake) host(root string) Host {
	return Host{
		Root: root,
		Stat: func(p string) (FileStat, error) {
			if strings.HasSuffix(p, ".raw") {
				return FileStat{Major: f.major, Minor: f.minor, Allocated: f.alloc[volName(p)]}, nil
			}
			return FileStat{Major: f.major, Minor: f.minor, IsDir: true}, nil
		},
		Statfs:  func(string) (FSStat, error) { return f.fs, nil },
		Extents: func(p string) (int, error) { return f.extents[volName(p)], nil },
		NoCOW:   func(p string) (bool, error) { return f.nocow[volName(p)], nil },
		DirectIO: func(string, bool) error {
			return f.dio
		},
		Connect: func(string, time.Duration) (time.Duration, error) {
			if f.connErr != nil {
				return 0, f.connErr
			}
			if len(f.rtts) == 0 {
				return 0, syscall.ECONNREFUSED
			}
			d := f.rtts[0]
			if len(f.rtts) > 1 {
				f.rtts = f.rtts[1:]
			}
			return d, nil
		},
		Interfaces: func() ([]Interface, error) {
			return append([]Interface{{Name: "lo", MTU: 65536, Up: true, Loopback: true, Addrs: []net.IP{net.ParseIP("127.0.0.1")}}}, f.ifs...), nil
		},
		SourceIP: func(string) (net.IP, error) {
			if f.src == nil {
				return nil, errors.New("no route")
			}
			return f.src, nil
		},
		Now: func() time.Time { return f.now },
	}
}

// copyTree copies testdata/name to a temporary root, keeping symbolic
// links, and puts dataDir in place of @DATA@ in mountinfo.
func copyTree(t *testing.T, name, dataDir string) string {
	t.Helper()
	src := filepath.Join("testdata", name)
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, out)
		case d.IsDir():
			return os.MkdirAll(out, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		esc := strings.ReplaceAll(dataDir, " ", `\040`)
		return os.WriteFile(out, []byte(strings.ReplaceAll(string(b), "@DATA@", esc)), 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

func writeVol(t *testing.T, dataDir string, m volume.Meta) {
	t.Helper()
	vd := filepath.Join(dataDir, volume.VolumesDir)
	if err := os.MkdirAll(vd, 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(vd, m.Name+".json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vd, m.Name+".raw"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

func vm(name string, size int64, c backend.CacheMode, rot bool) volume.Meta {
	return volume.Meta{Version: 1, Name: name, Size: size, Cache: c, Rotational: rot}
}

// fixture is one test host: a tree, a data directory with volumes, the
// fake syscalls and the options.
type fixture struct {
	t       *testing.T
	dataDir string
	f       *fake
	o       Options
}

func (x *fixture) vol(m volume.Meta) { writeVol(x.t, x.dataDir, m) }

type checkCase struct {
	name    string
	tree    string
	check   string
	subject string // "" matches the first row of the check
	setup   func(x *fixture)
	want    Status
	ev      string // substring the evidence must contain
	fix     string // substring the fix must contain
}

func runCase(t *testing.T, c checkCase) {
	dataDir := filepath.Join(t.TempDir(), "vmsan data")
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	x := &fixture{t: t, dataDir: dataDir, f: newFake(), o: Options{DataDir: dataDir}}
	if c.setup != nil {
		c.setup(x)
	}
	root := copyTree(t, c.tree, dataDir)
	rs := Run(x.f.host(root), x.o)
	for _, r := range rs {
		if !r.Status.Valid() {
			t.Errorf("row %+v: invalid status", r)
		}
		if r.Status != OK && r.Fix == "" {
			t.Errorf("row %+v: not ok but no fix", r)
		}
	}
	for _, r := range rs {
		if r.Check != c.check || (c.subject != "" && r.Subject != c.subject) {
			continue
		}
		if r.Status != c.want {
			t.Fatalf("%s %s: status %s, want %s\nevidence: %s\nfix: %s", r.Check, r.Subject, r.Status, c.want, r.Evidence, r.Fix)
		}
		if !strings.Contains(r.Evidence, c.ev) {
			t.Errorf("evidence %q lacks %q", r.Evidence, c.ev)
		}
		if !strings.Contains(r.Fix, c.fix) {
			t.Errorf("fix %q lacks %q", r.Fix, c.fix)
		}
		return
	}
	var got []string
	for _, r := range rs {
		got = append(got, r.Check+"/"+r.Subject)
	}
	t.Fatalf("no row %s/%s in %v", c.check, c.subject, got)
}

var (
	wbVol   = func(x *fixture) { x.vol(vm("vm1", 10*gib, backend.CacheWriteback, true)) }
	noneVol = func(x *fixture) { x.vol(vm("vm1", 10*gib, backend.CacheNone, true)) }
	eth1    = func(mtu int, up bool) Interface {
		return Interface{Name: "eth1", MTU: mtu, Up: up, Addrs: []net.IP{net.ParseIP("10.0.0.1")}}
	}
	withPeer = func(x *fixture, rtt time.Duration) {
		x.o.Peer = "10.0.0.2:7789"
		x.f.rtts = []time.Duration{rtt}
		x.f.ifs = []Interface{eth1(9000, true)}
		x.f.src = net.ParseIP("10.0.0.1")
	}
	history = func(x *fixture, ago time.Duration, avail int64) {
		x.o.History = true
		b, _ := json.Marshal([]sample{{T: x.f.now.Add(-ago), Avail: avail}})
		if err := os.WriteFile(filepath.Join(x.dataDir, HistoryFile), b, 0o644); err != nil {
			x.t.Fatal(err)
		}
	}
)

func checkCases() []checkCase {
	return []checkCase{
		// block.device: the stack under the data directory.
		{name: "partition", tree: "good", check: "block.device", want: OK, ev: "sda1 on sda"},
		{name: "dm over nvme by mapper name", tree: "dm-nvme", check: "block.device", want: OK, ev: "dm-0 (vg-data) over nvme0n1, nvme1n1",
			setup: func(x *fixture) { x.f.major, x.f.minor = 0, 0 }},
		{name: "btrfs anonymous dev", tree: "btrfs", check: "block.device", want: OK, ev: "sdb",
			setup: func(x *fixture) { x.f.major, x.f.minor = 0, 27 }},
		{name: "loop device", tree: "loop", check: "block.device", want: OK, ev: "loop3 is a loop device over /var/tmp/ext4.img",
			setup: func(x *fixture) { x.f.major, x.f.minor = 7, 3 }},
		{name: "overlay", tree: "overlay", check: "block.device", want: Warn, ev: "no block device", fix: "ext4 or xfs",
			setup: func(x *fixture) { x.f.major, x.f.minor = 0, 120 }},

		{name: "rotational matches", tree: "good", check: "block.rotational", want: OK, setup: wbVol},
		{name: "rotational mismatch", tree: "good", check: "block.rotational", want: Warn, ev: "vm1 advertise rotational=false",
			fix: "vmsan volume set vm1 --rotational=true", setup: func(x *fixture) { x.vol(vm("vm1", gib, backend.CacheWriteback, false)) }},
		{name: "nvme leaf, non-rotational volume", tree: "dm-nvme", check: "block.rotational", subject: "nvme1n1", want: OK,
			setup: func(x *fixture) { x.f.major = 0; x.vol(vm("vm1", gib, backend.CacheNone, false)) }},

		{name: "hdd mq-deadline", tree: "good", check: "block.scheduler", want: OK},
		{name: "hdd none", tree: "bad", check: "block.scheduler", want: Warn, fix: "echo mq-deadline > /sys/block/sda/queue/scheduler"},
		{name: "nvme none", tree: "dm-nvme", check: "block.scheduler", subject: "nvme1n1", want: OK, setup: func(x *fixture) { x.f.major = 0 }},
		{name: "loop device without scheduler", tree: "loop", check: "block.scheduler", subject: "loop3", want: OK, ev: "loop device over /var/tmp/ext4.img",
			setup: func(x *fixture) { x.f.major, x.f.minor = 7, 3 }},
		{name: "nvme bfq", tree: "dm-nvme-bfq", check: "block.scheduler", subject: "nvme1n1", want: Warn, fix: "echo none > /sys/block/nvme1n1/queue/scheduler",
			setup: func(x *fixture) { x.f.major = 0 }},

		{name: "read-ahead 512", tree: "good", check: "block.read_ahead_kb", want: OK, setup: wbVol},
		{name: "read-ahead 16384", tree: "bad", check: "block.read_ahead_kb", want: Warn, fix: "echo 512 > /sys/block/sda/queue/read_ahead_kb", setup: wbVol},
		{name: "read-ahead 16384 but O_DIRECT volumes", tree: "bad", check: "block.read_ahead_kb", want: OK, ev: "cache=none", setup: noneVol},
		{name: "read-ahead on the dm device", tree: "dm-nvme", check: "block.read_ahead_kb", subject: "dm-0", want: OK, setup: func(x *fixture) { x.f.major = 0 }},

		{name: "nr_requests 64", tree: "good", check: "block.nr_requests", want: OK},
		{name: "nr_requests 16", tree: "bad", check: "block.nr_requests", want: Warn, fix: "echo 128 > /sys/block/sda/queue/nr_requests"},

		{name: "max_sectors 1280", tree: "good", check: "block.max_sectors_kb", want: OK},
		{name: "max_sectors 128", tree: "bad", check: "block.max_sectors_kb", want: Warn, fix: "echo 1024 > /sys/block/sda/queue/max_sectors_kb"},
		{name: "max_sectors at hw limit", tree: "dm-nvme", check: "block.max_sectors_kb", subject: "nvme0n1", want: OK, setup: func(x *fixture) { x.f.major = 0 }},

		{name: "write back cache, cache=none", tree: "good", check: "block.write_cache", want: OK, setup: noneVol},
		{name: "write back cache on hdd, writethrough", tree: "good", check: "block.write_cache", want: Warn, ev: "~100 writes/s",
			fix: "vmsan volume set vm1 --cache none", setup: func(x *fixture) { x.vol(vm("vm1", gib, backend.CacheWritethrough, true)) }},
		{name: "write back cache on nvme, writethrough", tree: "dm-nvme", check: "block.write_cache", subject: "nvme0n1", want: OK,
			setup: func(x *fixture) { x.f.major = 0; x.vol(vm("vm1", gib, backend.CacheWritethrough, false)) }},

		{name: "ext4", tree: "good", check: "fs.type", want: OK, ev: "ext2/3/4"},
		{name: "tmpfs", tree: "good", check: "fs.type", want: Fail, fix: "disk filesystem", setup: func(x *fixture) { x.f.fs.Type = magicTmpfs }},
		{name: "overlay fs", tree: "overlay", check: "fs.type", want: Warn, setup: func(x *fixture) { x.f.fs.Type = magicOverlay }},
		{name: "btrfs without +C", tree: "btrfs", check: "fs.type", want: Warn, fix: "chattr +C",
			setup: func(x *fixture) { x.f.major = 0; x.f.fs.Type = magicBtrfs; wbVol(x) }},
		{name: "btrfs with +C", tree: "btrfs", check: "fs.type", want: OK,
			setup: func(x *fixture) {
				x.f.major = 0
				x.f.fs.Type = magicBtrfs
				x.f.nocow["volumes"], x.f.nocow["vm1"] = true, true
				wbVol(x)
			}},

		{name: "barriers on", tree: "good", check: "fs.barrier", want: OK},
		{name: "nobarrier", tree: "bad", check: "fs.barrier", want: Fail, ev: "nobarrier", fix: "mount -o remount,barrier /"},
		{name: "barrier on mount with escaped space", tree: "btrfs", check: "fs.barrier", want: OK, ev: "btrfs /dev/sdb"},

		{name: "O_DIRECT works", tree: "good", check: "fs.o_direct", want: OK, setup: noneVol},
		{name: "O_DIRECT refused, cache=none", tree: "good", check: "fs.o_direct", want: Fail, fix: "vmsan volume set vm1 --cache writeback",
			setup: func(x *fixture) { noneVol(x); x.f.dio = syscall.EINVAL }},
		{name: "O_DIRECT, no data directory: not probed", tree: "good", check: "fs.o_direct", want: OK, ev: "not probed",
			setup: func(x *fixture) {
				x.o.DataDir = filepath.Join(x.dataDir, "missing")
				x.f.dio = errors.New("must not be called")
			}},
		{name: "peer with zero timeouts takes the defaults", tree: "good", check: "repl.link", want: OK, ev: "ping_timeout 6s, ko 10s",
			setup: func(x *fixture) {
				withPeer(x, time.Millisecond)
				x.o.Repl = []Repl{{Volume: "v", Peer: "10.0.0.2:7789"}}
			}},
		{name: "O_DIRECT refused, no cache=none", tree: "good", check: "fs.o_direct", want: Warn,
			setup: func(x *fixture) { wbVol(x); x.f.dio = syscall.EINVAL }},

		{name: "few extents", tree: "good", check: "volume.fragmentation", subject: "vm1", want: OK,
			setup: func(x *fixture) { wbVol(x); x.f.alloc["vm1"], x.f.extents["vm1"] = 4*gib, 40 }},
		{name: "many extents", tree: "good", check: "volume.fragmentation", subject: "vm1", want: Warn, ev: "1250 per GiB", fix: "e4defrag",
			setup: func(x *fixture) { wbVol(x); x.f.alloc["vm1"], x.f.extents["vm1"] = 4*gib, 5000 }},

		{name: "writeback", tree: "good", check: "volume.cache", subject: "vm1", want: OK, setup: wbVol},
		{name: "unsafe", tree: "good", check: "volume.cache", subject: "vm1", want: Warn, ev: "FLUSH and FUA are ignored", fix: "--cache writeback",
			setup: func(x *fixture) { x.vol(vm("vm1", gib, backend.CacheUnsafe, true)) }},
		{name: "protocol A", tree: "good", check: "volume.cache", subject: "vm1", want: Warn, fix: "--protocol C",
			setup: func(x *fixture) { wbVol(x); x.o.Repl = []Repl{{Volume: "vm1", Protocol: "A"}} }},

		{name: "fully backed", tree: "good", check: "thin.overcommit", want: OK,
			setup: func(x *fixture) { x.vol(vm("vm1", 100*gib, backend.CacheNone, true)) }},
		{name: "overcommitted", tree: "good", check: "thin.overcommit", want: Warn, ev: "1.20× free space", fix: "fallocate -l SIZE",
			setup: func(x *fixture) {
				x.vol(vm("vm1", 400*gib, backend.CacheNone, true))
				x.vol(vm("vm2", 300*gib, backend.CacheNone, true))
				x.f.alloc["vm2"] = 100 * gib
			}},
		{name: "overcommitted and nearly full", tree: "good", check: "thin.overcommit", want: Fail, ev: "less than 5% free",
			setup: func(x *fixture) { x.vol(vm("vm1", 400*gib, backend.CacheNone, true)); x.f.fs.Bavail = 10 * gib / 4096 }},

		{name: "trend stable", tree: "good", check: "thin.trend", want: OK, ev: "stable",
			setup: func(x *fixture) { history(x, 48*time.Hour, 500*gib) }},
		{name: "trend full in 20 days", tree: "good", check: "thin.trend", want: Warn, ev: "full in about 20.0 days",
			setup: func(x *fixture) { history(x, 48*time.Hour, 550*gib) }},
		{name: "trend full tomorrow", tree: "good", check: "thin.trend", want: Fail,
			setup: func(x *fixture) { history(x, 48*time.Hour, 1500*gib) }},
		{name: "trend first sample", tree: "good", check: "thin.trend", want: OK, ev: "1 sample(s)",
			setup: func(x *fixture) { x.o.History = true }},

		{name: "listener on jumbo interface", tree: "good", check: "net.mtu", subject: "eth1", want: OK, ev: "listen 10.0.0.1:10809",
			setup: func(x *fixture) { x.o.Listen = []string{"10.0.0.1:10809"}; x.f.ifs = []Interface{eth1(9000, true)} }},
		{name: "wildcard listener, 1500", tree: "good", check: "net.mtu", subject: "eth1", want: Warn, ev: "10000 Mb/s", fix: "ip link set dev eth1 mtu 9000",
			setup: func(x *fixture) {
				x.o.Listen = []string{"0.0.0.0:10809", "unix:/run/x"}
				x.f.ifs = []Interface{eth1(1500, true)}
			}},
		{name: "peer interface down", tree: "good", check: "net.mtu", subject: "eth1", want: Fail, ev: "peer 10.0.0.2:7789",
			setup: func(x *fixture) { withPeer(x, time.Millisecond); x.f.ifs = []Interface{eth1(9000, false)} }},
		{name: "loopback only", tree: "good", check: "net.mtu", want: OK, ev: "no listener",
			setup: func(x *fixture) { x.o.Listen = []string{"127.0.0.1:10809"} }},

		{name: "default-size buffers", tree: "good", check: "net.tcp_buffers", want: OK},
		{name: "1 MiB buffers", tree: "bad", check: "net.tcp_buffers", want: Warn, fix: "net.ipv4.tcp_rmem"},
		{name: "long fat peer link", tree: "good", check: "net.tcp_buffers", want: Warn, ev: "bandwidth-delay",
			setup: func(x *fixture) { withPeer(x, 20*time.Millisecond) }},

		{name: "no peer", tree: "good", check: "repl.link", want: OK, ev: "no --peer"},
		{name: "lan peer", tree: "good", check: "repl.link", want: OK, ev: "ping_timeout 6s", setup: func(x *fixture) { withPeer(x, 200*time.Microsecond) }},
		{name: "slow peer, default timeouts", tree: "good", check: "repl.link", want: Warn, fix: "--ping-timeout",
			setup: func(x *fixture) { withPeer(x, 200*time.Millisecond) }},
		{name: "slow peer, long timeouts from repl/config.json", tree: "good", check: "repl.link", want: OK, ev: "settings of volume vm1",
			setup: func(x *fixture) {
				withPeer(x, 200*time.Millisecond)
				wbVol(x)
				err := driver.SaveSettings(driver.Dir(x.dataDir, "vm1"), driver.Settings{Listen: "10.0.0.1:7789", Peer: "10.0.0.2:7789",
					NodeID: 1, PingTimeout: replset.Duration(60 * time.Second), KoTimeout: replset.Duration(100 * time.Second)})
				if err != nil {
					x.t.Fatal(err)
				}
			}},
		{name: "peer slower than the timeouts", tree: "good", check: "repl.link", want: Fail, setup: func(x *fixture) { withPeer(x, 2*time.Second) }},
		{name: "peer unreachable", tree: "good", check: "repl.link", want: Fail, fix: "TCP port 7789",
			setup: func(x *fixture) { withPeer(x, 0); x.f.connErr = syscall.ECONNREFUSED }},

		{name: "resync limited", tree: "good", check: "repl.bandwidth", want: OK, ev: "eth1 at 10000 Mb/s",
			setup: func(x *fixture) {
				withPeer(x, time.Millisecond)
				x.o.Repl = []Repl{{Volume: "vm1", Peer: "10.0.0.2:7789", Protocol: "C", PingTimeout: 6 * time.Second, KoTimeout: 10 * time.Second, ResyncRate: 100 << 20}}
			}},
		{name: "resync unlimited", tree: "good", check: "repl.bandwidth", want: Warn, fix: "--resync-rate 834M",
			setup: func(x *fixture) { withPeer(x, time.Millisecond) }},

		{name: "multipath good", tree: "good", check: "client.multipath", want: OK, ev: "no_path_retry 12"},
		{name: "multipath wrong section", tree: "bad", check: "client.multipath", want: Warn, ev: "path_grouping_policy multibus", fix: `hardware_handler "1 alua"`},
		{name: "multipath no section", tree: "nosection", check: "client.multipath", want: Warn, ev: "no device section for vendor VMSAN"},
		{name: "multipath absent", tree: "overlay", check: "client.multipath", want: OK, ev: "not present"},

		{name: "iscsid good", tree: "good", check: "client.iscsi", want: OK, ev: "replacement_timeout 2"},
		{name: "iscsid defaults", tree: "bad", check: "client.iscsi", want: Warn, ev: "noop_out_timeout 5 (default)",
			fix: "iscsiadm -m node -o update -n node.session.timeo.replacement_timeout -v 2"},
		{name: "iscsid absent", tree: "overlay", check: "client.iscsi", want: OK, ev: "not present"},
	}
}

func TestChecks(t *testing.T) {
	for _, c := range checkCases() {
		t.Run(c.name, func(t *testing.T) { runCase(t, c) })
	}
}

// TestEveryCheckHasBothOutcomes keeps the table honest: every check Run
// emits (but the datadir summary row) has an ok case and a warn or fail
// case in checkCases.
func TestEveryCheckHasBothOutcomes(t *testing.T) {
	x := &fixture{t: t, dataDir: t.TempDir(), f: newFake()}
	rs := Run(x.f.host(copyTree(t, "good", x.dataDir)), Options{DataDir: x.dataDir, Peer: "10.0.0.2:1"})
	ok, bad := map[string]bool{}, map[string]bool{}
	for _, c := range checkCases() {
		if c.want == OK {
			ok[c.check] = true
		} else {
			bad[c.check] = true
		}
	}
	for _, r := range rs {
		if r.Check == "datadir" {
			continue
		}
		if !ok[r.Check] || !bad[r.Check] {
			t.Errorf("check %s: ok case %v, failing case %v", r.Check, ok[r.Check], bad[r.Check])
		}
	}
}

func TestDataDirUnreadableMeta(t *testing.T) {
	dir := t.TempDir()
	writeVol(t, dir, vm("vm1", gib, backend.CacheNone, false))
	if err := os.WriteFile(filepath.Join(dir, "volumes", "vm2.json"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := newFake()
	rs := Run(f.host(copyTree(t, "good", dir)), Options{DataDir: dir})
	if rs[0].Check != "datadir" || rs[0].Status != Warn || !strings.Contains(rs[0].Evidence, "vm2.json") {
		t.Fatalf("got %+v", rs[0])
	}
}

func TestDataDirMissingUsesParent(t *testing.T) {
	parent := t.TempDir()
	f := newFake()
	rs := Run(f.host(copyTree(t, "good", parent)), Options{DataDir: filepath.Join(parent, "not", "yet")})
	if rs[0].Status != OK || !strings.Contains(rs[0].Evidence, "does not exist") {
		t.Fatalf("got %+v", rs[0])
	}
}

func TestHistoryRecorded(t *testing.T) {
	dir := t.TempDir()
	f := newFake()
	root := copyTree(t, "good", dir)
	for i := 0; i < 3; i++ {
		Run(f.host(root), Options{DataDir: dir, History: true})
		f.now = f.now.Add(30 * time.Second) // the second run adds no sample (within a minute)
	}
	var hist []sample
	if err := readJSON(filepath.Join(dir, HistoryFile), &hist); err != nil {
		t.Fatal(err)
	}
	if len(hist) != 2 {
		t.Fatalf("%d samples, want 2", len(hist))
	}
}

func TestNilSeamsDoNotPanic(t *testing.T) {
	dir := t.TempDir()
	writeVol(t, dir, vm("vm1", gib, backend.CacheNone, false))
	rs := Run(Host{Root: copyTree(t, "bad", dir)}, Options{DataDir: dir, Peer: "10.0.0.2:7789", History: true, Listen: []string{"0.0.0.0:1"}})
	for _, r := range rs {
		if !r.Status.Valid() || r.Check == "" {
			t.Errorf("bad row %+v", r)
		}
	}
}

// TestRealHost runs every check against this machine: no assertion on
// the verdicts (they depend on the machine), only that every check
// produced well-formed rows.
func TestRealHost(t *testing.T) {
	dir := t.TempDir()
	writeVol(t, dir, vm("vm1", gib, backend.CacheNone, false))
	writeVol(t, dir, vm("vm2", gib, backend.CacheUnsafe, true))
	if err := os.WriteFile(filepath.Join(dir, "volumes", "vm1.raw"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	rs := Run(RealHost(), Options{DataDir: dir, Peer: ln.Addr().String(), History: true, Listen: []string{"0.0.0.0:10809"}})
	want := []string{"datadir", "block.device", "fs.type", "fs.barrier", "fs.o_direct", "volume.fragmentation", "volume.cache",
		"thin.overcommit", "thin.trend", "net.mtu", "net.tcp_buffers", "repl.link", "repl.bandwidth", "client.multipath", "client.iscsi"}
	got := map[string]bool{}
	for _, r := range rs {
		got[r.Check] = true
		if !r.Status.Valid() {
			t.Errorf("row %+v: invalid status", r)
		}
		if r.Evidence == "" {
			t.Errorf("row %+v: no evidence", r)
		}
		if r.Status != OK && r.Fix == "" {
			t.Errorf("row %+v: no fix", r)
		}
		t.Logf("%-22s %-14s %-4s %s", r.Check, r.Subject, r.Status, r.Evidence)
	}
	for _, c := range want {
		if !got[c] {
			t.Errorf("no row for %s", c)
		}
	}
	for _, r := range rs {
		if r.Check == "repl.link" && r.Status == Fail {
			t.Errorf("local listener unreachable: %+v", r)
		}
	}
}
