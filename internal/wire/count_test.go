package wire

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/peerpb"
)

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

// FuzzCountMessages: whatever the bytes, CountMessages never counts fewer
// messages than decoding them builds, and refuses at any max below its
// count.
func FuzzCountMessages(f *testing.F) {
	item := &pb.CheckItem{Name: "api", Key: "k", Limit: 1, Parent: &pb.ParentLimit{Key: "p"}}
	for _, m := range []proto.Message{
		&peerpb.ForwardRequest{Requests: []*pb.CheckRequest{{Requests: []*pb.CheckItem{item, {}}}, {}}},
		&peerpb.GlobalUpdateRequest{States: []*peerpb.GlobalState{{Grants: []*peerpb.GlobalGrant{{}, {}}, Lessees: []*peerpb.LesseeGrant{{}}}}},
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, m := range []proto.Message{&peerpb.ForwardRequest{}, &peerpb.GlobalUpdateRequest{}, &peerpb.GlobalHitsRequest{}} {
			d := m.ProtoReflect().Descriptor()
			n, ok := CountMessages(b, d, 1<<20)
			if !ok || proto.Unmarshal(b, m) != nil {
				continue
			}
			if got := built(m.ProtoReflect()); got > n {
				t.Errorf("%s: counted %d messages, decoding built %d", d.FullName(), n, got)
			}
			if n > 0 {
				if _, ok := CountMessages(b, d, n-1); ok {
					t.Errorf("%s: %d messages passed a max of %d", d.FullName(), n, n-1)
				}
			}
		}
	})
}

// BenchmarkCountMessages counts a forward of 1,000 items, as the owner's
// peer codec does before it decodes one: a tenth of the decoding's cost.
func BenchmarkCountMessages(b *testing.B) {
	req := &pb.CheckRequest{}
	for range 1000 {
		req.Requests = append(req.Requests, &pb.CheckItem{Name: "api_requests", Key: "user:12345", Limit: 100, DurationMs: 60000})
	}
	m := &peerpb.ForwardRequest{Requests: []*pb.CheckRequest{req}}
	buf, err := proto.Marshal(m)
	if err != nil {
		b.Fatal(err)
	}
	d := m.ProtoReflect().Descriptor()
	b.ReportAllocs()
	for b.Loop() {
		CountMessages(buf, d, MaxDepth<<20)
	}
}
