package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsan/vmsan/internal/config"
	"github.com/vmsan/vmsan/internal/daemon"
	"github.com/vmsan/vmsan/internal/repl/driver"
	"github.com/vmsan/vmsan/internal/replset"
	"github.com/vmsan/vmsan/internal/volume"
)

func newReplCmd() *cobra.Command {
	var dataDir string
	rc := &cobra.Command{
		Use:   "repl",
		Short: "Synchronous replication of volumes to a peer vmsan node (DRBD-style)",
		Long: `Replicate a volume to another vmsan serve process.

  openssl rand -base64 32 > /etc/vmsan/repl.secret   (copy it to the peer; mode 0600)
  vmsan repl configure vm1 --listen 10.0.0.1:7789 --peer 10.0.0.2:7789 --role primary \
      --shared-secret-file /etc/vmsan/repl.secret
  (on the peer: the same with the addresses swapped and --role secondary)
  With vmsan serve running, configure applies at once (no restart, clients
  stay connected); otherwise start vmsan serve on both nodes.
  vmsan repl remove vm1   makes it a plain volume again.

Every replication connection authenticates the peer with the shared secret
(HMAC challenge-response) and only the peer's address may connect;
--insecure runs without a secret.

Or declare it per volume in the file given to vmsan serve --config:
  volumes: [{name: vm1, size: 20G, replication: {listen: ..., peer: ..., role: primary,
             shared_secret_file: /etc/vmsan/repl.secret}}]

See docs/replication.md for protocols, states and split brain.`,
	}
	rc.PersistentFlags().StringVar(&dataDir, "data-dir", config.DefaultDataDir, "data directory of the node")

	var s driver.Settings
	var rate, minRate string
	// The flags count time in ticks of --tick-ms (as they always have);
	// their defaults are replset's, in ticks of its default tick, and
	// RunE turns them into the settings' durations.
	def := replset.Defaults()
	defTicks := def.Ticks()
	var tickMs, pingInterval, pingTimeout, koTicks, alTicks int
	var cfgJSON bool
	configure := &cobra.Command{
		Use:   "configure VOLUME --listen HOST:PORT --peer HOST:PORT --shared-secret-file FILE [--role primary|secondary] [--protocol A|B|C]",
		Short: "Set a volume's replication settings (applied at once by a running vmsan serve, else at its start)",
		Long: `Set a volume's replication settings.

With vmsan serve running on the data directory, the daemon writes them and
applies them at once, touching only this volume: replication starts on a
plain volume, or the volume's replica restarts with the new settings
(protocol, rates, timeouts, a new peer: a peer whose copy never synced with
this node gets a full sync, holes skipped). The volume's clients stay
connected; their requests wait while the replica restarts. Without a
daemon the settings are written and read at its next start.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if rate != "" {
				n, err := volume.ParseSize(rate)
				if err != nil {
					return err
				}
				s.ResyncRate = n
			}
			if minRate != "" {
				n, err := volume.ParseSize(minRate)
				if err != nil {
					return err
				}
				s.ResyncMinRate = n
			}
			tick := defTicks.Tick // --tick-ms 0 (or less): the default, as before
			if tickMs > 0 {
				tick = time.Duration(tickMs) * time.Millisecond
			}
			inTicks := func(n int) replset.Duration { return replset.Duration(time.Duration(n) * tick) }
			s.Tick = replset.Duration(tick)
			s.PingInterval, s.PingTimeout, s.KoTimeout, s.ALRetire = inTicks(pingInterval), inTicks(pingTimeout), inTicks(koTicks), inTicks(alTicks)
			if s.SharedSecretFile != "" {
				// Stored as given to the daemon, which may run elsewhere
				// than this shell's working directory.
				abs, err := filepath.Abs(s.SharedSecretFile)
				if err != nil {
					return err
				}
				s.SharedSecretFile = abs
			}
			// A running daemon writes the settings and applies them now;
			// without one they wait for the next start.
			out, applied, err := replConfigure(dataDir, args[0], s)
			if err != nil {
				return err
			}
			if cfgJSON {
				return printMaskedJSON(out) // a shared secret is never printed
			}
			auth := "shared secret from " + out.SharedSecretFile
			if out.Insecure {
				auth = "INSECURE (no peer authentication)"
			}
			when := "no daemon running: applied when vmsan serve starts"
			if applied {
				when = "applied now"
			}
			fmt.Printf("replication of %s: listen %s, peer %s, protocol %s, %s, node id %x (%s)\n",
				args[0], out.Listen, out.Peer, orDefault(out.Protocol, "C"), auth, out.NodeID, when)
			return nil
		},
	}
	f := configure.Flags()
	f.StringVar(&s.Listen, "listen", "", "this node's replication address for the volume")
	f.StringVar(&s.Peer, "peer", "", "the peer's replication address")
	f.StringVar(&s.Protocol, "protocol", def.Protocol, "A (async), B (peer received) or C (peer durable)")
	f.StringVar(&s.Role, "role", def.Role, "role at first start: primary or secondary")
	f.StringVar(&s.Dial, "dial", def.Dial, "auto (the lower listen address dials), yes or no; set when --peer is a proxy")
	f.StringVar(&s.SplitBrain, "split-brain", def.SplitBrain, "disconnect, discard-zero-changes, discard-younger-primary or discard-least-changes")
	f.IntVar(&tickMs, "tick-ms", int(defTicks.Tick/time.Millisecond), "tick length in ms (ping interval/timeout and ko are in ticks)")
	f.IntVar(&pingInterval, "ping-interval", defTicks.PingInterval, "ticks between pings")
	f.IntVar(&pingTimeout, "ping-timeout", defTicks.PingTimeout, "ticks without hearing from the peer before disconnecting")
	f.IntVar(&koTicks, "ko-ticks", defTicks.KoTicks, "ticks a replicated write may stay unacknowledged before the peer is dropped")
	f.IntVar(&alTicks, "al-retire-ticks", defTicks.ALRetireTicks, "ticks an activity-log extent stays hot after its last write")
	f.StringVar(&rate, "resync-rate", "", "resync bandwidth per second (e.g. 100M; empty: unlimited)")
	f.StringVar(&minRate, "resync-min-rate", "", "with --resync-rate: dynamic control, resync gets the rate minus application writes but at least this")
	f.BoolVar(&s.Checksum, "checksum-resync", false, "send hashes first and data only where they differ")
	f.StringVar(&s.SharedSecretFile, "shared-secret-file", "", "file whose first line is the secret both nodes prove on every replication connection (at least 16 bytes; the same on the peer)")
	f.BoolVar(&s.Insecure, "insecure", false, "run the link without a shared secret: any process reaching the port from an accepted address can take it over")
	f.StringSliceVar(&s.AcceptFrom, "accept-from", nil, "addresses or CIDR prefixes the peer connects from (default: the --peer host's addresses); set behind a proxy or NAT")
	f.BoolVar(&cfgJSON, "json", false, "print the settings written as JSON")

	var force bool
	op := func(use, short, path string) *cobra.Command {
		var asJSON bool
		c := &cobra.Command{
			Use: use + " VOLUME", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				if (path == "promote" || path == "demote") && force {
					return replOp(dataDir, args[0], path+"-force", asJSON)
				}
				return replOp(dataDir, args[0], path, asJSON)
			},
		}
		c.Flags().BoolVar(&asJSON, "json", false, "print the resulting status as JSON")
		return c
	}
	promote := op("promote", "Make this node primary for the volume (refused while the peer is primary and connected)", "promote")
	promote.Flags().BoolVar(&force, "force", false, "promote even if the local disk is not UpToDate")
	status := replStatusCommand(&dataDir)
	demote := op("demote", "Make this node secondary for the volume (refused while clients such as NBD connections hold it open; per-volume iSCSI logical units follow roles and do not count)", "demote")
	demote.Flags().BoolVar(&force, "force", false, "demote even though clients hold the volume open (their writes then fail)")
	var discard bool
	connect := op("connect", "Leave StandAlone and reconnect (after resolving split brain)", "connect")
	connect.Long = `Leave StandAlone and reconnect to the peer.

With --discard-my-data (on the node whose changes are to be dropped, once
it is secondary): if the handshake finds split brain, this node's writes
since the split are discarded and it resyncs from the peer, whatever the
split-brain policy. One-shot: it applies to the next handshake only. Run
plain "vmsan repl connect VOLUME" on the surviving node as well if it is
StandAlone. See "Split brain" in docs/replication.md.`
	connect.Flags().BoolVar(&discard, "discard-my-data", false, "on split brain, drop this node's changes and resync it from the peer (one-shot)")
	connect.RunE = func(cmd *cobra.Command, args []string) error {
		asJSON, _ := cmd.Flags().GetBool("json") // op's flag
		if discard {
			return replOp(dataDir, args[0], "connect-discard-my-data", asJSON)
		}
		return replOp(dataDir, args[0], "connect", asJSON)
	}
	var removeForce bool
	remove := &cobra.Command{
		Use:   "remove VOLUME",
		Short: "Stop replicating a volume and remove its replication state (a plain volume again; clients stay connected)",
		Long: `Stop replicating a volume and remove its replication state.

A running vmsan serve stops the volume's replica at once; the volume is then
served as a plain volume, its clients stay connected. Without a daemon the
state is removed and the volume starts plain at the next start. Refused when
the local copy is not UpToDate unless --force. Run it on the peer too (or
configure the peer with another partner). A volume with a replication
section in the config file gets it back at the next start: remove the
section as well.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			applied, err := replRemove(dataDir, args[0], removeForce)
			if err != nil {
				return err
			}
			if applied {
				fmt.Printf("replication of %s removed (applied now)\n", args[0])
			} else {
				fmt.Printf("replication of %s removed (no daemon running)\n", args[0])
			}
			return nil
		},
	}
	remove.Flags().BoolVar(&removeForce, "force", false, "remove even when the local copy is not UpToDate")
	rc.AddCommand(configure, remove, promote, demote,
		op("verify", "Online verify: compare hashes with the peer, mark and resync mismatches", "verify"),
		connect,
		op("disconnect", "Drop the connection and stay StandAlone", "disconnect"),
		status)
	return rc
}

