package bench

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/vmsan/vmsan/internal/volume"
)

// PrintTable writes the human table for res in its profile's traditional
// layout: CrystalDiskMark's text report for cdm, CrystalDiskMark 3's for
// cdm-legacy, bonnie++'s table and CSV line for bonnie, GNOME Disks'
// summary for gnome-disks, a fio-like block for job. Every table says which
// megabyte it uses.
func PrintTable(w io.Writer, res *Result) {
	fmt.Fprintf(w, "vmsan bench %s: %s (%s", res.Profile, res.Target.URI, res.Target.Kind)
	if res.Target.Kind == "file" || res.Target.Kind == "blockdev" {
		if res.Target.Direct {
			fmt.Fprint(w, ", O_DIRECT")
		} else {
			fmt.Fprint(w, ", buffered")
		}
		if res.Target.Filesystem != "" {
			fmt.Fprintf(w, ", %s", res.Target.Filesystem)
		}
	}
	if n := res.Target.NBD; n != nil {
		fmt.Fprintf(w, ", %d connection(s)", n.Connections)
		if n.TLS {
			fmt.Fprint(w, ", TLS")
		}
	}
	if n := res.Target.ISCSI; n != nil {
		fmt.Fprintf(w, ", iSCSI LUN %d", n.LUN)
		if n.Sessions > 1 {
			fmt.Fprintf(w, ", %d sessions", n.Sessions)
		}
		if n.HeaderDigest || n.DataDigest {
			fmt.Fprint(w, ", CRC32C digests")
		}
		if n.CHAP {
			fmt.Fprint(w, ", CHAP")
		}
	}
	fmt.Fprintf(w, ", %s)\n", volume.HumanSize(res.Target.Size))
	switch res.Profile {
	case ProfileCDM:
		printCDM(w, res)
	case ProfileCDMLegacy:
		printCDM3(w, res)
	case ProfileBonnie:
		printBonnie(w, res)
	case ProfileGnome:
		printGnome(w, res)
	default:
		printGeneric(w, res)
	}
	for _, n := range res.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

func star(r OpResult) string {
	if r.Cached {
		return " (*) " + r.Note
	}
	return ""
}

// printCDM follows CrystalDiskMark 8's "Copy" text.
func printCDM(w io.Writer, res *Result) {
	fmt.Fprintln(w, "------------------------------------------------------------------------------")
	fmt.Fprintln(w, "CrystalDiskMark-style results   * MB/s = 1,000,000 bytes/s, KB = 1000 bytes *")
	fmt.Fprintln(w, "------------------------------------------------------------------------------")
	for _, dir := range []string{"read", "write"} {
		any := false
		for _, r := range res.Ops {
			if r.Dir != dir {
				continue
			}
			if !any {
				fmt.Fprintf(w, "[%s]\n", strings.ToUpper(dir[:1])+dir[1:])
				any = true
			}
			kind := "SEQ"
			if strings.HasPrefix(r.Name, "RND") {
				kind = "RND"
			}
			fmt.Fprintf(w, "  %s %7s (Q=%3d, T=%2d): %9.3f MB/s [%9.1f IOPS] <%10.2f us>%s\n",
				kind, sizeLabel(int64(r.BS)), r.QD, r.Jobs, r.MBps, r.IOPS, r.Lat.MeanUs, star(r))
		}
	}
	printParams(w, res)
}

var cdm3Labels = map[string][2]string{
	"Seq":     {"Sequential Read", "Sequential Write"},
	"512K":    {"Random Read 512KB", "Random Write 512KB"},
	"4K":      {"Random Read 4KB (QD=1)", "Random Write 4KB (QD=1)"},
	"4K QD32": {"Random Read 4KB (QD=32)", "Random Write 4KB (QD=32)"},
}

// printCDM3 follows CrystalDiskMark 3's text, the rows users post.
func printCDM3(w io.Writer, res *Result) {
	fmt.Fprintln(w, "-----------------------------------------------------------------------")
	fmt.Fprintln(w, "CrystalDiskMark 3-style results     * MB/s = 1,000,000 byte/s *")
	fmt.Fprintln(w, "-----------------------------------------------------------------------")
	for _, name := range []string{"Seq", "512K", "4K", "4K QD32"} {
		for i, dir := range []string{"read", "write"} {
			r, ok := res.Row(name + " " + dir)
			if !ok {
				continue
			}
			extra := ""
			if strings.HasPrefix(name, "4K") {
				extra = fmt.Sprintf(" [%8.1f IOPS]", r.IOPS)
			}
			fmt.Fprintf(w, "%26s : %9.3f MB/s%s%s\n", cdm3Labels[name][i], r.MBps, extra, star(r))
		}
	}
	printParams(w, res)
}

func printParams(w io.Writer, res *Result) {
	if a, ok := res.Params["area_bytes"]; ok {
		fmt.Fprintf(w, "  Test: %v bytes, %v pass(es) of %vs, best pass reported\n", a, res.Params["passes"], res.Params["pass_seconds"])
	}
}

// printBonnie prints bonnie++ 1.97's table (the layout users post, with the
// Machine/Size and Latency lines of 1.97) and its CSV line.
func printBonnie(w io.Writer, res *Result) {
	host := res.Env.Hostname
	if len(host) > 15 {
		host = host[:15]
	}
	size, _ := res.Params["size_bytes"].(int64)
	fmt.Fprintln(w, "Version  1.97       ------Sequential Output------ --Sequential Input- --Random-")
	fmt.Fprintln(w, "Concurrency   1     -Per Chr- --Block-- -Rewrite- -Per Chr- --Block-- --Seeks--")
	fmt.Fprintln(w, "Machine        Size K/sec %CP K/sec %CP K/sec %CP K/sec %CP K/sec %CP  /sec %CP")
	line := fmt.Sprintf("%-15s %4s", host, bonnieSize(size))
	lat := "Latency             "
	for _, n := range bonnieOrder {
		r, ok := res.Row(n + " " + dirOf(n))
		if !ok {
			line += "          "
			lat += "          "
			continue
		}
		if n == BonnieSeeks {
			line += fmt.Sprintf(" %5.1f %3d", r.IOPS, int(r.CPU+0.5))
		} else {
			line += fmt.Sprintf(" %5d %3d", int64(float64(r.Bytes)/KiB/r.Seconds), int(r.CPU+0.5))
		}
		lat += fmt.Sprintf(" %9s", bonnieLatency(r.Lat.MaxUs))
	}
	fmt.Fprintln(w, line)
	fmt.Fprintln(w, lat)
	fmt.Fprintln(w, "(K/sec: K = 1024 bytes, as bonnie++; %CP: CPU time of this process / wall time)")
	for _, r := range res.Ops {
		if r.Cached {
			fmt.Fprintf(w, "(*) %s: %s\n", r.Name, r.Note)
		}
	}
	if res.BonnieCS != "" {
		fmt.Fprintln(w, res.BonnieCS)
	}
}

// printGnome prints the GNOME Disks summary rows.
func printGnome(w io.Writer, res *Result) {
	g := res.Gnome
	if g == nil {
		printGeneric(w, res)
		return
	}
	fmt.Fprintf(w, "GNOME Disks-style benchmark: %d samples of %s, MB/s = 1,000,000 bytes/s\n", len(g.Samples), volume.HumanSize(g.SampleSize))
	fmt.Fprintf(w, "Min Read: %.1f MB/s\nMax Read: %.1f MB/s\nAvg Read: %.1f MB/s\n", g.MinRead, g.MaxRead, g.AvgRead)
	if g.AvgWrite > 0 {
		fmt.Fprintf(w, "Min Write: %.1f MB/s\nMax Write: %.1f MB/s\nAvg Write: %.1f MB/s\n", g.MinWrite, g.MaxWrite, g.AvgWrite)
	}
	fmt.Fprintf(w, "AVG Access: %.2f ms\n", g.AccessMs)
	for _, r := range res.Ops {
		if r.Cached {
			fmt.Fprintln(w, "(*) reads served from cache")
			break
		}
	}
}

// printGeneric prints every row with throughput in MB/s and MiB/s, IOPS,
// latency percentiles and CPU.
func printGeneric(w io.Writer, res *Result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "test\tdir\tbs\tQD\tjobs\tMB/s\tMiB/s\tIOPS\tlat mean us\tp50 us\tp99 us\tp99.9 us\tmax us\tCPU%\t")
	for _, r := range res.Ops {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%.2f\t%.2f\t%.0f\t%.1f\t%.1f\t%.1f\t%.1f\t%.1f\t%.0f\t%s\n",
			r.Name, r.Dir, sizeLabel(int64(r.BS)), r.QD, r.Jobs, r.MBps, r.MiBps, r.IOPS,
			r.Lat.MeanUs, r.Lat.P50Us, r.Lat.P99Us, r.Lat.P999Us, r.Lat.MaxUs, r.CPU, star(r))
	}
	tw.Flush()
	fmt.Fprintln(w, "(MB/s: 1 MB = 1,000,000 bytes; MiB/s: 1 MiB = 1,048,576 bytes)")
}

