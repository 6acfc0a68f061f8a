package bench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmsan/vmsan/internal/volume"
)

// fileTarget is a regular file or a block device, accessed with
// pread/pwrite from as many goroutines as the queue depth asks for.
type fileTarget struct {
	f       *os.File
	path    string
	size    int64
	align   int
	info    TargetInfo
	removeF bool // scratch file to remove on Close
	// shrinkTo >= 0 is the size an existing file had before --force grew
	// it to --size; Close truncates it back (unless --keep).
	shrinkTo int64
}

// directAlign is the buffer/offset alignment used for O_DIRECT on regular
// files: 4 KiB satisfies ext4, xfs and btrfs on 512e and 4Kn disks alike.
const directAlign = 4096

func openFile(path string, o TargetOptions) (Target, error) {
	st, err := os.Stat(path)
	created := false
	switch {
	case err == nil && st.IsDir():
		// Like bonnie++ -d: benchmark a scratch file inside the directory.
		path = filepath.Join(path, fmt.Sprintf("vmsan-bench.%d.tmp", os.Getpid()))
		created = true
	case err == nil:
	case errors.Is(err, os.ErrNotExist):
		created = true
	default:
		return nil, fmt.Errorf("bench: %w", err)
	}
	if created {
		if o.ReadOnly {
			return nil, fmt.Errorf("bench: %s does not exist and --read-only forbids creating it", path)
		}
		if o.Size <= 0 {
			return nil, fmt.Errorf("bench: %s does not exist; give --size to create a scratch file", path)
		}
	}

	if created {
		// The benchmark will write the whole file: refuse up front rather
		// than fill the filesystem (bonnie's default is 2x RAM).
		var sf unix.Statfs_t
		if err := unix.Statfs(filepath.Dir(path), &sf); err == nil {
			if free := int64(sf.Bavail) * int64(sf.Bsize); free < o.Size {
				return nil, fmt.Errorf("bench: %s has %s free, the scratch file needs %s; give a smaller --size", filepath.Dir(path), volume.HumanSize(free), volume.HumanSize(o.Size))
			}
		}
	}
	flags := os.O_RDWR
	if o.ReadOnly {
		flags = os.O_RDONLY
	}
	if created {
		flags |= os.O_CREATE | os.O_EXCL
	}
	isDev := err == nil && !st.IsDir() && st.Mode()&os.ModeDevice != 0
	if isDev && !o.ReadOnly {
		// O_EXCL on a block device fails with EBUSY while it is mounted or
		// held (by LVM, md, swap, ...): the kernel's own "in use" check.
		flags |= unix.O_EXCL
	}
	if o.Direct {
		flags |= unix.O_DIRECT
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		if isDev && errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("bench: %s is in use (mounted or held by another driver); refusing to write to it", path)
		}
		if o.Direct && errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("bench: the filesystem under %s refuses O_DIRECT; run without --direct (results will then include the page cache)", path)
		}
		return nil, fmt.Errorf("bench: %w", err)
	}
	t := &fileTarget{f: f, path: path, align: 1, removeF: created && !o.Keep, shrinkTo: -1}
	fail := func(e error) (Target, error) {
		f.Close()
		if created {
			os.Remove(path)
		}
		return nil, e
	}
	if created {
		if err := f.Truncate(o.Size); err != nil {
			return fail(fmt.Errorf("bench: sizing scratch file: %w", err))
		}
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return fail(fmt.Errorf("bench: %w", err))
	}
	if !created && !isDev && o.Size > size && !o.ReadOnly {
		if !o.Force && size > 0 {
			return fail(fmt.Errorf("bench: %s is %d bytes, smaller than --size %d; use --force to grow it", path, size, o.Size))
		}
		if err := f.Truncate(o.Size); err != nil {
			return fail(fmt.Errorf("bench: growing %s: %w", path, err))
		}
		if !o.Keep {
			t.shrinkTo = size
		}
		size = o.Size
	}
	if o.Direct {
		t.align = directAlign
		if isDev {
			if lbs, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET); err == nil && lbs > 0 {
				t.align = lbs
			}
		}
	}
	size = size / int64(t.align) * int64(t.align)
	if size <= 0 {
		return fail(fmt.Errorf("bench: %s is empty; give --size to benchmark a new file", path))
	}
	t.size = size
	kind := "file"
	if isDev {
		kind = "blockdev"
	}
	t.info = TargetInfo{URI: path, Kind: kind, Size: size, Direct: o.Direct, ReadOnly: o.ReadOnly, Created: created}
	t.info.Filesystem = fsType(path)
	if isDev {
		t.info.Device = filepath.Base(path)
		t.info.Filesystem = ""
	}
	t.info.Queue, t.info.Device = blockQueue(f, isDev, t.info.Device)
	return t, nil
}

