package wire

import (
	"bytes"
	"fmt"
	"math"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// kinds are the messages this package knows, each made new by its func.
var kinds = []func() proto.Message{
	func() proto.Message { return &pb.CheckRequest{} },
	func() proto.Message { return &pb.CheckStreamRequest{} },
	func() proto.Message { return &pb.CheckResponse{} },
	func() proto.Message { return &pb.CheckStreamResponse{} },
	func() proto.Message { return &peerpb.ForwardRequest{} },
	func() proto.Message { return &peerpb.ForwardStreamRequest{} },
	func() proto.Message { return &peerpb.ForwardResponse{} },
	func() proto.Message { return &peerpb.ForwardStreamResponse{} },
}

func items() []*pb.CheckItem {
	return []*pb.CheckItem{
		{Name: "api", Key: "user:42", Limit: 100, DurationMs: 60_000},
		{Name: "api", Key: "user:7", Hits: proto.Int64(0), Limit: 1, DurationMs: 1, Algorithm: pb.Algorithm_SLIDING_LOG,
			Burst: 5, Behavior: pb.Behavior_GLOBAL, Reset_: true, CreatedAtMs: 1_795_315_155_007, ChargeRefused: true},
		{Name: "other", Key: "ключ", Hits: proto.Int64(-3), Limit: -1, DurationMs: math.MinInt64, Algorithm: -7,
			Behavior: 1 << 30, Policy: "domain/k=v"},
		{}, // every field zero: an empty message, still written
		{Key: "only a key", Policy: "domain/k=v"},
		{Name: "api", Key: "user:9", Limit: 10, DurationMs: 1000, MinIntervalMs: 250, Ceiling: 40},
		{Name: "llm", Key: "tenant", Hits: proto.Int64(1000), Limit: 20_000, DurationMs: 60_000, ReserveTtlMs: proto.Int64(30_000)},
		{Name: "llm", Key: "tenant", ReserveTtlMs: proto.Int64(0)}, // present, even when 0
	}
}

func results() []*pb.CheckResult {
	return []*pb.CheckResult{
		{Limit: 100, Remaining: 99, ResetTimeMs: 1_795_315_155_007},
		{Status: pb.Status_OVER_LIMIT, RetryAfterMs: -1, Error: "key: must not be empty", ErrorCode: pb.ErrorCode_INVALID_ARGUMENT},
		{Status: -2, Limit: math.MaxInt64, DelayMs: 250, ErrorCode: 99},
		{Limit: 10, Remaining: 0, Borrowed: true},
		{Limit: 20_000, Remaining: 19_000, ReservationId: "0123456789abcdef0123456789abcdef"},
		{},
	}
}

// messages are one of each kind, filled in every way this package
// encodes itself.
func messages() []proto.Message {
	return []proto.Message{
		&pb.CheckRequest{},
		&pb.CheckRequest{Requests: items(), All: true},
		&pb.CheckStreamRequest{Requests: items(), All: true, Id: 1 << 40, TimeoutMs: 2000, Ring: math.MaxUint64},
		&pb.CheckStreamRequest{Id: 1},
		&pb.CheckResponse{Responses: results()},
		&pb.CheckStreamResponse{Id: 7, Responses: results(), Ring: 12345, Status: []byte{8, 14, 18, 3, 'b', 'a', 'd'}},
		&peerpb.ForwardRequest{Requests: []*pb.CheckRequest{{Requests: items()}, {}, {Requests: items()[:1], All: true}}, Relayed: true, Pulled: true},
		&peerpb.ForwardStreamRequest{Requests: []*pb.CheckRequest{{Requests: items()}}, Id: 3, TimeoutMs: 1},
		&peerpb.ForwardResponse{Responses: []*pb.CheckResponse{{Responses: results()}, {}}},
		&peerpb.ForwardStreamResponse{Id: 9, Responses: []*pb.CheckResponse{{Responses: results()}}, Status: []byte{8, 3}},
	}
}

// TestAsProto: every message encodes byte for byte as proto.Marshal
// encodes it, through Marshal and through the gRPC codec, and decodes
// back, through Unmarshal and the codec, to a message equal to it.
func TestAsProto(t *testing.T) {
	for _, m := range messages() {
		t.Run(fmt.Sprintf("%T", m), func(t *testing.T) {
			want, err := proto.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			e := newEncoder()
			_, fast := e.plan(m)
			e.free()
			if !fast {
				t.Fatalf("%v: not encoded by hand", m)
			}
			got, err := Marshal(m)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("Marshal = %x, %v\nproto gives %x", got, err, want)
			}
			if Size(m) != len(want) {
				t.Errorf("Size = %d, want %d", Size(m), len(want))
			}
			data, err := Codec{}.Marshal(m)
			if err != nil || !bytes.Equal(data.Materialize(), want) {
				t.Fatalf("Codec.Marshal = %x, %v\nproto gives %x", data.Materialize(), err, want)
			}
			back := m.ProtoReflect().New().Interface()
			if !decodeKnown(want, back) {
				t.Fatalf("%x: not decoded by hand", want)
			}
			if !proto.Equal(back, m) {
				t.Errorf("decoded %v\nwant %v", back, m)
			}
			viaCodec := m.ProtoReflect().New().Interface()
			if err := (Codec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(want)}, viaCodec); err != nil || !proto.Equal(viaCodec, m) {
				t.Errorf("Codec.Unmarshal = %v, %v\nwant %v", viaCodec, err, m)
			}
		})
	}
}

