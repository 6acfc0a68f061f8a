package iscsi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/iscsi/initiator"
	"github.com/vmsan/vmsan/internal/iscsi/pdu"
)

// Access control, holds and administration of the iSCSI target, against
// a real `vmsan serve` (docs/iscsi.md "Access control" and "Administration").

// cli runs the vmsan CLI against v's data directory.
func (v *vmsan) cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args = append(args, "--data-dir", filepath.Join(v.dir, "data"))
	out, err := exec.CommandContext(ctx, vmsanBin, args...).CombinedOutput()
	return string(out), err
}

// exports returns `volume list --json`'s EXPORTS of vol.
func (v *vmsan) exports(t *testing.T, vol string) int64 {
	t.Helper()
	out, err := v.cli(t, "volume", "list", "--json")
	if err != nil {
		t.Fatalf("volume list: %v\n%s", err, out)
	}
	var l []daemon.VolumeInfo
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("volume list --json: %v\n%s", err, out)
	}
	for _, vi := range l {
		if vi.Name == vol {
			return vi.Exports
		}
	}
	t.Fatalf("volume %s not listed:\n%s", vol, out)
	return 0
}

// dialGo logs in with the in-repo initiator and opens LUN 0 (a session
// that stays open until closed, unlike libiscsi's tools).
func dialGo(t *testing.T, addr string, cfg initiator.Config) (*initiator.Session, *initiator.LU) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if cfg.TargetName == "" {
		cfg.TargetName = nodeIQN
	}
	s, err := initiator.Dial(ctx, addr, cfg)
	if err != nil {
		t.Fatalf("login as %s: %v", cfg.InitiatorName, err)
	}
	t.Cleanup(func() { s.Close() })
	lu, err := s.LU(ctx, 0)
	if err != nil {
		t.Fatalf("LUN 0: %v", err)
	}
	return s, lu
}

// loginErr logs in and returns the target's refusal (nil: it let us in,
// and the session is closed again).
func loginErr(t *testing.T, addr string, cfg initiator.Config) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if cfg.TargetName == "" {
		cfg.TargetName = nodeIQN
	}
	s, err := initiator.Dial(ctx, addr, cfg)
	if err == nil {
		s.Logout(ctx)
	}
	return err
}

func loginStatusOf(err error) pdu.LoginStatus {
	var le *initiator.LoginError
	if errors.As(err, &le) {
		return le.Status
	}
	return 0
}

func (v *vmsan) logText() string {
	b, _ := os.ReadFile(v.log.Name())
	return string(b)
}

// waitLog waits up to 10 s until the daemon's log contains all of subs on
// one line.
func (v *vmsan) waitLog(t *testing.T, subs ...string) {
	t.Helper()
	v.waitLogLine(t, 10*time.Second, subs...)
}

// TestClosedByDefault: without CHAP, an ACL or allow_any, every login is
// refused with 0202 (iscsi-inq fails, qemu-io cannot open the LUN),
// discovery lists no target, the refusals are logged and counted by
// reason, and the start-up log says why.
func TestClosedByDefault(t *testing.T) {
	t.Parallel()
	v := startVmsan(t, "    allow_any: false\n")
	v.waitLog(t, "every login is refused", "allow_any")
	if out, err := run(t, 30*time.Second, "iscsi-inq", v.url("", 0)); err == nil {
		t.Fatalf("iscsi-inq logged in to a target without access control:\n%s", out)
	}
	if out, err := run(t, 60*time.Second, "qemu-io", "-f", "raw", "-c", "read 0 4k", v.url("", 0)); err == nil && !strings.Contains(out, "Could not") {
		t.Fatalf("qemu-io opened the LUN:\n%s", out)
	}
	if st := loginStatusOf(loginErr(t, v.addr, initiator.Config{InitiatorName: "iqn.2026-11.org.example:intruder"})); st != pdu.LoginAuthorizationFailure {
		t.Fatalf("login status %v, want 0202", st)
	}
	out, err := run(t, 30*time.Second, "iscsi-ls", "iscsi://"+v.addr)
	if strings.Contains(out, nodeIQN) {
		t.Fatalf("discovery lists the target (err %v):\n%s", err, out)
	}
	v.waitLog(t, "login refused", "iqn.2026-11.org.example:intruder", "reason=authorization")
	if n := scrape(t, v.metrics)[`vmsan_iscsi_login_failures_total{reason="authorization"}`]; n < 3 {
		t.Fatalf("vmsan_iscsi_login_failures_total{reason=\"authorization\"} = %v, want >= 3", n)
	}
}