// Compare prints the rows of several results side by side with the change
// of each against the first, in each row's headline unit.
func Compare(w io.Writer, names []string, rs []*Result) {
	if len(rs) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	hdr := "profile\ttest\tdir\tunit\t"
	for i, n := range names {
		hdr += n + "\t"
		if i > 0 {
			hdr += "change\t"
		}
	}
	fmt.Fprintln(tw, hdr)
	// Row order: first result's rows, then rows only later results have.
	type key struct{ profile, k string }
	var order []key
	seen := map[key]bool{}
	for _, r := range rs {
		for _, o := range r.Ops {
			k := key{r.Profile, o.Key()}
			if !seen[k] {
				seen[k] = true
				order = append(order, k)
			}
		}
	}
	for _, k := range order {
		var base float64
		var unit string
		line := ""
		for i, r := range rs {
			var o OpResult
			ok := r.Profile == k.profile
			if ok {
				o, ok = r.Row(k.k)
			}
			if !ok {
				line += "-\t"
				if i > 0 {
					line += "\t"
				}
				continue
			}
			v, u := o.Headline()
			unit = u
			mark := ""
			if o.Cached {
				mark = "*"
			}
			line += fmt.Sprintf("%.2f%s\t", v, mark)
			if i == 0 {
				base = v
				continue
			}
			if base > 0 {
				line += fmt.Sprintf("%+.1f%%\t", (v-base)/base*100)
			} else {
				line += "\t"
			}
		}
		name, dir := splitKey(k.k)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.profile, name, dir, unit, line)
	}
	tw.Flush()
	fmt.Fprintln(w, "(change vs the first result; MB/s = 1,000,000 bytes/s; for ms lower is better; * = measured the page cache)")
}

func splitKey(k string) (string, string) {
	i := strings.LastIndexByte(k, ' ')
	if i < 0 {
		return k, ""
	}
	return k[:i], k[i+1:]
}
