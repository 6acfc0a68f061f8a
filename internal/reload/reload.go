// Package reload is the configuration side of a reload: the signal loop
// (with systemd's RELOADING/READY framing), which settings differ and need
// a restart, and the volume settings a config entry asks for. The daemon
// (Daemon.Reload) applies what can change at runtime.
package reload

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/vmsan/vmsan/internal/backend"
	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/sdnotify"
	"github.com/vmsan/vmsan/internal/volume"
)

// Handle reloads the configuration each time sig delivers (vmsan
// serve passes SIGHUP), until ctx is done. load re-reads the configuration
// the way start-up read it (config file, then command-line flags over it);
// apply is the daemon's Reload. A configuration that fails to load or to apply is logged and the running
// one kept: a reload never stops the daemon. Under systemd each reload is
// framed by RELOADING=1 (with MONOTONIC_USEC) and READY=1, so `systemctl
// reload` waits for it (Type=notify-reload) and status shows "reloading".
func Handle(ctx context.Context, log *slog.Logger, sig <-chan os.Signal, load func() (config.Config, error), apply func(config.Config) error) {
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-sig:
			log.Info("reloading configuration", "signal", fmt.Sprint(s))
			sdnotify.Reloading("reloading configuration")
			cfg, err := load()
			if err == nil {
				err = apply(cfg)
			}
			if err != nil {
				log.Error("reload rejected; keeping the running configuration", "err", err)
				// Still serving (with the running configuration): READY.
				sdnotify.Ready("serving; last reload rejected: " + err.Error())
			} else {
				sdnotify.Ready("serving")
			}
		}
	}
}

// WarnCAChange warns when a reload adds or removes the TLS CA: whether new
// connections need a client certificate changes with it.
func WarnCAChange(log *slog.Logger, cur, next config.TLS) {
	switch {
	case cur.CA != "" && next.CA == "":
		log.Warn("tls.ca removed: new connections no longer need a client certificate")
	case cur.CA == "" && next.CA != "":
		log.Warn("tls.ca set: new connections need a client certificate; connected clients stay")
	}
}

// LogRestarts names in a log line each setting that differs between the
// running configuration cur and next and that only a restart applies
// (iscsiOn: the iSCSI front end runs, so its access settings reload).
func LogRestarts(log *slog.Logger, cur, next config.Config, iscsiOn bool) {
	restart := func(setting string, args ...any) {
		log.Warn(setting+" changed; restart to apply", args...)
	}
	if next.DataDir != cur.DataDir {
		restart("data_dir", "running", cur.DataDir, "configured", next.DataDir)
	}
	if !slices.Equal(next.Listeners(), cur.Listeners()) {
		restart("listen", "running", cur.Listeners(), "configured", next.Listeners())
	}
	if next.MetricsListen != cur.MetricsListen {
		restart("metrics_listen", "running", cur.MetricsListen, "configured", next.MetricsListen)
	}
	if next.Pprof != cur.Pprof {
		restart("pprof")
	}
	if next.MaxPayload != cur.MaxPayload {
		restart("max_payload", "running", int64(cur.MaxPayload), "configured", int64(next.MaxPayload))
	}
	if next.InflightBudget != cur.InflightBudget {
		restart("inflight_budget", "running", int64(cur.InflightBudget), "configured", int64(next.InflightBudget))
	}
	if next.MaxConnections != cur.MaxConnections {
		restart("max_connections", "running", cur.MaxConnections, "configured", next.MaxConnections)
	}
	if next.MaxPendingHandshakes != cur.MaxPendingHandshakes {
		restart("nbd.max_pending_handshakes", "running", cur.MaxPendingHandshakes, "configured", next.MaxPendingHandshakes)
	}
	if next.HandshakeTimeout != cur.HandshakeTimeout {
		restart("nbd.handshake_timeout", "running", time.Duration(cur.HandshakeTimeout), "configured", time.Duration(next.HandshakeTimeout))
	}
	if next.TLS.Mode != cur.TLS.Mode {
		restart("tls.mode", "running", cur.TLS.Mode, "configured", next.TLS.Mode)
	}
	if next.Engine != cur.Engine {
		restart("engine")
	}
	if !reflect.DeepEqual(next.ISCSI.WithoutAccess(), cur.ISCSI.WithoutAccess()) || !iscsiOn && !reflect.DeepEqual(next.ISCSI, cur.ISCSI) {
		// Portals, the mode, identities and timers are read once in New;
		// new volumes appear as LUNs/targets without a reload. Access
		// settings (CHAP, ACLs, allow_any) apply below.
		restart("iscsi", "keys", iscsiRestartKeys(cur.ISCSI, next.ISCSI))
	}
}

// iscsiRestartKeys names the iscsi settings (YAML keys) that differ
// between a and b and need a restart.
func iscsiRestartKeys(a, b config.ISCSI) []string {
	a, b = a.WithoutAccess(), b.WithoutAccess()
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	var out []string
	for i := 0; i < va.NumField(); i++ {
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			name, _, _ := strings.Cut(va.Type().Field(i).Tag.Get("yaml"), ",")
			out = append(out, "iscsi."+name)
		}
	}
	if len(out) == 0 {
		out = []string{"iscsi"} // the front end is off: any change needs a restart
	}
	return out
}

// FindVolume is the entry of vs named name.
func FindVolume(vs []config.Volume, name string) (config.Volume, bool) {
	for _, v := range vs {
		if v.Name == name {
			return v, true
		}
	}
	return config.Volume{}, false
}

// VolumeSettings are the settings the config entry cv declares that
// differ from the volume's metadata m (volconf.Ensure applies the same at
// start): cache and description only when set.
func VolumeSettings(cv config.Volume, m volume.Meta) control.Settings {
	var s control.Settings
	if cv.Cache != "" && backend.CacheMode(cv.Cache) != m.Cache {
		c := cv.Cache
		s.Cache = &c
	}
	if cv.Description != "" && cv.Description != m.Description {
		s.Description = &cv.Description
	}
	if cv.Rotational != m.Rotational {
		s.Rotational = &cv.Rotational
	}
	if cv.ReadOnly != m.ReadOnly {
		s.ReadOnly = &cv.ReadOnly
	}
	return s
}
