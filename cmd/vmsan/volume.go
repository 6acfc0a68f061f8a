package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/volume"
)

func newVolumeCmd() *cobra.Command {
	var dataDir string
	var asJSON bool
	vc := &cobra.Command{
		Use:   "volume",
		Short: "Create, list, inspect, resize and delete volumes (through the running daemon if there is one)",
	}
	vc.PersistentFlags().StringVar(&dataDir, "data-dir", config.DefaultDataDir, "data directory")
	vc.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")

	// withOps opens the data dir (via the daemon's control socket when one
	// is running) for the duration of fn. It must exist: a typo'd
	// --data-dir is an error, not a new empty directory.
	withOps := func(fn func(daemon.VolumeOps) error) error {
		ops, _, err := daemon.OpenExistingVolumeOps(dataDir, volumeHooks)
		if err != nil {
			return err
		}
		defer ops.Close()
		return fn(ops)
	}
	// withOpsCreate is withOps for commands that create volumes, which
	// create the data directory when there is none.
	withOpsCreate := func(fn func(daemon.VolumeOps) error) error {
		ops, _, err := daemon.OpenVolumeOps(dataDir, volumeHooks)
		if err != nil {
			return err
		}
		defer ops.Close()
		return fn(ops)
	}
	show := func(vi daemon.VolumeInfo) error {
		if asJSON {
			return PrintJSON(os.Stdout, vi)
		}
		PrintVolume(os.Stdout, vi)
		return nil
	}

	var (
		size, cache, desc    string
		rotational, readOnly bool
		blockSize            uint32
	)
	create := &cobra.Command{
		Use:   "create NAME --size SIZE",
		Short: "Create a thin (sparse) volume; SIZE takes units: 20G = 20 GiB, 20GB = 20*10^9",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := volume.ParseSize(size)
			if err != nil {
				return err
			}
			mode, err := backend.ParseCacheMode(cache)
			if err != nil {
				return err
			}
			return withOpsCreate(func(ops daemon.VolumeOps) error {
				vi, err := ops.Create(volume.CreateOptions{Name: args[0], Size: n, Cache: mode, Rotational: rotational,
					ReadOnly: readOnly, Description: desc, LogicalBlockSize: blockSize})
				if err != nil {
					return err
				}
				return show(vi)
			})
		},
	}
	create.Flags().StringVar(&size, "size", "", "volume size, e.g. 20G (required)")
	create.MarkFlagRequired("size")
	create.Flags().StringVar(&cache, "cache", "writeback", "cache mode: none, writethrough, writeback, unsafe")
	create.Flags().BoolVar(&rotational, "rotational", false, "advertise the volume as rotational (clients may merge and sort requests)")
	create.Flags().BoolVar(&readOnly, "read-only", false, "export read-only")
	create.Flags().StringVar(&desc, "description", "", "free-text description (NBD_INFO_DESCRIPTION)")
	create.Flags().Uint32Var(&blockSize, "block-size", 512, "logical block size (512 or 4096)")

	var listSnaps bool
	list := &cobra.Command{
		Use:   "list [--snapshots [VOL]]",
		Short: "List volumes (or, with --snapshots, snapshots: of VOL or of every volume)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if listSnaps {
				return listSnapshots(dataDir, asJSON, args)
			}
			if len(args) > 0 {
				return fmt.Errorf("list takes a volume name only with --snapshots")
			}
			return withOps(func(ops daemon.VolumeOps) error {
				// A partial list comes with an error naming unreadable
				// volumes: print what is readable, then fail with it.
				l, err := ops.List()
				if l == nil {
					return err
				}
				if asJSON {
					if jerr := PrintJSON(os.Stdout, l); jerr != nil {
						return jerr
					}
				} else {
					PrintVolumeTable(os.Stdout, l)
				}
				return err
			})
		},
	}
	list.Flags().BoolVar(&listSnaps, "snapshots", false, "list snapshots instead of volumes")
	info := &cobra.Command{
		Use:   "info NAME|VOL@SNAP",
		Short: "Show a volume's (or a snapshot's) metadata",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if vol, sn, isSnap, err := volume.SplitRef(args[0]); err == nil && isSnap {
				return snapshotInfo(dataDir, vol, sn, asJSON)
			}
			return withOps(func(ops daemon.VolumeOps) error {
				vi, err := ops.Info(args[0])
				if err != nil {
					return err
				}
				return show(vi)
			})
		},
	}
	var force bool
	resize := &cobra.Command{
		Use:   "resize NAME [+|-]SIZE",
		Short: "Grow a volume online (clients see it on reconnect); shrinking needs --force",
		Long: `Resize a volume to SIZE, or by SIZE: "+10G" grows it by 10 GiB, "-- -1G"
shrinks it by 1 GiB (the "--" keeps "-1G" from being read as a flag;
shrinking destroys the data past the new end and needs --force).

NBD has no resize notification: a running QEMU guest sees the new size
after "block_resize DRIVE SIZE" in the QEMU monitor (or QMP block_resize),
see docs/volumes.md.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withOps(func(ops daemon.VolumeOps) error {
				cur := int64(0)
				if s := strings.TrimSpace(args[1]); s != "" && (s[0] == '+' || s[0] == '-') {
					// Relative: to the size the volume has now.
					vi, err := ops.Info(args[0])
					if err != nil {
						return err
					}
					cur = vi.Size
				}
				n, err := volume.ParseResize(args[1], cur)
				if err != nil {
					return err
				}
				vi, err := ops.Resize(args[0], n, force)
				if err != nil {
					return err
				}
				return show(vi)
			})
		},
	}
	resize.Flags().BoolVar(&force, "force", false, "allow shrinking (destroys data past the new end)")
	var delForce bool
	del := &cobra.Command{
		Use:   "delete NAME|VOL@SNAP",
		Short: "Delete a volume and its data, or a snapshot; refused while clients are connected (and for a volume with snapshots) unless --force",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if vol, sn, isSnap, err := volume.SplitRef(args[0]); err == nil && isSnap {
				return deleteSnapshot(dataDir, vol, sn, delForce, asJSON)
			}
			return withOps(func(ops daemon.VolumeOps) error {
				if err := ops.Delete(args[0], delForce); err != nil {
					return err
				}
				if asJSON {
					return PrintJSON(os.Stdout, deleted{Deleted: args[0], Kind: "volume"})
				}
				fmt.Printf("deleted volume %s\n", args[0])
				return nil
			})
		},
	}
	del.Flags().BoolVar(&delForce, "force", false, "delete even while exported (connected clients get I/O errors), and a volume together with its snapshots")
	var (
		setCache, setDesc string
		setRot, setRO     bool
	)
	set := &cobra.Command{
		Use:   "set NAME [--cache MODE] [--rotational[=false]] [--read-only[=false]] [--description TEXT]",
		Short: "Change a volume's settings (the daemon reopens it; refused while clients are connected)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var s daemon.Settings
			f := cmd.Flags()
			if f.Changed("cache") {
				s.Cache = &setCache
			}
			if f.Changed("rotational") {
				s.Rotational = &setRot
			}
			if f.Changed("read-only") {
				s.ReadOnly = &setRO
			}
			if f.Changed("description") {
				s.Description = &setDesc
			}
			if s == (daemon.Settings{}) {
				return fmt.Errorf("nothing to change: give at least one of --cache, --rotational, --read-only, --description")
			}
			return withOps(func(ops daemon.VolumeOps) error {
				vi, err := ops.Update(args[0], s)
				if err != nil {
					return err
				}
				return show(vi)
			})
		},
	}
	set.Flags().StringVar(&setCache, "cache", "", "cache mode: none, writethrough, writeback, unsafe")
	set.Flags().BoolVar(&setRot, "rotational", false, "advertise the volume as rotational")
	set.Flags().BoolVar(&setRO, "read-only", false, "export read-only")
	set.Flags().StringVar(&setDesc, "description", "", "free-text description")
	var repairMode struct{ recreate, fileSize, metaSize, newID bool }
	repair := &cobra.Command{
		Use:   "repair NAME (--recreate | --use-file-size | --use-metadata-size | --new-identity)",
		Short: "Make a volume whose raw file is missing or of the wrong size servable again (offline: stop vmsan serve first)",
		Long: `vmsan refuses to serve a volume whose raw file is missing, or whose size
disagrees with its metadata in a way no interrupted vmsan operation leaves
(the file was changed outside vmsan). Choose how to repair it:

  --recreate           the raw file is missing: create an empty (all-zero)
                       one of the volume's size
  --use-file-size      the volume takes the file's size (no byte is lost)
  --use-metadata-size  the file is extended with zeroes, or cut, to the
                       volume's size (cutting destroys the data past it)
  --new-identity       nothing to fix in size, but the file was changed in
                       place behind vmsan's back (e.g. a snapshot restore)

Every repair gives the volume a new data identity: a replicated volume
comes back Inconsistent and resyncs in full from its peer. Repair works on
the data directory directly, so the daemon must be stopped.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var modes []volume.RepairMode
			for _, c := range []struct {
				on bool
				m  volume.RepairMode
			}{{repairMode.recreate, volume.RepairRecreate}, {repairMode.fileSize, volume.RepairUseFileSize},
				{repairMode.metaSize, volume.RepairUseMetadataSize}, {repairMode.newID, volume.RepairNewIdentity}} {
				if c.on {
					modes = append(modes, c.m)
				}
			}
			if len(modes) != 1 {
				return fmt.Errorf("give exactly one of --recreate, --use-file-size, --use-metadata-size, --new-identity")
			}
			s, err := volume.OpenExisting(dataDir)
			if err != nil {
				if errors.Is(err, volume.ErrLocked) {
					return fmt.Errorf("%w: repair is offline, stop vmsan serve first", err)
				}
				return err
			}
			defer s.Close()
			m, err := s.Repair(args[0], modes[0])
			if err != nil {
				return err
			}
			if asJSON {
				return PrintJSON(os.Stdout, m)
			}
			fmt.Printf("repaired volume %s (%s): %s, new data identity %s\n", m.Name, modes[0], volume.HumanSize(m.Size), m.DataID)
			return nil
		},
	}
	rf := repair.Flags()
	rf.BoolVar(&repairMode.recreate, "recreate", false, "create a missing raw file, all zeroes")
	rf.BoolVar(&repairMode.fileSize, "use-file-size", false, "set the volume's size to the raw file's size")
	rf.BoolVar(&repairMode.metaSize, "use-metadata-size", false, "extend or cut the raw file to the volume's size")
	rf.BoolVar(&repairMode.newID, "new-identity", false, "only give the volume a new data identity (replicas resync in full)")
	vc.AddCommand(create, list, info, resize, set, del, repair)
	vc.AddCommand(snapshotCommands(&dataDir, &asJSON)...) // snapshot, clone, rollback, import, export: see snapshot.go
	vc.AddCommand(replVolumeCommands()...)                // promote, demote, verify: see repl.go
	return vc
}

// deleted is what `vmsan volume delete --json` prints.
type deleted struct {
	Deleted string `json:"deleted"`
	Kind    string `json:"kind"` // "volume" or "snapshot"
}
