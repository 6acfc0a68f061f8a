package driver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"time"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/httpjson"
	"github.com/vmsan/vmsan/internal/repl"
	"github.com/vmsan/vmsan/internal/volume"
)

// Replication that changes on a running daemon (what `vmsan repl
// configure` and `vmsan repl remove` do when a daemon serves the data
// directory):
//
//	PUT    /v1/repl/{volume}   body: Settings. Write them (Configure) and
//	                           apply now: start replication on a plain
//	                           volume, or restart the volume's replica
//	                           with the new settings (protocol, rates,
//	                           timeouts, peer). Answers the Status.
//	DELETE /v1/repl/{volume}   ?force=1. Stop the volume's replication and
//	                           remove its state: a plain volume again.
//
// Only the named volume is touched. Its clients stay connected: their
// requests are held (route.pause) while the replica is replaced, then go to
// the new one; nothing fails. A new peer address with a peer that never
// shared a generation with this node (a fresh volume) gets a full sync
// from the primary that skips holes and zero ranges (repl.Decide: a peer at
// generation 0 is a full sync target); a peer holding other data is refused
// as unrelated, as at start.

// changeTimeout bounds how long a change waits for the volume's client
// requests in flight (answered by the old replica, or by the engine) before
// it gives up and leaves the volume as it was.
var changeTimeout = 10 * time.Second

// Apply writes a volume's replication settings and applies them at once.
// The returned settings are those written (with the node id).
func (p *Plugin) Apply(name string, s Settings) (Settings, error) {
	return p.apply(name, s, false)
}

// apply is Apply; fromFile: the settings come from the configuration
// file (a reload), not from `vmsan repl configure`.
func (p *Plugin) apply(name string, s Settings, fromFile bool) (Settings, error) {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	if fromFile {
		p.fileVolumes[name] = true
	}
	dir := Dir(p.dataDir, name)
	old, oldErr := LoadSettings(dir)
	out, err := Configure(p.dataDir, name, s)
	if err != nil {
		return out, err
	}
	if p.fileVolumes[name] && !fromFile {
		p.log.Warn("replication settings changed at runtime for a volume with a replication section in the configuration file: the file's settings apply again at the next start", "volume", name)
	}
	r := p.replica(name)
	if r != nil {
		running := p.applied[name]
		if reflect.DeepEqual(running.WithDefaults(), out.WithDefaults()) && sameSecret(r, out) {
			// Nothing changed (as drbdadm adjust: a no-op), except that a
			// StandAlone replica connects again (e.g. its handshake was
			// refused while the peer still had the old protocol).
			return out, reconnect(r)
		}
		if retunable(running, out) && sameSecret(r, out) {
			// Timeouts and rates only: in place, the link stays up.
			if err := r.Retune(out); err != nil {
				SaveSettings(dir, running)
				return out, fmt.Errorf("replication of %s: %w", name, err)
			}
			p.applied[name] = out
			p.log.Info("replication settings applied in place", "volume", name)
			return out, reconnect(r)
		}
	}
	restore := func() {
		// Leave the settings file as the running state.
		if oldErr == nil {
			SaveSettings(dir, old)
		} else {
			os.Remove(filepath.Join(dir, "config.json"))
		}
	}
	rt := p.route(name)
	if err := p.quiesce(name, rt, r); err != nil {
		restore()
		return out, err
	}
	defer rt.resume()
	if r != nil {
		p.stopReplica(name, r)
	}
	if err := p.startReplica(name, out); err != nil {
		restore()
		if r != nil {
			// Back to the replica as it ran, if it can.
			if rerr := p.startReplica(name, old); rerr != nil {
				p.log.Error("replication could not be restarted with its previous settings either: the volume is not replicated now", "volume", name, "err", rerr)
				rt.cur.Store(nil)
				p.releaseDevice(name)
			}
		}
		return out, err
	}
	if r == nil {
		p.log.Info("replication added at runtime", "volume", name, "peer", out.Peer)
	} else {
		p.log.Info("replication reconfigured at runtime", "volume", name, "peer", out.Peer, "old_peer", old.Peer)
	}
	return out, nil
}

// ReloadReplication applies a volume's replication section of the
// configuration file on reload (daemon.ReplicationReloader), as Apply.
func (p *Plugin) ReloadReplication(name string, r *config.Replication) error {
	_, err := p.apply(name, r.Settings(), true)
	return err
}

// sameSecret reports whether s's secret is the one r runs with (a secret
// file's content may have changed under the same settings).
func sameSecret(r *Replica, s Settings) bool {
	sec, err := s.Secret()
	return err == nil && string(sec) == string(r.hsParams.Secret)
}

// reconnect leaves StandAlone (Connect), as drbdadm adjust connects a
// resource that is not connected.
func reconnect(r *Replica) error {
	if r.Status().Conn != repl.StandAlone.String() {
		return nil
	}
	return r.Connect()
}

// ErrNotReplicated: the volume has no replication to remove.
var ErrNotReplicated = errors.New("volume is not replicated on this node")

