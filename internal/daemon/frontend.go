package daemon

import (
	"log/slog"
	"syscall"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/export"
	"github.com/vmsan/vmsan/internal/frontend"
	"github.com/vmsan/vmsan/internal/role"
	"github.com/vmsan/vmsan/internal/volrt"
)

// FrontEnd is a protocol server over the daemon's volumes (NBD and
// iSCSI): see package frontend. The daemon builds every entry of
// frontEndFactories in New, starts them in Run, stops them first in
// Shutdown, and reads their Stats for status and metrics.
type FrontEnd = frontend.FrontEnd

// frontEndFactories builds the daemon's front ends, in banner order. A
// front end is added with one line here (and its factory, next to nbd.go).
// A factory builds its front end against feHost (frontend.Host), whose
// NewSessions which gives every
// front end the connect/disconnect log lines and client events.
// Factories run in New once TLS is loaded, before the control socket,
// the volumes (created and opened after every listener is bound) and
// plugins; they bind their listeners but serve nothing until Serve, and
// must look volumes up only when clients come.
var frontEndFactories = []func(d *Daemon) (FrontEnd, error){
	newNBDFrontEnd,
	newISCSIFrontEnd, // iscsi.go (package iscsi/iscsifront); nil unless iscsi.listen is configured
}

// FrontEnds returns the daemon's front ends (read-only after New).
func (d *Daemon) FrontEnds() []FrontEnd { return d.frontEnds }

// frontEndStats snapshots every front end.
func (d *Daemon) frontEndStats() []volrt.FrontEndStats {
	out := make([]volrt.FrontEndStats, 0, len(d.frontEnds))
	for _, fe := range d.frontEnds {
		out = append(out, fe.Stats())
	}
	return out
}

// clients returns each volume's connected clients over all front ends.
func (d *Daemon) clients() map[string][]volrt.Session {
	out := map[string][]volrt.Session{}
	for _, fe := range d.frontEnds {
		for _, s := range fe.Stats().Clients {
			out[s.Volume] = append(out[s.Volume], s)
		}
	}
	return out
}

// newSessions is the client tracker for a front end: watched by the daemon
// so that every client's connect and disconnect is logged (with address
// and duration) and published as a client event (events.go).
func (d *Daemon) newSessions(frontEnd string) *volrt.Sessions {
	s := volrt.NewSessions(frontEnd)
	s.Watch(d.sessionChanged)
	return s
}

// inflightBudget is the configured inflight_budget, or the default for
// this host's RAM.
func (d *Daemon) inflightBudget() config.Size {
	if d.cfg.InflightBudget != 0 {
		return d.cfg.InflightBudget
	}
	var si syscall.Sysinfo_t
	var ram uint64
	if syscall.Sysinfo(&si) == nil {
		ram = uint64(si.Totalram) * uint64(si.Unit)
	}
	return config.DefaultInflightBudget(ram, d.cfg.MaxPayload)
}

// feHost is the daemon as front ends see it (frontend.Host).
type feHost struct{ d *Daemon }

var _ frontend.Host = feHost{}

func (h feHost) Logger() *slog.Logger                  { return h.d.log }
func (h feHost) Registry() export.Registry             { return registry{h.d} }
func (h feHost) Volumes() *frontend.Volumes            { return h.d.vols.Load() }
func (h feHost) StateDir(vol string) (string, error)   { return h.d.store.StateDir(vol) }
func (h feHost) Budget() *volrt.Budget                 { return &h.d.budget }
func (h feHost) VolumeRole(vol string) role.Role       { return h.d.volumeRole(vol) }
func (h feHost) BannerExport() string                  { return h.d.bannerExport() }
func (h feHost) NewSessions(fe string) *volrt.Sessions { return h.d.newSessions(fe) }
