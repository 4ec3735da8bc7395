package wire

import (
	"sync"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// encoder encodes one message by hand, in two passes: plan adds up the
// size of every nested message, in the order append writes them, and
// append writes each with its size before it. Every field here has a
// number under 16, so each tag is one byte.
type encoder struct {
	sizes []int // the size of each nested message, in the order they are written
	next  int   // the next of sizes that append uses
}

var encoders = sync.Pool{New: func() any { return new(encoder) }}

// newEncoder returns an encoder of the pool; free gives it back.
func newEncoder() *encoder { return encoders.Get().(*encoder) }

func (e *encoder) free() {
	e.sizes, e.next = e.sizes[:0], 0
	encoders.Put(e)
}

// plan works out the sizes of m and its nested messages, and returns m's
// size and whether the hand-written path encodes it: m is of a type it
// knows, and holds no unknown fields, no result metadata and no string
// that is not UTF-8.
func (e *encoder) plan(m proto.Message) (int, bool) {
	if unknown(m) {
		return 0, false
	}
	switch m := m.(type) {
	case *pb.CheckRequest:
		return e.checkRequest(m)
	case *pb.CheckStreamRequest:
		n, ok := e.items(m.Requests)
		return n + sizeBool(m.All) + sizeVarint(m.Id) + sizeVarint(uint64(m.TimeoutMs)) + sizeFixed(m.Ring), ok
	case *pb.CheckResponse:
		return e.results(m.Responses)
	case *pb.CheckStreamResponse:
		n, ok := e.results(m.Responses)
		return n + sizeVarint(m.Id) + sizeBytes(len(m.Status)) + sizeFixed(m.Ring), ok
	case *peerpb.ForwardRequest:
		n, ok := e.requests(m.Requests)
		return n + sizeBool(m.Relayed) + sizeBool(m.Pulled), ok
	case *peerpb.ForwardStreamRequest:
		n, ok := e.requests(m.Requests)
		return n + sizeVarint(m.Id) + sizeVarint(uint64(m.TimeoutMs)), ok
	case *peerpb.ForwardResponse:
		return e.responses(m.Responses)
	case *peerpb.ForwardStreamResponse:
		n, ok := e.responses(m.Responses)
		return n + sizeVarint(m.Id) + sizeBytes(len(m.Status)), ok
	}
	return 0, false
}

// unknown reports whether m holds fields its type does not know, which
// only proto encodes.
func unknown(m proto.Message) bool { return len(m.ProtoReflect().GetUnknown()) > 0 }

// reserve reserves the place in e.sizes of the next nested message's
// size, which set records.
func (e *encoder) reserve() int {
	e.sizes = append(e.sizes, 0)
	return len(e.sizes) - 1
}

// set records the size n of the nested message reserved at i, and returns
// the size of the field that holds it: written even when empty.
func (e *encoder) set(i, n int) int {
	e.sizes[i] = n
	return 1 + protowire.SizeBytes(n)
}

func (e *encoder) checkRequest(m *pb.CheckRequest) (int, bool) {
	n, ok := e.items(m.Requests)
	return n + sizeBool(m.All), ok
}

func (e *encoder) items(items []*pb.CheckItem) (int, bool) {
	return planRepeated(e, items, itemSize)
}

// planRepeated plans the elements ms of a repeated message field, each
// of the size that size works out, and returns the size of them all.
func planRepeated[T any, M interface {
	*T
	proto.Message
}](e *encoder, ms []M, size func(M) (int, bool)) (int, bool) {
	total := 0
	for _, m := range ms {
		if m == nil || unknown(m) {
			return 0, false
		}
		i := e.reserve()
		n, ok := size(m)
		if !ok {
			return 0, false
		}
		total += e.set(i, n)
	}
	return total, true
}

// itemSize is the size of it, if the hand-written path encodes it: an
// item with a parent (a borrowing check, see package borrow) is left
// to proto, which nests the ParentLimit message.
func itemSize(it *pb.CheckItem) (int, bool) {
	if it.Parent != nil || !utf8.ValidString(it.Name) || !utf8.ValidString(it.Key) || !utf8.ValidString(it.Policy) {
		return 0, false
	}
	n := sizeBytes(len(it.Name)) + sizeBytes(len(it.Key)) + sizeBytes(len(it.Policy)) +
		sizeVarint(uint64(it.Limit)) + sizeVarint(uint64(it.DurationMs)) + sizeVarint(uint64(it.Algorithm)) +
		sizeVarint(uint64(it.Burst)) + sizeVarint(uint64(it.Behavior)) + sizeBool(it.Reset_) +
		sizeVarint(uint64(it.CreatedAtMs)) + sizeBool(it.ChargeRefused) +
		sizeVarint(uint64(it.MinIntervalMs)) + sizeVarint(uint64(it.Ceiling))
	if it.Hits != nil {
		n += 1 + protowire.SizeVarint(uint64(*it.Hits)) // present, even when 0
	}
	if it.ReserveTtlMs != nil {
		n += protowire.SizeTag(16) + protowire.SizeVarint(uint64(*it.ReserveTtlMs)) // present, even when 0
	}
	return n, true
}

func (e *encoder) results(results []*pb.CheckResult) (int, bool) {
	return planRepeated(e, results, func(r *pb.CheckResult) (int, bool) {
		if len(r.Metadata) > 0 || !utf8.ValidString(r.Error) || !utf8.ValidString(r.ReservationId) {
			return 0, false
		}
		return resultSize(r), true
	})
}

func resultSize(r *pb.CheckResult) int {
	return sizeVarint(uint64(r.Status)) + sizeVarint(uint64(r.Limit)) + sizeVarint(uint64(r.Remaining)) +
		sizeVarint(uint64(r.ResetTimeMs)) + sizeVarint(uint64(r.RetryAfterMs)) + sizeVarint(uint64(r.DelayMs)) +
		sizeBytes(len(r.Error)) + sizeVarint(uint64(r.ErrorCode)) + sizeBool(r.Borrowed) +
		sizeBytes(len(r.ReservationId))
}

func (e *encoder) requests(reqs []*pb.CheckRequest) (int, bool) {
	return planRepeated(e, reqs, e.checkRequest)
}

func (e *encoder) responses(resps []*pb.CheckResponse) (int, bool) {
	return planRepeated(e, resps, func(r *pb.CheckResponse) (int, bool) { return e.results(r.Responses) })
}

// sizeVarint is the size of a varint field holding v, 0 when v is 0 (not
// written).
func sizeVarint(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v)
}