// Remove stops a volume's replication and removes its replication state;
// the volume is plain again, its clients stay connected. Without force it
// refuses when the local copy is not UpToDate (it would then serve data
// that a resync had not finished writing).
func (p *Plugin) Remove(name string, force bool) error {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	dir := Dir(p.dataDir, name)
	r := p.replica(name)
	if r == nil {
		if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
			return fmt.Errorf("replication of %s: %w", name, ErrNotReplicated)
		}
		// Configured but not running (a volume not served): just the state.
		return os.RemoveAll(dir)
	}
	if st := r.Status(); st.Disk != repl.UpToDate.String() && !force {
		return fmt.Errorf("replication of %s: the local copy is %s, not UpToDate: removing replication would serve it as it is; use --force to remove anyway", name, st.Disk)
	}
	rt := p.route(name)
	if err := p.quiesce(name, rt, r); err != nil {
		return err
	}
	defer rt.resume()
	p.stopReplica(name, r)
	rt.cur.Store(nil)
	p.releaseDevice(name)
	p.disownRole(name)
	// The state goes: replication added later starts fresh (a bitmap
	// kept from now would miss the writes made while plain).
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("replication of %s stopped, but its state could not be removed: %w", name, err)
	}
	p.log.Info("replication removed at runtime", "volume", name)
	return nil
}

// RemoveOffline is Remove without a running daemon: the volume's
// replication state is removed (it starts plain at the next start). Without
// force it refuses when the local copy is not UpToDate.
func RemoveOffline(dataDir, name string, force bool) error {
	if err := volume.ValidateName(name); err != nil {
		return err
	}
	dir := Dir(dataDir, name)
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err != nil {
		return fmt.Errorf("replication of %s: %w", name, ErrNotReplicated)
	}
	if !force {
		st := &state{dir: dir}
		m, _, _, found, err := st.load()
		if err != nil {
			return fmt.Errorf("replication of %s: %w (use --force to remove anyway)", name, err)
		}
		if found && m.Disk != repl.UpToDate {
			return fmt.Errorf("replication of %s: the local copy is %s, not UpToDate: removing replication would serve it as it is; use --force to remove anyway", name, m.Disk)
		}
	}
	return os.RemoveAll(dir)
}

// quiesce pauses the volume's route and waits for the client requests in
// flight: those the replica r holds (nil: none), or the writes in the
// engine. On error the route runs again as before.
// REQUIRES: lifeMu held.
func (p *Plugin) quiesce(name string, rt *route, r *Replica) error {
	if err := rt.pause(changeTimeout); err != nil {
		return fmt.Errorf("replication of %s: %w", name, err)
	}
	var err error
	if r != nil {
		err = r.drainClients(changeTimeout)
	} else {
		dev, oerr := p.open(name)
		if oerr != nil {
			rt.resume()
			return fmt.Errorf("replication of %s: volume: %w", name, oerr)
		}
		err = flushDevice(dev)
		dev.Release()
	}
	if err != nil {
		rt.resume()
		return fmt.Errorf("replication of %s: waiting for client requests in flight: %w", name, err)
	}
	return nil
}

// stopReplica closes r (a clean stop: bitmap complete on disk) and forgets
// it; the volume's device stays open for the next replica.
// REQUIRES: lifeMu held.
func (p *Plugin) stopReplica(name string, r *Replica) {
	if err := r.Close(); err != nil {
		p.log.Warn("replication stopped with an error", "volume", name, "err", err)
	}
	delete(p.applied, name)
	p.mu.Lock()
	if p.replicas[name] == r {
		delete(p.replicas, name)
	}
	p.mu.Unlock()
}

func (p *Plugin) releaseDevice(name string) {
	p.mu.Lock()
	dev := p.devByName[name]
	delete(p.devByName, name)
	p.mu.Unlock()
	if dev != nil {
		dev.Release()
	}
}

func (p *Plugin) handleConfigure(w http.ResponseWriter, req *http.Request) {
	name := req.PathValue("volume")
	var s Settings
	dec := json.NewDecoder(io.LimitReader(req.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		httpjson.Write(w, http.StatusBadRequest, daemon.APIError{Code: "bad_request", Message: "replication settings: " + err.Error()})
		return
	}
	if _, err := p.Apply(name, s); err != nil {
		code, status := "conflict", http.StatusConflict
		if errors.Is(err, volume.ErrNotFound) {
			code, status = "not_found", http.StatusNotFound
		}
		httpjson.Write(w, status, daemon.APIError{Code: code, Message: err.Error()})
		return
	}
	r := p.replica(name)
	if r == nil {
		httpjson.Write(w, http.StatusConflict, daemon.APIError{Code: "conflict", Message: "replication of " + name + " not running"})
		return
	}
	httpjson.Write(w, http.StatusOK, r.Status())
}

func (p *Plugin) handleRemove(w http.ResponseWriter, req *http.Request) {
	name := req.PathValue("volume")
	force, _ := strconv.ParseBool(req.URL.Query().Get("force"))
	if err := p.Remove(name, force); err != nil {
		code, status := "conflict", http.StatusConflict
		if errors.Is(err, ErrNotReplicated) {
			code, status = "not_found", http.StatusNotFound
		}
		httpjson.Write(w, status, daemon.APIError{Code: code, Message: err.Error()})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
