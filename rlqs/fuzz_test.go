package rlqs

import (
	"strings"
	"testing"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/proto"
)

// FuzzValidate: any message, as the wire delivers it, after any domain:
// validate returns an error or usages within every bound, never panics.
func FuzzValidate(f *testing.F) {
	seed := func(domain string, m *rlqspb.RateLimitQuotaUsageReports) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(domain, b)
	}
	seed("", &rlqspb.RateLimitQuotaUsageReports{Domain: "edge", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqspb.BucketId{Bucket: map[string]string{"path": "/api", "tenant": "a"}}, NumRequestsAllowed: 3, NumRequestsDenied: 1}}})
	seed("edge", &rlqspb.RateLimitQuotaUsageReports{Domain: "other"})
	seed("edge", &rlqspb.RateLimitQuotaUsageReports{BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{BucketId: &rlqspb.BucketId{Bucket: map[string]string{"": "x"}}}}})
	f.Fuzz(func(t *testing.T, domain string, data []byte) {
		var m rlqspb.RateLimitQuotaUsageReports
		if proto.Unmarshal(data, &m) != nil {
			return
		}
		got, us, bad, err := validate(domain, &m)
		for _, e := range append(bad, err) {
			if e != nil && !strings.Contains(e.Error(), ":") {
				t.Fatalf("error %q names no field", e)
			}
		}
		if err != nil {
			return
		}
		if len(us)+len(bad) != len(m.GetBucketQuotaUsages()) {
			t.Fatalf("%d usages and %d ignored of %d", len(us), len(bad), len(m.GetBucketQuotaUsages()))
		}
		if got == "" || domain != "" && got != domain || len(us) > MaxUsagesPerMessage {
			t.Fatalf("validate(%q) = %q, %d usages", domain, got, len(us))
		}
		seen := map[string]bool{}
		for _, u := range us {
			if len(u.entries) == 0 || len(u.entries) > MaxEntries || u.allowed < 0 || u.allowed > MaxRequestsPerReport || u.denied < 0 || u.denied > MaxRequestsPerReport || seen[u.key] {
				t.Fatalf("usage %+v out of bounds", u)
			}
			seen[u.key] = true
			for i, e := range u.entries {
				if e.Key == "" || e.Value == "" || len(e.Key) > MaxEntryLen || len(e.Value) > MaxEntryLen || i > 0 && u.entries[i-1].Key >= e.Key {
					t.Fatalf("entries %v: empty, too long or not sorted", u.entries)
				}
			}
		}
	})
}
