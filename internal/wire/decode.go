package wire

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// decodeKnown decodes b into m by hand, if m is of a type this package
// knows and b is input it takes (see the package doc), and reports whether
// it did. When it did not, m may hold part of b: proto.Unmarshal resets it.
func decodeKnown(b []byte, m proto.Message) bool {
	var d decoder
	switch m := m.(type) {
	case *pb.CheckRequest:
		m.Reset()
		return d.checkRequest(b, &m.Requests, &m.All, nil)
	case *pb.CheckStreamRequest:
		m.Reset()
		return d.checkRequest(b, &m.Requests, &m.All, func(f field) bool {
			switch {
			case f.num == 3 && f.typ == protowire.VarintType:
				m.Id = f.u
			case f.num == 4 && f.typ == protowire.VarintType:
				m.TimeoutMs = int64(f.u)
			case f.num == 5 && f.typ == protowire.Fixed64Type:
				m.Ring = f.u
			default:
				return false
			}
			return true
		})
	case *pb.CheckResponse:
		m.Reset()
		return d.checkResponse(b, 1, &m.Responses, nil)
	case *pb.CheckStreamResponse:
		m.Reset()
		return d.checkResponse(b, 2, &m.Responses, func(f field) bool {
			switch {
			case f.num == 1 && f.typ == protowire.VarintType:
				m.Id = f.u
			case f.num == 3 && f.typ == protowire.BytesType:
				m.Status = append([]byte{}, f.b...)
			case f.num == 4 && f.typ == protowire.Fixed64Type:
				m.Ring = f.u
			default:
				return false
			}
			return true
		})
	case *peerpb.ForwardRequest:
		m.Reset()
		return d.forwardRequest(b, &m.Requests, func(f field) bool {
			switch {
			case f.num == 2 && f.typ == protowire.VarintType:
				m.Relayed = f.u != 0
			case f.num == 3 && f.typ == protowire.VarintType:
				m.Pulled = f.u != 0
			default:
				return false
			}
			return true
		})
	case *peerpb.ForwardStreamRequest:
		m.Reset()
		return d.forwardRequest(b, &m.Requests, func(f field) bool {
			switch {
			case f.num == 2 && f.typ == protowire.VarintType:
				m.Id = f.u
			case f.num == 3 && f.typ == protowire.VarintType:
				m.TimeoutMs = int64(f.u)
			default:
				return false
			}
			return true
		})
	case *peerpb.ForwardResponse:
		m.Reset()
		return d.forwardResponse(b, 1, &m.Responses, nil)
	case *peerpb.ForwardStreamResponse:
		m.Reset()
		return d.forwardResponse(b, 2, &m.Responses, func(f field) bool {
			switch {
			case f.num == 1 && f.typ == protowire.VarintType:
				m.Id = f.u
			case f.num == 3 && f.typ == protowire.BytesType:
				m.Status = append([]byte{}, f.b...)
			default:
				return false
			}
			return true
		})
	}
	return false
}

// field is one field of an encoded message.
type field struct {
	num protowire.Number
	typ protowire.Type
	u   uint64 // the value of a varint or fixed64 field
	b   []byte // the value of a bytes field
}

// next reads the field at the start of *b into f and moves *b past it. It
// reports false for a malformed field, or one of a wire type that none of
// the messages here uses (fixed32, groups).
func next(b *[]byte, f *field) bool {
	var (
		num protowire.Number
		typ protowire.Type
		n   int
	)
	if t := *b; len(t) > 0 && t[0] < 0x80 && t[0] >= 8 { // a one-byte tag, the usual
		num, typ, n = protowire.Number(t[0]>>3), protowire.Type(t[0]&7), 1
	} else if num, typ, n = protowire.ConsumeTag(t); n < 0 {
		return false
	}
	rest := (*b)[n:]
	switch typ {
	case protowire.VarintType:
		if len(rest) > 0 && rest[0] < 0x80 { // a one-byte varint, the usual
			f.u, n = uint64(rest[0]), 1
			break
		}
		f.u, n = protowire.ConsumeVarint(rest)
	case protowire.Fixed64Type:
		f.u, n = protowire.ConsumeFixed64(rest)
	case protowire.BytesType:
		f.b, n = protowire.ConsumeBytes(rest)
	default:
		return false
	}
	if n < 0 {
		return false
	}
	f.num, f.typ = num, typ
	*b = rest[n:]
	return true
}

// count returns how many fields numbered num, of the bytes wire type, b
// holds, so that their messages can be allocated at once.
func count(b []byte, num protowire.Number) (int, bool) {
	var f field
	n := 0
	for len(b) > 0 {
		if !next(&b, &f) {
			return 0, false
		}
		if f.num == num && f.typ == protowire.BytesType {
			n++
		}
	}
	return n, true
}

// decoder decodes one message, and keeps what its parts may share: the
// last name and policy read, which the next items usually repeat.
type decoder struct {
	name, policy string
}

// other decodes a field that a message's own function does not know; nil
// knows none.
type other func(f field) bool

// checkRequest decodes a CheckRequest, or a message with its fields 1 and
// 2 and others that more takes.
func (d *decoder) checkRequest(b []byte, items *[]*pb.CheckItem, all *bool, more other) bool {
	n, ok := count(b, 1)
	if !ok {
		return false
	}
	var (
		slab []pb.CheckItem
		hits []int64 // for the items that have hits, allocated with the first
		f    field
	)
	if n > 0 {
		slab = make([]pb.CheckItem, n)
		*items = make([]*pb.CheckItem, 0, n)
	}
	for len(b) > 0 {
		if !next(&b, &f) {
			return false
		}
		switch {
		case f.num == 1 && f.typ == protowire.BytesType:
			it := &slab[len(*items)]
			if !d.item(f.b, it, &hits, n) {
				return false
			}
			*items = append(*items, it)
		case f.num == 2 && f.typ == protowire.VarintType:
			*all = f.u != 0
		case more == nil || !more(f):
			return false
		}
	}
	return true
}

