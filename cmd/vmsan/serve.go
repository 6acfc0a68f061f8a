package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/sdnotify"
	"github.com/vmsan/vmsan/internal/volume"
)

func init() {
	var (
		cfgFile, dataDir, metrics, logLevel, maxPayload string
		tlsMode, tlsCert, tlsKey, tlsCA                 string
		listen                                          []string
		pprof, printConfig                              bool
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve volumes over NBD (with no flags: ./vmsan-data, 127.0.0.1:10809, a 10 GiB volume \"default\")",
		Long: `Serve the volumes of a data directory over NBD.

With no arguments: data directory ./vmsan-data, listeners 127.0.0.1:10809 and
unix:./vmsan-data/nbd.sock, and a 10 GiB sparse volume "default" created if the
directory has no volumes. Flags override the config file. SIGTERM/SIGINT stop
accepting, drain in-flight requests, flush every volume and exit 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := config.Default()
			if cfgFile != "" {
				var err error
				if cfg, err = config.Load(cfgFile); err != nil {
					return err
				}
			}
			f := cmd.Flags()
			if f.Changed("data-dir") {
				cfg.DataDir = dataDir
			}
			if f.Changed("listen") {
				cfg.Listen = listen
			}
			if f.Changed("metrics-listen") {
				cfg.MetricsListen = metrics
			}
			if f.Changed("log-level") {
				cfg.LogLevel = logLevel
			}
			if f.Changed("pprof") {
				cfg.Pprof = pprof
			}
			if f.Changed("max-payload") {
				n, err := volume.ParseSize(maxPayload)
				if err != nil {
					return err
				}
				cfg.MaxPayload = config.Size(n)
			}
			if f.Changed("tls") {
				cfg.TLS.Mode = tlsMode
			}
			if f.Changed("tls-cert") {
				cfg.TLS.Cert = tlsCert
			}
			if f.Changed("tls-key") {
				cfg.TLS.Key = tlsKey
			}
			if f.Changed("tls-ca") {
				cfg.TLS.CA = tlsCA
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			if printConfig {
				b, err := cfg.Marshal()
				if err != nil {
					return err
				}
				os.Stdout.Write(b)
				return nil
			}
			d, err := daemon.New(cfg, daemon.Options{Out: os.Stdout})
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			// After the first signal starts the graceful drain, restore the
			// default action so a second Ctrl-C kills a drain that hangs.
			go func() { <-ctx.Done(); sdnotify.Stopping("draining"); stop() }()
			sdnotify.Ready("serving") // New bound every listener; systemd may start clients
			return d.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfgFile, "config", "", "YAML config file (see docs/architecture.md); flags override it")
	f.StringVar(&dataDir, "data-dir", config.DefaultDataDir, "data directory holding volumes")
	f.StringArrayVar(&listen, "listen", nil, "NBD listener HOST:PORT or unix:PATH (repeatable; default 127.0.0.1:10809 and unix:DATA_DIR/nbd.sock)")
	f.StringVar(&metrics, "metrics-listen", "", "serve Prometheus metrics on HOST:PORT at /metrics")
	f.BoolVar(&pprof, "pprof", false, "serve /debug/pprof on the metrics listener and the control socket")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&maxPayload, "max-payload", "32M", "largest NBD READ/WRITE accepted")
	f.StringVar(&tlsMode, "tls", "off", "TLS mode: off, optional or required")
	f.StringVar(&tlsCert, "tls-cert", "", "server certificate (PEM)")
	f.StringVar(&tlsKey, "tls-key", "", "server private key (PEM)")
	f.StringVar(&tlsCA, "tls-ca", "", "CA bundle: when set, clients must present a certificate it signed")
	f.BoolVar(&printConfig, "print-config", false, "print the effective configuration as YAML and exit")
	rootCmd.AddCommand(cmd)
}
