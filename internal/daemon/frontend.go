package daemon

import (
	"context"
	"syscall"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/volrt"
)

// FrontEnd is a protocol server over the daemon's volumes (NBD
// and iSCSI). The daemon builds every entry of frontEndFactories in New, starts
// them in Run, stops them first in Shutdown, and reads their Stats for
// status and metrics; it knows nothing else about any protocol.
//
// Concurrency: Stats and BannerLines may be called concurrently with
// Serve; Shutdown is called once, after or concurrently with Serve.
type FrontEnd interface {
	// Name is the front end's short name ("nbd"): the status section and
	// the metrics label.
	Name() string
	// Serve serves until Shutdown (then returns nil) or until a listener
	// fails (returns the error; the daemon then shuts down).
	Serve(ctx context.Context) error
	// Shutdown stops accepting, lets in-flight requests complete and be
	// answered, and releases the listeners. Bounded by ctx.
	Shutdown(ctx context.Context) error
	// Stats is the front-end-neutral snapshot (clients included).
	Stats() volrt.FrontEndStats
	// BannerLines are printed at start-up after the volume summary: how a
	// user connects (QEMU options, URLs).
	BannerLines() []string
	// Close releases listeners without draining (unwinding a failed New
	// or after Shutdown). Idempotent.
	Close()
}

// frontEndFactories builds the daemon's front ends, in banner order. A
// front end is added with one line here (and its factory, next to nbd.go).
// A factory takes its client tracker from d.newSessions, which gives every
// front end the connect/disconnect log lines and client events.
// Factories run in New once TLS is loaded, before the control socket,
// the volumes (created and opened after every listener is bound) and
// plugins; they bind their listeners but serve nothing until Serve, and
// must look volumes up only when clients come.
var frontEndFactories = []func(d *Daemon) (FrontEnd, error){
	newNBDFrontEnd,
	newISCSIFrontEnd, // iscsi.go; nil unless iscsi.listen is configured
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

// BudgetStats is the daemon-wide in-flight budget's snapshot (metrics,
// status).
func (d *Daemon) BudgetStats() volrt.BudgetStats { return d.budget.Stats() }
