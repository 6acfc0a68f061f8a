//go:build linux

package doctor

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// RealHost returns a Host that examines the running machine.
func RealHost() Host {
	return Host{
		Root:       "/",
		Stat:       realStat,
		Statfs:     realStatfs,
		Extents:    realExtents,
		NoCOW:      realNoCOW,
		DirectIO:   realDirectIO,
		Connect:    realConnect,
		Interfaces: realInterfaces,
		SourceIP:   realSourceIP,
		Now:        time.Now,
	}
}

func realStat(p string) (FileStat, error) {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return FileStat{}, &os.PathError{Op: "stat", Path: p, Err: err}
	}
	return FileStat{
		Major: unix.Major(uint64(st.Dev)), Minor: unix.Minor(uint64(st.Dev)),
		Size: st.Size, Allocated: st.Blocks * 512, IsDir: st.Mode&unix.S_IFMT == unix.S_IFDIR,
	}, nil
}

func realStatfs(p string) (FSStat, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return FSStat{}, &os.PathError{Op: "statfs", Path: p, Err: err}
	}
	return FSStat{Type: int64(st.Type), Bsize: int64(st.Bsize), Blocks: st.Blocks, Bavail: st.Bavail}, nil
}

// fiemap is struct fiemap (linux/fiemap.h) without the extent array: with
// fm_extent_count 0 the kernel only counts the extents into
// fm_mapped_extents.
type fiemap struct {
	start, length                         uint64
	flags, mappedExtents, extentCount, rs uint32
}

// fsIocFiemap is FS_IOC_FIEMAP, _IOWR('f', 11, struct fiemap).
const fsIocFiemap = 0xC020660B

func realExtents(p string) (int, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	// No FIEMAP_FLAG_SYNC: the doctor must not force a flush of a live
	// volume; delayed-allocation extents are counted as the kernel reports
	// them.
	fm := fiemap{length: ^uint64(0)}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&fm)))
	if errno != 0 {
		return 0, fmt.Errorf("FIEMAP %s: %w", p, errno)
	}
	return int(fm.mappedExtents), nil
}

// fsNocowFl is FS_NOCOW_FL from linux/fs.h.
const fsNocowFl = 0x00800000

func realNoCOW(p string) (bool, error) {
	f, err := os.Open(p)
	if err != nil {
		return false, err
	}
	defer f.Close()
	v, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		return false, err
	}
	return v&fsNocowFl != 0, nil
}

const dioAlign = 4096

// alignedBuf returns a dioAlign-aligned buffer of dioAlign bytes (O_DIRECT
// requires the memory, offset and length to be aligned).
func alignedBuf() []byte {
	b := make([]byte, 2*dioAlign)
	off := int(uintptr(unsafe.Pointer(&b[0])) & (dioAlign - 1))
	if off != 0 {
		off = dioAlign - off
	}
	return b[off : off+dioAlign]
}

func realDirectIO(p string, create bool) error {
	buf := alignedBuf()
	if !create {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", p, err)
		}
		defer unix.Close(fd)
		if _, err := unix.Pread(fd, buf, 0); err != nil {
			return fmt.Errorf("read %s: %w", p, err)
		}
		return nil
	}
	f, err := os.CreateTemp(p, ".doctor-odirect-")
	if err != nil {
		return err
	}
	name := f.Name()
	f.Close()
	defer os.Remove(name)
	fd, err := unix.Open(name, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", filepath.Base(name), err)
	}
	defer unix.Close(fd)
	if _, err := unix.Pwrite(fd, buf, 0); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if _, err := unix.Pread(fd, buf, 0); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	return nil
}

func realConnect(addr string, timeout time.Duration) (time.Duration, error) {
	t0 := time.Now()
	c, err := net.DialTimeout("tcp", addr, timeout)
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	c.Close()
	return d, nil
}

func realInterfaces() ([]Interface, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	out := make([]Interface, 0, len(ifs))
	for _, i := range ifs {
		x := Interface{Name: i.Name, MTU: i.MTU, Up: i.Flags&net.FlagUp != 0, Loopback: i.Flags&net.FlagLoopback != 0}
		addrs, _ := i.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				x.Addrs = append(x.Addrs, n.IP)
			}
		}
		out = append(out, x)
	}
	return out, nil
}

// realSourceIP asks the kernel's routing table by connecting a UDP socket
// (which sends nothing) and reading its local address.
func realSourceIP(addr string) (net.IP, error) {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ua, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok {
		return nil, errors.New("no UDP local address")
	}
	return ua.IP, nil
}
