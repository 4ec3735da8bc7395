package peerpb

// The bounds of the peer protocol's messages that more than one package
// must agree on: the peer server refuses what exceeds them, and the
// senders (hand-off, replication) size their batches by them; a snapshot
// names its node as peer messages do.
const (
	// MaxHandOffCounters is the most counters one HandOff or Replicate RPC
	// may carry.
	MaxHandOffCounters = 1000
	// MaxHandOffBytes is the most bytes of counter records one HandOff or
	// Replicate RPC carries. With gRPC's framing (a few bytes a record) such
	// an RPC stays far under the peer server's receive limit, so a node
	// with a smaller limit is the only reason a batch is refused for its
	// size; the sender then splits it.
	MaxHandOffBytes = 1 << 20
	// MaxNodeNameLen bounds a node's name: the sender's name in peer
	// requests, and the name in a snapshot's header.
	MaxNodeNameLen = 256
)
