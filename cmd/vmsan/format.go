package main

// The text and JSON renderings of the control API's answers: the CLI is
// their only user, so they live with it.

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/iscsi/iscsifront"
	"github.com/vmsan/vmsan/internal/volume"
)

// PrintJSON writes v as indented JSON.
func PrintJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// PrintVolume writes one volume as "key: value" lines.
func PrintVolume(w io.Writer, v control.VolumeInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "name:\t%s\n", v.Name)
	fmt.Fprintf(tw, "uuid:\t%s\n", v.UUID)
	fmt.Fprintf(tw, "size:\t%s (%d bytes)\n", volume.HumanSize(v.Size), v.Size)
	fmt.Fprintf(tw, "allocated:\t%s (%d bytes)\n", volume.HumanSize(v.Allocated), v.Allocated)
	fmt.Fprintf(tw, "block size:\t%d logical, %d physical\n", v.LogicalBlockSize, v.PhysicalBlockSize)
	fmt.Fprintf(tw, "cache:\t%s\n", v.Cache)
	fmt.Fprintf(tw, "rotational:\t%v\n", v.Rotational)
	fmt.Fprintf(tw, "read-only:\t%v\n", v.ReadOnly)
	fmt.Fprintf(tw, "created:\t%s\n", v.Created.Format(time.RFC3339))
	if v.Description != "" {
		fmt.Fprintf(tw, "description:\t%s\n", v.Description)
	}
	fmt.Fprintf(tw, "path:\t%s\n", v.Path)
	if v.Open {
		fmt.Fprintf(tw, "exports:\t%d\n", v.Exports)
	}
	if v.Problem != "" {
		fmt.Fprintf(tw, "problem:\t%s\n", v.Problem)
	}
	tw.Flush()
}

// PrintVolumeTable writes volumes as a table.
func PrintVolumeTable(w io.Writer, l []control.VolumeInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSIZE\tALLOCATED\tCACHE\tFLAGS\tEXPORTS\tUUID")
	for _, v := range l {
		flags := "-"
		switch {
		case v.ReadOnly && v.Rotational:
			flags = "ro,rot"
		case v.ReadOnly:
			flags = "ro"
		case v.Rotational:
			flags = "rot"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", v.Name, volume.HumanSize(v.Size), volume.HumanSize(v.Allocated), v.Cache, flags, v.Exports, v.UUID)
	}
	tw.Flush()
}

// PrintStatus writes the daemon status for people.
func PrintStatus(w io.Writer, s control.Status) {
	fmt.Fprintf(w, "vmsan daemon pid %d, data dir %s\n", s.PID, s.DataDir)
	for _, l := range s.Listeners {
		fmt.Fprintf(w, "  listening on %s\n", l)
	}
	if s.Metrics != "" {
		fmt.Fprintf(w, "  metrics at %s\n", s.Metrics)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VOLUME\tSIZE\tALLOCATED\tCACHE\tCONNS\tREQUESTS\tBACKEND OPS\tMERGE RATIO\tMEAN WRITE\tREAD\tWRITTEN\tLAT P50\tLAT P99")
	for _, v := range s.Volumes {
		e := v.Engine
		if e == nil {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t-\t-\t-\t-\t-\t-\t-\t-\n", v.Name, volume.HumanSize(v.Size), volume.HumanSize(v.Allocated), v.Cache, v.Connections)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%.2f\t%s\t%s\t%s\t%s\t%s\n", v.Name, volume.HumanSize(v.Size), volume.HumanSize(v.Allocated), v.Cache, v.Connections,
			e.Requests, e.BackendOps, e.MergeRatio, volume.HumanSize(int64(e.MeanWriteBytes)), volume.HumanSize(int64(e.BytesRead)), volume.HumanSize(int64(e.BytesWritten)),
			usec(e.LatencyP50us), usec(e.LatencyP99us))
	}
	tw.Flush()
	printNoSpace(w, s.Volumes)
	printClients(w, s.Volumes)
	iscsifront.PrintStats(w, s.FrontEnds)
	for k, v := range s.Extra {
		b, _ := json.MarshalIndent(v, "  ", "  ")
		fmt.Fprintf(w, "\n%s:\n  %s\n", k, b)
	}
}

// usec renders a latency given in microseconds ("-" when there is none).
func usec(us float64) string {
	switch {
	case us <= 0:
		return "-"
	case us < 1000:
		return fmt.Sprintf("%.0fµs", us)
	default:
		return fmt.Sprintf("%.1fms", us/1000)
	}
}

// printNoSpace lists the volumes whose writes failed with ENOSPC.
func printNoSpace(w io.Writer, vols []control.VolumeStatus) {
	n := 0
	for _, v := range vols {
		if v.NoSpace != nil {
			n++
		}
	}
	if n == 0 {
		return
	}
	fmt.Fprintln(w, "\nOUT OF SPACE: writes failed with ENOSPC (the filesystem under these thin volumes is full):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VOLUME\tENOSPC ERRORS\tLAST\tFS FREE\tFS SIZE")
	for _, v := range vols {
		if ns := v.NoSpace; ns != nil {
			fmt.Fprintf(tw, "%s\t%d\t%s (%s ago)\t%s\t%s\n", v.Name, ns.Errors, ns.Last.Local().Format(time.DateTime),
				time.Since(ns.Last).Truncate(time.Second), volume.HumanSize(ns.FSFreeBytes), volume.HumanSize(ns.FSSizeBytes))
		}
	}
	tw.Flush()
}

// printClients lists the connected clients per volume: front end, address
// and since when (how long ago).
func printClients(w io.Writer, vols []control.VolumeStatus) {
	n := 0
	for _, v := range vols {
		n += len(v.Clients)
	}
	if n == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VOLUME\tFRONT END\tCLIENT\tCONNECTED SINCE")
	for _, v := range vols {
		for _, c := range v.Clients {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s (%s ago)\n", v.Name, c.FrontEnd, c.Remote,
				c.Since.Local().Format(time.DateTime), time.Since(c.Since).Truncate(time.Second))
		}
	}
	tw.Flush()
}
