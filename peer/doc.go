// Package peer carries traffic between ringlimit nodes: a gRPC Server that
// hands peer RPCs to a Handler, and a Pool of client connections that other
// nodes use to reach it.
//
// Pool.Forward gathers concurrent checks bound for one peer into batches
// (a batcher of package batch for each peer), sent as the messages of one
// long-lived ForwardStream, or as Forward RPCs to a peer that refuses the
// stream. A request that finds no batch in flight goes at once; the others
// gather, and a batch leaves when none is in flight, at Config.BatchLimit
// items or Config.BatchWait after its first. The owner answers each
// request as if it came alone: batching changes latency, never decisions.
// NewPool starts nothing; Pool.Run owns every goroutine that sends
// batches, and requests pending when it ends fail; so do those gathered
// and not sent when Retain drops their peer, while those sent get their
// answer. See docs/design-ports.md, "The peer pool".
package peer
