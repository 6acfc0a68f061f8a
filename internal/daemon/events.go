package daemon

import (
	"strconv"
	"time"

	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/volops"
	"github.com/vmsan/vmsan/internal/volrt"
)

// The event stream (GET /v1/events, `vmsan events`): the daemon publishes
// volume, client and (through the replication plugin) replication events
// on d.events; each subscriber first gets the current state as "exists"
// lines, ended by "exists -", then changes as they happen. A subscriber
// subscribes before the snapshot is taken, so no change is lost between
// the two; a change that happened just before the snapshot may be
// reported by both (the later line wins).

// sessionChanged is every front end's Sessions watcher: the connect and
// disconnect log lines (with the client's address and, on disconnect, how
// long it stayed) and the client events.
func (d *Daemon) sessionChanged(c volrt.SessionChange) {
	id := strconv.FormatUint(c.ID, 10)
	if c.Connected {
		d.log.Info("client connected", "front_end", c.FrontEnd, "volume", c.Volume, "remote", c.Remote)
		d.events.Publish(events.New(events.Create, events.Client, clientAttrs(c.Session)...))
		return
	}
	dur := c.Duration.Round(time.Millisecond)
	d.log.Info("client disconnected", "front_end", c.FrontEnd, "volume", c.Volume, "remote", c.Remote, "duration", dur.String())
	d.events.Publish(events.New(events.Destroy, events.Client, "id", id, "front_end", c.FrontEnd,
		"volume", c.Volume, "remote", c.Remote, "duration", dur.String()))
}

func clientAttrs(s volrt.Session) []string {
	return []string{"id", strconv.FormatUint(s.ID, 10), "front_end", s.FrontEnd, "volume", s.Volume,
		"remote", s.Remote, "since", s.Since.UTC().Format(time.RFC3339)}
}

// eventSnapshot is the current state as "exists" events: volumes, clients,
// then the plugins' sources.
func (d *Daemon) eventSnapshot() []events.Event {
	var out []events.Event
	list, _ := d.store.List()
	for _, m := range list {
		out = append(out, events.New(events.Exists, events.Volume, volops.VolumeAttrs(m)...))
	}
	for _, fs := range d.frontEndStats() {
		for _, c := range fs.Clients {
			out = append(out, events.New(events.Exists, events.Client, clientAttrs(c)...))
		}
	}
	out = append(out, d.noSpace.Events(*d.vols.Load())...)
	d.statusMu.Lock()
	srcs := append([]func() []events.Event(nil), d.eventSrc...)
	d.statusMu.Unlock()
	for _, fn := range srcs {
		out = append(out, fn()...)
	}
	return out
}
