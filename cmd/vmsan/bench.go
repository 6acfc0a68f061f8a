package main

import (
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/bench"
	"github.com/vmsan/vmsan/internal/volume"
)

func newBenchCmd() *cobra.Command {
	var (
		cfg                                bench.RunConfig
		size, bs, chunk, chrSize, sampleSz string
		offset                             string
		rw, runtime, passTime, warmup      string
		interval, chrTime                  string
		plotOut, compPlot                  string
		compPlotOpts                       bench.PlotOptions
		compJSON                           bool
	)
	cmd := &cobra.Command{
		Use:   "bench [flags] TARGET",
		Short: "Benchmark a file, block device, NBD export or iSCSI LUN (bonnie++, CrystalDiskMark, GNOME Disks, fio-like job)",
		Long: `Benchmark TARGET, which is a file, a directory (a scratch file is created
inside), a block device, nbd://host[:port]/export, nbds://...,
nbd+unix:///export?socket=PATH, or an iSCSI LUN:
iscsi://[user%secret@]host[:port]/IQN/LUN (mutual CHAP with
?target_user=U&target_password=P, digests with ?header_digest=crc32c).

Profiles: cdm (CrystalDiskMark 8), cdm-legacy (CrystalDiskMark 3), bonnie
(bonnie++ 1.97), gnome-disks (GNOME Disks), job (one fio-like job).
Throughput is in decimal MB/s (1 MB = 1,000,000 bytes). Every run writes a
JSON result; compare runs with 'vmsan bench compare A.json B.json'.
See docs/bench.md.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			cfg.Target = args[0]
			// "vmsan bench compar" would benchmark a new scratch file
			// named compar: a missing plain name that is close to a
			// subcommand is a typo of that subcommand.
			if !strings.ContainsAny(args[0], "/:") {
				if _, err := os.Stat(args[0]); err != nil {
					if s := c.SuggestionsFor(args[0]); len(s) > 0 {
						return usageError{fmt.Sprintf("%s does not exist; did you mean %s %s?", args[0], c.CommandPath(), strings.Join(s, " or "))}
					}
				}
			}
			o := &cfg.Options
			// 0 means "the profile's default" inside the bench package;
			// on the command line it is a mistake, not QD1.
			for _, n := range []struct {
				name string
				v    int
			}{{"iodepth", o.Job.QD}, {"jobs", o.Job.Jobs}} {
				if c.Flags().Changed(n.name) && n.v < 1 {
					return fmt.Errorf("--%s %d: must be at least 1", n.name, n.v)
				}
			}
			var err error
			parseSz := func(name, v string, dst *int64) {
				if err == nil && v != "" {
					if *dst, err = volume.ParseSize(v); err != nil {
						err = fmt.Errorf("--%s: %w", name, err)
					}
				}
			}
			parseSz("size", size, &cfg.Size)
			parseSz("offset", offset, &o.Job.Offset)
			parseSz("chr-size", chrSize, &o.ChrSize)
			parseSz("sample-size", sampleSz, &o.SampleSize)
			var b, ch int64
			parseSz("bs", bs, &b)
			parseSz("chunk", chunk, &ch)
			if err != nil {
				return err
			}
			o.Job.BS, o.Chunk = int(b), int(ch)
			if o.Job.RW, err = bench.ParsePattern(rw); err != nil {
				return err
			}
			for _, d := range []struct {
				name, v string
				dst     *int64
			}{{"runtime", runtime, (*int64)(&o.Job.Runtime)}, {"pass-time", passTime, (*int64)(&o.PassTime)}, {"warmup", warmup, (*int64)(&o.Warmup)}, {"interval", interval, (*int64)(&o.Interval)}, {"chr-time", chrTime, (*int64)(&o.ChrTime)}} {
				if d.v == "" {
					continue
				}
				v, err := bench.ParseDuration(d.v)
				if err != nil {
					return fmt.Errorf("--%s: %w", d.name, err)
				}
				*d.dst = int64(v)
			}
			cfg.Plot = plotOut
			ctx, stop := signal.NotifyContext(c.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return bench.Execute(ctx, cfg, os.Stdout, os.Stderr)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&cfg.Options.Profile, "profile", "p", bench.ProfileCDM, "profile: "+strings.Join(bench.Profiles, ", "))
	f.BoolVar(&cfg.Open.Direct, "direct", false, "O_DIRECT for files and block devices (bypass the page cache)")
	f.BoolVar(&cfg.Options.ReadOnly, "read-only", false, "open read-only and skip write tests")
	f.BoolVar(&cfg.Open.Force, "force", false, "allow write tests on a target that already holds data")
	f.BoolVar(&cfg.Open.Keep, "keep", false, "keep test data: a scratch file the benchmark created, blocks it allocated in holes of an existing file or NBD export, a file --force grew")
	f.BoolVar(&cfg.Options.DropCache, "drop-cache", false, "drop the file's page cache before read passes (buffered files)")
	f.StringVar(&size, "size", "", "test size: cdm test area (default 1G), bonnie file size (default 2x RAM), job region; also the size of a new scratch file")
	f.BoolVar(&cfg.JSON, "json", false, "print the JSON result to stdout instead of the table")
	f.StringVarP(&cfg.Out, "output", "o", "", `result file (default RESULTS_DIR/vmsan-bench-PROFILE-TIME.json; "none" for no file)`)
	f.StringVar(&cfg.ResultsDir, "results-dir", "", "directory for auto-named results (default $XDG_STATE_HOME/vmsan/bench, i.e. ~/.local/state/vmsan/bench)")
	f.StringVar(&plotOut, "plot", "", "draw the result into FILE.png or FILE.svg")
	f.BoolVar(&cfg.PlotOpts.LogScale, "log-scale", false, "--plot: logarithmic value axis (small results stay visible next to large ones)")
	f.BoolVarP(&cfg.Quiet, "quiet", "q", false, "no progress output")
	f.Uint64Var(&cfg.Options.Seed, "seed", 0, "random seed (default: time based)")
	// NBD
	f.IntVar(&cfg.Open.Connections, "connections", 0, "NBD connections (default 4 when the server allows multi-conn, else 1); iSCSI sessions (default 1)")
	f.StringVar(&cfg.Open.TLSCA, "tls-ca", "", "CA certificate (PEM) for nbds://")
	f.StringVar(&cfg.Open.TLSCert, "tls-cert", "", "client certificate (PEM) for nbds://")
	f.StringVar(&cfg.Open.TLSKey, "tls-key", "", "client key (PEM) for nbds://")
	f.BoolVar(&cfg.Open.TLSInsecure, "tls-insecure", false, "do not verify the server certificate")
	// cdm
	f.IntVar(&cfg.Options.Passes, "passes", 5, "cdm: measured passes per test (best is reported)")
	f.StringVar(&passTime, "pass-time", "5s", "cdm: duration of each pass")
	f.StringVar(&warmup, "warmup", "1s", "cdm: unmeasured warm-up before each test")
	f.StringVar(&interval, "interval", "0", "cdm: pause between passes")
	// job
	f.StringVar(&rw, "rw", "randread", "job: read, write, randread, randwrite, randrw, rw")
	f.StringVar(&bs, "bs", "4k", "job: block size")
	f.IntVar(&cfg.Options.Job.QD, "iodepth", 1, "job: requests in flight per job")
	f.IntVar(&cfg.Options.Job.Jobs, "jobs", 1, "job: parallel jobs (threads)")
	f.StringVar(&runtime, "runtime", "10s", "job: duration (0: one pass over --size)")
	f.IntVar(&cfg.Options.Job.RWMix, "rwmix", 50, "job: percentage of reads for randrw/rw")
	f.StringVar(&offset, "offset", "0", "job: region start")
	// bonnie
	f.StringVar(&chunk, "chunk", "8k", "bonnie: chunk size")
	f.StringVar(&chrSize, "chr-size", "16M", "bonnie: region of the per-char (1-byte) tests")
	f.StringVar(&chrTime, "chr-time", "20s", "bonnie: time cap of each per-char test")
	f.IntVar(&cfg.Options.Seeks, "seeks", 8192, "bonnie: random seeks")
	f.IntVar(&cfg.Options.SeekProcs, "seek-procs", 5, "bonnie: parallel seekers")
	// gnome-disks
	f.IntVar(&cfg.Options.Samples, "samples", 100, "gnome-disks: rate samples across the target")
	f.StringVar(&sampleSz, "sample-size", "10M", "gnome-disks: bytes per sample")
	f.BoolVar(&cfg.Options.WriteTest, "write", false, "gnome-disks: also measure write rate (data is read and written back)")
	f.IntVar(&cfg.Options.AccessReads, "access-reads", 1000, "gnome-disks: random page reads for the access time")

	compare := &cobra.Command{
		Use:   "compare A.json B.json [...]",
		Short: "Show bench results side by side with % change against the first",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return bench.CompareFiles(args, compPlot, compJSON, os.Stdout, compPlotOpts)
		},
	}
	compare.Flags().StringVar(&compPlot, "plot", "", "draw bar charts (and gnome-disks rate vs position) into FILE.png or FILE.svg")
	compare.Flags().BoolVar(&compJSON, "json", false, "print the comparison as JSON")
	compare.Flags().BoolVar(&compPlotOpts.LogScale, "log-scale", false, "--plot: logarithmic value axis (small results stay visible next to large ones)")
	cmd.AddCommand(compare)
	return cmd
}
