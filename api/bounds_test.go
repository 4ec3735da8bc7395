package api

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/structpb"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/checkjson"
	"github.com/ringlimit/ringlimit/internal/wire"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/service"
)

// allocated returns the bytes f allocates, in this process, all goroutines
// included.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// maximalItem is a check item with every field at its longest.
func maximalItem() *pb.CheckItem {
	hits := int64(checks.MaxLimit)
	return &pb.CheckItem{
		Name: strings.Repeat("n", limiter.MaxNameLen), Key: strings.Repeat("k", limiter.MaxKeyLen),
		Policy: strings.Repeat("p", limiter.MaxNameLen), Hits: &hits,
		Limit: -1, DurationMs: -1, Burst: -1, CreatedAtMs: -1, MinIntervalMs: -1, Ceiling: -1, // -1 takes the most bytes as a varint
		Algorithm: pb.Algorithm_SLIDING_WINDOW, Behavior: pb.Behavior_UNBATCHED, Reset_: true, ChargeRefused: true,
		Parent: &pb.ParentLimit{Key: strings.Repeat("p", checks.MaxParentKeyLen), Limit: -1, DurationMs: -1},
	}
}

// TestBoundsFitMaximalItems checks the premise of MaxBodyBytes and
// MaxRecvMsgBytes: a thousand items at their longest fit in both.
func TestBoundsFitMaximalItems(t *testing.T) {
	item := maximalItem()
	req := &pb.CheckRequest{All: true}
	for range checks.MaxItems {
		req.Requests = append(req.Requests, item)
	}
	if n := proto.Size(item); n > 1950 {
		t.Errorf("a maximal item takes %d bytes of protobuf, want at most the 1,950 MaxRecvMsgBytes assumes", n)
	}
	if n := proto.Size(req); n > MaxRecvMsgBytes {
		t.Errorf("%d maximal items take %d bytes of protobuf, more than MaxRecvMsgBytes %d", checks.MaxItems, n, MaxRecvMsgBytes)
	}

	one := fmt.Sprintf(`{"name":%q,"key":%q,"hits":-9223372036854775808,"limit":-9223372036854775808,`+
		`"duration_ms":-9223372036854775808,"algorithm":"SLIDING_WINDOW","burst":-9223372036854775808,`+
		`"behavior":"UNBATCHED","reset":false,"created_at_ms":-9223372036854775808,"charge_refused":false,"policy":%q,`+
		`"min_interval_ms":-9223372036854775808,"ceiling":-9223372036854775808,`+
		`"parent":{"key":%q,"limit":-9223372036854775808,"duration_ms":-9223372036854775808}}`,
		item.Name, item.Key, item.Policy, item.Parent.Key)
	if len(one) > 2250 {
		t.Errorf("a maximal item takes %d bytes of JSON, want at most the 2,250 MaxBodyBytes assumes", len(one))
	}
	body := `{"requests":[` + strings.Repeat(one+",", checks.MaxItems-1) + one + `],"all":true}`
	if len(body) > MaxBodyBytes {
		t.Errorf("%d maximal items take %d bytes of JSON, more than MaxBodyBytes %d", checks.MaxItems, len(body), MaxBodyBytes)
	}
	d, err := checkjson.Decode(strings.NewReader(body))
	if err != nil || len(d.Request.Requests) != checks.MaxItems {
		t.Errorf("decoding %d maximal items: %d items, %v", checks.MaxItems, len(d.Request.GetRequests()), err)
	}
}

// TestHTTPManyEmptyItemsCostLittle is the attack of a body of many empty
// items: it is refused, having allocated about what a thousand items take,
// not memory in proportion to the body.
func TestHTTPManyEmptyItemsCostLittle(t *testing.T) {
	h := New(Config{Checker: service.New(service.Config{})}).Handler()
	const items = 600_000 // 1.8 MB, under MaxBodyBytes
	body := []byte(`{"requests":[` + strings.Repeat(`{},`, items-1) + `{}]}`)
	rec := httptest.NewRecorder()
	n := allocated(func() {
		req := httptest.NewRequest(http.MethodPost, "/v1/check", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, req)
	})
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "requests: more than 1000 items") {
		t.Errorf("%d empty items: %d %s, want 400 naming requests", items, rec.Code, rec.Body)
	}
	// Decoding every item would allocate tens of MB (encoding/json into
	// []json.RawMessage: 60 MB); a thousand items take a few hundred KB.
	if n > 2<<20 {
		t.Errorf("refusing %d empty items allocated %d bytes, want at most 2 MiB", items, n)
	}
	t.Logf("refusing %d empty items (%d bytes) allocated %d bytes", items, len(body), n)
}

// rawCodec sends and receives *[]byte as they are, so a test can send a
// message no client library would build.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
func (rawCodec) Name() string { return "proto" }

// emptyItems encodes a CheckRequest of n empty items: two bytes each.
func emptyItems(n int) []byte {
	b := make([]byte, 0, 2*n)
	for range n {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, 0)
	}
	return b
}

