package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/sdnotify"
	"github.com/vmsan/vmsan/internal/volume"
)

func newServeCmd() *cobra.Command {
	var (
		fl          serveFlags
		printConfig bool
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve volumes over NBD (with no flags: ./vmsan-data, 127.0.0.1:10809, a 10 GiB volume \"default\" in a directory without volumes)",
		Long: `Serve the volumes of a data directory over NBD.

With no arguments: data directory ./vmsan-data, listeners 127.0.0.1:10809 and
unix:./vmsan-data/nbd.sock, and a 10 GiB sparse volume "default" created if the
directory has no volumes (any --data-dir; not when the config file declares
volumes or sets no_default_volume: true). Volumes are created only once every
listener is bound: a start that fails creates nothing. Flags override the
config file. SIGTERM/SIGINT stop
accepting, drain in-flight requests, flush every volume and exit 0. SIGHUP
reloads: the config file and TLS certificate files are read again, new
volumes are created and exported, and settings that need a restart are
named in the log; connected clients are not disturbed, and a bad config is
logged and ignored.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Catch SIGHUP from the start: its default action kills the
			// process, and a reload must never do that, even one sent while
			// volumes are still opening. Signals that arrive before the
			// daemon serves wait in the channel.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			load := func() (config.Config, error) { return fl.config(cmd) }
			cfg, err := load()
			if err != nil {
				return err
			}
			if printConfig {
				// The new form (nbd: beside iscsi:), with a note on
				// stderr for each deprecated top-level key the file used.
				for _, n := range cfg.DeprecationNotes() {
					fmt.Fprintln(os.Stderr, "vmsan: "+n)
				}
				b, err := cfg.MarshalMasked() // secrets are never printed
				if err != nil {
					return err
				}
				os.Stdout.Write(b)
				return nil
			}
			d, err := daemon.New(cfg, daemon.Options{Out: os.Stdout, Plugins: plugins, Hooks: volumeHooks})
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			// After the first signal starts the graceful drain, restore the
			// default action so a second Ctrl-C kills a drain that hangs.
			go func() { <-ctx.Done(); sdnotify.Stopping("draining"); stop() }()
			go d.HandleReloads(ctx, hup, load)
			sdnotify.Ready("serving") // New bound every listener; systemd may start clients
			return d.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&fl.cfgFile, "config", "", "YAML config file (see docs/architecture.md); flags override it")
	f.StringVar(&fl.dataDir, "data-dir", config.DefaultDataDir, "data directory holding volumes")
	f.StringArrayVar(&fl.listen, "listen", nil, "NBD listener HOST:PORT or unix:PATH (repeatable; default 127.0.0.1:10809 and unix:DATA_DIR/nbd.sock)")
	f.StringArrayVar(&fl.iscsiListen, "iscsi-listen", nil, "serve iSCSI on HOST[:PORT][,TPGT] (repeatable; port 3260, portal group tag 1 by default); see docs/iscsi.md")
	f.StringVar(&fl.metrics, "metrics-listen", "", "serve Prometheus metrics on HOST:PORT at /metrics")
	f.BoolVar(&fl.pprof, "pprof", false, "serve /debug/pprof on the metrics listener and the control socket")
	f.StringVar(&fl.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&fl.maxPayload, "max-payload", "32M", "largest NBD READ/WRITE accepted")
	f.StringVar(&fl.inflightBudget, "inflight-budget", "", "request payload bytes held in flight over all clients (default 1G or RAM/4, whichever is smaller)")
	f.IntVar(&fl.maxConns, "max-connections", 0, "most NBD connections open at once (default 1024)")
	f.IntVar(&fl.iscsiMaxSessions, "iscsi-max-sessions", 0, "most iSCSI sessions open at once (default 256)")
	f.BoolVar(&fl.iscsiAllowAny, "iscsi-allow-any", false, "let any initiator log in to iSCSI targets without an ACL or CHAP (iscsi.allow_any; without it such logins are refused)")
	f.StringVar(&fl.tlsMode, "tls", "off", "TLS mode: off, optional or required")
	f.StringVar(&fl.tlsCert, "tls-cert", "", "server certificate (PEM)")
	f.StringVar(&fl.tlsKey, "tls-key", "", "server private key (PEM)")
	f.StringVar(&fl.tlsCA, "tls-ca", "", "CA bundle: when set, clients must present a certificate it signed")
	f.BoolVar(&printConfig, "print-config", false, "print the effective configuration as YAML (secrets masked) and exit")
	return cmd
}

// serveFlags are serve's flags that override the config file.
type serveFlags struct {
	cfgFile, dataDir, metrics, logLevel, maxPayload string
	tlsMode, tlsCert, tlsKey, tlsCA                 string
	listen, iscsiListen                             []string
	pprof, iscsiAllowAny                            bool
	inflightBudget                                  string
	maxConns, iscsiMaxSessions                      int
}

// config builds serve's configuration: defaults, then the --config file,
// then the flags the user set. SIGHUP runs it again, so a reload sees the
// file as it is now with the same flags over it.
func (fl *serveFlags) config(cmd *cobra.Command) (config.Config, error) {
	cfg := config.Default()
	if fl.cfgFile != "" {
		var err error
		if cfg, err = config.Load(fl.cfgFile); err != nil {
			return config.Config{}, err
		}
	}
	f := cmd.Flags()
	if f.Changed("data-dir") {
		cfg.DataDir = fl.dataDir
	}
	if f.Changed("listen") {
		cfg.Listen = fl.listen
	}
	if f.Changed("iscsi-listen") {
		cfg.ISCSI.Listen = nil
		for _, l := range fl.iscsiListen {
			p, err := config.ParseISCSIPortal(l)
			if err != nil {
				return config.Config{}, err
			}
			cfg.ISCSI.Listen = append(cfg.ISCSI.Listen, p)
		}
	}
	if f.Changed("metrics-listen") {
		cfg.MetricsListen = fl.metrics
	}
	if f.Changed("log-level") {
		cfg.LogLevel = fl.logLevel
	}
	if f.Changed("pprof") {
		cfg.Pprof = fl.pprof
	}
	if f.Changed("max-payload") {
		n, err := volume.ParseSize(fl.maxPayload)
		if err != nil {
			return config.Config{}, err
		}
		cfg.MaxPayload = config.Size(n)
	}
	if f.Changed("inflight-budget") {
		n, err := volume.ParseSize(fl.inflightBudget)
		if err != nil {
			return config.Config{}, err
		}
		cfg.InflightBudget = config.Size(n)
	}
	if f.Changed("max-connections") {
		cfg.MaxConnections = fl.maxConns
	}
	if f.Changed("iscsi-allow-any") {
		cfg.ISCSI.AllowAny = fl.iscsiAllowAny
	}
	if f.Changed("iscsi-max-sessions") {
		cfg.ISCSI.MaxSessions = fl.iscsiMaxSessions
	}
	if f.Changed("tls") {
		cfg.TLS.Mode = fl.tlsMode
	}
	if f.Changed("tls-cert") {
		cfg.TLS.Cert = fl.tlsCert
	}
	if f.Changed("tls-key") {
		cfg.TLS.Key = fl.tlsKey
	}
	if f.Changed("tls-ca") {
		cfg.TLS.CA = fl.tlsCA
	}
	if err := cfg.Validate(); err != nil {
		return config.Config{}, err
	}
	return cfg, nil
}
