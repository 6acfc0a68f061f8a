package daemon

import (
	"io"

	"github.com/vmsan/vmsan/internal/iscsi/iscsifront"
)

// The iSCSI front end is package iscsi/iscsifront, built against
// frontend.Host (feHost); the daemon builds it when iscsi.listen is
// configured, answers GET /v1/iscsi from it, and re-exports its show
// types for the CLI.

// ISCSIInfo is `vmsan iscsi show` (GET /v1/iscsi).
type ISCSIInfo = iscsifront.Info

// PrintISCSI writes ISCSIInfo as text.
func PrintISCSI(w io.Writer, in ISCSIInfo) { iscsifront.Print(w, in) }

func newISCSIFrontEnd(d *Daemon) (FrontEnd, error) {
	f, err := iscsifront.New(feHost{d}, d.cfg.ISCSI)
	if f == nil || err != nil {
		return nil, err // nil interface, not a nil *FrontEnd
	}
	return f, nil
}

// iscsiFrontEnd returns the running iSCSI front end, or nil.
func (d *Daemon) iscsiFrontEnd() *iscsifront.FrontEnd {
	for _, fe := range d.frontEnds {
		if f, ok := fe.(*iscsifront.FrontEnd); ok {
			return f
		}
	}
	return nil
}

// iscsiShow is GET /v1/iscsi's body.
func (d *Daemon) iscsiShow() ISCSIInfo {
	if f := d.iscsiFrontEnd(); f != nil {
		return f.Show()
	}
	return iscsifront.Off()
}

// ISCSIShow fetches `vmsan iscsi show`'s data through c.
func ISCSIShow(c *Client) (ISCSIInfo, error) {
	var in ISCSIInfo
	err := c.Do("GET", "/v1/iscsi", nil, &in)
	return in, err
}
