package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/batch"
	"github.com/ringlimit/ringlimit/internal/mux"
	"github.com/ringlimit/ringlimit/internal/respcall"
	"github.com/ringlimit/ringlimit/internal/wire"
)

// maxFlying is the most batches in flight to one node. The second and
// later go only when full enough (sendAt checks): a node answers
// concurrent batches on several cores, while batches of a few checks each
// would cost more requests than they save.
const maxFlying = 4

// sendAt is the checks at which a gathered batch goes without waiting for
// the batches in flight (while fewer than maxFlying are). A request costs
// a node about as much as 20-30 checks in it do, whatever it carries
// (docs/bench/cpu.md: mostly the kernel waking threads to read and
// answer it), so a batch of sendAt checks has spread that cost to about what its
// checks cost, and gathering more would mostly make its callers wait. It
// keeps the node busy between batches, too, which is cheaper for it than
// sleeping and waking: 50 callers on one node measured 20-25% more
// checks/s at 10-15% less node CPU a check than with batches that waited
// for the one in flight (from 8 to 32 checks were tried; 12 to 20 did
// best).
const sendAt = 16

// few is the checks in flight and gathered (at their peak, lately: see
// batch.Config.Few) below which a node's callers are few: no more than
// maxFlying, so that each check may have a batch of its own in flight,
// and goes at once. A caller then waits for no other caller's batch, and
// the node reads the next request as it answers one, which costs it less
// than sleeping between them (docs/bench/client.md, "The client at few
// callers"). With more callers, batches wait to grow as before: sent at
// once, 8 callers' batches of about 2 checks cost the node about 1.6
// times the CPU a check of the batches of 4 they make waiting.
const few = maxFlying + 1

// node is one ringlimit node (or balancer) the client sends checks to, and
// the batching of the checks bound for it. It is safe for concurrent use.
//
// Batching is adaptive, as between nodes (package batch does it for
// both): a part that finds no batch in flight to the node goes at once,
// alone, from its caller's goroutine, so that idle traffic waits for
// nothing, and so does one whose callers are few (fewer than few checks
// in flight and gathered). Parts that arrive while a batch is in flight
// and callers are more are gathered, and the gathered batch goes when
// the batches in flight have returned, or at once when it holds sendAt
// checks (or maxBatchBytes bytes) and fewer than maxFlying batches are in
// flight; while maxFlying are, it gathers up to maxBatchItems. There is
// no timer: a gathered part waits for at most the batch ahead of it,
// about one round trip.
//
// Batches travel as the requests of one CheckStream, which costs the node
// far less per batch than a Check RPC; a part that travels alone, and any
// batch the stream cannot carry (not connected yet, a node that does not
// serve it), goes in a Check RPC.
type node struct {
	addr   string
	conn   *grpc.ClientConn
	rl     pb.RateLimiterClient
	stream *mux.Client[pb.CheckStreamRequest, pb.CheckStreamResponse] // nil: Check RPCs only
	base   context.Context                                            // ends when the client closes: RPCs of batches
	batch  *batch.Batcher[*part]                                      // nil: every part goes alone
	router *router                                                    // nil when the client does not route
	port   portProbe                                                  // says when addr is not a gRPC port
	// resp carries batches to the node's RESP port once its stream has
	// named one (see respCheck); nil until then, or for good unless
	// useRESP.
	resp    atomic.Pointer[respcall.Pool]
	useRESP bool
	respMu  sync.Mutex // serialises learnRESP and close
	closed  bool       // under respMu
}

// nodeConfig is what the nodes of one client share.
type nodeConfig struct {
	dial     []grpc.DialOption
	batching bool
	streams  bool            // batches go on a CheckStream
	resp     bool            // and to the node's RESP port once it names one: plaintext, no dial options
	base     context.Context // ends when the client closes
	router   *router         // nil when the client does not route
}