// replVolumeCommands are `vmsan volume promote|demote|verify VOLUME`, the
// names the issue uses; they call the same control endpoints as `vmsan repl
// ...` and read the volume command's persistent --data-dir flag.
func replVolumeCommands() []*cobra.Command {
	mk := func(use, short, path string, force *bool) *cobra.Command {
		return &cobra.Command{
			Use: use + " VOLUME", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(cmd *cobra.Command, args []string) error {
				dataDir, err := cmd.Flags().GetString("data-dir")
				if err != nil {
					return err
				}
				asJSON, _ := cmd.Flags().GetBool("json") // the volume command's
				if force != nil && *force {
					return replOp(dataDir, args[0], path+"-force", asJSON)
				}
				return replOp(dataDir, args[0], path, asJSON)
			},
		}
	}
	var force, demoteForce bool
	p := mk("promote", "Make this node primary for a replicated volume (refused while the peer is primary and connected)", "promote", &force)
	p.Flags().BoolVar(&force, "force", false, "promote even if the local disk is not UpToDate")
	d := mk("demote", "Make this node secondary for a replicated volume (refused while clients such as NBD connections hold it open; per-volume iSCSI logical units follow roles and do not count)", "demote", &demoteForce)
	d.Flags().BoolVar(&demoteForce, "force", false, "demote even though clients hold the volume open (their writes then fail)")
	return []*cobra.Command{p, d,
		mk("verify", "Online verify of a replicated volume against its peer", "verify", nil)}
}