// TestExposureWarnings: a portal and an NBD listener on every address,
// open to any initiator (allow_any) and without TLS, are warned about at
// start-up.
func TestExposureWarnings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ip, np := freeLoop(t), freeLoop(t)
	ip, np = strings.Replace(ip, "127.0.0.1", "0.0.0.0", 1), strings.Replace(np, "127.0.0.1", "0.0.0.0", 1)
	p := startProc(t, dir, fmt.Sprintf(`data_dir: %s
listen: [%q]
no_default_volume: true
volumes:
  - {name: disk, size: 1M}
iscsi:
    listen: [%q]
    node_name: test
    allow_any: true
`, filepath.Join(dir, "data"), np, ip), strings.Replace(ip, "0.0.0.0", "127.0.0.1", 1))
	v := &vmsan{proc: p}
	// The address is logged as bound ("[::]:PORT" on a dual-stack host).
	v.waitLog(t, "portals reachable from the network accept any initiator", ip[strings.LastIndexByte(ip, ':'):]+"]")
	v.waitLog(t, "NBD listener is reachable from the network without TLS", np[strings.LastIndexByte(np, ':'):])
}

// TestHoldsEndWithSession: once a qemu-io over iSCSI has exited (with and
// without CHAP), the volume has no export left: volume set and rollback
// work without --force. While a session is open they are refused and
// EXPORTS counts it. After the reopen, the LUN serves the new volume.
func TestHoldsEndWithSession(t *testing.T) {
	t.Parallel()
	v := startVmsan(t, "")
	out, err := run(t, 60*time.Second, "qemu-io", "-f", "raw", "-c", "write -P 0x5c 0 4k", "-c", "read -P 0x5c 0 4k", v.url("", 0))
	if err != nil || strings.Contains(out, "fail") {
		t.Fatalf("qemu-io: %v\n%s", err, out)
	}
	if n := v.exports(t, "disk"); n != 0 {
		t.Fatalf("EXPORTS %d after qemu-io exited, want 0", n)
	}
	if out, err := v.cli(t, "volume", "set", "disk", "--description", "after qemu-io"); err != nil {
		t.Fatalf("volume set after qemu-io exited: %v\n%s", err, out)
	}
	if out, err := v.cli(t, "volume", "snapshot", "disk", "s1", "--copy"); err != nil {
		t.Fatalf("volume snapshot: %v\n%s", err, out)
	}
	// The reopened volume is what the LUN serves now.
	out, err = run(t, 60*time.Second, "qemu-io", "-f", "raw", "-c", "read -P 0x5c 0 4k", "-c", "write -P 0x77 0 4k", v.url("", 0))
	if err != nil || strings.Contains(out, "fail") {
		t.Fatalf("qemu-io after volume set: %v\n%s", err, out)
	}
	if out, err := v.cli(t, "volume", "rollback", "disk@s1", "--copy"); err != nil {
		t.Fatalf("volume rollback after qemu-io exited: %v\n%s", err, out)
	}

	// A session that stays: it counts, and it blocks both.
	s, lu := dialGo(t, v.addr, initiator.Config{InitiatorName: "iqn.2026-11.org.example:held"})
	buf := make([]byte, 4096)
	if _, err := lu.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, bytes.Repeat([]byte{0x5c}, 4096)) {
		t.Fatalf("read after rollback: %v (data %x...)", err, buf[:8])
	}
	if n := v.exports(t, "disk"); n != 1 {
		t.Fatalf("EXPORTS %d with a session open, want 1", n)
	}
	if out, err := v.cli(t, "volume", "set", "disk", "--description", "held"); err == nil || !strings.Contains(out, "connected") {
		t.Fatalf("volume set with a session open: %v\n%s", err, out)
	}
	if out, err := v.cli(t, "volume", "rollback", "disk@s1", "--copy"); err == nil {
		t.Fatalf("volume rollback with a session open succeeded:\n%s", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Logout(ctx); err != nil {
		t.Fatal(err)
	}
	waitCond(t, "EXPORTS to drop after the logout", 10*time.Second, func() bool { return v.exports(t, "disk") == 0 })
	if out, err := v.cli(t, "volume", "set", "disk", "--description", "after logout"); err != nil {
		t.Fatalf("volume set after the logout: %v\n%s", err, out)
	}
}

// TestHoldsEndWithCHAPSession: the same with CHAP (qemu-io's credentials
// in the URL).
func TestHoldsEndWithCHAPSession(t *testing.T) {
	t.Parallel()
	v := startVmsan(t, fmt.Sprintf("    auth: {user: %s, secret: %q}\n", rawUser, rawSecret))
	out, err := run(t, 60*time.Second, "qemu-io", "-f", "raw", "-c", "read 0 4k", v.url(rawUser+"%"+rawSecret, 0))
	if err != nil || strings.Contains(out, "fail") {
		t.Fatalf("qemu-io: %v\n%s", err, out)
	}
	if n := v.exports(t, "disk"); n != 0 {
		t.Fatalf("EXPORTS %d after qemu-io exited, want 0", n)
	}
	if out, err := v.cli(t, "volume", "set", "disk", "--description", "x"); err != nil {
		t.Fatalf("volume set: %v\n%s", err, out)
	}
}

// TestISCSIShow: `vmsan iscsi show --json` with a held session reports
// the target, LUN map, ACL, CHAP user (no secret), portal group and the
// session's negotiated values; the text form and `vmsan status` show it.
func TestISCSIShow(t *testing.T) {
	t.Parallel()
	const ini = "iqn.2026-11.org.example:show"
	v := startVmsan(t, fmt.Sprintf("    auth: {user: %s, secret: %q}\n    initiators: [%s]\n", rawUser, rawSecret, ini))
	_, lu := dialGo(t, v.addr, initiator.Config{InitiatorName: ini, User: rawUser, Secret: rawSecret,
		HeaderDigest: "CRC32C", MaxBurstLength: 131072, FirstBurstLength: 65536, MaxRecvDataSegmentLength: 65536})
	if _, err := lu.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	out, err := v.cli(t, "iscsi", "show", "--json")
	if err != nil {
		t.Fatalf("iscsi show: %v\n%s", err, out)
	}
	if strings.Contains(out, rawSecret) {
		t.Fatalf("iscsi show prints the CHAP secret:\n%s", out)
	}
	var in daemon.ISCSIInfo
	if err := json.Unmarshal([]byte(out), &in); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !in.Enabled || in.IQN != nodeIQN || in.Mode != "node" || len(in.Portals) != 1 || in.Portals[0].Addr != v.addr ||
		len(in.PortalGroups) != 1 || in.PortalGroups[0].Tag != 1 || len(in.Targets) != 1 {
		t.Fatalf("iscsi show: %s", out)
	}
	tg := in.Targets[0]
	if tg.Name != nodeIQN || tg.Access != "acl+chap" || tg.CHAPUser != rawUser || len(tg.Initiators) != 1 || tg.Initiators[0] != ini ||
		len(tg.LUNs) != 1 || tg.LUNs[0].LUN != 0 || tg.LUNs[0].Volume != "disk" || tg.Sessions != 1 {
		t.Fatalf("target: %+v", tg)
	}
	if len(in.Sessions) != 1 {
		t.Fatalf("sessions: %+v", in.Sessions)
	}
	s := in.Sessions[0]
	if s.Initiator != ini || len(s.ISID) != 12 || s.TSIH == 0 || s.Target != nodeIQN || s.Portal != v.addr || s.Connections != 1 ||
		s.Auth != "CHAP" || s.CHAPUser != rawUser || s.HeaderDigest != "CRC32C" || s.DataDigest != "None" ||
		s.MaxBurstLength != 131072 || s.FirstBurstLength != 65536 || s.InitiatorMaxRecvDataSegmentLength != 65536 ||
		s.TargetMaxRecvDataSegmentLength != 262144 || !s.ImmediateData || s.InitialR2T || s.CommandsInFlight != 0 {
		t.Fatalf("session: %+v", s)
	}
	out, err = v.cli(t, "iscsi", "show")
	if err != nil || !strings.Contains(out, ini) || !strings.Contains(out, "LUN 0 -> disk") || !strings.Contains(out, "access acl+chap") {
		t.Fatalf("iscsi show (text): %v\n%s", err, out)
	}
	out, err = v.cli(t, "status")
	if err != nil || !strings.Contains(out, "iscsi ("+v.addr+"): 1 sessions") || !strings.Contains(out, "logins 1, login failures 0") ||
		!strings.Contains(out, "check conditions") || !strings.Contains(out, "NOP timeouts") {
		t.Fatalf("status: %v\n%s", err, out)
	}
}

// TestReloadAccess: CHAP secrets and ACLs change on SIGHUP. A new secret
// works for new logins at once and the old one is refused, while the
// session that logged in with the old one keeps working (the default);
// with drop_revoked_sessions, an ACL that no longer lists a logged-in
// initiator closes its session. Each change is logged by key; failures
// are counted by reason.
func TestReloadAccess(t *testing.T) {
	t.Parallel()
	const (
		a, b    = "iqn.2026-11.org.example:a", "iqn.2026-11.org.example:b"
		secret2 = "the-new-secret-42"
	)
	sec := filepath.Join(t.TempDir(), "chap.secret")
	if err := os.WriteFile(sec, []byte(rawSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	v := startVmsan(t, fmt.Sprintf("    auth: {user: %s, secret_file: %s}\n", rawUser, sec))
	cfgFile := filepath.Join(v.dir, "vmsan.yaml")
	old := initiator.Config{InitiatorName: a, User: rawUser, Secret: rawSecret}
	_, luA := dialGo(t, v.addr, old)
	read := func(lu *initiator.LU) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := lu.ReadAtContext(ctx, make([]byte, 4096), 0)
		return err
	}
	hup := func(yaml string) {
		t.Helper()
		if yaml != "" {
			if err := os.WriteFile(cfgFile, []byte(yaml), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := v.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}

	// 1. The secret file changes (the config file does not).
	if err := os.WriteFile(sec, []byte(secret2+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hup("")
	v.waitLog(t, "access setting changed", "key=iscsi.auth")
	if st := loginStatusOf(loginErr(t, v.addr, old)); st != pdu.LoginAuthenticationFailure {
		t.Fatalf("old secret after the reload: status %v, want 0201", st)
	}
	if err := loginErr(t, v.addr, initiator.Config{InitiatorName: b, User: rawUser, Secret: secret2}); err != nil {
		t.Fatalf("new secret after the reload: %v", err)
	}
	if err := read(luA); err != nil {
		t.Fatalf("the session logged in before the reload stopped working: %v", err)
	}

	// 2. An ACL without a, with drop_revoked_sessions: a's session closes.
	cfg, err := os.ReadFile(cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	next := strings.Replace(string(cfg), "    auth:", fmt.Sprintf("    initiators: [%s]\n    drop_revoked_sessions: true\n    auth:", b), 1)
	if next == string(cfg) {
		t.Fatalf("config has no auth line:\n%s", cfg)
	}
	hup(next)
	v.waitLog(t, "access setting changed", "key=iscsi.initiators")
	v.waitLog(t, "closing a session whose initiator lost access", a)
	waitCond(t, "a's session to fail", 10*time.Second, func() bool { return read(luA) != nil })
	if st := loginStatusOf(loginErr(t, v.addr, initiator.Config{InitiatorName: a, User: rawUser, Secret: secret2})); st != pdu.LoginAuthorizationFailure {
		t.Fatalf("a after the ACL change: status %v, want 0202", st)
	}
	_, luB := dialGo(t, v.addr, initiator.Config{InitiatorName: b, User: rawUser, Secret: secret2})
	if err := read(luB); err != nil {
		t.Fatal(err)
	}
	v.waitLog(t, "iscsi: login", "initiator="+b, "portal="+v.addr)
	v.waitLog(t, "iscsi: session ended", "how=logout", "initiator="+b)
	if strings.Contains(v.logText(), "iscsi changed; restart to apply") {
		t.Fatalf("an access change was logged as needing a restart:\n%s", v.logTail())
	}
	m := scrape(t, v.metrics)
	if m[`vmsan_iscsi_login_failures_total{reason="authentication"}`] < 1 || m[`vmsan_iscsi_login_failures_total{reason="authorization"}`] < 1 {
		t.Fatalf("login failure counters: authentication %v, authorization %v",
			m[`vmsan_iscsi_login_failures_total{reason="authentication"}`], m[`vmsan_iscsi_login_failures_total{reason="authorization"}`])
	}
}
