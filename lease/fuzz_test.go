package lease

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/global"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/ring"
)

// FuzzLease sends arbitrary lessee calls, decoded as the public port
// decodes them, to a node that owns every key, with the real lending core
// behind it: a call is answered (one grant a report, each with an error or
// an account) or refused whole with ErrInvalid, never a panic, and no
// grant is more than the limit's capacity beyond what was acknowledged.
// (The capacity is the report's own: a fuzzed limit may be up to
// checks.MaxLimit, so a bound of the seeds' limits would be no bound.)
func FuzzLease(f *testing.F) {
	item := &pb.CheckItem{Name: "api", Key: "k", Limit: 10, DurationMs: 60_000}
	for _, req := range []*pb.LeaseRequest{
		{Lessee: make([]byte, 16), Reports: []*pb.LeaseReport{{Item: item, Epoch: 1, Asked: 1, Hits: 1}}},
		{Lessee: make([]byte, 16), Reports: []*pb.LeaseReport{{Item: item, Epoch: 2, Admitted: 5, Acked: 3, Asked: 9, Granted: 7, Release: true}}},
		{Lessee: make([]byte, 16), Reports: []*pb.LeaseReport{{Item: item, Epoch: -1, Admitted: 1 << 62}, {Item: item}}},
		{Lessee: []byte("short")},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	self := ring.Member{Name: "a"}
	r := ring.New(self)
	f.Fuzz(func(t *testing.T, b []byte) {
		var req pb.LeaseRequest
		if proto.Unmarshal(b, &req) != nil {
			return
		}
		// A node of its own for each input: an account lent under one
		// limit may hold more than a later report's smaller limit allows
		// (grants already lent stay lent, as GLOBAL's do when a limit
		// changes), which an input's reports alone cannot tell.
		core := global.New(global.Config{Store: limiter.New(limiter.Config{}), Cluster: fakeMembership{r, self}})
		n := New(Config{Lender: core, Cluster: fakeMembership{r, self}, Result: result, MaxClockSkew: time.Minute})
		resp, err := n.Lease(t.Context(), &req)
		if err != nil {
			return
		}
		if len(resp.GetGrants()) != len(req.GetReports()) {
			t.Fatalf("%d grants for %d reports", len(resp.GetGrants()), len(req.GetReports()))
		}
		for i, g := range resp.GetGrants() {
			item := req.GetReports()[i].GetItem()
			capacity := algorithms.Limit{Count: item.GetLimit(), Burst: item.GetBurst()}.Capacity()
			if g.GetError() == "" && g.GetGranted()-g.GetAcked() > capacity {
				t.Errorf("report %d: granted %d beyond acked %d, more than the limit's capacity %d", i, g.GetGranted(), g.GetAcked(), capacity)
			}
		}
	})
}