// item decodes a CheckItem into it; hits is where optional hits go,
// allocated for n items with the first.
func (d *decoder) item(b []byte, it *pb.CheckItem, hits *[]int64, n int) bool {
	var f field
	for len(b) > 0 {
		if !next(&b, &f) {
			return false
		}
		if f.typ == protowire.BytesType {
			var ok bool
			switch f.num {
			case 1:
				it.Name, ok = shared(f.b, &d.name)
			case 2:
				it.Key, ok = str(f.b)
			case 12:
				it.Policy, ok = shared(f.b, &d.policy)
			}
			if !ok {
				return false
			}
			continue
		}
		if f.typ != protowire.VarintType {
			return false
		}
		switch v := f.u; f.num {
		case 3:
			if it.Hits != nil { // repeated: the last wins
				*it.Hits = int64(v)
				continue
			}
			if *hits == nil {
				*hits = make([]int64, 0, n) // one an item at most
			}
			*hits = append(*hits, int64(v))
			it.Hits = &(*hits)[len(*hits)-1]
		case 4:
			it.Limit = int64(v)
		case 5:
			it.DurationMs = int64(v)
		case 6:
			it.Algorithm = pb.Algorithm(int32(v))
		case 7:
			it.Burst = int64(v)
		case 8:
			it.Behavior = pb.Behavior(int32(v))
		case 9:
			it.Reset_ = v != 0
		case 10:
			it.CreatedAtMs = int64(v)
		case 11:
			it.ChargeRefused = v != 0
		case 13:
			it.MinIntervalMs = int64(v)
		case 14:
			it.Ceiling = int64(v)
		case 16:
			if it.ReserveTtlMs == nil { // repeated: the last wins
				it.ReserveTtlMs = new(int64)
			}
			*it.ReserveTtlMs = int64(v)
		default: // 15, a parent, among others: left to proto
			return false
		}
	}
	return true
}

// str returns b as a string if it is UTF-8, as protobuf requires of
// proto3 strings.
func str(b []byte) (string, bool) {
	if !utf8.Valid(b) {
		return "", false
	}
	return string(b), true
}

// shared is str, returning *last instead of a new string when b equals it,
// and keeping the string in *last.
func shared(b []byte, last *string) (string, bool) {
	if string(b) == *last { // no allocation: the compiler compares in place
		return *last, true
	}
	s, ok := str(b)
	if ok {
		*last = s
	}
	return s, ok
}

// checkResponse decodes a CheckResponse, or a message with its results in
// field num and other fields that more takes.
func (d *decoder) checkResponse(b []byte, num protowire.Number, results *[]*pb.CheckResult, more other) bool {
	return repeated(b, num, results, d.result, more)
}

// repeated decodes a message whose field num is a repeated message field:
// its elements go to *out, decoded by elem, allocated in one slab; the
// other fields go to more.
func repeated[T any](b []byte, num protowire.Number, out *[]*T, elem func([]byte, *T) bool, more other) bool {
	n, ok := count(b, num)
	if !ok {
		return false
	}
	var (
		slab []T
		f    field
	)
	if n > 0 {
		slab = make([]T, n)
		*out = make([]*T, 0, n)
	}
	for len(b) > 0 {
		if !next(&b, &f) {
			return false
		}
		switch {
		case f.num == num && f.typ == protowire.BytesType:
			el := &slab[len(*out)]
			if !elem(f.b, el) {
				return false
			}
			*out = append(*out, el)
		case more == nil || !more(f):
			return false
		}
	}
	return true
}

// result decodes a CheckResult without metadata: a result with metadata
// (rare: a check not decided by its owner) is left to proto.
func (d *decoder) result(b []byte, r *pb.CheckResult) bool {
	var f field
	for len(b) > 0 {
		if !next(&b, &f) {
			return false
		}
		if (f.num == 7 || f.num == 11) && f.typ == protowire.BytesType {
			s, ok := str(f.b)
			if !ok {
				return false
			}
			if f.num == 7 {
				r.Error = s
			} else {
				r.ReservationId = s
			}
			continue
		}
		if f.typ != protowire.VarintType {
			return false
		}
		switch v := f.u; f.num {
		case 1:
			r.Status = pb.Status(int32(v))
		case 2:
			r.Limit = int64(v)
		case 3:
			r.Remaining = int64(v)
		case 4:
			r.ResetTimeMs = int64(v)
		case 5:
			r.RetryAfterMs = int64(v)
		case 6:
			r.DelayMs = int64(v)
		case 8:
			r.ErrorCode = pb.ErrorCode(int32(v))
		case 10:
			r.Borrowed = v != 0
		default:
			return false
		}
	}
	return true
}

// forwardRequest decodes a ForwardRequest, or a message with its field 1
// and others that more takes.
func (d *decoder) forwardRequest(b []byte, reqs *[]*pb.CheckRequest, more other) bool {
	return repeated(b, 1, reqs, func(b []byte, r *pb.CheckRequest) bool {
		return d.checkRequest(b, &r.Requests, &r.All, nil)
	}, more)
}

// forwardResponse decodes a ForwardResponse, or a message with its
// responses in field num and other fields that more takes.
func (d *decoder) forwardResponse(b []byte, num protowire.Number, resps *[]*pb.CheckResponse, more other) bool {
	return repeated(b, num, resps, func(b []byte, r *pb.CheckResponse) bool {
		return d.checkResponse(b, 1, &r.Responses, nil)
	}, more)
}