// TestLeftToProto: what the hand-written path does not take is encoded
// and decoded by proto, with proto's results: unknown fields kept, result
// metadata, strings that are not UTF-8 refused.
func TestLeftToProto(t *testing.T) {
	unknownItem := &pb.CheckItem{Name: "api", Key: "k"}
	unknownItem.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 5))
	for _, m := range []proto.Message{
		&pb.CheckRequest{Requests: []*pb.CheckItem{unknownItem}},
		&pb.CheckResponse{Responses: []*pb.CheckResult{{Metadata: map[string]string{"decided_by": "fallback"}}}},
		&pb.CheckRequest{Requests: []*pb.CheckItem{{Name: "api", Key: "\xff"}}},
		&pb.CheckStreamResponse{Responses: []*pb.CheckResult{{Error: "bad \xc0"}}},
		&pb.MembersResponse{Members: []*pb.Member{{Name: "n"}}},
	} {
		t.Run(fmt.Sprintf("%T", m), func(t *testing.T) {
			e := newEncoder()
			_, fast := e.plan(m)
			e.free()
			if fast {
				t.Fatalf("%v: encoded by hand", m)
			}
			want, wantErr := proto.Marshal(m)
			got, err := Marshal(m)
			if (err == nil) != (wantErr == nil) || !bytes.Equal(got, want) {
				t.Fatalf("Marshal = %x, %v; proto gives %x, %v", got, err, want, wantErr)
			}
			if Size(m) != proto.Size(m) {
				t.Errorf("Size = %d, want %d", Size(m), proto.Size(m))
			}
			if err != nil {
				return
			}
			back := m.ProtoReflect().New().Interface()
			if decodeKnown(want, back) {
				t.Fatalf("%x: decoded by hand", want)
			}
			if err := Unmarshal(want, back); err != nil || !proto.Equal(back, m) {
				t.Errorf("Unmarshal = %v, %v\nwant %v", back, err, m)
			}
		})
	}
	invalid := protowire.AppendString(protowire.AppendTag(nil, 2, protowire.BytesType), "\xff")
	item := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), invalid)
	if err := Unmarshal(item, &pb.CheckRequest{}); err == nil {
		t.Error("a key that is not UTF-8 decoded without an error")
	}
}

