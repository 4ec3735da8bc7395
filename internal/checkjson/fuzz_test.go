package checkjson

import (
	"bytes"
	"testing"
	"unicode/utf8"

	"github.com/ringlimit/ringlimit/checks"
)

// FuzzDecodeCheckRequest feeds arbitrary bodies to the JSON decoder: it
// must never panic, and what it accepts must be a well-formed request of
// valid UTF-8 strings with at most checks.MaxItems items.
func FuzzDecodeCheckRequest(f *testing.F) {
	f.Add([]byte(`{"requests":[{"name":"api","key":"user:42","limit":10,"duration_ms":60000}]}`))
	f.Add([]byte(`{"requests":[{"name":"a","key":"k","hits":0,"limit":1,"duration_ms":1,"algorithm":"SLIDING_LOG","behavior":"GLOBAL","burst":3,"reset":true,"created_at_ms":1}],"all":true}`))
	f.Add([]byte(`{"requests":[{"key":"k","policy":"d/k=v","charge_refused":true}]}`))
	f.Add([]byte(`{"requests":[{"name":"a","key":"k","min_interval_ms":1000},{"name":"a","key":"k","limit":5,"duration_ms":1000,"min_interval_ms":-1}]}`))
	f.Add([]byte(`{"requests":[{"min_interval_ms":9223372036854775808},{"algorithm":"spacing"}]}`))
	f.Add([]byte(`{"requests":[{"algorithm":"nope"},{"behavior":"x"}]}`))
	f.Add([]byte(`{"requests":[{"limit":"1"}]}`))
	f.Add([]byte(`{"requests":[{"name":"a","NAME":"b"}],"all":false,"all":true}`))
	f.Add([]byte(`{"requests":[{"key":"\ud83d\ude00\u00e9\n\"\\\/","name":"\ud83d"}]}`))
	f.Add([]byte("{\"requests\":[{\"key\":\"\xc3\x28\"}]}"))
	f.Add([]byte(`{"requests":[{"hits":null,"limit":null,"reset":null}],"all":null}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"requests":[{"name":"a","key":"k","limit":1,"ceiling":3,"parent":{"key":"all","limit":10,"duration_ms":1000}}]}`))
	f.Add([]byte(`{"requests":[{"parent":{"key":"\ud83d","limit":-1}},{"parent":{"x":1}},{"parent":{"key":"a"`))
	f.Fuzz(func(t *testing.T, body []byte) {
		d, err := Decode(bytes.NewReader(body))
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if n := len(d.Request.Requests) + len(d.itemErr); n > checks.MaxItems {
			t.Fatalf("accepted %d items", n)
		}
		if len(d.pos) != len(d.Request.Requests) {
			t.Fatalf("%d positions for %d items", len(d.pos), len(d.Request.Requests))
		}
		for _, it := range d.Request.Requests {
			for _, s := range []string{it.Name, it.Key, it.Policy, it.GetParent().GetKey()} {
				if !utf8.ValidString(s) {
					t.Fatalf("accepted invalid UTF-8 %q", s)
				}
			}
		}
	})
}