func (t *fileTarget) ReadAt(p []byte, off int64) (int, error)  { return t.f.ReadAt(p, off) }
func (t *fileTarget) WriteAt(p []byte, off int64) (int, error) { return t.f.WriteAt(p, off) }
func (t *fileTarget) Flush() error                             { return t.f.Sync() }
func (t *fileTarget) Size() int64                              { return t.size }
func (t *fileTarget) Align() int                               { return t.align }
func (t *fileTarget) MaxIO() int                               { return 0 }
func (t *fileTarget) Info() TargetInfo                         { return t.info }

// DropCache asks the kernel to drop this file's clean pages from the page
// cache (posix_fadvise DONTNEED), so a following buffered read pass starts
// cold. Dirty pages are written first so they become droppable.
func (t *fileTarget) DropCache() error {
	if err := t.f.Sync(); err != nil {
		return err
	}
	return unix.Fadvise(int(t.f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

func (t *fileTarget) Close() error {
	var err error
	if t.shrinkTo >= 0 {
		err = t.f.Truncate(t.shrinkTo)
	}
	if e := t.f.Close(); err == nil {
		err = e
	}
	if t.removeF {
		if e := os.Remove(t.path); err == nil {
			err = e
		}
	}
	return err
}

// fsMagic names the filesystems a VM disk image is likely to live on.
var fsMagic = map[int64]string{
	0xEF53:     "ext4",
	0x58465342: "xfs",
	0x9123683E: "btrfs",
	0x01021994: "tmpfs",
	0x794c7630: "overlayfs",
	0x6969:     "nfs",
	0x2FC12FC1: "zfs",
	0x65735546: "fuse",
	0xFF534D42: "cifs",
	0x858458f6: "ramfs",
	0x62656572: "sysfs",
	0x62646576: "bdev",
	0xCA451A4E: "bcachefs",
	0xF2F52010: "f2fs",
}

// fsType reports the filesystem holding path, from statfs(2).
func fsType(path string) string {
	var s unix.Statfs_t
	if err := unix.Statfs(path, &s); err != nil {
		return ""
	}
	if n, ok := fsMagic[int64(s.Type)]; ok {
		return n
	}
	return fmt.Sprintf("0x%x", uint64(s.Type))
}

// queueKeys are the block-queue settings that change benchmark results
// (rotational and the scheduler can make a 10x difference to a replica applying small writes).
var queueKeys = []string{"rotational", "scheduler", "read_ahead_kb", "max_sectors_kb", "nr_requests", "logical_block_size", "physical_block_size", "write_cache"}

// blockQueue reads /sys/block/<dev>/queue for the device itself or, for a
// file, for the device its filesystem lives on (partitions use their
// parent's queue).
func blockQueue(f *os.File, isDev bool, devName string) (map[string]string, string) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return nil, devName
	}
	dev := st.Dev
	if isDev {
		dev = st.Rdev
	}
	sys := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(dev), unix.Minor(dev))
	real, err := filepath.EvalSymlinks(sys)
	if err != nil {
		return nil, devName
	}
	if devName == "" {
		devName = filepath.Base(real)
	}
	q := filepath.Join(real, "queue")
	if _, err := os.Stat(q); err != nil {
		q = filepath.Join(filepath.Dir(real), "queue") // partition
	}
	m := map[string]string{}
	for _, k := range queueKeys {
		if b, err := os.ReadFile(filepath.Join(q, k)); err == nil {
			m[k] = strings.TrimSpace(string(b))
		}
	}
	if len(m) == 0 {
		return nil, devName
	}
	return m, devName
}
