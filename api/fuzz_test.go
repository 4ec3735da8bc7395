package api

import (
	"testing"

	"github.com/ringlimit/ringlimit/service"
)

// FuzzDecodeCheckRequest feeds arbitrary bodies to the JSON decoder: it
// must never panic, and what it accepts must be a well-formed request.
func FuzzDecodeCheckRequest(f *testing.F) {
	f.Add([]byte(`{"requests":[{"name":"api","key":"user:42","limit":10,"duration_ms":60000}]}`))
	f.Add([]byte(`{"requests":[{"name":"a","key":"k","hits":0,"limit":1,"duration_ms":1,"algorithm":"SLIDING_LOG","behavior":"GLOBAL","burst":3,"reset":true,"created_at_ms":1}],"all":true}`))
	f.Add([]byte(`{"requests":[{"key":"k","policy":"d/k=v","charge_refused":true}]}`))
	f.Add([]byte(`{"requests":[{"algorithm":"nope"},{"behavior":"x"}]}`))
	f.Add([]byte(`{"requests":[{"limit":"1"}]}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		d, err := decodeCheckRequest(body)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if n := len(d.req.Requests) + len(d.itemErr); n > service.MaxItems {
			t.Fatalf("accepted %d items", n)
		}
		if len(d.pos) != len(d.req.Requests) {
			t.Fatalf("%d positions for %d items", len(d.pos), len(d.req.Requests))
		}
	})
}
