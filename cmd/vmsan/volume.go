package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/volume"
)

func init() {
	var dataDir string
	var asJSON bool
	vc := &cobra.Command{
		Use:   "volume",
		Short: "Create, list, inspect, resize and delete volumes (through the running daemon if there is one)",
	}
	vc.PersistentFlags().StringVar(&dataDir, "data-dir", config.DefaultDataDir, "data directory")
	vc.PersistentFlags().BoolVar(&asJSON, "json", false, "print JSON")

	// withOps opens the data dir (via the daemon's control socket when one
	// is running) for the duration of fn.
	withOps := func(fn func(daemon.VolumeOps) error) error {
		ops, _, err := daemon.OpenVolumeOps(dataDir)
		if err != nil {
			return err
		}
		defer ops.Close()
		return fn(ops)
	}
	show := func(vi daemon.VolumeInfo) error {
		if asJSON {
			return daemon.PrintJSON(os.Stdout, vi)
		}
		daemon.PrintVolume(os.Stdout, vi)
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
			return withOps(func(ops daemon.VolumeOps) error {
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

	list := &cobra.Command{
		Use:   "list",
		Short: "List volumes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return withOps(func(ops daemon.VolumeOps) error {
				// A partial list comes with an error naming unreadable
				// volumes: print what is readable, then fail with it.
				l, err := ops.List()
				if l == nil {
					return err
				}
				if asJSON {
					if jerr := daemon.PrintJSON(os.Stdout, l); jerr != nil {
						return jerr
					}
				} else {
					daemon.PrintVolumeTable(os.Stdout, l)
				}
				return err
			})
		},
	}
	info := &cobra.Command{
		Use:   "info NAME",
		Short: "Show a volume's metadata",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
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
		Use:   "resize NAME SIZE",
		Short: "Grow a volume online (clients see it on reconnect); shrinking needs --force",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := volume.ParseSize(args[1])
			if err != nil {
				return err
			}
			return withOps(func(ops daemon.VolumeOps) error {
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
		Use:   "delete NAME",
		Short: "Delete a volume and its data; refused while clients are connected unless --force",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withOps(func(ops daemon.VolumeOps) error {
				if err := ops.Delete(args[0], delForce); err != nil {
					return err
				}
				fmt.Printf("deleted volume %s\n", args[0])
				return nil
			})
		},
	}
	del.Flags().BoolVar(&delForce, "force", false, "delete even while exported (connected clients get I/O errors)")
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
	vc.AddCommand(create, list, info, resize, set, del)
	vc.AddCommand(replVolumeCommands()...) // promote, demote, verify: see repl.go
	rootCmd.AddCommand(vc)
}
