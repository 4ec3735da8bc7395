package resp

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/api"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/internal/clients"
	"github.com/ringlimit/ringlimit/internal/mux"
)

// checkPayload is an RL.CHECK payload of one check of key, and a
// timeout.
func checkPayload(t testing.TB, key string, timeoutMs int64) string {
	t.Helper()
	hits := int64(1)
	b, err := proto.Marshal(&pb.CheckStreamRequest{Id: 7, TimeoutMs: timeoutMs, Requests: []*pb.CheckItem{
		{Name: "n", Key: key, Limit: 2, DurationMs: 60_000, Hits: &hits},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestRLCheckAnswersAsTheStream: RL.CHECK's payload is decided by the
// node's gRPC face, as a CheckStream's request; the answer is its
// response, and the counter is the one a native check spends.
func TestRLCheckAnswersAsTheStream(t *testing.T) {
	ts := startNative(t)
	c := goRedis(t, ts.addr, 2)
	ctx := context.Background()
	for i, want := range []pb.Status{pb.Status_UNDER_LIMIT, pb.Status_UNDER_LIMIT, pb.Status_OVER_LIMIT} {
		out, err := c.Do(ctx, "RL.CHECK", checkPayload(t, "k", 1000)).Text()
		if err != nil {
			t.Fatalf("check %d: %v", i, err)
		}
		var resp pb.CheckStreamResponse
		if err := proto.Unmarshal([]byte(out), &resp); err != nil {
			t.Fatal(err)
		}
		if resp.GetId() != 7 || len(resp.GetResponses()) != 1 || resp.GetResponses()[0].GetStatus() != want {
			t.Fatalf("check %d: %v, want id 7 and %v", i, &resp, want)
		}
	}
}

// startNative starts a server whose RL.CHECK is answered by the gRPC
// face of its own service.
func startNative(t *testing.T) *testServer {
	late := &lateNative{}
	ts := startServer(t, newClock(), Config{Native: late})
	late.face.Store(api.New(api.Config{Checker: ts.svc}))
	return ts
}

// lateNative answers through face, set once the server's service is made.
type lateNative struct{ face atomic.Pointer[api.Server] }

func (l *lateNative) DecodeCheckStream(b []byte, m *pb.CheckStreamRequest) error {
	return l.face.Load().DecodeCheckStream(b, m)
}

func (l *lateNative) RESPCheck(ctx context.Context, req *pb.CheckStreamRequest) *pb.CheckStreamResponse {
	return l.face.Load().RESPCheck(ctx, req)
}

// TestRLCheckRefusesWhatItCannotDecide: a payload that does not decode,
// too many items, the wrong arity, or a server without Native, each get
// an error naming why, and the connection goes on.
func TestRLCheckRefusesWhatItCannotDecide(t *testing.T) {
	ts := startNative(t)
	c := goRedis(t, ts.addr, 2)
	ctx := context.Background()
	many := &pb.CheckStreamRequest{}
	for range 1001 {
		many.Requests = append(many.Requests, &pb.CheckItem{})
	}
	b, _ := proto.Marshal(many)
	for _, tc := range []struct {
		args []any
		want string
	}{
		{[]any{"RL.CHECK", "\xff\xff\xff"}, "ERR RL.CHECK payload: "},
		{[]any{"RL.CHECK"}, "ERR wrong number of arguments"},
		{[]any{"RL.CHECK", "a", "b"}, "ERR wrong number of arguments"},
	} {
		err := c.Do(ctx, tc.args...).Err()
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
		if pong, err := c.Ping(ctx).Result(); err != nil || pong != "PONG" {
			t.Fatalf("after %q: PING = %q, %v", tc.args, pong, err)
		}
	}
	// 1,001 items: the request is refused whole, with its status, as the
	// stream refuses it; decoding built no more than that.
	out, err := c.Do(ctx, "RL.CHECK", string(b)).Text()
	var resp pb.CheckStreamResponse
	if err != nil || proto.Unmarshal([]byte(out), &resp) != nil || status.Code(mux.Err(resp.GetStatus())) != codes.InvalidArgument {
		t.Errorf("1,001 items: %v, %v, want INVALID_ARGUMENT", &resp, err)
	}
	// A payload longer than an argument may be: the port's bounds hold
	// before it is read, and the connection ends.
	if err := c.Do(ctx, "RL.CHECK", strings.Repeat("x", DefaultLimits().MaxBulk+1)).Err(); err == nil || !strings.Contains(err.Error(), "Protocol error") {
		t.Errorf("a payload over MaxBulk: %v, want a protocol error", err)
	}

	bare := startServer(t, newClock(), Config{})
	if err := goRedis(t, bare.addr, 2).Do(ctx, "RL.CHECK", checkPayload(t, "k", 0)).Err(); err == nil ||
		err.Error() != "ERR RL.CHECK is not served here" {
		t.Errorf("without Native: %v", err)
	}
}

// recording is a Native that records the context of each check.
type recording struct {
	client   chan clients.ID
	deadline chan time.Duration
}

func (recording) DecodeCheckStream(b []byte, m *pb.CheckStreamRequest) error {
	return proto.Unmarshal(b, m)
}

func (r recording) RESPCheck(ctx context.Context, req *pb.CheckStreamRequest) *pb.CheckStreamResponse {
	r.client <- clients.FromContext(ctx)
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Time{}
	}
	r.deadline <- time.Until(d)
	return &pb.CheckStreamResponse{Id: req.GetId()}
}

// TestRLCheckNamesItsClientAndKeepsItsTimeout: the checks of RL.CHECK are
// made as the client of the connection (its address range), as on the
// other ports, and end at the request's timeout or the server's, the
// sooner.
func TestRLCheckNamesItsClientAndKeepsItsTimeout(t *testing.T) {
	r := recording{client: make(chan clients.ID, 2), deadline: make(chan time.Duration, 2)}
	ts := startServer(t, newClock(), Config{Native: r, RequestTimeout: 3 * time.Second})
	c := goRedis(t, ts.addr, 2)
	for _, tc := range []struct {
		timeoutMs int64
		want      time.Duration
	}{{500, 500 * time.Millisecond}, {0, 3 * time.Second}} {
		if err := c.Do(context.Background(), "RL.CHECK", checkPayload(t, "k", tc.timeoutMs)).Err(); err != nil {
			t.Fatal(err)
		}
		if id := <-r.client; id != "ip:127.0.0.0/24" {
			t.Errorf("client %q, want ip:127.0.0.0/24", id)
		}
		if d := <-r.deadline; d > tc.want || d < tc.want-time.Second {
			t.Errorf("timeout_ms %d: the check's deadline in %v, want %v", tc.timeoutMs, d, tc.want)
		}
	}
}
