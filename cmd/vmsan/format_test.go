package main

import (
	"strings"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/control"
	"github.com/vmsan/vmsan/internal/volrt"
	"github.com/vmsan/vmsan/internal/volume"
)

// TestPrintStatusClients checks `vmsan status` lists each connected
// client (front end, address) under the volume table.
func TestPrintStatusClients(t *testing.T) {
	st := control.Status{Volumes: []control.VolumeStatus{{VolumeInfo: control.VolumeInfo{Meta: volume.Meta{Name: "default"}},
		Clients: []volrt.Session{{FrontEnd: "nbd", Volume: "default", Remote: "127.0.0.1:4242", Since: time.Now()}}}}}
	var out strings.Builder
	PrintStatus(&out, st)
	if !strings.Contains(out.String(), "CLIENT") || !strings.Contains(out.String(), "127.0.0.1:4242") || !strings.Contains(out.String(), "nbd") {
		t.Errorf("vmsan status output lacks clients:\n%s", out.String())
	}
}
