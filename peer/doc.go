// Package peer carries traffic between ringlimit nodes: a gRPC Server that
// hands peer RPCs to a Handler, and a Pool of client connections that other
// nodes use to reach it.
//
// A node that does not own a key forwards the check to the key's owner.
// Forwarding one RPC per check costs a round trip and a gRPC stream per
// check, so Pool.Forward gathers concurrent checks bound for the same peer
// into one batch, and sends the batches to each peer as the messages of
// one long-lived ForwardStream (a Forward RPC each when the peer refuses
// the stream: it does not know this node yet, or is of an older
// version). Each peer has a batcher (package batch): callers hand it
// their request and wait on a result channel of their own. Batching is
// adaptive: a request that finds no batch to its peer in flight is sent
// at once, so idle traffic pays no delay; requests that arrive while one
// is in flight are gathered, and the gathered batch leaves when no batch
// is in flight any more, when it holds Config.BatchLimit items, or
// Config.BatchWait after its first request, whichever comes first (at
// most a few batches per peer in flight at once). The owner answers each
// request of the batch as if it had arrived alone, so batching changes
// latency, never decisions.
//
// Goroutine ownership follows the project rule: NewPool starts nothing;
// Pool.Run owns every goroutine that sends batches and returns only after
// all of them have exited. A caller never waits on a batcher that is gone:
// requests pending when Run ends or when Retain drops their peer fail with
// an error, and callers whose context ends return at once. The gRPC
// connections themselves, with gRPC's own goroutines, belong to the Pool
// until Close.
package peer
