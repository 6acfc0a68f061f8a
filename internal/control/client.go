package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/vmsan/vmsan/internal/netutil"
	"github.com/vmsan/vmsan/internal/volume"
)

// Client talks to a running daemon over its control socket.
//
// Concurrency: safe for concurrent use.
type Client struct {
	path string
	hc   *http.Client
}

// Dial connects to the daemon serving dataDir. It returns an error wrapping
// ErrNoDaemon when no daemon answers on the control socket (no socket file,
// or a stale one from a killed daemon).
func Dial(dataDir string) (*Client, error) {
	p := filepath.Join(dataDir, SocketName)
	if !volume.DataDirExists(dataDir) {
		// Say what is really wrong (a typo'd --data-dir, most likely).
		return nil, fmt.Errorf("%w: %w", ErrNoDaemon, volume.NoDataDirError(dataDir))
	}
	c, err := netutil.DialUnix("unix", p, func(n, a string) (net.Conn, error) { return net.DialTimeout(n, a, 2*time.Second) })
	if err != nil {
		return nil, fmt.Errorf("%w (%v)", ErrNoDaemon, err)
	}
	c.Close()
	return NewClient(p), nil
}

// daemonGone reports whether a transport error means the daemon is no
// longer there (not a timeout of a slow one).
func daemonGone(err error) bool {
	for _, e := range []error{syscall.ECONNREFUSED, syscall.ENOENT, syscall.ECONNRESET, syscall.EPIPE, io.EOF, io.ErrUnexpectedEOF} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// NewClient returns a client for the control socket at path (no connection
// is made until the first call).
func NewClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return netutil.DialUnix("unix", path, func(n, a string) (net.Conn, error) { return d.DialContext(ctx, n, a) })
		},
		MaxIdleConns: 2,
	}
	return &Client{path: path, hc: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
}

// maxReplyBytes bounds a control reply (status of thousands of volumes fits).
const maxReplyBytes = 64 << 20

// Do performs one API call: body (if not nil) is sent as JSON, a 2xx reply is
// decoded into out (if not nil), anything else becomes an *APIError. Other
// subsystems use it for the endpoints they add.
func (c *Client) Do(method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://vmsan"+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if daemonGone(err) {
			return fmt.Errorf("%w (control socket %s: %v)", ErrDaemonStopped, c.path, err)
		}
		return fmt.Errorf("control socket %s: %w", c.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		ae := &APIError{}
		if json.Unmarshal(b, ae) != nil || ae.Message == "" {
			ae = &APIError{Code: "http", Message: fmt.Sprintf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(b))}
		}
		return ae
	}
	if out != nil && len(b) > 0 {
		return json.Unmarshal(b, out)
	}
	return nil
}

// Status returns the daemon's status.
func (c *Client) Status() (Status, error) {
	var s Status
	err := c.Do("GET", "/v1/status", nil, &s)
	return s, err
}

// List returns all volumes.
func (c *Client) List() ([]VolumeInfo, error) {
	var v []VolumeInfo
	err := c.Do("GET", "/v1/volumes", nil, &v)
	return v, err
}

// Info returns one volume.
func (c *Client) Info(name string) (VolumeInfo, error) {
	var v VolumeInfo
	err := c.Do("GET", "/v1/volumes/"+url.PathEscape(name), nil, &v)
	return v, err
}

// Create creates a volume.
func (c *Client) Create(o volume.CreateOptions) (VolumeInfo, error) {
	var v VolumeInfo
	req := CreateRequest{Name: o.Name, Size: strconv.FormatInt(o.Size, 10), Cache: string(o.Cache), Rotational: o.Rotational,
		ReadOnly: o.ReadOnly, Description: o.Description, BlockSize: o.LogicalBlockSize}
	err := c.Do("POST", "/v1/volumes", req, &v)
	return v, err
}

// Resize resizes a volume.
func (c *Client) Resize(name string, size int64, force bool) (VolumeInfo, error) {
	var v VolumeInfo
	err := c.Do("POST", "/v1/volumes/"+url.PathEscape(name)+"/resize", ResizeRequest{Size: strconv.FormatInt(size, 10), Force: force}, &v)
	return v, err
}

// Update changes a volume's settings.
func (c *Client) Update(name string, s Settings) (VolumeInfo, error) {
	var v VolumeInfo
	err := c.Do("POST", "/v1/volumes/"+url.PathEscape(name)+"/settings", s, &v)
	return v, err
}

