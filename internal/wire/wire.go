// Package wire encodes and decodes ringlimit's busiest protobuf messages
// (checks, their results, and the batches that carry them between client,
// node and owner) by hand, without reflection, and every other message
// with package proto.
//
// The rule that keeps it right: the hand-written path takes only input it
// decodes exactly as proto.Unmarshal would, and hands anything else (an
// unknown field, an unexpected wire type, a string that is not UTF-8, a
// malformed field, result metadata) to proto.Unmarshal whole; it encodes
// byte for byte what proto.Marshal does, and hands proto.Marshal what it
// does not encode. FuzzUnmarshal and FuzzMarshal hold it to that,
// differentially. Why: docs/design-ports.md, "The wire codec".
package wire

import (
	"fmt"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Codec is gRPC's proto codec (encoding.CodecV2, named "proto"), with the
// hand-written path for the messages this package knows. Install it on a
// server with grpc.ForceServerCodecV2 and on a client with
// grpc.ForceCodecV2 (a default call option).
type Codec struct{}

// Name is the codec's name, the proto codec's.
func (Codec) Name() string { return "proto" }

// Marshal encodes v, a proto.Message, into a buffer of gRPC's pool when it
// is large, as gRPC's proto codec does.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("wire: cannot marshal %T, not a proto.Message", v)
	}
	e := newEncoder()
	defer e.free()
	size, fast := e.plan(m)
	if !fast {
		size = proto.Size(m)
	}
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := e.marshal(make([]byte, 0, size), m, fast)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	b, err := e.marshal((*buf)[:0], m, fast)
	if err != nil {
		pool.Put(buf)
		return nil, err
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal decodes data into v, a proto.Message.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("wire: cannot unmarshal into %T, not a proto.Message", v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return Unmarshal(buf.ReadOnlyData(), m)
}

// Marshal encodes m as proto.Marshal does, byte for byte.
func Marshal(m proto.Message) ([]byte, error) {
	e := newEncoder()
	defer e.free()
	size, fast := e.plan(m)
	if !fast {
		return proto.Marshal(m)
	}
	return e.marshal(make([]byte, 0, size), m, true)
}

// Size is proto.Size(m), worked out without reflection for the messages
// this package knows.
func Size(m proto.Message) int {
	e := newEncoder()
	defer e.free()
	if size, fast := e.plan(m); fast {
		return size
	}
	return proto.Size(m)
}

// marshal appends m to b: by hand if fast (e.plan said so, and e holds its
// plan), else with proto.
func (e *encoder) marshal(b []byte, m proto.Message, fast bool) ([]byte, error) {
	if !fast {
		return proto.MarshalOptions{}.MarshalAppend(b, m)
	}
	return e.append(b, m), nil
}

// Unmarshal decodes b into m as proto.Unmarshal does: m is reset first,
// and holds no reference to b afterwards.
func Unmarshal(b []byte, m proto.Message) error {
	if decodeKnown(b, m) {
		return nil
	}
	return proto.Unmarshal(b, m)
}
