package control

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/vmsan/vmsan/internal/events"
	"github.com/vmsan/vmsan/internal/httpjson"
	"github.com/vmsan/vmsan/internal/volume"
)

// Ops is the daemon as the control API calls it: every operation the
// handlers expose, each safe for concurrent use. The daemon implements it
// (an adapter in internal/daemon); errors are mapped to codes by StatusOf.
type Ops interface {
	Status() Status
	// List returns the volumes; a nil list with an error is a failure, a
	// list with an error lists what was readable.
	List() ([]VolumeInfo, error)
	Info(name string) (VolumeInfo, error)
	CreateVolume(o volume.CreateOptions) (VolumeInfo, error)
	ResizeVolume(name string, size int64, force bool) (VolumeInfo, error)
	UpdateVolume(name string, s Settings) (VolumeInfo, error)
	DeleteVolume(name string, force bool) error
	// CreateSnapshot takes a snapshot; temporary ones are removed at the
	// next start if the caller does not delete them.
	CreateSnapshot(vol, snap string, copyData, temporary bool) (SnapshotInfo, error)
	DeleteSnapshot(vol, snap string, force bool) error
	// ListSnapshots works like List ("" vol: every volume's).
	ListSnapshots(vol string) ([]SnapshotInfo, error)
	Clone(src, name string, copyData bool) (VolumeInfo, error)
	Rollback(vol, snap string, force, copyData bool) (VolumeInfo, error)
	ImportVolume(o volume.CreateOptions, path string) (VolumeInfo, error)
	// ISCSIShow is the body of GET /v1/iscsi.
	ISCSIShow() any
	// Events is the event bus; EventSnapshot the current state as
	// "exists" events.
	Events() *events.Bus
	EventSnapshot() []events.Event
}

// MaxBodyBytes bounds a control request body; real ones are < 1 KiB.
const MaxBodyBytes = 64 << 10

// eventBuffer is each event subscriber's queue: a burst of this many
// events (e.g. hundreds of clients reconnecting at once) is absorbed; a
// subscriber that falls further behind is dropped with an "overflow" line.
const eventBuffer = 1024

// eventWriteTimeout bounds one write to an event subscriber: a client that
// stops reading its socket must not hold a handler (and a shutdown) forever.
const eventWriteTimeout = 30 * time.Second

// Register adds the control API's endpoints to mux. Event streams end
// when stop is closed (an HTTP server's Shutdown waits for handlers).
func Register(mux *http.ServeMux, ops Ops, log *slog.Logger, stop <-chan struct{}) {
	h := handlers{ops: ops, log: log, stop: stop}
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) { WriteJSON(w, http.StatusOK, ops.Status()) })
	mux.HandleFunc("GET /v1/volumes", h.list)
	mux.HandleFunc("POST /v1/volumes", h.create)
	mux.HandleFunc("GET /v1/volumes/{name}", h.info)
	mux.HandleFunc("POST /v1/volumes/{name}/resize", h.resize)
	mux.HandleFunc("POST /v1/volumes/{name}/settings", h.settings)
	mux.HandleFunc("DELETE /v1/volumes/{name}", h.delete)
	mux.HandleFunc("GET /v1/events", h.events)
	mux.HandleFunc("GET /v1/iscsi", func(w http.ResponseWriter, _ *http.Request) { WriteJSON(w, http.StatusOK, ops.ISCSIShow()) })
	mux.HandleFunc("GET /v1/snapshots", h.snapList)
	mux.HandleFunc("POST /v1/volumes/{name}/snapshots", h.snapCreate)
	mux.HandleFunc("DELETE /v1/volumes/{name}/snapshots/{snap}", h.snapDelete)
	mux.HandleFunc("POST /v1/clone", h.clone)
	mux.HandleFunc("POST /v1/volumes/{name}/rollback", h.rollback)
	mux.HandleFunc("POST /v1/import", h.importVolume)
}

type handlers struct {
	ops  Ops
	log  *slog.Logger
	stop <-chan struct{}
}

// WriteJSON writes v as an indented JSON reply with status.
func WriteJSON(w http.ResponseWriter, status int, v any) { httpjson.Write(w, status, v) }

// WriteError writes err as an APIError with its status (StatusOf).
func WriteError(w http.ResponseWriter, err error) {
	st, ae := StatusOf(err)
	WriteJSON(w, st, ae)
}

// decodeBody decodes the request body into v; on a bad body it writes
// the error reply and returns false.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := readJSON(r, v); err != nil {
		WriteError(w, err)
		return false
	}
	return true
}

func readJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &APIError{Code: "bad_request", Message: "bad request body: " + err.Error()}
	}
	return nil
}

// reply writes v with status, or the error.
func reply(w http.ResponseWriter, status int, v any, err error) {
	if err != nil {
		WriteError(w, err)
		return
	}
	WriteJSON(w, status, v)
}