// Delete deletes a volume.
func (c *Client) Delete(name string, force bool) error {
	return c.Do("DELETE", "/v1/volumes/"+url.PathEscape(name)+"?force="+strconv.FormatBool(force), nil, nil)
}

// Close releases idle connections.
func (c *Client) Close() error {
	c.hc.CloseIdleConnections()
	return nil
}

// VolumeOps is what `vmsan volume` needs, implemented both by the control
// client (daemon running) and directly on the store (no daemon).
type VolumeOps interface {
	Create(volume.CreateOptions) (VolumeInfo, error)
	List() ([]VolumeInfo, error)
	Info(name string) (VolumeInfo, error)
	Resize(name string, size int64, force bool) (VolumeInfo, error)
	Update(name string, s Settings) (VolumeInfo, error)
	Delete(name string, force bool) error
	Close() error
}

// OpenExistingVolumeOps is OpenVolumeOps for commands that must not create
// a data directory (everything but creating a volume): a directory that
// does not exist is an error wrapping volume.ErrNoDataDir.
func OpenExistingVolumeOps(dataDir string, hooks ...VolumeHooks) (ops VolumeOps, viaDaemon bool, err error) {
	if !volume.DataDirExists(dataDir) {
		return nil, false, volume.NoDataDirError(dataDir)
	}
	return OpenVolumeOps(dataDir, hooks...)
}

// OpenVolumeOps returns VolumeOps for dataDir: through the running daemon
// when its control socket answers (so resize/delete respect live exports),
// otherwise directly on the directory (taking its lock, so a daemon cannot
// start meanwhile). viaDaemon says which. hooks (pass the daemon's
// Options.Hooks) apply to deletes and resizes done directly.
func OpenVolumeOps(dataDir string, hooks ...VolumeHooks) (ops VolumeOps, viaDaemon bool, err error) {
	if c, err := Dial(dataDir); err == nil {
		return c, true, nil
	}
	s, err := volume.Open(dataDir)
	if err != nil {
		if errors.Is(err, volume.ErrLocked) {
			return nil, false, fmt.Errorf("%w, but its control socket %s does not answer", err, filepath.Join(dataDir, SocketName))
		}
		return nil, false, err
	}
	return directOps{s, MergeHooks(hooks)}, false, nil
}

// directOps works on the store with no daemon. Nothing is exported then, so
// in-use checks are vacuous.
type directOps struct {
	s     *volume.Store
	hooks VolumeHooks
}

func (o directOps) vi(m volume.Meta) VolumeInfo {
	vi := VolumeInfo{Meta: m, Path: o.s.RawPath(m.Name), Allocated: AllocatedBytes(o.s.RawPath(m.Name))}
	if m.Name != "" {
		if err := o.s.CheckRaw(m.Name); err != nil {
			vi.Problem = err.Error()
		}
	}
	return vi
}

func (o directOps) Create(c volume.CreateOptions) (VolumeInfo, error) {
	m, err := o.s.Create(c)
	return o.vi(m), err
}

func (o directOps) List() ([]VolumeInfo, error) {
	ms, err := o.s.List() // partial list plus error: show what is readable
	out := make([]VolumeInfo, 0, len(ms))
	for _, m := range ms {
		out = append(out, o.vi(m))
	}
	return out, err
}

func (o directOps) Info(name string) (VolumeInfo, error) {
	m, err := o.s.Get(name)
	return o.vi(m), err
}

func (o directOps) Resize(name string, size int64, force bool) (VolumeInfo, error) {
	if err := CheckResize(o.hooks.Resize, o.s.Dir(), name, size); err != nil {
		return VolumeInfo{}, err
	}
	m, err := o.s.Resize(name, size, force)
	return o.vi(m), err
}

func (o directOps) Update(name string, s Settings) (VolumeInfo, error) {
	m, err := o.s.Update(name, s.Apply)
	return o.vi(m), err
}

func (o directOps) Delete(name string, force bool) error {
	if _, err := o.s.Get(name); err != nil {
		return err
	}
	if err := CheckDelete(o.hooks.Delete, o.s.Dir(), name, force); err != nil {
		return err
	}
	return o.s.Delete(name, force)
}

func (o directOps) Close() error { return o.s.Close() }

// Events opens the event stream (control: GET /v1/events); the caller reads lines
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
