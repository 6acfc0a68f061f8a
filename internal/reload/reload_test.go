package reload

import (
	"reflect"
	"strings"
	"testing"

	"github.com/vmsan/vmsan/internal/config"
)

// TestISCSIRestartKeys: a reload names the iscsi keys that need a
// restart; access settings (CHAP, ACLs, allow_any) are not among them,
// and the running config takes them over without its restart-only keys.
func TestISCSIRestartKeys(t *testing.T) {
	cur := config.ISCSI{Listen: []config.ISCSIPortal{{Addr: "127.0.0.1:3260"}}, NodeName: "a",
		Targets: []config.ISCSITarget{{Volume: "db", SCSIID: "5f0c2d9e-0b7e-4c55-9a41-2b1f0e9f6c11"}}}
	next := cur
	next.Auth = &config.ISCSIAuth{User: "u", Secret: "twelve-bytes!"}
	next.Initiators = []string{"iqn.2026-11.org.example:x"}
	next.AllowAny, next.DropRevokedSessions = true, true
	next.Targets = []config.ISCSITarget{{Volume: "db", SCSIID: cur.Targets[0].SCSIID, Initiators: []string{"iqn.2026-11.org.example:y"}}}
	if !reflect.DeepEqual(cur.WithoutAccess(), next.WithoutAccess()) {
		t.Fatalf("access-only change needs a restart: %v", iscsiRestartKeys(cur, next))
	}
	next.NodeName = "b"
	next.Listen = []config.ISCSIPortal{{Addr: "127.0.0.1:3261"}}
	if got := strings.Join(iscsiRestartKeys(cur, next), ","); got != "iscsi.listen,iscsi.node_name" {
		t.Fatalf("restart keys %q", got)
	}
	merged := cur.WithAccessOf(next)
	if merged.NodeName != "a" || merged.Listen[0].Addr != "127.0.0.1:3260" || merged.Auth == nil || !merged.AllowAny ||
		len(merged.Targets) != 1 || merged.Targets[0].SCSIID != cur.Targets[0].SCSIID || len(merged.Targets[0].Initiators) != 1 {
		t.Fatalf("merged %+v", merged)
	}
}