// sizeBytes is the size of a bytes or string field of n bytes, 0 when n
// is 0.
func sizeBytes(n int) int {
	if n == 0 {
		return 0
	}
	return 1 + protowire.SizeBytes(n)
}

func sizeFixed(v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + 8
}

func sizeBool(v bool) int {
	if v {
		return 2
	}
	return 0
}

// append appends m, planned already.
func (e *encoder) append(b []byte, m proto.Message) []byte {
	switch m := m.(type) {
	case *pb.CheckRequest:
		b = e.appendItems(b, 1, m.Requests)
		b = appendBool(b, 2, m.All)
	case *pb.CheckStreamRequest:
		b = e.appendItems(b, 1, m.Requests)
		b = appendBool(b, 2, m.All)
		b = appendVarint(b, 3, m.Id)
		b = appendVarint(b, 4, uint64(m.TimeoutMs))
		b = appendFixed(b, 5, m.Ring)
	case *pb.CheckResponse:
		b = e.appendResults(b, 1, m.Responses)
	case *pb.CheckStreamResponse:
		b = appendVarint(b, 1, m.Id)
		b = e.appendResults(b, 2, m.Responses)
		b = appendBytes(b, 3, m.Status)
		b = appendFixed(b, 4, m.Ring)
	case *peerpb.ForwardRequest:
		b = e.appendRequests(b, 1, m.Requests)
		b = appendBool(b, 2, m.Relayed)
		b = appendBool(b, 3, m.Pulled)
	case *peerpb.ForwardStreamRequest:
		b = e.appendRequests(b, 1, m.Requests)
		b = appendVarint(b, 2, m.Id)
		b = appendVarint(b, 3, uint64(m.TimeoutMs))
	case *peerpb.ForwardResponse:
		b = e.appendResponses(b, 1, m.Responses)
	case *peerpb.ForwardStreamResponse:
		b = appendVarint(b, 1, m.Id)
		b = e.appendResponses(b, 2, m.Responses)
		b = appendBytes(b, 3, m.Status)
	}
	return b
}

