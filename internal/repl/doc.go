// Package repl is vmsan's synchronous block replication (DRBD-style) between
// two nodes, written as a deterministic state machine in the style of
// etcd-io/raft: a Node has no sockets, clocks, goroutines or disk calls.
//
// Simplest use (the driver in internal/repl/driver does exactly this):
//
//	n := repl.NewNode(cfg, persisted)
//	n.Connect()                        // both TCP channels are up
//	n.Step(msgFromPeer)                // a decoded peer message
//	n.Propose(id, repl.Write{...})     // a client write on the primary
//	n.Tick()                           // every Config.TickInterval
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
// Concurrency: a Node is NOT safe for concurrent use. The driver owns it from
// one goroutine and serialises every input.
//
// Wire format: Encode/Decode in msg.go are pure functions over []byte; every
// length read from the wire is bounded before allocating.
package repl