// TestGRPCManyEmptyItemsCostLittle is the attack of a gRPC message of many
// empty items: under the receive limit it is refused as too many items,
// having built only the first thousand and one; over it, it is refused
// before it is decoded.
func TestGRPCManyEmptyItemsCostLittle(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(ServerOptions()...)
	New(Config{Checker: service.New(service.Config{})}).RegisterGRPC(srv)
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8<<20)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	check := func(msg []byte) error {
		var out []byte
		return conn.Invoke(context.Background(), "/ringlimit.v1.RateLimiter/Check", &msg, &out, grpc.ForceCodecV2(rawCodec{}))
	}
	if err := check(emptyItems(1)); err != nil { // warm the connection up
		t.Fatal(err)
	}

	const items = 1_000_000 // 2 MB, under MaxRecvMsgBytes
	msg := emptyItems(items)
	var callErr error
	n := allocated(func() { callErr = check(msg) })
	if status.Code(callErr) != codes.InvalidArgument || !strings.Contains(callErr.Error(), "requests: more than 1000 items") {
		t.Errorf("%d empty items: %v, want InvalidArgument naming requests", items, callErr)
	}
	// protobuf builds a CheckItem of about 100 bytes per 2 bytes of
	// message: 100 MB here, 200 MB for a 4 MiB message.
	if n > 16<<20 {
		t.Errorf("refusing %d empty items allocated %d bytes, want at most 16 MiB", items, n)
	}
	t.Logf("refusing %d empty items (%d bytes) allocated %d bytes", items, len(msg), n)

	if err := check(emptyItems(2 * items)); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a message of %d bytes: %v, want ResourceExhausted", 4*items, err)
	}
	big := metadata.AppendToOutgoingContext(context.Background(), "x-big", strings.Repeat("x", MaxHeaderListBytes))
	var out []byte
	msg = emptyItems(1)
	if err := conn.Invoke(big, "/ringlimit.v1.RateLimiter/Check", &msg, &out, grpc.ForceCodecV2(rawCodec{})); err == nil {
		t.Errorf("metadata of %d bytes: no error", MaxHeaderListBytes)
	}
}

// TestBoundedCodec checks the codec on a bound of any message, and that
// it leaves other messages and malformed input to protobuf.
func TestBoundedCodec(t *testing.T) {
	b := BoundOf(&pb.CheckResponse{}, "responses", 3)
	c := boundedCodec{CodecV2: encoding.GetCodecV2(protocodec.Name), bounds: map[protoreflect.FullName]Bound{b.Message: b}}
	resp := &pb.CheckResponse{}
	req := &pb.CheckRequest{All: true}
	for range 10 {
		resp.Responses = append(resp.Responses, &pb.CheckResult{Limit: 1})
		req.Requests = append(req.Requests, &pb.CheckItem{Key: "k"})
	}
	unmarshal := func(m, into proto.Message) error {
		data, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(data)}, into)
	}
	var gotResp pb.CheckResponse
	if err := unmarshal(resp, &gotResp); err != nil || len(gotResp.Responses) != 4 {
		t.Errorf("bounded at 3: %d elements, %v; want 4", len(gotResp.Responses), err)
	}
	var gotReq pb.CheckRequest
	if err := unmarshal(req, &gotReq); err != nil || !proto.Equal(&gotReq, req) {
		t.Errorf("unbounded message: %v, %v; want it whole", &gotReq, err)
	}
	// One result with a million empty metadata entries: 2 MB that
	// protobuf would build into about 100 MB of map.
	var inner []byte
	for range 1_000_000 {
		inner = protowire.AppendTag(inner, 9, protowire.BytesType)
		inner = protowire.AppendVarint(inner, 0)
	}
	nested := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), inner)
	var nestedErr error
	n := allocated(func() {
		nestedErr = c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(nested)}, &pb.CheckResponse{})
	})
	if nestedErr == nil || !strings.Contains(nestedErr.Error(), "more than 65536 messages") {
		t.Errorf("a million nested messages: %v, want an error counting them", nestedErr)
	}
	if n > 4<<20 {
		t.Errorf("refusing a million nested messages allocated %d bytes, want at most 4 MiB", n)
	}
	// google.protobuf.Value nests: a Value holds a ListValue of Values.
	nest := func(levels int) []byte {
		var v []byte
		for range levels {
			list := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), v)
			v = protowire.AppendBytes(protowire.AppendTag(nil, 6, protowire.BytesType), list)
		}
		return v
	}
	value := (&structpb.Value{}).ProtoReflect().Descriptor()
	if _, ok := wire.CountMessages(nest(wire.MaxDepth/2-1), value, MaxMessages); !ok {
		t.Errorf("%d levels of nesting refused", wire.MaxDepth-2)
	}
	if _, ok := wire.CountMessages(nest(wire.MaxDepth), value, MaxMessages); ok {
		t.Errorf("%d levels of nesting accepted", 2*wire.MaxDepth)
	}

	bad := []byte{0x0a, 0x05, 0x08} // requests: 5 bytes promised, 1 given
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(bad)}, &pb.CheckResponse{}); err == nil {
		t.Error("malformed message: no error")
	}
	if got := wire.Prefix(bad, 1, 0); !bytes.Equal(got, bad) {
		t.Errorf("prefix of a malformed message = %x, want it whole", got)
	}
}
