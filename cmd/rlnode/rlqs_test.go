package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ringlimit/ringlimit/policy"
	"github.com/ringlimit/ringlimit/rls"
)

// TestRLQSRelayedOverCluster: an Envoy's quota stream on a node that does
// not own its bucket's counter is a lessee of the owner, through the peer
// port: the owner holds the stream's account, the stream's node none, and
// the assignment is a token bucket of the owner's share.
func TestRLQSRelayedOverCluster(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	if err := os.WriteFile(path, []byte("domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, 2, "--policy-file", path)
	r := c.nodes[0].Cluster().Ring()
	tenant := ""
	for i := 0; tenant == ""; i++ {
		v := fmt.Sprint("t", i)
		if o, _ := r.Owner(rls.CounterKey("edge", []policy.Entry{{Key: "tenant", Value: v}}, nil)); o.Name == c.nodes[1].Cluster().LocalMember().Name {
			tenant = v
		}
	}
	cc, err := grpc.NewClient(c.nodes[0].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqspb.BucketId{Bucket: map[string]string{"tenant": tenant}}, NumRequestsAllowed: 1}}}); err != nil {
		t.Fatal(err)
	}
	// A lease the owner has just made lends no share for a lease
	// time-to-live (another owner's may be in force: see global/shares.go),
	// so the first answers are DENY_ALL, renewed until the share comes.
	for {
		resp, err := st.Recv()
		if err != nil {
			t.Fatalf("no token bucket from the owner's share: %v", err)
		}
		a := resp.GetBucketAction()
		if len(a) != 1 || a[0].GetQuotaAssignmentAction() == nil {
			t.Fatalf("a report through a non-owner: %v, want one assignment", resp)
		}
		if a[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetMaxTokens() > 0 {
			break
		}
	}
	if owner, here := series(t, c.nodes[1].HTTPAddr(), "ringlimit_lease_accounts"), series(t, c.nodes[0].HTTPAddr(), "ringlimit_lease_accounts"); owner != 1 || here != 0 {
		t.Fatalf("lease accounts: %v on the owner, %v on the stream's node; want the stream's on the owner only", owner, here)
	}
	if got := series(t, c.nodes[0].HTTPAddr(), "ringlimit_rlqs_streams"); got != 1 {
		t.Fatalf("ringlimit_rlqs_streams = %v on the stream's node, want 1", got)
	}
}
