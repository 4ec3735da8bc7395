package client

import (
	"context"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// call is one caller's Check in progress: its request, split into parts
// (one per node it goes to), and the results the parts bring back.
type call struct {
	ctx context.Context // the caller's: a part whose caller has gone is not sent
	req *pb.CheckRequest

	// results has one entry per item of req, written by the parts before
	// done is closed; the caller reads it after. With a single part it is
	// that part's slice of the node's answer.
	results []*pb.CheckResult
	left    atomic.Int32 // parts not answered yet
	done    chan struct{}

	mu     sync.Mutex
	failed int   // items whose part failed
	err    error // the first part's error
	one    part  // the part of a call that is not split, without an allocation
}

func newCall(ctx context.Context, req *pb.CheckRequest) *call {
	return &call{ctx: ctx, req: req, done: make(chan struct{})}
}

// whole returns c's only part, for node to: every item, in order.
func (c *call) whole(to *node) *part {
	c.one = part{c: c, to: to, items: c.req.GetRequests()}
	c.left.Store(1)
	return &c.one
}

// split returns c's parts, one per node that place assigns an item to,
// in order of first appearance.
func (c *call) split(place func(*pb.CheckItem) *node) []*part {
	items := c.req.GetRequests()
	var parts []*part
	for i, it := range items {
		to := place(it)
		k := 0
		for k < len(parts) && parts[k].to != to {
			k++
		}
		if k == len(parts) {
			parts = append(parts, &part{c: c, to: to})
		}
		parts[k].items = append(parts[k].items, it)
		parts[k].pos = append(parts[k].pos, i)
	}
	if len(parts) == 1 {
		c.one = *parts[0]
		c.one.items, c.one.pos = items, nil // the whole request, in order
		parts[0] = &c.one
	} else {
		c.results = make([]*pb.CheckResult, len(items))
	}
	c.left.Store(int32(len(parts)))
	return parts
}

// wait returns c's response once every part is answered, or ctx's error
// as soon as ctx ends. A failed part fails the whole call if it was the
// only one; otherwise its items get UNAVAILABLE results and the others
// their answers, as the wire does for a check it could not decide.
func (c *call) wait() (*pb.CheckResponse, error) {
	select {
	case <-c.done:
	case <-c.ctx.Done():
		return nil, c.ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil && c.failed == len(c.req.GetRequests()) {
		return nil, c.err
	}
	return &pb.CheckResponse{Responses: c.results}, nil
}

// part is the items of a call bound for one node.
type part struct {
	c     *call
	to    *node
	items []*pb.CheckItem
	pos   []int // pos[k] is the index in c.req of items[k]; nil: items is c.req's
	// retried is set when the part has been sent again after its node was
	// unreachable; it is not sent a third time.
	retried bool
}

// answer records results, one per item of p, or err, and releases the
// caller when p was its last part.
func (p *part) answer(results []*pb.CheckResult, err error) {
	c := p.c
	switch {
	case err != nil:
		c.mu.Lock()
		if c.err == nil {
			c.err = err
		}
		c.failed += len(p.items)
		if p.pos != nil {
			for _, i := range p.pos {
				c.results[i] = &pb.CheckResult{Status: pb.Status_OVER_LIMIT, Error: err.Error(), ErrorCode: pb.ErrorCode_UNAVAILABLE}
			}
		}
		c.mu.Unlock()
	case p.pos == nil:
		c.results = results
	default:
		for k, i := range p.pos {
			c.results[i] = results[k]
		}
	}
	if c.left.Add(-1) == 0 {
		close(c.done)
	}
}

// Size, Left and Fail make a part a call that package batch gathers.

// Size returns p's checks and an upper bound of their encoded bytes.
func (p *part) Size() (items, bytes int) {
	for _, it := range p.items {
		bytes += itemBytes(it)
	}
	return len(p.items), bytes
}

// Left returns why p's caller has stopped waiting, or nil.
func (p *part) Left() error { return p.c.ctx.Err() }

// Fail answers p with err.
func (p *part) Fail(err error) { p.answer(nil, err) }

// The bounds of a batch, under the node's (service.MaxItems items,
// api.MaxRecvMsgBytes encoded bytes), so that a node never refuses a
// batch for its size.
const (
	maxBatchItems = 1000
	maxBatchBytes = 1 << 20
)

// itemBytes bounds an item's encoded size from above, cheaply: its
// strings and any fields it does not know (which protobuf encodes), plus
// itemFixed for every other field at its widest, the tags and lengths.
func itemBytes(it *pb.CheckItem) int {
	n := len(it.GetName()) + len(it.GetKey()) + len(it.GetPolicy()) + len(it.ProtoReflect().GetUnknown()) + itemFixed
	if p := it.GetParent(); p != nil {
		n += len(p.GetKey()) + len(p.ProtoReflect().GetUnknown())
	}
	return n
}

// streamBytes bounds a CheckStream request's encoded size from above: its
// items, and 40 bytes for all, id, timeout_ms and ring with their tags.
func streamBytes(r *pb.CheckStreamRequest) int {
	n := 40
	for _, it := range r.GetRequests() {
		n += itemBytes(it)
	}
	return n
}

// itemFixed is the most a CheckItem's fields take but for their strings:
// its own tag and length (6 bytes), three strings' tags and lengths (18),
// nine int64 and enum fields at 11 bytes each (99), two bools (4),
// reserve_ttl_ms (12) and parent with its key's tag and length and two
// int64 (34): 173, rounded up.
const itemFixed = 192

// alone reports whether p must travel in a request of its own, exactly
// as its caller sent it, rather than share one with other parts:
//
//   - its request has "all" set and two items with the same key: a
//     request has one all flag, and sharing it would group the other
//     parts' items with these, or ungroup these;
//   - an item is UNBATCHED, which asks for an RPC of its own;
//   - it is too big for a batch (a node answers it as it answers any
//     request that size);
//   - a string is not valid UTF-8, which protobuf refuses to encode: the
//     RPC would fail, and only this caller's RPC should.
func (p *part) alone() bool {
	if len(p.items) == 0 || len(p.items) > maxBatchItems {
		return true
	}
	bytes := 0
	for _, it := range p.items {
		if it.GetBehavior() == pb.Behavior_UNBATCHED ||
			!utf8.ValidString(it.GetName()) || !utf8.ValidString(it.GetKey()) || !utf8.ValidString(it.GetPolicy()) {
			return true
		}
		bytes += itemBytes(it)
	}
	return bytes > maxBatchBytes || (p.c.req.GetAll() && repeatsKey(p.items))
}

// repeatsKey reports whether two of items have the same key.
func repeatsKey(items []*pb.CheckItem) bool {
	if len(items) < 2 {
		return false
	}
	if len(items) <= 16 { // the usual few limits of one check: no map
		for i, a := range items {
			for _, b := range items[i+1:] {
				if a.GetKey() == b.GetKey() {
					return true
				}
			}
		}
		return false
	}
	seen := make(map[string]bool, len(items))
	for _, it := range items {
		if seen[it.GetKey()] {
			return true
		}
		seen[it.GetKey()] = true
	}
	return false
}