// newNode returns the node at addr. It connects lazily.
func newNode(addr string, conf nodeConfig) (*node, error) {
	// The codec goes first, so that a caller's dial options may set
	// another.
	dial := append([]grpc.DialOption{grpc.WithDefaultCallOptions(grpc.ForceCodecV2(wire.Codec{}))}, conf.dial...)
	conn, err := grpc.NewClient(addr, dial...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	n := &node{addr: addr, conn: conn, rl: pb.NewRateLimiterClient(conn), base: conf.base, router: conf.router, port: portProbe{addr: addr},
		useRESP: conf.resp}
	if conf.batching {
		n.startBatching()
	}
	if conf.batching && conf.streams {
		n.stream = mux.NewClient(mux.Config[pb.CheckStreamRequest, pb.CheckStreamResponse]{
			Open:  n.rl.CheckStream,
			Ready: func() bool { return conn.GetState() == connectivity.Ready },
			Stamp: func(r *pb.CheckStreamRequest, id uint64, timeoutMs int64) { r.Id, r.TimeoutMs = id, timeoutMs },
			ID:    (*pb.CheckStreamResponse).GetId,
			Size:  streamBytes,
			Header: func(md metadata.MD) {
				if n.useRESP {
					n.learnRESP(md.Get(respcall.PortHeader))
				}
			},
		})
	}
	return n, nil
}

// startBatching makes n batch the parts that may share a request, with
// RPCs that end when n.base does.
func (n *node) startBatching() {
	n.batch = batch.New(batch.Config[*part]{
		Send:      func(ctx context.Context, parts []*part) { n.flush(ctx, parts, false) },
		MaxFlying: maxFlying,
		SendAt:    sendAt,
		Few:       few,
		MaxItems:  maxBatchItems,
		MaxBytes:  maxBatchBytes,
	})
	n.batch.Start(n.base)
}

// close ends n's stream and RESP connections, and closes its connection.
func (n *node) close() error {
	if n.stream != nil {
		n.stream.Close()
	}
	n.respMu.Lock()
	n.closed = true
	if p := n.resp.Swap(nil); p != nil {
		p.Close()
	}
	n.respMu.Unlock()
	return n.conn.Close()
}

// Check sends req to n and returns the node's answer. It is the whole
// client when the client does not route.
func (n *node) Check(ctx context.Context, req *pb.CheckRequest) (*pb.CheckResponse, error) {
	c := newCall(ctx, req)
	n.submit(c.whole(n), true)
	return c.wait()
}

// submit sends p to n, batched with others unless it must go alone; the
// answer goes to p's call. With wait, p is its caller's only part, and
// when p goes at once, alone, it goes from this goroutine: an idle check
// costs no goroutine and no hand-over. Otherwise submit does not wait.
func (n *node) submit(p *part, wait bool) {
	switch {
	case n.batch != nil && !p.alone() && wait:
		n.batch.Do(p)
	case n.batch != nil && !p.alone():
		n.batch.Add(p)
	case wait:
		n.flushAlone(p)
	default:
		go n.flushAlone(p)
	}
}

// flushAlone sends p in a Check RPC of its own, unless its caller has
// gone: then its checks are charged nothing.
func (n *node) flushAlone(p *part) {
	if err := p.Left(); err != nil {
		p.Fail(err)
		return
	}
	n.flush(n.base, []*part{p}, true)
}

// flush sends parts, whose callers wait, as one request and answers
// each. A single part goes under its caller's context, as without
// batching; several go under a context that ends with base (the client)
// or at the latest of their deadlines (none if one has none), since each
// caller stops waiting at its own. A part that is alone goes in a Check
// RPC of its own.
func (n *node) flush(base context.Context, parts []*part, alone bool) {
	items := 0
	for _, p := range parts {
		items += len(p.items)
	}
	var (
		ctx context.Context
		req *pb.CheckRequest
	)
	if len(parts) == 1 {
		p := parts[0]
		ctx = p.c.ctx
		req = p.c.req
		if p.pos != nil {
			req = &pb.CheckRequest{Requests: p.items, All: p.c.req.GetAll()}
		}
	} else {
		// One request has one all flag, false here: a part whose own flag
		// matters (it repeats a key) travels alone.
		req = &pb.CheckRequest{Requests: make([]*pb.CheckItem, 0, items)}
		for _, p := range parts {
			req.Requests = append(req.Requests, p.items...)
		}
		var cancel context.CancelFunc
		ctx, cancel = batchContext(base, parts)
		defer cancel()
	}
	resp, err := n.check(ctx, req, alone)
	if err == nil && len(resp.GetResponses()) != items {
		err = fmt.Errorf("%w: node %s answered %d results for %d checks", ErrInternal, n.addr, len(resp.GetResponses()), items)
	}
	off := 0
	for _, p := range parts {
		if err != nil {
			n.fail(p, err)
			continue
		}
		k := len(p.items)
		p.answer(resp.Responses[off:off+k:off+k], nil) // capped: appending to one caller's results must not touch the next's
		off += k
	}
}

// batchContext is the context of a batch of parts: base, ending at the
// latest of the parts' deadlines, if each has one.
func batchContext(base context.Context, parts []*part) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, p := range parts {
		d, ok := p.c.ctx.Deadline()
		if !ok {
			return context.WithCancel(base)
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(base, latest)
}

// check sends req to n: on n's stream, unless it must travel alone, or
// its context carries gRPC metadata (a lone caller's, which a message on
// the stream would not carry), or the stream cannot carry it; else in a
// Check RPC. A routing client says which ring it routed req by and learns
// from the answer whether the node's ring differs.
func (n *node) check(ctx context.Context, req *pb.CheckRequest, alone bool) (*pb.CheckResponse, error) {
	var v *view
	if n.router != nil {
		v = n.router.view.Load()
	}
	if n.stream != nil && !alone {
		if _, md := metadata.FromOutgoingContext(ctx); !md {
			if p := n.resp.Load(); p != nil {
				resp, err := n.respCheck(ctx, p, req, v)
				if !errors.Is(err, respcall.ErrRefused) {
					return resp, err
				}
			}
			resp, err := n.streamCheck(ctx, req, v)
			if !errors.Is(err, mux.ErrRefused) {
				return resp, err
			}
		}
	}
	if v == nil || v.hex == "" { // no ring learned: the node routes
		return n.rl.Check(ctx, req)
	}
	ours := v.hex
	var header metadata.MD
	resp, err := n.rl.Check(metadata.AppendToOutgoingContext(ctx, ringHeader, ours), req, grpc.Header(&header))
	if theirs := header.Get(ringHeader); len(theirs) > 0 && theirs[0] != ours {
		n.router.ask(n) // n first: a ring that differs is most often the newer
	}
	return resp, err
}

// streamCheck sends req on n's stream; v is the ring it was routed by,
// nil if none.
func (n *node) streamCheck(ctx context.Context, req *pb.CheckRequest, v *view) (*pb.CheckResponse, error) {
	m := &pb.CheckStreamRequest{Requests: req.GetRequests(), All: req.GetAll()}
	if v != nil {
		m.Ring = v.sum
	}
	resp, err := n.stream.Call(ctx, m)
	if err != nil {
		return nil, err
	}
	return n.streamAnswer(resp, v)
}

// streamAnswer is the answer of a request that travelled as a
// CheckStream's, on the stream or the RESP port; v is the ring it was
// routed by, nil if none.
func (n *node) streamAnswer(resp *pb.CheckStreamResponse, v *view) (*pb.CheckResponse, error) {
	if theirs := resp.GetRing(); theirs != 0 && v != nil && theirs != v.sum {
		n.router.ask(n) // n first: a ring that differs is most often the newer
	}
	if err := mux.Err(resp.GetStatus()); err != nil {
		return nil, err
	}
	return &pb.CheckResponse{Responses: resp.GetResponses()}, nil
}

// Lease sends a lessee's call to n, in an RPC of its own.
func (n *node) Lease(ctx context.Context, req *pb.LeaseRequest) (*pb.LeaseResponse, error) {
	return n.rl.Lease(ctx, req)
}

func (n *node) Settle(ctx context.Context, req *pb.SettleRequest) (*pb.SettleResponse, error) {
	return n.rl.Settle(ctx, req)
}

// fail answers p with err, unless the client routes and sends p to
// another node instead; an address that is not a gRPC port is said so.
func (n *node) fail(p *part, err error) {
	if n.router != nil && n.router.reroute(p, err) {
		return
	}
	p.answer(nil, n.port.explain(err))
}

// learnRESP takes the port a node's stream named (ports: the header's
// values) as where to send n's batches from now on: RL.CHECK on the
// node's RESP port, at the host of n's address. A client that dials with
// options of its own (TLS, credentials, interceptors) never does: the
// RESP port would not carry what they add to every call.
func (n *node) learnRESP(ports []string) {
	if len(ports) != 1 {
		return
	}
	port, err := strconv.ParseUint(ports[0], 10, 16)
	host, _, splitErr := net.SplitHostPort(n.addr)
	if err != nil || port == 0 || splitErr != nil {
		return // not a port, or not an address of host and port (a gRPC target such as dns:///…)
	}
	addr := net.JoinHostPort(host, strconv.FormatUint(port, 10))
	n.respMu.Lock()
	defer n.respMu.Unlock()
	if old := n.resp.Load(); n.closed || old != nil && old.Addr() == addr {
		return
	}
	if old := n.resp.Swap(respcall.New(addr, maxFlying)); old != nil {
		old.Close()
	}
}

// respCheck sends req as RL.CHECK on the node's RESP port, through p; v
// is the ring it was routed by, nil if none. It carries what a stream's
// request does (the items, all, the ring, the caller's timeout) and its
// answer means the same. An error wrapping respcall.ErrRefused means
// nothing decided req (it is too big for the port, no connection is
// free, or the node refused the command): the stream carries it then.
func (n *node) respCheck(ctx context.Context, p *respcall.Pool, req *pb.CheckRequest, v *view) (*pb.CheckResponse, error) {
	m := &pb.CheckStreamRequest{Id: 1, Requests: req.GetRequests(), All: req.GetAll()}
	if v != nil {
		m.Ring = v.sum
	}
	if d, ok := ctx.Deadline(); ok {
		t := time.Until(d)
		if t <= 0 {
			return nil, context.DeadlineExceeded
		}
		m.TimeoutMs = (t + time.Millisecond - 1).Milliseconds()
	}
	if streamBytes(m) > respcall.MaxPayload {
		return nil, fmt.Errorf("%w: a request of up to %d bytes", respcall.ErrRefused, streamBytes(m))
	}
	payload, err := wire.Marshal(m)
	if err != nil {
		return nil, err
	}
	var resp pb.CheckStreamResponse
	err = p.Call(ctx, payload, func(answer []byte) error {
		if _, ok := wire.CountMessages(answer, resp.ProtoReflect().Descriptor(), maxAnswerMessages(len(m.Requests))); !ok {
			return fmt.Errorf("%w: node %s answered RL.CHECK with too many messages", ErrInternal, n.addr)
		}
		if err := wire.Unmarshal(answer, &resp); err != nil {
			return fmt.Errorf("%w: node %s answered RL.CHECK with %v", ErrInternal, n.addr, err)
		}
		return nil
	})
	switch {
	case errors.Is(err, respcall.ErrLost):
		return nil, status.Error(codes.Unavailable, err.Error())
	case err != nil:
		return nil, err
	case resp.GetId() != m.Id:
		return nil, fmt.Errorf("%w: node %s answered RL.CHECK with id %d, not %d", ErrInternal, n.addr, resp.GetId(), m.Id)
	}
	return n.streamAnswer(&resp, v)
}

// maxAnswerMessages bounds the messages of a node's answer to items
// checks, so that a port that lies cannot make the client build many
// more than it asked for: a result and its metadata (a message each
// entry) per check, and a few more.
func maxAnswerMessages(items int) int { return 16 + 16*items }