// TestDecodeSharesRepeatedNames: consecutive items with one name share
// one string, and the items of a request share one allocation.
func TestDecodeSharesRepeatedNames(t *testing.T) {
	req := &pb.CheckRequest{}
	for i := range 10 {
		req.Requests = append(req.Requests, &pb.CheckItem{Name: "api", Key: fmt.Sprint("user:", i), Hits: proto.Int64(1), Limit: 10, DurationMs: 1000})
	}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var got pb.CheckRequest
	// The request's slices (items, pointers, hits), and one string a key.
	allocs := testing.AllocsPerRun(100, func() {
		if err := Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 3+10+1 {
		t.Errorf("decoding 10 items of one name takes %v allocations, want at most 14", allocs)
	}
	if !proto.Equal(&got, req) {
		t.Errorf("decoded %v, want %v", &got, req)
	}
}

// FuzzUnmarshal decodes arbitrary bytes as each message this package
// knows, with Unmarshal and with proto.Unmarshal: both fail, or both give
// equal messages, which Marshal then encodes as proto.Marshal does.
func FuzzUnmarshal(f *testing.F) {
	for _, m := range messages() {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x02, 0x1a, 0x00}) // an item of a request, whose field 3 is of the wrong type
	f.Add([]byte{0x0a, 0x04, 0x12, 0x02, 0xc3, 0x28})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, kind := range kinds {
			got, want := kind(), kind()
			err, wantErr := Unmarshal(b, got), proto.Unmarshal(b, want)
			if (err == nil) != (wantErr == nil) {
				t.Fatalf("%T from %x: Unmarshal says %v, proto %v", got, b, err, wantErr)
			}
			if err != nil {
				continue
			}
			if !proto.Equal(got, want) {
				t.Fatalf("%T from %x: Unmarshal gives %v, proto %v", got, b, got, want)
			}
			enc, err := Marshal(got)
			wantEnc, wantErr := proto.MarshalOptions{Deterministic: true}.Marshal(want)
			if (err == nil) != (wantErr == nil) {
				t.Fatalf("%v: Marshal says %v, proto %v", got, err, wantErr)
			}
			back := kind()
			if err := proto.Unmarshal(enc, back); err != nil || !proto.Equal(back, want) {
				t.Fatalf("%v: Marshal gives %x, which decodes to %v, %v", want, enc, back, err)
			}
			if e := newEncoder(); func() bool { defer e.free(); _, fast := e.plan(got); return fast }() && !bytes.Equal(enc, wantEnc) {
				t.Fatalf("%v: Marshal gives %x, proto %x", want, enc, wantEnc)
			}
		}
	})
}

// FuzzMarshal encodes a request and a response of arbitrary fields
// (strings that may not be UTF-8 included) with Marshal and with
// proto.Marshal: both fail, or both give the same bytes.
func FuzzMarshal(f *testing.F) {
	f.Add("api", "user:42", "", int64(1), true, int64(100), int64(60_000), int32(0), int64(0), int32(0), false, "")
	f.Add("a\xffb", "k", "p", int64(-1), false, int64(-5), int64(1), int32(-1), int64(7), int32(3), true, "error \xc0")
	f.Fuzz(func(t *testing.T, name, key, policy string, hits int64, hasHits bool, limit, duration int64, algorithm int32,
		burst int64, behavior int32, flag bool, text string) {
		item := &pb.CheckItem{Name: name, Key: key, Policy: policy, Limit: limit, DurationMs: duration, Algorithm: pb.Algorithm(algorithm),
			Burst: burst, Behavior: pb.Behavior(behavior), Reset_: flag, CreatedAtMs: hits, ChargeRefused: !flag}
		if hasHits {
			item.Hits = proto.Int64(hits)
		}
		result := &pb.CheckResult{Status: pb.Status(algorithm), Limit: limit, Remaining: burst, ResetTimeMs: duration,
			RetryAfterMs: hits, DelayMs: -limit, Error: text, ErrorCode: pb.ErrorCode(behavior)}
		for _, m := range []proto.Message{
			&peerpb.ForwardStreamRequest{Requests: []*pb.CheckRequest{{Requests: []*pb.CheckItem{item, item}, All: flag}}, Id: uint64(hits), TimeoutMs: burst},
			&peerpb.ForwardStreamResponse{Id: uint64(limit), Responses: []*pb.CheckResponse{{Responses: []*pb.CheckResult{result}}}, Status: []byte(text)},
			&pb.CheckStreamResponse{Id: uint64(duration), Responses: []*pb.CheckResult{result, result}, Ring: uint64(burst)},
		} {
			got, err := Marshal(m)
			want, wantErr := proto.Marshal(m)
			if (err == nil) != (wantErr == nil) || !bytes.Equal(got, want) {
				t.Fatalf("%v: Marshal = %x, %v; proto gives %x, %v", m, got, err, want, wantErr)
			}
		}
	})
}

