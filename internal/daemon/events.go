package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/volrt"
	"github.com/vmsan/vmsan/internal/volume"
)

// The event stream (GET /v1/events, `vmsan events`): the daemon publishes
// volume, client and (through the replication plugin) replication events
// on d.events; each subscriber first gets the current state as "exists"
// lines, ended by "exists -", then changes as they happen. A subscriber
// subscribes before the snapshot is taken, so no change is lost between
// the two; a change that happened just before the snapshot may be
// reported by both (the later line wins).

// eventBuffer is each subscriber's queue: a burst of this many events
// (e.g. hundreds of clients reconnecting at once) is absorbed; a
// subscriber that falls further behind is dropped with an "overflow" line.
const eventBuffer = 1024

// eventWriteTimeout bounds one write to an event subscriber: a client that
// stops reading its socket must not hold a handler (and a shutdown) forever.
const eventWriteTimeout = 30 * time.Second

// Events is the daemon's event bus; plugins publish on it.
func (d *Daemon) Events() *events.Bus { return d.events }

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

func volumeAttrs(m volume.Meta) []string {
	return []string{"name", m.Name, "size", strconv.FormatInt(m.Size, 10), "cache", string(m.Cache),
		"read_only", strconv.FormatBool(m.ReadOnly)}
}

// publishVolume publishes kind for the volume m.
func (d *Daemon) publishVolume(kind string, m volume.Meta) {
	d.events.Publish(events.New(kind, events.Volume, volumeAttrs(m)...))
}

// eventSnapshot is the current state as "exists" events: volumes, clients,
// then the plugins' sources.
func (d *Daemon) eventSnapshot() []events.Event {
	var out []events.Event
	list, _ := d.store.List()
	for _, m := range list {
		out = append(out, events.New(events.Exists, events.Volume, volumeAttrs(m)...))
	}
	for _, fs := range d.frontEndStats() {
		for _, c := range fs.Clients {
			out = append(out, events.New(events.Exists, events.Client, clientAttrs(c)...))
		}
	}
	out = append(out, d.noSpaceEvents()...)
	d.statusMu.Lock()
	srcs := append([]func() []events.Event(nil), d.eventSrc...)
	d.statusMu.Unlock()
	for _, fn := range srcs {
		out = append(out, fn()...)
	}
	return out
}

// hEvents streams events: ?now=true stops after the snapshot,
// ?format=json writes one JSON object per line instead of text.
func (d *Daemon) hEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	now, err := parseBoolParam(q.Get("now"))
	if err != nil {
		writeErr(w, &APIError{Code: "bad_request", Message: "now: " + err.Error()})
		return
	}
	asJSON := false
	switch f := q.Get("format"); f {
	case "", "text":
	case "json":
		asJSON = true
	default:
		writeErr(w, &APIError{Code: "bad_request", Message: fmt.Sprintf("format=%q: want text or json", f)})
		return
	}
	sub := d.events.Subscribe(eventBuffer)
	defer sub.Close()
	rc := http.NewResponseController(w)
	if asJSON {
		w.Header().Set("Content-Type", "application/x-ndjson")
	} else {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	}
	w.WriteHeader(http.StatusOK)
	write := func(e events.Event) error {
		rc.SetWriteDeadline(time.Now().Add(eventWriteTimeout))
		var line []byte
		if asJSON {
			line, _ = json.Marshal(e)
		} else {
			line = []byte(e.String())
		}
		if _, err := w.Write(append(line, '\n')); err != nil {
			return err
		}
		return nil
	}
	for _, e := range d.eventSnapshot() {
		if write(e) != nil {
			return
		}
	}
	if write(events.New(events.Exists, "-")) != nil || rc.Flush() != nil || now {
		return
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-d.eventsStop:
			return
		case e, ok := <-sub.C():
			if !ok {
				if sub.Overflowed() {
					write(events.New(events.Overflow, ""))
					rc.Flush()
				}
				return
			}
			if write(e) != nil {
				return
			}
			// Write what is queued before flushing: one flush per burst.
			for n := len(sub.C()); n > 0; n-- {
				if e, ok := <-sub.C(); ok && write(e) != nil {
					return
				}
			}
			if rc.Flush() != nil {
				return
			}
		}
	}
}

func parseBoolParam(s string) (bool, error) {
	if s == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return false, fmt.Errorf("%q: want true or false", s)
	}
	return b, nil
}

// Events opens the event stream (see hEvents); the caller reads lines
// until EOF or ctx is done, and closes the body.
func (c *Client) Events(ctx context.Context, now, asJSON bool) (io.ReadCloser, error) {
	q := url.Values{}
	q.Set("now", strconv.FormatBool(now))
	if asJSON {
		q.Set("format", "json")
	}
	req, err := http.NewRequestWithContext(ctx, "GET", "http://vmsan/v1/events?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	// The stream has no end: the client's overall timeout must not apply.
	hc := &http.Client{Transport: c.hc.Transport}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w", c.path, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
		ae := &APIError{}
		if json.Unmarshal(b, ae) != nil || ae.Message == "" {
			ae = &APIError{Code: "http", Message: fmt.Sprintf("GET /v1/events: %s", resp.Status)}
		}
		return nil, ae
	}
	return resp.Body, nil
}
