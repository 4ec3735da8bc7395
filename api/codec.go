package api

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/wire"
	"github.com/ringlimit/ringlimit/lease"
)

// MaxRecvMsgBytes is the gRPC receive limit of the client port. A
// CheckItem at its longest takes under 1,950 bytes in protobuf (name 256
// bytes, key 1,024, policy 256, a parent's key 256, the other fields at
// their widest and the tags and lengths), so a thousand of them fit in
// 1.95 MB; 2 MiB leaves a little headroom. (gRPC's default is 4 MiB.)
const MaxRecvMsgBytes = 2 << 20

// MaxHeaderListBytes bounds the metadata of one RPC on the client port
// (gRPC's default is 16 MiB); a check needs a few hundred bytes.
const MaxHeaderListBytes = 64 << 10

// Bound is the most elements a request message may carry in one repeated
// field, as decoded by the codec of ServerOptions.
type Bound struct {
	Message protoreflect.FullName
	Field   protoreflect.FieldNumber
	Max     int
}

// BoundOf is the Bound of max elements in msg's repeated field called field.
// It panics if msg has no such field: a bug, not an input.
func BoundOf(msg proto.Message, field protoreflect.Name, max int) Bound {
	d := msg.ProtoReflect().Descriptor()
	f := d.Fields().ByName(field)
	if f == nil || !f.IsList() {
		panic(fmt.Sprintf("api.BoundOf: %s has no repeated field %s", d.FullName(), field))
	}
	return Bound{Message: d.FullName(), Field: f.Number(), Max: max}
}

// MaxMessages is the most protobuf messages one request on the client port
// may build, nested ones included: a check request builds at most 1,002
// (after the codec's bound on items), an Envoy request of 1,000 descriptors
// of 64 entries 65,001. Small messages cost about 80 bytes each
// however few bytes they take on the wire, so this bounds what a request of
// many empty nested messages (an Envoy descriptor of a million empty
// entries) can cost.
const MaxMessages = 1 << 16

// ServerOptions are the options of the grpc.Server that serves
// RegisterGRPC: the receive limits MaxRecvMsgBytes and MaxHeaderListBytes,
// and a codec that decodes at most checks.MaxItems+1 items of a
// CheckRequest or CheckStreamRequest, lease.MaxReports+1 reports of a
// LeaseRequest (and at most Max+1 elements of each
// of bounds), however many the message holds, and refuses a request that
// would build more than MaxMessages messages. protobuf would otherwise build every element before
// the service counts them: a message of empty items costs about a hundred
// times its size.
func ServerOptions(bounds ...Bound) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxRecvMsgBytes), grpc.MaxHeaderListSize(MaxHeaderListBytes), grpc.ForceServerCodecV2(newCodec(bounds...))}
}

// newCodec returns the codec of ServerOptions, with bounds besides those
// of the client port's own requests.
func newCodec(bounds ...Bound) boundedCodec {
	c := boundedCodec{CodecV2: wire.Codec{}, bounds: map[protoreflect.FullName]Bound{}}
	own := []Bound{BoundOf(&pb.CheckRequest{}, "requests", checks.MaxItems), BoundOf(&pb.CheckStreamRequest{}, "requests", checks.MaxItems),
		BoundOf(&pb.LeaseRequest{}, "reports", lease.MaxReports)}
	for _, b := range append(bounds, own...) {
		c.bounds[b.Message] = b
	}
	return c
}

// boundedCodec is gRPC's proto codec (wire.Codec, which decodes and
// encodes checks without reflection), except that it counts before it
// decodes. For the messages in bounds, it decodes from a prefix of their
// encoding that ends before the repeated field's Max+2nd element, so the
// handler sees Max+1 elements and refuses the request as it refuses any
// with too many, with the usual error, having built only those. A request
// that would build more than MaxMessages messages is refused; gRPC reports
// a codec's error as INTERNAL.
type boundedCodec struct {
	encoding.CodecV2
	bounds map[protoreflect.FullName]Bound
}

func (c boundedCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	bound, ok := c.bounds[m.ProtoReflect().Descriptor().FullName()]
	return decodeBounded(buf.ReadOnlyData(), m, bound, ok)
}

// decodeBounded decodes b into m as boundedCodec does, with bound if
// bounded.
func decodeBounded(b []byte, m proto.Message, bound Bound, bounded bool) error {
	d := m.ProtoReflect().Descriptor()
	if bounded {
		b = wire.Prefix(b, bound.Field, bound.Max+1)
	}
	if _, ok := wire.CountMessages(b, d, MaxMessages); !ok {
		return fmt.Errorf("%s: more than %d messages, or nested too deeply", d.FullName(), MaxMessages)
	}
	return wire.Unmarshal(b, m)
}
