// Package repl is vmsan's synchronous block replication (DRBD-style) between
// two nodes, written as a deterministic state machine in the style of raft
// libraries' Ready loop: a Node has no sockets, clocks, goroutines or disk
// calls.
//
// Simplest use (the driver in internal/repl/driver does exactly this):
//
//	n := repl.NewNode(cfg, meta, bitmapWords, alExtents) // persisted state
//	n.Connect()                        // both TCP channels are up
//	n.Step(msgFromPeer)                // a decoded peer message
//	id, err := n.Propose(repl.Write{...}) // a client write on the primary
//	n.Tick()                           // every tick (replset.Settings.Ticks().Tick)
//	for n.HasReady() {
//	    rd := n.Ready()
//	    persist(rd.Persist)            // 1. make metadata/AL/bitmap durable
//	    send(rd.Send)                  // 2. then send, in order
//	    submit(rd.Apply, rd.Reads)     // 3. then local I/O (async; report with LocalDone/ReadDone)
//	    release(rd.Release)            // 4. then reply to clients
//	}
//
// Everything the node decides (messages to send, writes to apply, acks to
// release, state to persist, disconnects) comes out of Ready; everything that
// happens in the world goes in through the input methods. Because of that the
// whole protocol — handshake, generation-identifier comparison, split brain
// policies, resync, protocol A/B/C acknowledgement rules, ping and ko
// timeouts — is tested by replaying scenario files in testdata/ without any
// I/O.
//
// Files by phase: node.go (types, NewNode, Ready, admin inputs, Step's
// dispatch), connect.go (connection life cycle, handshake, decision; the
// comparison itself is Decide in decide.go), primary.go (client writes and
// their release), secondary.go (applying the replicated stream), resync.go
// (resync and online verify), activitylog.go (activity log), tick.go
// (timeouts), bitmap.go (dirty bitmap), msg.go (wire format). Each file
// lists the invariants it keeps as INVARIANT comments at its top.
//
// Settings: Config is in ticks; replset.Settings (durations, the one
// replication settings type) converts to them with Ticks, and Protocol and
// SplitBrainPolicy are replset's types under this package's names.
//
// Concurrency: a Node is NOT safe for concurrent use. The driver owns it from
// one goroutine and serialises every input.
//
// Wire format: AppendEncode/AppendHeader and Decode/DecodeHeader in msg.go
// are pure functions over []byte; every length read from the wire is bounded
// before allocating.
package repl
