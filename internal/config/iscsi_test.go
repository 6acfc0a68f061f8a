package config

import (
	"strings"
	"testing"
	"time"
)

func TestISCSIConfig(t *testing.T) {
	cfg, err := Parse([]byte(`iscsi:
  listen: ["127.0.0.1:3260", {addr: "[::1]:3261", tpgt: 2}]
  node_name: Host_1
  mode: per-volume
  discovery_auth: {user: d, secret: "twelve-bytes"}
  auth: {user: u, secret: "twelve-bytes", mutual_user: t, mutual_secret: "other-secret"}
  initiators: [iqn.1993-08.org.debian:01:abc]
`))
	if err != nil {
		t.Fatal(err)
	}
	ic := cfg.ISCSI
	if len(ic.Listen) != 2 || ic.Listen[0].Tag() != 1 || ic.Listen[1].Tag() != 2 || ic.Listen[1].Addr != "[::1]:3261" {
		t.Fatalf("listen %+v", ic.Listen)
	}
	if got := ic.TargetName(); got != "iqn.2026-11.org.vmsan:host-1" {
		t.Fatalf("IQN %q", got)
	}
	lim, err := Parse([]byte("iscsi: {enable: true, login_timeout: 5s, max_pending_logins: 16, dataout_timeout: 10s}\n"))
	if err != nil || lim.ISCSI.LoginTimeout != Duration(5*time.Second) || lim.ISCSI.MaxPendingLogins != 16 || lim.ISCSI.DataOutTimeout != Duration(10*time.Second) {
		t.Fatalf("login_timeout, max_pending_logins, dataout_timeout: %+v, %v", lim.ISCSI, err)
	}
	on, err := Parse([]byte("iscsi: {enable: true}\n"))
	if err != nil || !on.ISCSI.Enabled() || len(on.ISCSI.Portals()) != 1 || on.ISCSI.Portals()[0].Addr != DefaultISCSIListen {
		t.Fatalf("enable without listen: %+v, %v", on.ISCSI, err)
	}
	if off := Default(); off.ISCSI.Enabled() {
		t.Fatal("iSCSI on by default")
	}
	for _, c := range []struct{ yaml, want string }{
		{"iscsi: {listen: [\"unix:/x\"]}", "TCP only"},
		{"iscsi: {listen: [\"127.0.0.1:99999\"]}", "want 0..65535"},
		{"iscsi: {mode: cluster}", "want node or per-volume"},
		{"iscsi: {auth: {user: u, secret: short}}", "12 to 255 bytes"},
		{"iscsi: {auth: {user: u, secret: \"twelve-bytes\", secret_file: /x}}", "exactly one of secret and secret_file"},
		{"iscsi: {auth: {user: u, secret: \"twelve-bytes\", mutual_user: t, mutual_secret: \"twelve-bytes\"}}", "must differ"},
		{"iscsi: {initiators: [bob]}", "not an iSCSI name"},
		{"iscsi: {iqn: \"IQN.upper\"}", "not an iSCSI name"},
		{"iscsi: {targets: [{auth: {user: u, secret: \"twelve-bytes\"}}]}", "volume is required"},
		{"iscsi: {max_pending_logins: -1}", "iscsi.max_pending_logins -1"},
		{"iscsi: {login_timeout: -1s}", "iscsi.login_timeout"},
	} {
		if _, err := Parse([]byte(c.yaml)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.yaml, err, c.want)
		}
	}
	for _, c := range []struct {
		in   string
		addr string
		tag  uint16
	}{{"10.0.0.1", "10.0.0.1:3260", 1}, {"10.0.0.1:3270,3", "10.0.0.1:3270", 3}, {"[fe80::1]", "[fe80::1]:3260", 1}} {
		p, err := ParseISCSIPortal(c.in)
		if err != nil || p.Addr != c.addr || p.Tag() != c.tag {
			t.Errorf("ParseISCSIPortal(%q) = %+v, %v", c.in, p, err)
		}
	}
	if _, err := ParseISCSIPortal("10.0.0.1,0"); err == nil {
		t.Error("portal group tag 0 accepted")
	}
}

// TestISCSIPairConfig: a replicated pair's port identities (relative
// ports, peer portals, scsi_id) parse, and collisions are refused.
func TestISCSIPairConfig(t *testing.T) {
	cfg, err := Parse([]byte(`iscsi:
  mode: per-volume
  listen: [{addr: "10.0.0.1:3260", tpgt: 1, relative_port: 1}, {addr: "10.0.1.1:3260", tpgt: 1, relative_port: 3}]
  peer_portals: [{addr: "10.0.0.2:3260", tpgt: 2, relative_port: 2}]
  targets: [{volume: db, scsi_id: 5f0c2d9e-0b7e-4c55-9a41-2b1f0e9f6c11}]
`))
	if err != nil {
		t.Fatal(err)
	}
	ic := cfg.ISCSI
	if ic.Listen[1].Rel(1) != 3 || ic.PeerPortals[0].RelativePort != 2 || ic.SCSIIDs()["db"] != "5f0c2d9e-0b7e-4c55-9a41-2b1f0e9f6c11" {
		t.Fatalf("parsed %+v", ic)
	}
	if (ISCSIPortal{Addr: "x:1"}).Rel(4) != 5 {
		t.Fatal("default relative port is not the position from 1")
	}
	for _, c := range []struct{ yaml, want string }{
		{`iscsi: {mode: per-volume, listen: ["10.0.0.1:3260"], peer_portals: [{addr: "10.0.0.2:3260", tpgt: 1, relative_port: 2}]}`, "also one of this node's portal groups"},
		{`iscsi: {mode: per-volume, listen: ["10.0.0.1:3260"], peer_portals: [{addr: "10.0.0.2:3260", tpgt: 2, relative_port: 1}]}`, "relative_port 1 already used"},
		{`iscsi: {mode: per-volume, listen: ["10.0.0.1:3260"], peer_portals: [{addr: "10.0.0.2:3260", tpgt: 2}]}`, "relative_port is required"},
		{`iscsi: {listen: ["10.0.0.1:3260"], peer_portals: [{addr: "10.0.0.2:3260", tpgt: 2, relative_port: 2}]}`, "needs mode per-volume"},
		{`iscsi: {listen: [{addr: "10.0.0.1:3260", relative_port: 2}, "10.0.0.1:3261"]}`, "relative_port 2 already used"},
		{`iscsi: {targets: [{volume: db, scsi_id: not-a-uuid}]}`, "want a UUID"},
	} {
		if _, err := Parse([]byte(c.yaml)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.yaml, err, c.want)
		}
	}
}