func benchMessages() []proto.Message {
	items := make([]*pb.CheckItem, 10)
	results := make([]*pb.CheckResult, 10)
	for i := range items {
		items[i] = &pb.CheckItem{Name: "bench", Key: fmt.Sprint("bench:", i*997), Hits: proto.Int64(1), Limit: 1_000_000, DurationMs: 1000}
		results[i] = &pb.CheckResult{Limit: 1_000_000, Remaining: 999_000, ResetTimeMs: 1_795_315_155_007}
	}
	return []proto.Message{
		&pb.CheckRequest{Requests: items},
		&pb.CheckResponse{Responses: results},
		&peerpb.ForwardStreamRequest{Requests: []*pb.CheckRequest{{Requests: items[:3]}, {Requests: items[3:7]}, {Requests: items[7:]}}, Id: 1},
		&peerpb.ForwardStreamResponse{Responses: []*pb.CheckResponse{{Responses: results[:3]}, {Responses: results[3:7]}, {Responses: results[7:]}}, Id: 1},
	}
}

// BenchmarkCodec compares this package with proto on the messages of a
// check of ten items, as the node receives it, forwards it and answers.
func BenchmarkCodec(b *testing.B) {
	for _, m := range benchMessages() {
		enc, err := proto.Marshal(m)
		if err != nil {
			b.Fatal(err)
		}
		name := fmt.Sprintf("%T", m)[len("*ringlimitv1."):]
		b.Run("unmarshal/"+name+"/proto", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := proto.Unmarshal(enc, m.ProtoReflect().New().Interface()); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("unmarshal/"+name+"/wire", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := Unmarshal(enc, m.ProtoReflect().New().Interface()); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("marshal/"+name+"/proto", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := proto.Marshal(m); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("marshal/"+name+"/wire", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Marshal(m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestEveryFieldSurvives: an item and a result with any one field set, of
// every field their messages declare, encode as proto encodes them and
// decode back whole, whether by hand or left to proto. A field added to
// the .proto that this package neither encodes nor leaves to proto fails
// here, rather than vanishing on the wire.
func TestEveryFieldSurvives(t *testing.T) {
	for _, m := range []proto.Message{&pb.CheckItem{}, &pb.CheckResult{}} {
		fields := m.ProtoReflect().Descriptor().Fields()
		for i := range fields.Len() {
			fd := fields.Get(i)
			one := m.ProtoReflect().New()
			setSome(one, fd)
			var msg proto.Message
			switch v := one.Interface().(type) {
			case *pb.CheckItem:
				msg = &pb.CheckRequest{Requests: []*pb.CheckItem{v}}
			case *pb.CheckResult:
				msg = &pb.CheckResponse{Responses: []*pb.CheckResult{v}}
			}
			t.Run(string(fd.FullName()), func(t *testing.T) {
				want, err := proto.Marshal(msg)
				if err != nil {
					t.Fatal(err)
				}
				got, err := Marshal(msg)
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("Marshal = %x, %v; proto gives %x", got, err, want)
				}
				back := msg.ProtoReflect().New().Interface()
				if err := Unmarshal(want, back); err != nil || !proto.Equal(back, msg) {
					t.Errorf("Unmarshal = %v, %v; want %v", back, err, msg)
				}
			})
		}
	}
}

// setSome sets field fd of m to a value other than its default.
func setSome(m protoreflect.Message, fd protoreflect.FieldDescriptor) {
	switch {
	case fd.IsMap():
		m.Mutable(fd).Map().Set(protoreflect.ValueOfString("k").MapKey(), protoreflect.ValueOfString("v"))
		return
	case fd.Kind() == protoreflect.MessageKind:
		sub := m.Mutable(fd).Message()
		setSome(sub, sub.Descriptor().Fields().Get(0))
		return
	}
	var v protoreflect.Value
	switch fd.Kind() {
	case protoreflect.BoolKind:
		v = protoreflect.ValueOfBool(true)
	case protoreflect.StringKind:
		v = protoreflect.ValueOfString("x")
	case protoreflect.EnumKind:
		v = protoreflect.ValueOfEnum(1)
	case protoreflect.Int64Kind:
		v = protoreflect.ValueOfInt64(7)
	case protoreflect.Int32Kind:
		v = protoreflect.ValueOfInt32(7)
	default:
		panic(fmt.Sprintf("setSome: kind %v of %s", fd.Kind(), fd.FullName()))
	}
	m.Set(fd, v)
}