// open appends the tag and size of the next nested message, as field num.
func (e *encoder) open(b []byte, num protowire.Number) []byte {
	n := e.sizes[e.next]
	e.next++
	b = append(b, tag(num, protowire.BytesType))
	return protowire.AppendVarint(b, uint64(n))
}

func (e *encoder) appendItems(b []byte, num protowire.Number, items []*pb.CheckItem) []byte {
	for _, it := range items {
		b = e.open(b, num)
		b = appendString(b, 1, it.Name)
		b = appendString(b, 2, it.Key)
		if it.Hits != nil {
			b = append(b, tag(3, protowire.VarintType))
			b = protowire.AppendVarint(b, uint64(*it.Hits))
		}
		b = appendVarint(b, 4, uint64(it.Limit))
		b = appendVarint(b, 5, uint64(it.DurationMs))
		b = appendVarint(b, 6, uint64(it.Algorithm))
		b = appendVarint(b, 7, uint64(it.Burst))
		b = appendVarint(b, 8, uint64(it.Behavior))
		b = appendBool(b, 9, it.Reset_)
		b = appendVarint(b, 10, uint64(it.CreatedAtMs))
		b = appendBool(b, 11, it.ChargeRefused)
		b = appendString(b, 12, it.Policy)
		b = appendVarint(b, 13, uint64(it.MinIntervalMs))
		b = appendVarint(b, 14, uint64(it.Ceiling))
		// 15, a parent, is never here (see itemSize); 16 takes a
		// two-byte tag.
		if it.ReserveTtlMs != nil {
			b = protowire.AppendTag(b, 16, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(*it.ReserveTtlMs))
		}
	}
	return b
}

func (e *encoder) appendResults(b []byte, num protowire.Number, results []*pb.CheckResult) []byte {
	for _, r := range results {
		b = e.open(b, num)
		b = appendVarint(b, 1, uint64(r.Status))
		b = appendVarint(b, 2, uint64(r.Limit))
		b = appendVarint(b, 3, uint64(r.Remaining))
		b = appendVarint(b, 4, uint64(r.ResetTimeMs))
		b = appendVarint(b, 5, uint64(r.RetryAfterMs))
		b = appendVarint(b, 6, uint64(r.DelayMs))
		b = appendString(b, 7, r.Error)
		b = appendVarint(b, 8, uint64(r.ErrorCode))
		b = appendBool(b, 10, r.Borrowed)
		b = appendString(b, 11, r.ReservationId)
	}
	return b
}

func (e *encoder) appendRequests(b []byte, num protowire.Number, reqs []*pb.CheckRequest) []byte {
	for _, r := range reqs {
		b = e.open(b, num)
		b = e.appendItems(b, 1, r.Requests)
		b = appendBool(b, 2, r.All)
	}
	return b
}

func (e *encoder) appendResponses(b []byte, num protowire.Number, resps []*pb.CheckResponse) []byte {
	for _, r := range resps {
		b = e.open(b, num)
		b = e.appendResults(b, 1, r.Responses)
	}
	return b
}

// appendVarint appends a varint field, unless v is 0.
func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(append(b, tag(num, protowire.VarintType)), v)
}

func appendBool(b []byte, num protowire.Number, v bool) []byte {
	if !v {
		return b
	}
	return append(b, tag(num, protowire.VarintType), 1)
}

func appendFixed(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendFixed64(append(b, tag(num, protowire.Fixed64Type)), v)
}

// appendString appends a string field, unless s is empty.
func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendVarint(append(b, tag(num, protowire.BytesType)), uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	b = protowire.AppendVarint(append(b, tag(num, protowire.BytesType)), uint64(len(v)))
	return append(b, v...)
}

// tag is the one-byte tag of field num (under 16) of wire type typ.
func tag(num protowire.Number, typ protowire.Type) byte { return byte(num)<<3 | byte(typ) }
