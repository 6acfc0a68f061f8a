// Package hostinfo is what the comparison programs under bench/ share about
// the machine they run on: a description of it for the report (CPU, memory,
// kernel, filesystem, tool versions, load at start), the CPU time a server's
// process tree used, and small parsing/formatting helpers.
//
// Simplest use:
//
//	m := hostinfo.Machine(dataDir, "fio", "nbdkit")  // report header
//	before := hostinfo.TreeCPU(pid)
//	// ... run a job ...
//	cpu := hostinfo.TreeCPU(pid) - before
//
// Concurrency: every function is safe for concurrent use.
package hostinfo

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// FSType names the filesystem dir is on (statfs magic), or its hex magic.
func FSType(dir string) string {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return "unknown"
	}
	switch st.Type {
	case 0x01021994:
		return "tmpfs"
	case 0xEF53:
		return "ext4"
	case 0x58465342:
		return "xfs"
	case 0x9123683E:
		return "btrfs"
	case 0x794c7630:
		return "overlayfs"
	}
	return fmt.Sprintf("0x%x", st.Type)
}

// Machine describes the host for a report: CPUs, CPU model, memory, kernel,
// the filesystem of dir, the first line of `TOOL --version` for each tool
// that answers, the load average at start, and a one-line "summary".
// The load says how much else competed for the CPUs: figures are only
// comparable with each other within one run.
func Machine(dir string, tools ...string) map[string]string {
	m := map[string]string{"cpus": fmt.Sprint(runtime.NumCPU()), "fs": FSType(dir), "goarch": runtime.GOARCH}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				m["cpu"] = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["kernel"] = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if l := strings.SplitN(string(b), "\n", 2)[0]; l != "" {
			m["mem"] = strings.Join(strings.Fields(l)[1:], " ")
		}
	}
	for _, t := range tools {
		// CombinedOutput: some tools (tgtd) print their version on stderr.
		if out, err := exec.Command(t, "--version").CombinedOutput(); err == nil {
			m[t] = FirstLine(strings.TrimSpace(string(out)))
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m["loadavg_start"] = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	m["summary"] = fmt.Sprintf("%s CPUs (%s), %s RAM, kernel %s, %s filesystem, load average at start %s",
		m["cpus"], m["cpu"], m["mem"], m["kernel"], m["fs"], m["loadavg_start"])
	return m
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat times (100 on Linux).
const clockTicks = 100

// TreeCPU is the user+system CPU time used so far by pid and its
// descendants (including reaped children), from /proc. Subtract two
// readings to get a job's server CPU time.
func TreeCPU(pid int) time.Duration {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	type st struct {
		ppid  int
		ticks int64
	}
	procs := map[int]st{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		// Fields after "(comm)": state ppid ... utime(14) stime(15) cutime(16) cstime(17).
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 15 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		var t int64
		for _, x := range f[11:15] {
			v, _ := strconv.ParseInt(x, 10, 64)
			t += v
		}
		procs[p] = st{ppid, t}
	}
	var total int64
	var walk func(int, int)
	walk = func(p, depth int) {
		if depth > 16 {
			return
		}
		total += procs[p].ticks
		for c, x := range procs {
			if x.ppid == p {
				walk(c, depth+1)
			}
		}
	}
	walk(pid, 0)
	return time.Duration(total) * time.Second / clockTicks
}

// ParseSize reads a positive size with an optional K/M/G/T suffix (powers
// of 1024), as the programs' -size flags take it.
func ParseSize(s string) (int64, error) {
	s = strings.TrimSpace(strings.ToUpper(s))
	mult := int64(1)
	for suf, m := range map[string]int64{"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40} {
		if strings.HasSuffix(s, suf) {
			mult = m
			s = strings.TrimSuffix(s, suf)
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mult, nil
}

// Human formats a size in whole GiB, else MiB.
func Human(n int64) string {
	if n%(1<<30) == 0 {
		return fmt.Sprintf("%d GiB", n>>30)
	}
	return fmt.Sprintf("%d MiB", n>>20)
}

// Logf prints a progress line with the time of day on stderr.
func Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", args...)
}

// FirstLine is s up to its first newline.
func FirstLine(s string) string { return strings.SplitN(s, "\n", 2)[0] }