// forceParam reads ?force= (absent: false).
func forceParam(r *http.Request) (bool, error) {
	f := r.URL.Query().Get("force")
	if f == "" {
		return false, nil
	}
	force, err := strconv.ParseBool(f)
	if err != nil {
		return false, &APIError{Code: "bad_request", Message: fmt.Sprintf("force=%q: want true or false", f)}
	}
	return force, nil
}

func (h handlers) list(w http.ResponseWriter, r *http.Request) {
	out, err := h.ops.List()
	if out == nil {
		WriteError(w, err)
		return
	}
	if err != nil {
		h.log.Warn("some volumes are unreadable", "err", err)
	}
	WriteJSON(w, http.StatusOK, out)
}

func (h handlers) info(w http.ResponseWriter, r *http.Request) {
	vi, err := h.ops.Info(r.PathValue("name"))
	reply(w, http.StatusOK, vi, err)
}

func (h handlers) create(w http.ResponseWriter, r *http.Request) {
	var req CreateRequest
	if !decodeBody(w, r, &req) {
		return
	}
	o, err := req.Options()
	if err != nil {
		WriteError(w, fmt.Errorf("%w: %v", volume.ErrBadSize, err))
		return
	}
	vi, err := h.ops.CreateVolume(o)
	reply(w, http.StatusCreated, vi, err)
}

func (h handlers) resize(w http.ResponseWriter, r *http.Request) {
	var req ResizeRequest
	if !decodeBody(w, r, &req) {
		return
	}
	size, err := volume.ParseSize(req.Size)
	if err != nil {
		WriteError(w, fmt.Errorf("%w: %v", volume.ErrBadSize, err))
		return
	}
	vi, err := h.ops.ResizeVolume(r.PathValue("name"), size, req.Force)
	reply(w, http.StatusOK, vi, err)
}

func (h handlers) settings(w http.ResponseWriter, r *http.Request) {
	var req Settings
	if !decodeBody(w, r, &req) {
		return
	}
	vi, err := h.ops.UpdateVolume(r.PathValue("name"), req)
	reply(w, http.StatusOK, vi, err)
}

func (h handlers) delete(w http.ResponseWriter, r *http.Request) {
	force, err := forceParam(r)
	if err == nil {
		err = h.ops.DeleteVolume(r.PathValue("name"), force)
	}
	if err != nil {
		WriteError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h handlers) snapList(w http.ResponseWriter, r *http.Request) {
	l, err := h.ops.ListSnapshots(r.URL.Query().Get("volume"))
	if err != nil && len(l) == 0 {
		WriteError(w, err)
		return
	}
	if err != nil {
		h.log.Warn("some snapshots are unreadable", "err", err)
	}
	WriteJSON(w, http.StatusOK, l)
}

func (h handlers) snapCreate(w http.ResponseWriter, r *http.Request) {
	var req SnapshotRequest
	if !decodeBody(w, r, &req) {
		return
	}
	si, err := h.ops.CreateSnapshot(r.PathValue("name"), req.Name, req.Copy, req.Temporary)
	reply(w, http.StatusCreated, si, err)
}

func (h handlers) snapDelete(w http.ResponseWriter, r *http.Request) {
	force, err := forceParam(r)
	if err == nil {
		err = h.ops.DeleteSnapshot(r.PathValue("name"), r.PathValue("snap"), force)
	}
	if err != nil {
		WriteError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (h handlers) clone(w http.ResponseWriter, r *http.Request) {
	var req CloneRequest
	if !decodeBody(w, r, &req) {
		return
	}
	vi, err := h.ops.Clone(req.Source, req.Name, req.Copy)
	reply(w, http.StatusCreated, vi, err)
}

func (h handlers) rollback(w http.ResponseWriter, r *http.Request) {
	var req RollbackRequest
	if !decodeBody(w, r, &req) {
		return
	}
	vi, err := h.ops.Rollback(r.PathValue("name"), req.Snapshot, req.Force, req.Copy)
	reply(w, http.StatusOK, vi, err)
}

func (h handlers) importVolume(w http.ResponseWriter, r *http.Request) {
	var req ImportRequest
	if !decodeBody(w, r, &req) {
		return
	}
	o, err := req.Options()
	if err != nil {
		WriteError(w, fmt.Errorf("%w: %v", volume.ErrBadSize, err))
		return
	}
	vi, err := h.ops.ImportVolume(o, req.Path)
	reply(w, http.StatusCreated, vi, err)
}

// events streams events: ?now=true stops after the snapshot,
// ?format=json writes one JSON object per line instead of text.
func (h handlers) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	now, err := parseBoolParam(q.Get("now"))
	if err != nil {
		WriteError(w, &APIError{Code: "bad_request", Message: "now: " + err.Error()})
		return
	}
	asJSON := false
	switch f := q.Get("format"); f {
	case "", "text":
	case "json":
		asJSON = true
	default:
		WriteError(w, &APIError{Code: "bad_request", Message: fmt.Sprintf("format=%q: want text or json", f)})
		return
	}
	sub := h.ops.Events().Subscribe(eventBuffer)
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
	for _, e := range h.ops.EventSnapshot() {
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
		case <-h.stop:
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