// replConfigure has a running daemon write and apply s (applied true), or
// writes the settings file when no daemon serves dataDir.
func replConfigure(dataDir, volume string, s driver.Settings) (driver.Settings, bool, error) {
	c, err := daemon.Dial(dataDir)
	if errors.Is(err, daemon.ErrNoDaemon) {
		out, err := driver.Configure(dataDir, volume, s)
		return out, false, err
	}
	if err != nil {
		return s, false, err
	}
	defer c.Close()
	var st driver.Status
	if err := c.Do("PUT", "/v1/repl/"+url.PathEscape(volume), s, &st); err != nil {
		return s, false, err
	}
	out, err := driver.LoadSettings(driver.Dir(dataDir, volume))
	if err != nil {
		// Applied; only this process cannot read the file back (another
		// user's data directory): report what was asked for.
		out = s
	}
	return out, true, nil
}

// replRemove has a running daemon remove a volume's replication (applied
// true), or removes its state when no daemon serves dataDir.
func replRemove(dataDir, volume string, force bool) (bool, error) {
	c, err := daemon.Dial(dataDir)
	if errors.Is(err, daemon.ErrNoDaemon) {
		return false, driver.RemoveOffline(dataDir, volume, force)
	}
	if err != nil {
		return false, err
	}
	defer c.Close()
	q := ""
	if force {
		q = "?force=1"
	}
	return true, c.Do("DELETE", "/v1/repl/"+url.PathEscape(volume)+q, nil, nil)
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// replOp posts one replication operation (promote, demote, verify, ...) for
// volume to the running daemon and prints the volume's resulting status.
func replOp(dataDir, volume, op string, asJSON bool) error {
	c, err := daemon.Dial(dataDir)
	if err != nil {
		return err
	}
	defer c.Close()
	var st driver.Status
	// by names this command in the daemon's log lines and events for a
	// role change (the role controller records who asked).
	by := url.QueryEscape(fmt.Sprintf("cli pid %d uid %d", os.Getpid(), os.Getuid()))
	if err := c.Do("POST", "/v1/repl/"+url.PathEscape(volume)+"/"+op+"?by="+by, nil, &st); err != nil {
		return err
	}
	if asJSON {
		return PrintJSON(os.Stdout, []driver.Status{st}) // a list, as repl status --json
	}
	writeReplTable(os.Stdout, []driver.Status{st})
	return nil
}

// printMaskedJSON prints v as JSON with the values of secret-like keys
// (config.IsSecretKey: secret, shared_secret, password, ...) masked, for
// output that echoes settings.
func printMaskedJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var x any
	if err := json.Unmarshal(b, &x); err != nil {
		return err
	}
	var mask func(any)
	mask = func(x any) {
		switch t := x.(type) {
		case map[string]any:
			for k, e := range t {
				if s, ok := e.(string); ok && s != "" && config.IsSecretKey(k) {
					t[k] = config.Masked
					continue
				}
				mask(e)
			}
		case []any:
			for _, e := range t {
				mask(e)
			}
		}
	}
	mask(x)
	return PrintJSON(os.Stdout, x)
}
