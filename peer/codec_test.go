package peer

import (
	"testing"

	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
)

// peerRequests are an empty message of each request the peer server decodes.
func peerRequests() []proto.Message {
	return []proto.Message{&peerpb.ForwardRequest{}, &peerpb.ForwardStreamRequest{}, &peerpb.HandOffRequest{},
		&peerpb.ReplicateRequest{}, &peerpb.GlobalHitsRequest{}, &peerpb.GlobalUpdateRequest{}, &peerpb.LeaseRelayRequest{}}
}

// built counts the messages m holds, nested ones included, m not.
func built(m protoreflect.Message) int {
	n := 0
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				n += 1 + built(v.List().Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			n += 1 + built(v.Message())
		}
		return true
	})
	return n
}

// TestCodecRefusesBombs: a forward of many empty items, and a GLOBAL
// report of many empty reports, are refused before they are built, and
// a refusal holds nothing in the budget.
func TestCodecRefusesBombs(t *testing.T) {
	items := make([]byte, 0, 2*MaxForwardMessages)
	for range MaxForwardMessages {
		items = protowire.AppendTag(items, 1, protowire.BytesType)
		items = protowire.AppendVarint(items, 0)
	}
	forward := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), items)
	reports := make([]byte, 0, 1<<20)
	for len(reports) < 1<<20 {
		reports = protowire.AppendTag(reports, 2, protowire.BytesType)
		reports = protowire.AppendVarint(reports, 0)
	}
	budget := semaphore.NewWeighted(MaxInflightBytes)
	c := codec{budget: budget}
	for _, tc := range []struct {
		m proto.Message
		b []byte
	}{{&peerpb.ForwardRequest{}, forward}, {&peerpb.ForwardStreamRequest{}, forward}, {&peerpb.GlobalHitsRequest{}, reports}} {
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.b)}, tc.m); err == nil {
			t.Errorf("%T of %d bytes of empty messages: decoded, want refused", tc.m, len(tc.b))
		}
	}
	if !budget.TryAcquire(MaxInflightBytes) {
		t.Error("refused requests hold part of the budget")
	}
}

// TestCodecBudget: decoded requests hold their cost until released, a
// request that finds no room waits, then is refused, and release gives
// the room back.
func TestCodecBudget(t *testing.T) {
	req := &peerpb.HandOffRequest{From: "b", Counters: []*peerpb.CounterState{{Counter: make([]byte, 1000)}}}
	data, err := codec{}.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	budget := semaphore.NewWeighted(2000)
	c := codec{budget: budget}
	first, second := &peerpb.HandOffRequest{}, &peerpb.HandOffRequest{}
	if err := c.Unmarshal(data, first); err != nil {
		t.Fatal(err)
	}
	if err := c.Unmarshal(data, second); err == nil {
		t.Fatal("a second request decoded with the budget held by the first")
	}
	release(first)
	release(first) // again: nothing more
	if err := c.Unmarshal(data, second); err != nil {
		t.Fatalf("after release: %v", err)
	}
	release(second)
	if !budget.TryAcquire(2000) {
		t.Error("the budget is not whole after both were released")
	}
}

// FuzzPeerCodec decodes arbitrary bytes as each peer request through the
// peer port's codec: never a panic, never more messages built than the
// request's kind may, never more elements of a bounded field than one
// beyond its bound, and the budget whole again once the request is
// released.
func FuzzPeerCodec(f *testing.F) {
	item := &pb.CheckItem{Name: "api", Key: "k", Limit: 1, Parent: &pb.ParentLimit{Key: "p"}}
	for _, m := range []proto.Message{
		&peerpb.ForwardRequest{Requests: []*pb.CheckRequest{{Requests: []*pb.CheckItem{item, item}}}},
		&peerpb.HandOffRequest{From: "b", Counters: []*peerpb.CounterState{{Counter: []byte{1}}, {}}},
		&peerpb.GlobalUpdateRequest{From: "b", States: []*peerpb.GlobalState{{Name: "n", Grants: []*peerpb.GlobalGrant{{Node: "a"}}}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		for i := range peerRequests() {
			f.Add(uint8(i), b)
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, b []byte) {
		all := peerRequests()
		m := all[int(kind)%len(all)]
		budget := semaphore.NewWeighted(MaxInflightBytes)
		if err := (codec{budget: budget}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, m); err != nil {
			if !budget.TryAcquire(MaxInflightBytes) {
				t.Fatal("a refused request holds part of the budget")
			}
			return
		}
		if n, limit := built(m.ProtoReflect()), maxMessages(m, b); n > limit {
			t.Errorf("%T: built %d messages, more than %d", m, n, limit)
		}
		if bound, ok := bounded[string(m.ProtoReflect().Descriptor().FullName())]; ok {
			fd := m.ProtoReflect().Descriptor().Fields().ByNumber(bound.field)
			if n := m.ProtoReflect().Get(fd).List().Len(); n > bound.max+1 {
				t.Errorf("%T: built %d of field %d, more than %d", m, n, bound.field, bound.max+1)
			}
		}
		release(m)
		if !budget.TryAcquire(MaxInflightBytes) {
			t.Error("a released request holds part of the budget")
		}
	})
}
