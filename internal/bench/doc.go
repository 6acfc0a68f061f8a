// Package bench is vmsan's storage benchmark: the measurements users of
// KVM/QEMU storage make by hand (bonnie++, CrystalDiskMark, GNOME Disks, a
// fio job), as one reproducible command with machine-readable results.
//
// Simplest use:
//
//	t, err := bench.OpenTarget(ctx, "nbd://127.0.0.1:10809/default", bench.TargetOptions{})
//	res, err := bench.RunProfile(ctx, t, bench.Options{Profile: bench.ProfileCDM}, nil)
//	bench.PrintTable(os.Stdout, res)
//	res.Save("cdm.json")
//
// A Target is a file, a block device, an NBD export (nbd://, nbds://,
// nbd+unix://) or an iSCSI LUN (iscsi://[user%secret@]host[:port]/IQN/LUN,
// through package iscsi/initiator); other kinds plug in with
// RegisterScheme. Queue depth is
// produced by calling a Target from as many goroutines as requests should
// be in flight, so every Target is safe for concurrent use.
//
// Units are pinned: throughput is decimal MB/s (10^6 bytes) everywhere, with
// MiB/s (2^20 bytes) alongside in JSON and the generic table; bonnie++
// tables use K = 1024 bytes because bonnie++ does.
//
// Concurrency: RunProfile and Run use many goroutines internally but are
// themselves meant to be called one at a time per Target; results and
// Options are plain values.
package bench
