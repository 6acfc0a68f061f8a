package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/bench"
	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/nbd/client"
	prog "github.com/vmsan/vmsan/internal/progress"
	"github.com/vmsan/vmsan/internal/sparse"
	"github.com/vmsan/vmsan/internal/volume"
)

// snapshotCommands are `vmsan volume snapshot|clone|rollback|import|export`
// (list --snapshots and delete VOL@SNAP are in volume.go). They share the
// volume command's --data-dir and --json.
func snapshotCommands(dataDir *string, asJSON *bool) []*cobra.Command {
	// withSnapOps opens the data directory like the other volume commands:
	// it must exist (a typo'd --data-dir is an error), except for import,
	// which creates a volume (withImportOps).
	withSnapOps := func(fn func(daemon.VolumeOps, daemon.SnapshotOps, bool) error) error {
		return withSnapOpsOpen(daemon.OpenExistingVolumeOps, *dataDir, fn)
	}
	withImportOps := func(fn func(daemon.VolumeOps, daemon.SnapshotOps, bool) error) error {
		return withSnapOpsOpen(daemon.OpenVolumeOps, *dataDir, fn)
	}
	show := func(v any, text func()) error {
		if *asJSON {
			return PrintJSON(os.Stdout, v)
		}
		text()
		return nil
	}

	var copyData bool
	snap := &cobra.Command{
		Use:   "snapshot VOL NAME [--copy]",
		Short: "Take a read-only snapshot VOL@NAME (instant by reflink on xfs/btrfs; --copy elsewhere)",
		Long: `Take a read-only, point-in-time snapshot of a volume, named VOL@NAME.

With the daemon running, new writes are held and the volume flushed while
the snapshot is made, so it contains every acknowledged write and nothing
half-written. On xfs (reflink=1, the mkfs default) and btrfs the snapshot
is a reflink: instant, and it shares blocks with the volume until either
is written. Other filesystems (ext4, tmpfs) refuse unless --copy, a full
copy that keeps holes (writes are held for the whole copy).

The snapshot is served read-only over NBD as export VOL@NAME, e.g.
  nbdinfo nbd+unix:///VOL@NAME?socket=/run/vmsan/nbd.sock`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withSnapOps(func(_ daemon.VolumeOps, ops daemon.SnapshotOps, _ bool) error {
				var stop func()
				if copyData {
					stop = followCopy(ops, args[0]+volume.SnapSep+args[1])
				}
				si, err := ops.CreateSnapshot(args[0], args[1], copyData)
				if stop != nil {
					stop()
				}
				if err != nil {
					return err
				}
				return show(si, func() {
					fmt.Printf("snapshot %s created (%s, %s, %s allocated)\n", si.Name, si.Method, volume.HumanSize(si.Size), volume.HumanSize(si.Allocated))
				})
			})
		},
	}
	snap.Flags().BoolVar(&copyData, "copy", false, "full copy (holes preserved) where the filesystem cannot reflink")

	clone := &cobra.Command{
		Use:   "clone VOL@SNAP|VOL NEWVOL [--copy]",
		Short: "Create a new read-write volume from a snapshot (or from a volume as it is now)",
		Long: `Create NEWVOL, an independent read-write volume with the contents of the
snapshot VOL@SNAP, or of the volume VOL as of now (quiesced like a
snapshot). It has the source's size, block size and settings, and its own
UUID and data identity. Reflink on xfs/btrfs; --copy elsewhere.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withSnapOps(func(_ daemon.VolumeOps, ops daemon.SnapshotOps, _ bool) error {
				vi, err := ops.Clone(args[0], args[1], copyData)
				if err != nil {
					return err
				}
				if *asJSON {
					return PrintJSON(os.Stdout, vi)
				}
				fmt.Printf("cloned %s to volume %s\n", args[0], vi.Name)
				PrintVolume(os.Stdout, vi)
				return nil
			})
		},
	}
	clone.Flags().BoolVar(&copyData, "copy", false, "full copy (holes preserved) where the filesystem cannot reflink")

	var rbForce bool
	rollback := &cobra.Command{
		Use:   "rollback VOL@SNAP [--force] [--copy]",
		Short: "Make a volume's contents those of one of its snapshots (refused while clients are connected unless --force)",
		Long: `Replace the contents (and size) of VOL with those of its snapshot SNAP,
in place. Writes made since the snapshot are lost; the snapshot stays.

Refused while NBD clients are connected unless --force: they would see
the disk change under them (a guest's filesystem cache would then be
wrong; shut the guest down or detach the disk first). Refused for a
replicated volume: the peer would keep the rolled-away data; take the
volume out of replication first. The volume gets a new data identity.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			vol, sn, isSnap, err := volume.SplitRef(args[0])
			if err != nil {
				return err
			}
			if !isSnap {
				return fmt.Errorf("rollback needs a snapshot: VOL@SNAP (see vmsan volume list --snapshots)")
			}
			return withSnapOps(func(_ daemon.VolumeOps, ops daemon.SnapshotOps, _ bool) error {
				vi, err := ops.Rollback(vol, sn, rbForce, copyData)
				if err != nil {
					return err
				}
				return show(vi, func() { fmt.Printf("volume %s rolled back to %s (new data identity %s)\n", vol, args[0], vi.DataID) })
			})
		},
	}
	rollback.Flags().BoolVar(&rbForce, "force", false, "roll back even while clients are connected")
	rollback.Flags().BoolVar(&copyData, "copy", false, "full copy (holes preserved) where the filesystem cannot reflink")

	var (
		impCache, impDesc string
		impBlock          uint32
		quiet             bool
	)
	imp := &cobra.Command{
		Use:   "import NAME FILE|URL",
		Short: "Create a volume from a disk image (raw, qcow2 or any format qemu-img reads) or an NBD URL",
		Long: `Create the volume NAME with the contents of FILE or of an NBD export.

  raw files are copied directly; any other format (qcow2, vmdk, vdi, ...)
  is detected with 'qemu-img info' and converted with 'qemu-img convert'
  (qemu-img must be installed for those).
  nbd://, nbds://, nbd+unix:// URLs are read with vmsan's NBD client.

The copy is sparse: holes and all-zero blocks of the source stay holes.
The volume's size is the image's virtual size (rounded up to the block
size). A progress bar is drawn on a terminal (--quiet turns it off).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			mode, err := backend.ParseCacheMode(impCache)
			if err != nil {
				return err
			}
			if err := volume.ValidateName(args[0]); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return withImportOps(func(vops daemon.VolumeOps, ops daemon.SnapshotOps, _ bool) error {
				if _, err := vops.Info(args[0]); err == nil {
					return fmt.Errorf("%w: %s", volume.ErrExists, args[0])
				}
				tmp := volume.TempImportPath(*dataDir)
				size, err := importTo(ctx, tmp, args[1], quiet)
				if err != nil {
					os.Remove(tmp)
					if ctx.Err() != nil {
						return fmt.Errorf("import interrupted; nothing was created")
					}
					return err
				}
				lbs := impBlock
				if lbs == 0 {
					lbs = volume.DefaultLogicalBlockSize
				}
				vsize := (size + int64(lbs) - 1) / int64(lbs) * int64(lbs)
				vi, err := ops.ImportVolume(volume.CreateOptions{Name: args[0], Size: vsize, Cache: mode, Description: impDesc, LogicalBlockSize: impBlock}, tmp)
				if err != nil {
					os.Remove(tmp)
					if errors.Is(err, daemon.ErrDaemonStopped) {
						return importDaemonStopped(*dataDir, args[0], err)
					}
					return err
				}
				return show(vi, func() {
					fmt.Printf("imported %s as volume %s (%s, %s allocated)\n", args[1], vi.Name, volume.HumanSize(vi.Size), volume.HumanSize(vi.Allocated))
				})
			})
		},
	}
	imp.Flags().StringVar(&impCache, "cache", "writeback", "cache mode: none, writethrough, writeback, unsafe")
	imp.Flags().StringVar(&impDesc, "description", "", "free-text description (NBD_INFO_DESCRIPTION)")
	imp.Flags().Uint32Var(&impBlock, "block-size", 512, "logical block size (512 or 4096)")
	imp.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress bar")

	var (
		expFormat, expSince, expBacking string
		expMode                         string
		expForce                        bool
	)
	exp := &cobra.Command{
		Use:   "export VOL|VOL@SNAP FILE [-O raw|qcow2|...] [--copy]",
		Short: "Write a volume (through a temporary snapshot when the daemon runs) or a snapshot to an image file",
		Long: `Write the contents of a volume or snapshot to FILE, sparse (holes stay
holes): raw by default, or any format qemu-img writes with -O (qcow2,
vmdk, ...; needs qemu-img).

A live volume (daemon running) is exported from a temporary snapshot,
VOL@tmp-export-..., taken quiesced like 'vmsan volume snapshot' and deleted
afterwards: the image is the volume at one instant while clients keep
writing (if the command or the daemon stops before deleting it, the
daemon's next start does). That snapshot is a reflink (xfs, btrfs); elsewhere give --copy
(a full copy in the data directory first, writes held during it), or
export a snapshot you took. Without a daemon the raw file is read
directly (nothing writes to it: this command holds the directory lock).

FILE is created 0600 (owner only) whatever the format and the umask, as
the volumes are; --mode 0640 (say) gives it other permissions once written.

Incremental: --since SNAP --backing BASE writes FILE as a qcow2 overlay on
BASE (a full export of VOL@SNAP made earlier) holding only the blocks that
changed since SNAP (found by comparing contents; needs qemu-img and
qemu-nbd). Restore with 'vmsan volume import NAME FILE'.

  vmsan volume snapshot vm1 mon && vmsan volume export vm1@mon mon.raw
  vmsan volume snapshot vm1 tue && vmsan volume export vm1@tue tue.qcow2 --since mon --backing mon.raw`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			vol, sn, isSnap, err := volume.SplitRef(args[0])
			if err != nil {
				return err
			}
			if !expForce {
				if _, err := os.Lstat(args[1]); err == nil {
					return fmt.Errorf("%s exists; use --force to overwrite it", args[1])
				}
			}
			if expSince != "" {
				if expBacking == "" {
					return fmt.Errorf("--since needs --backing FILE: the full export of %s@%s the overlay builds on", vol, expSince)
				}
				if cmd.Flags().Changed("output-format") && expFormat != "qcow2" {
					return fmt.Errorf("--since writes a qcow2 overlay; -O %s is not possible", expFormat)
				}
				expFormat = "qcow2"
			}
			mode, err := parseFileMode(expMode)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// Guest data must not be world-readable, not even while it is
			// written: files this command and qemu-img create are 0600
			// whatever the umask; the final mode is set once written.
			defer syscall.Umask(syscall.Umask(0o077))
			if err := setExportMode(args[1], 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err // --force over a wider file: private before any data goes in
			}
			return withSnapOps(func(vops daemon.VolumeOps, ops daemon.SnapshotOps, viaDaemon bool) (retErr error) {
				var src string
				var size int64
				switch {
				case isSnap:
					l, err := ops.ListSnapshots(vol)
					if err != nil {
						return err
					}
					for _, si := range l {
						if si.Snapshot == sn {
							src, size = si.Path, si.Size
						}
					}
					if src == "" {
						return volume.SnapshotNotFound(args[0])
					}
				case viaDaemon:
					// Named and marked (temporary) so that the daemon's
					// next start removes it if this command cannot.
					tmpSnap := fmt.Sprintf("tmp-export-%s-%s", time.Now().UTC().Format("20060102T150405"), uuid.NewString()[:8])
					si, err := ops.CreateTemporarySnapshot(vol, tmpSnap, copyData)
					if err != nil {
						return fmt.Errorf("export of a live volume goes through a temporary snapshot: %w", err)
					}
					defer func() {
						if cerr := deleteTempSnapshot(*dataDir, ops, vol, tmpSnap); cerr != nil {
							retErr = errors.Join(retErr, cerr)
						}
					}()
					src, size = si.Path, si.Size
				default:
					vi, err := vops.Info(vol)
					if err != nil {
						return err
					}
					if vi.Problem != "" {
						return errors.New(vi.Problem)
					}
					src, size = vi.Path, vi.Size
				}
				if expSince != "" {
					l, err := ops.ListSnapshots(vol)
					if err != nil {
						return err
					}
					base := ""
					for _, si := range l {
						if si.Snapshot == expSince {
							base = si.Path
						}
					}
					if base == "" {
						return fmt.Errorf("--since: %w", volume.SnapshotNotFound(vol+volume.SnapSep+expSince))
					}
					if err := exportSince(ctx, src, base, size, args[1], expBacking, quiet); err != nil {
						return err
					}
				} else if err := exportFile(ctx, src, size, args[1], expFormat, quiet); err != nil {
					if ctx.Err() != nil {
						// SIGINT/SIGTERM: no half-written image stays
						// (the temporary snapshot is deleted on return).
						if st, serr := os.Lstat(args[1]); serr == nil && st.Mode().IsRegular() {
							os.Remove(args[1])
						}
						return fmt.Errorf("export interrupted; %s not written", args[1])
					}
					return err
				}
				if err := setExportMode(args[1], mode); err != nil {
					return err
				}
				return show(exportResult{Source: args[0], File: args[1], Format: expFormat, Size: size, Mode: fmt.Sprintf("%04o", mode)}, func() {
					fmt.Printf("exported %s to %s (%s, %s)\n", args[0], args[1], expFormat, volume.HumanSize(size))
				})
			})
		},
	}
	exp.Flags().StringVarP(&expFormat, "output-format", "O", "raw", "image format: raw, or any format qemu-img writes (qcow2, vmdk, ...)")
	exp.Flags().BoolVar(&copyData, "copy", false, "where the filesystem cannot reflink, take the temporary snapshot of a live volume by full copy")
	exp.Flags().BoolVar(&expForce, "force", false, "overwrite FILE if it exists")
	exp.Flags().StringVar(&expMode, "mode", "0600", "permissions of FILE (octal), whatever the umask: guest data is private by default")
	exp.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress bar")
	exp.Flags().StringVar(&expSince, "since", "", "incremental: write a qcow2 overlay of only the blocks changed since this snapshot of the volume")
	exp.Flags().StringVar(&expBacking, "backing", "", "with --since: the full export of that snapshot, recorded as the overlay's backing file (relative to FILE's directory)")
	return []*cobra.Command{snap, clone, rollback, imp, exp}
}

// withSnapOpsOpen runs fn with the volume and snapshot operations open
// returns for dataDir.
func withSnapOpsOpen(open func(string, ...daemon.VolumeHooks) (daemon.VolumeOps, bool, error), dataDir string,
	fn func(daemon.VolumeOps, daemon.SnapshotOps, bool) error) error {
	ops, viaDaemon, err := open(dataDir, volumeHooks)
	if err != nil {
		return err
	}
	defer ops.Close()
	sops, ok := ops.(daemon.SnapshotOps)
	if !ok {
		return errors.New("internal error: volume operations without snapshot support")
	}
	return fn(ops, sops, viaDaemon)
}

// printSnapshots is `vmsan volume list --snapshots`.
func printSnapshots(w io.Writer, l []daemon.SnapshotInfo) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SNAPSHOT\tSIZE\tALLOCATED\tMETHOD\tCREATED\tEXPORTS")
	for _, si := range l {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", si.Name, volume.HumanSize(si.Size), volume.HumanSize(si.Allocated), si.Method,
			si.Created.Local().Format("2006-01-02 15:04:05"), si.Exports)
	}
	tw.Flush()
}

// progress returns a bar on a terminal (stderr: percent, amount, rate,
// ETA; internal/progress), else nothing.
func progress(name string, total int64, quiet bool) (set func(int64), done func()) {
	if quiet || total <= 0 || !prog.IsTerminal(os.Stderr) {
		return func(int64) {}, func() {}
	}
	b := prog.New(os.Stderr, name, total, prog.Bytes)
	return b.Set, func() {
		b.Set(total)
		b.Done("")
	}
}

// followCopy draws a bar (on a terminal) for the daemon's full copy into
// target, from its copy events; stop ends it.
func followCopy(ops any, target string) (stop func()) {
	if !prog.IsTerminal(os.Stderr) {
		return func() {}
	}
	var mu sync.Mutex
	var b *prog.Bar
	end := daemon.FollowCopy(ops, target, func(done, total int64) {
		mu.Lock()
		defer mu.Unlock()
		if b == nil {
			b = prog.New(os.Stderr, "copy "+target, total, prog.Bytes)
		}
		b.Set(done)
	})
	return func() {
		end()
		mu.Lock()
		defer mu.Unlock()
		if b != nil {
			b.Done("")
		}
	}
}

// isNBDURL reports whether src is an NBD URL rather than a file.
func isNBDURL(src string) bool {
	for _, p := range []string{"nbd://", "nbds://", "nbd+unix://", "nbds+unix://"} {
		if strings.HasPrefix(src, p) {
			return true
		}
	}
	return false
}

// imageInfo is what `qemu-img info --output=json` says about a file.
type imageInfo struct {
	Format      string `json:"format"`
	VirtualSize int64  `json:"virtual-size"`
}

func qemuImgInfo(ctx context.Context, path string) (imageInfo, error) {
	out, err := exec.CommandContext(ctx, "qemu-img", "info", "--output=json", path).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return imageInfo{}, fmt.Errorf("qemu-img info %s: %s", path, strings.TrimSpace(string(ee.Stderr)))
		}
		return imageInfo{}, fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	var ii imageInfo
	if err := json.Unmarshal(out, &ii); err != nil {
		return imageInfo{}, fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	if ii.VirtualSize <= 0 || ii.VirtualSize > volume.MaxSize {
		return imageInfo{}, fmt.Errorf("qemu-img info %s: virtual size %d out of range", path, ii.VirtualSize)
	}
	return ii, nil
}

// sniffFormat recognises the image formats vmsan refuses to copy as raw
// when qemu-img is missing (their headers would become the disk's data).
func sniffFormat(f *os.File) string {
	var b [8]byte
	if n, _ := f.ReadAt(b[:], 0); n < 4 {
		return "raw"
	}
	switch {
	case string(b[:4]) == "QFI\xfb":
		return "qcow2"
	case string(b[:4]) == "KDMV":
		return "vmdk"
	case string(b[:8]) == "conectix":
		return "vpc"
	case string(b[:4]) == "<<< " || string(b[:4]) == "\x7f\x10\xda\xbe":
		return "vdi"
	}
	return "raw"
}

// importTo fills the new file dst with src's contents (sparse) and returns
// the virtual size.
func importTo(ctx context.Context, dst, src string, quiet bool) (int64, error) {
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	if isNBDURL(src) {
		return importNBD(ctx, out, src, quiet)
	}
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return 0, err
	}
	if !st.Mode().IsRegular() && st.Mode()&os.ModeDevice == 0 {
		return 0, fmt.Errorf("%s is not a file or block device", src)
	}
	format, size := "raw", st.Size()
	if _, lerr := exec.LookPath("qemu-img"); lerr == nil {
		ii, err := qemuImgInfo(ctx, src)
		if err != nil {
			return 0, err
		}
		format, size = ii.Format, ii.VirtualSize
	} else if f := sniffFormat(in); f != "raw" {
		return 0, fmt.Errorf("%s looks like a %s image: install qemu-img (package qemu-utils) to import it", src, f)
	}
	if format != "raw" {
		// qemu-img writes holes for unallocated and zero clusters.
		args := []string{"convert", "-f", format, "-O", "raw"}
		if !quiet && bench.IsTerminal(os.Stderr) {
			args = append(args, "-p")
		}
		c := exec.CommandContext(ctx, "qemu-img", append(args, src, dst)...)
		c.Stdout, c.Stderr = os.Stderr, os.Stderr
		if err := c.Run(); err != nil {
			return 0, fmt.Errorf("qemu-img convert %s: %w", src, err)
		}
		return size, nil
	}
	if st.Mode()&os.ModeDevice != 0 {
		if size, err = in.Seek(0, io.SeekEnd); err != nil {
			return 0, err
		}
	}
	if err := out.Truncate(size); err != nil {
		return 0, err
	}
	set, done := progress("import", size, quiet)
	err = sparse.Copy(ctx, out, in, size, sparse.Options{Data: sparse.FileData(in), Progress: set})
	done()
	if err != nil {
		return 0, err
	}
	return size, out.Sync()
}

// importNBD copies an NBD export into out, skipping what block status
// reports as zero (holes) when the server supports it.
func importNBD(ctx context.Context, out *os.File, url string, quiet bool) (int64, error) {
	c, err := client.Dial(ctx, url, nil)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	size := c.Size()
	if size <= 0 || size > volume.MaxSize {
		return 0, fmt.Errorf("%s: export size %d out of range", url, size)
	}
	if err := out.Truncate(size); err != nil {
		return 0, err
	}
	set, done := progress("import", size, quiet)
	err = sparse.Copy(ctx, out, c, size, sparse.Options{Data: nbdData(c, size), Progress: set})
	done()
	if err != nil {
		return 0, err
	}
	return size, out.Sync()
}

// nbdData is a sparse.DataFunc from NBD block status: the next range not
// reported as reading zeroes. Without block status everything is data
// (the copy still skips all-zero blocks).
func nbdData(c *client.Conn, size int64) sparse.DataFunc {
	return func(off int64) (int64, int64, bool, error) {
		for off < size {
			exts, err := c.BlockStatus(off, min(size-off, 1<<30))
			if err != nil || len(exts) == 0 {
				return off, size, true, nil
			}
			start := int64(-1)
			end := off
			for _, e := range exts {
				if e.Length <= 0 || e.Offset+e.Length <= off {
					continue
				}
				if e.Zero {
					if start >= 0 {
						return start, end, true, nil
					}
					end = e.Offset + e.Length
					continue
				}
				if start < 0 {
					start = max(e.Offset, off)
				}
				end = e.Offset + e.Length
			}
			if start >= 0 {
				return start, min(end, size), true, nil
			}
			if end <= off {
				return off, size, true, nil // no progress: treat as data
			}
			off = end
		}
		return 0, 0, false, nil
	}
}

// exportFile writes the raw file src (size bytes) to dst in format.
func exportFile(ctx context.Context, src string, size int64, dst, format string, quiet bool) error {
	if format != "raw" {
		if _, err := exec.LookPath("qemu-img"); err != nil {
			return fmt.Errorf("-O %s needs qemu-img (package qemu-utils): %w", format, err)
		}
		args := []string{"convert", "-f", "raw", "-O", format}
		if !quiet && bench.IsTerminal(os.Stderr) {
			args = append(args, "-p")
		}
		c := exec.CommandContext(ctx, "qemu-img", append(args, src, dst)...)
		c.Stdout, c.Stderr = os.Stderr, os.Stderr
		if err := c.Run(); err != nil {
			return fmt.Errorf("qemu-img convert to %s: %w", format, err)
		}
		return nil
	}
	in, err := volume.OpenImageFile(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	// A block device cannot hold holes (the copy skips zero blocks).
	if st, err := out.Stat(); err == nil && !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file: export to a file (for a block device use qemu-img convert -n)", dst)
	}
	if err := out.Truncate(size); err != nil {
		return err
	}
	set, done := progress("export", size, quiet)
	err = sparse.Copy(ctx, out, in, size, sparse.Options{Data: in.Data, Progress: set})
	done()
	if err != nil {
		os.Remove(dst)
		return err
	}
	if err := out.Sync(); err != nil {
		return err
	}
	return nil
}

// listSnapshots is `vmsan volume list --snapshots [VOL]`.
func listSnapshots(dataDir string, asJSON bool, args []string) error {
	vol := ""
	if len(args) == 1 {
		vol = args[0]
	}
	ops, _, err := daemon.OpenExistingVolumeOps(dataDir, volumeHooks)
	if err != nil {
		return err
	}
	defer ops.Close()
	l, err := ops.(daemon.SnapshotOps).ListSnapshots(vol)
	if l == nil && err != nil {
		return err
	}
	if asJSON {
		if jerr := PrintJSON(os.Stdout, l); jerr != nil {
			return jerr
		}
	} else {
		printSnapshots(os.Stdout, l)
	}
	return err
}

// deleteSnapshot is `vmsan volume delete VOL@SNAP`.
func deleteSnapshot(dataDir, vol, snap string, force, asJSON bool) error {
	ops, _, err := daemon.OpenExistingVolumeOps(dataDir, volumeHooks)
	if err != nil {
		return err
	}
	defer ops.Close()
	if err := ops.(daemon.SnapshotOps).DeleteSnapshot(vol, snap, force); err != nil {
		return err
	}
	if asJSON {
		return PrintJSON(os.Stdout, deleted{Deleted: vol + volume.SnapSep + snap, Kind: "snapshot"})
	}
	fmt.Printf("deleted snapshot %s%s%s\n", vol, volume.SnapSep, snap)
	return nil
}

// snapshotInfo is `vmsan volume info VOL@SNAP`: a snapshot is a
// first-class name wherever a volume's is read.
func snapshotInfo(dataDir, vol, snap string, asJSON bool) error {
	ops, _, err := daemon.OpenExistingVolumeOps(dataDir, volumeHooks)
	if err != nil {
		return err
	}
	defer ops.Close()
	l, err := ops.(daemon.SnapshotOps).ListSnapshots(vol)
	if err != nil && l == nil {
		return err
	}
	for _, si := range l {
		if si.Snapshot != snap {
			continue
		}
		if asJSON {
			return PrintJSON(os.Stdout, si)
		}
		PrintVolume(os.Stdout, daemon.VolumeInfo{Meta: si.Meta, Path: si.Path, Allocated: si.Allocated, Open: si.Exports > 0, Exports: si.Exports})
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 1, ' ', 0)
		fmt.Fprintf(tw, "snapshot of:\t%s\n", si.Volume)
		fmt.Fprintf(tw, "method:\t%s\n", si.Method)
		if si.Temporary {
			fmt.Fprintf(tw, "temporary:\ttrue (a command's; removed at the next daemon start)\n")
		}
		return tw.Flush()
	}
	return volume.SnapshotNotFound(vol + volume.SnapSep + snap)
}

// exportResult is what `vmsan volume export --json` prints.
type exportResult struct {
	Source string `json:"source"`
	File   string `json:"file"`
	Format string `json:"format"`
	Size   int64  `json:"size"`
	Mode   string `json:"mode"`
}

// setExportMode gives the export file path mode (regular files only: a
// device node's permissions are not the export's to change).
func setExportMode(path string, mode os.FileMode) error {
	st, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return nil
	}
	return os.Chmod(path, mode)
}

// parseFileMode parses --mode: octal permission bits (0600, 640).
func parseFileMode(s string) (os.FileMode, error) {
	n, err := strconv.ParseUint(strings.TrimPrefix(s, "0o"), 8, 32)
	if err != nil || n > 0o777 {
		return 0, fmt.Errorf("--mode %q: want octal permissions such as 0600 or 0640", s)
	}
	return os.FileMode(n), nil
}

// deleteTempSnapshot removes an export's temporary snapshot. A daemon
// that stopped meanwhile cannot: the directory is then free, and the
// snapshot is deleted on it directly. A snapshot already gone (a
// restarted daemon removed it) is fine. An error names the snapshot and
// fails the command.
func deleteTempSnapshot(dataDir string, ops daemon.SnapshotOps, vol, snap string) error {
	err := ops.DeleteSnapshot(vol, snap, true)
	if errors.Is(err, daemon.ErrDaemonStopped) {
		var s *volume.Store
		if s, err = volume.OpenExisting(dataDir); err == nil {
			err = s.DeleteSnapshot(vol, snap)
			s.Close()
		}
	}
	if err == nil || errors.Is(err, volume.ErrNotFound) {
		return nil
	}
	return fmt.Errorf("the temporary snapshot %s%s%s was not deleted (the next vmsan serve removes it): %w", vol, volume.SnapSep, snap, err)
}

// importDaemonStopped is the error of an import whose daemon stopped
// before answering. The volume's metadata is the import's commit point
// (volume.Store.CreateFromFile), so the data directory, free now, says
// whether the volume was created: nothing was, unless the daemon stopped
// after committing it.
func importDaemonStopped(dataDir, name string, err error) error {
	s, oerr := volume.OpenExisting(dataDir)
	if oerr != nil {
		return fmt.Errorf("the daemon stopped during the import; see vmsan volume list whether %s was created (%v)", name, err)
	}
	defer s.Close()
	if _, gerr := s.Get(name); gerr == nil {
		return fmt.Errorf("the daemon stopped right after creating volume %s: it is complete, but was not exported", name)
	}
	return fmt.Errorf("the daemon stopped; nothing was created (volume %s does not exist)", name)
}
