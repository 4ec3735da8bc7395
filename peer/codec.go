package peer

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/internal/wire"
)

// The bounds of a peer message as it is decoded. The receive limit
// (MaxMessageBytes) bounds its bytes; these bound what decoding them
// builds, which for a message of empty items is a hundred times more: a
// member-signed Forward of 4 MiB of empty items once took a node to 3.2
// GB (8 in parallel).
const (
	// MaxForwardMessages is the most messages a Forward or a
	// ForwardStream batch may build: MaxForwardItems requests and as many
	// items, each with a parent (a check with a ceiling), and the batch.
	MaxForwardMessages = 3*MaxForwardItems + 1
	// bytesPerMessage bounds the messages of the other requests (GLOBAL
	// reports and states, whose count only their size bounds): one a
	// bytesPerMessage bytes of the message, at least 1,024. An honest
	// report or grant takes more than that on the wire.
	bytesPerMessage = 8
	// messageCost is what a decoded message is charged against the bytes
	// in flight, besides its wire bytes: a generous size of the small
	// messages peers send, with their pointer and slab.
	messageCost = 256
	// MaxInflightBytes bounds the bytes of peer requests in flight on one
	// peer server (ServerOptions), decoded and not yet answered: about 25
	// requests of the largest kind, and tens of thousands of the usual.
	MaxInflightBytes = 256 << 20
	// inflightWait bounds how long a message waits for room in the
	// budget before it is refused.
	inflightWait = time.Second
)

// bounded is, for each request of the Peer service with a repeated field
// its handler bounds, that field and the bound: the codec decodes no more
// than one element beyond it (wire.Prefix), however many the message
// holds, so that the handler refuses it having built only those.
var bounded = map[string]struct {
	field protowire.Number
	max   int
}{
	string((&peerpb.ForwardRequest{}).ProtoReflect().Descriptor().FullName()):       {1, MaxForwardItems},
	string((&peerpb.ForwardStreamRequest{}).ProtoReflect().Descriptor().FullName()): {1, MaxForwardItems},
	string((&peerpb.HandOffRequest{}).ProtoReflect().Descriptor().FullName()):       {2, peerpb.MaxHandOffCounters},
	string((&peerpb.ReplicateRequest{}).ProtoReflect().Descriptor().FullName()):     {2, peerpb.MaxHandOffCounters},
	string((&peerpb.LeaseRelayRequest{}).ProtoReflect().Descriptor().FullName()):    {3, checks.MaxItems},
}

// maxMessages is the most messages decoding b, an encoded m, may build.
func maxMessages(m proto.Message, b []byte) int {
	switch m.(type) {
	case *peerpb.ForwardRequest, *peerpb.ForwardStreamRequest:
		return MaxForwardMessages
	}
	return max(1024, len(b)/bytesPerMessage)
}

// codec is wire.Codec, except that it counts before it decodes: it
// decodes the bounded fields (bounded) from a prefix of the message, and
// refuses a message that would build more messages than maxMessages, or
// for which the node's budget of bytes in flight has no room within
// inflightWait. A request it decodes holds its cost (its bytes and
// messageCost a message) in the budget until released (release) after
// its handler returns. gRPC answers a codec's refusal with INTERNAL.
type codec struct {
	wire.Codec
	budget *semaphore.Weighted // nil: no bound in flight (a client's codec, tests)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return c.Codec.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	d := m.ProtoReflect().Descriptor()
	if bound, ok := bounded[string(d.FullName())]; ok {
		b = wire.Prefix(b, bound.field, bound.max+1)
	}
	limit := maxMessages(m, b)
	n, ok := wire.CountMessages(b, d, limit)
	if !ok {
		return fmt.Errorf("%s: more than %d messages, or nested too deeply", d.FullName(), limit)
	}
	if c.budget == nil {
		return wire.Unmarshal(b, m)
	}
	cost := int64(len(b) + n*messageCost)
	ctx, cancel := context.WithTimeout(context.Background(), inflightWait)
	defer cancel()
	if err := c.budget.Acquire(ctx, cost); err != nil {
		return fmt.Errorf("%s: no room for %d bytes among the peer messages in flight: %w", d.FullName(), cost, err)
	}
	if err := wire.Unmarshal(b, m); err != nil {
		c.budget.Release(cost)
		return err
	}
	held.Store(v, hold{c.budget, cost})
	return nil
}

// held maps each request the codec decoded, and its handler has not
// finished with, to its cost in the budget it came from.
var held sync.Map

type hold struct {
	budget *semaphore.Weighted
	cost   int64
}

// release gives back the budget req holds, if any. Calling it again does
// nothing.
func release(req any) {
	if h, ok := held.LoadAndDelete(req); ok {
		h.(hold).budget.Release(h.(hold).cost)
	}
}

// releaseUnary releases a unary request's budget when the call ends,
// whether a handler took it or an interceptor refused it. It must be the
// outermost interceptor: ServerOptions installs it first.
func releaseUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	defer release(req)
	return handler(ctx, req)
}
