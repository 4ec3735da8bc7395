package checkjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/ringlimit/ringlimit/algorithms"
	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/checks"
)

// The shapes of POST /v1/check as structs for encoding/json: the
// reference that AppendResponse and Decode are tested
// against, and the shape DESIGN.md and docs/checks.md give.

type checkResponseJSON struct {
	Responses []checkResultJSON `json:"responses"`
}

type checkResultJSON struct {
	Status        string            `json:"status"`
	Limit         int64             `json:"limit"`
	Remaining     int64             `json:"remaining"`
	ResetTimeMs   int64             `json:"reset_time_ms"`
	RetryAfterMs  int64             `json:"retry_after_ms"`
	DelayMs       int64             `json:"delay_ms"`
	AdmitsOne     *bool             `json:"admits_one,omitempty"`
	Borrowed      bool              `json:"borrowed,omitempty"`
	ReservationID string            `json:"reservation_id,omitempty"`
	Error         string            `json:"error,omitempty"`
	ErrorCode     string            `json:"error_code,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

type checkRequestJSON struct {
	Requests []checkItemJSON `json:"requests"`
	All      bool            `json:"all"`
}

type checkItemJSON struct {
	Name          string      `json:"name"`
	Key           string      `json:"key"`
	Hits          *int64      `json:"hits"`
	Limit         int64       `json:"limit"`
	DurationMs    int64       `json:"duration_ms"`
	Algorithm     string      `json:"algorithm"`
	Burst         int64       `json:"burst"`
	Behavior      string      `json:"behavior"`
	Reset         bool        `json:"reset"`
	CreatedAtMs   int64       `json:"created_at_ms"`
	ChargeRefused bool        `json:"charge_refused"`
	Policy        string      `json:"policy"`
	MinIntervalMs int64       `json:"min_interval_ms"`
	Ceiling       int64       `json:"ceiling"`
	Parent        *parentJSON `json:"parent"`
	ReserveTTLMs  *int64      `json:"reserve_ttl_ms"`
}

type parentJSON struct {
	Key        string `json:"key"`
	Limit      int64  `json:"limit"`
	DurationMs int64  `json:"duration_ms"`
}

// referenceResponse is the answer to d as the struct encoding/json wrote
// before AppendResponse.
func referenceResponse(d Body, resp *pb.CheckResponse) checkResponseJSON {
	out := checkResponseJSON{Responses: make([]checkResultJSON, len(d.pos)+len(d.itemErr))}
	for _, e := range d.itemErr {
		out.Responses[e.pos] = checkResultJSON{
			Status:       pb.Status_OVER_LIMIT.String(),
			RetryAfterMs: -1,
			Error:        e.err.Error(),
			ErrorCode:    pb.ErrorCode_INVALID_ARGUMENT.String(),
		}
	}
	for j, r := range resp.GetResponses() {
		res := checkResultJSON{
			Status:        r.Status.String(),
			Limit:         r.Limit,
			Remaining:     r.Remaining,
			ResetTimeMs:   r.ResetTimeMs,
			RetryAfterMs:  r.RetryAfterMs,
			DelayMs:       r.DelayMs,
			Borrowed:      r.Borrowed,
			ReservationID: r.ReservationId,
			Error:         r.Error,
			Metadata:      r.Metadata,
		}
		if r.ErrorCode != pb.ErrorCode_OK {
			res.ErrorCode = r.ErrorCode.String()
		}
		if items := d.Request.GetRequests(); j < len(items) && items[j].Hits != nil && *items[j].Hits == 0 && r.Error == "" {
			admits := r.Status == pb.Status_UNDER_LIMIT && r.Remaining >= 1
			res.AdmitsOne = &admits
		}
		out.Responses[d.pos[j]] = res
	}
	return out
}

// randomString returns a string of up to 20 bytes or runes: ASCII
// (control characters, quotes, HTML and all), runes of every width,
// U+2028 and U+2029, U+FFFD, surrogate halves encoded as UTF-8 (invalid)
// and stray bytes.
func randomString(rng *rand.Rand) string {
	var b []byte
	for range rng.IntN(20) {
		switch rng.IntN(6) {
		case 0:
			b = append(b, byte(rng.IntN(0x80)))
		case 1:
			b = append(b, byte(rng.IntN(256)))
		case 2:
			b = utf8.AppendRune(b, []rune{'\u2028', '\u2029', '\ufffd', 'é', '€', '😀', '\u007f', '\u0080'}[rng.IntN(8)])
		case 3:
			b = utf8.AppendRune(b, rune(rng.IntN(0x110000)))
		case 4:
			b = append(b, 0xed, 0xa0|byte(rng.IntN(32)), 0x80|byte(rng.IntN(64))) // a surrogate half
		default:
			b = append(b, `"\<>&/`[rng.IntN(6)])
		}
	}
	return string(b)
}

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	cases := []string{"", "plain", "\"\\/\b\f\n\r\t\x00\x1f\x7f", "<a href='x'>&amp;</a>", "\u2028\u2029", "é€😀", "\xff", "\xc3\x28", "\xed\xa0\x80", "a\xf0\x9f\x98"}
	for range 10_000 {
		cases = append(cases, randomString(rng))
	}
	for _, s := range cases {
		checkAppendString(t, s)
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "plain", "\"\\\b\f\n\r\t\x00", "<>&\u2028\u2029", "\xff\xed\xa0\x80é😀"} {
		f.Add(s)
	}
	f.Fuzz(checkAppendString)
}

// checkAppendString checks that appendString writes s exactly as
// encoding/json does, as JSON that decodes to s where s is valid UTF-8.
func checkAppendString(t *testing.T, s string) {
	want, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	got := appendString([]byte("x"), s)[1:]
	if !bytes.Equal(got, want) {
		t.Fatalf("appendString(%q) = %s, want %s", s, got, want)
	}
	var back string
	if err := json.Unmarshal(got, &back); err != nil || !json.Valid(got) || !utf8.Valid(got) {
		t.Fatalf("appendString(%q) = %s: not valid JSON: %v", s, got, err)
	}
	if utf8.ValidString(s) && back != s {
		t.Fatalf("appendString(%q) decodes to %q", s, back)
	}
}

// TestAppendCheckResponseMatchesEncodingJSON is the differential test of
// the answer: for random answers (results of every field, metadata,
// errors, items that failed to parse, anywhere in the body), the bytes
// are those encoding/json writes for referenceResponse.
func TestAppendCheckResponseMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	num := func() int64 {
		switch rng.IntN(4) {
		case 0:
			return 0
		case 1:
			return -rng.Int64()
		}
		return rng.Int64N(1 << (1 + rng.IntN(62)))
	}
	for range 2_000 {
		d := Body{Request: &pb.CheckRequest{}}
		resp := &pb.CheckResponse{}
		for p := range rng.IntN(20) {
			if rng.IntN(4) == 0 {
				d.itemErr = append(d.itemErr, itemError{p, fmt.Errorf("item: %s", randomString(rng))})
				continue
			}
			d.pos = append(d.pos, p)
			r := &pb.CheckResult{
				Status: pb.Status(rng.IntN(2)), Limit: num(), Remaining: num(), ResetTimeMs: num(),
				RetryAfterMs: num(), DelayMs: num(), ErrorCode: pb.ErrorCode(rng.IntN(len(pb.ErrorCode_name))),
				Borrowed: rng.IntN(2) == 0,
			}
			if rng.IntN(3) == 0 {
				r.Error = randomString(rng)
			}
			if rng.IntN(3) == 0 {
				r.ReservationId = randomString(rng)
			}
			if rng.IntN(3) == 0 {
				r.Metadata = map[string]string{}
				for range rng.IntN(4) {
					r.Metadata[randomString(rng)] = randomString(rng)
				}
			}
			resp.Responses = append(resp.Responses, r)
			item := &pb.CheckItem{}
			if h := int64(rng.IntN(3)) - 1; h >= 0 { // absent, a peek or a check of 1
				item.Hits = &h
			}
			d.Request.Requests = append(d.Request.Requests, item)
		}
		var want bytes.Buffer
		if err := json.NewEncoder(&want).Encode(referenceResponse(d, resp)); err != nil {
			t.Fatal(err)
		}
		if got := AppendResponse(nil, d, resp); !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("AppendResponse\n got %s\nwant %s", got, want.Bytes())
		}
	}
}

// TestDecodeRandomRequests decodes random requests written by
// encoding/json, with any subset of fields in any order, nulls, escapes
// and white space, into the items they were written from.
func TestDecodeRandomRequests(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 1_000 {
		want := &pb.CheckRequest{All: rng.IntN(2) == 0}
		var items []string
		for range rng.IntN(12) {
			it := &pb.CheckItem{}
			var fields []string
			add := func(name string, v any) {
				b, err := json.Marshal(v)
				if err != nil {
					t.Fatal(err)
				}
				fields = append(fields, fmt.Sprintf("%q%s:%s%s", name, space(rng), space(rng), b))
			}
			for _, f := range rng.Perm(len(itemFields)) {
				if rng.IntN(3) == 0 {
					continue
				}
				if rng.IntN(8) == 0 {
					add(itemFields[f], nil)
					continue
				}
				n := rng.Int64() - rng.Int64()
				name := itemFields[f]
				ints := map[string]*int64{"limit": &it.Limit, "duration_ms": &it.DurationMs, "burst": &it.Burst, "created_at_ms": &it.CreatedAtMs,
					"min_interval_ms": &it.MinIntervalMs, "ceiling": &it.Ceiling}
				strs := map[string]*string{"name": &it.Name, "key": &it.Key, "policy": &it.Policy}
				bools := map[string]*bool{"reset": &it.Reset_, "charge_refused": &it.ChargeRefused}
				switch {
				case ints[name] != nil:
					*ints[name] = n
					add(name, n)
				case strs[name] != nil:
					*strs[name] = validString(rng)
					add(name, *strs[name])
				case bools[name] != nil:
					*bools[name] = n%2 == 0
					add(name, n%2 == 0)
				case name == "hits":
					it.Hits = &n
					add(name, n)
				case name == "reserve_ttl_ms":
					it.ReserveTtlMs = &n
					add(name, n)
				case name == "algorithm":
					it.Algorithm = pb.Algorithm(rng.IntN(len(pb.Algorithm_name)))
					add("algorithm", strings.ToLower(it.Algorithm.String()))
				case name == "behavior":
					it.Behavior = pb.Behavior(rng.IntN(len(pb.Behavior_name)))
					add("behavior", it.Behavior.String())
				case name == "parent":
					it.Parent = &pb.ParentLimit{}
					p := map[string]any{}
					if rng.IntN(2) == 0 {
						it.Parent.Key = validString(rng)
						p["key"] = it.Parent.Key
					}
					if rng.IntN(2) == 0 {
						it.Parent.Limit = n
						p["limit"] = n
					}
					if rng.IntN(2) == 0 {
						it.Parent.DurationMs = -n
						p["duration_ms"] = -n
					}
					add("parent", p)
				}
			}
			want.Requests = append(want.Requests, it)
			items = append(items, "{"+space(rng)+strings.Join(fields, ","+space(rng))+space(rng)+"}")
		}
		body := fmt.Sprintf(`%s{"all":%t,%s"requests":[%s]}%s`, space(rng), want.All, space(rng), strings.Join(items, ","+space(rng)), space(rng))
		// A byte at a time, every token crosses the scanner's buffer.
		for _, r := range []io.Reader{strings.NewReader(body), iotest.OneByteReader(strings.NewReader(body)), iotest.DataErrReader(strings.NewReader(body))} {
			d, err := Decode(r)
			if err != nil {
				t.Fatalf("%s: %v", body, err)
			}
			if len(d.itemErr) != 0 || !proto.Equal(d.Request, want) {
				t.Fatalf("%s\ndecoded %v (item errors %v)\nwant %v", body, d.Request, d.itemErr, want)
			}
		}
	}
}

// validString is a random valid UTF-8 string; encoding/json escapes some
// of it. One in 50 is longer than the scanner's buffer.
func validString(rng *rand.Rand) string {
	s := strings.ToValidUTF8(randomString(rng), "?")
	if rng.IntN(50) == 0 {
		s = strings.Repeat(s+"x", 5000/(len(s)+1)+1)
	}
	return s
}

// space is up to 2 characters of JSON white space.
func space(rng *rand.Rand) string {
	return []string{"", "", " ", "\n", "\t ", "\r\n"}[rng.IntN(6)]
}

// FuzzDecodeMatchesEncodingJSON checks Decode against
// encoding/json on the same body: what it accepts, encoding/json accepts
// too (it is stricter, never looser), with the same values; what
// encoding/json finds malformed, it refuses.
func FuzzDecodeMatchesEncodingJSON(f *testing.F) {
	f.Add([]byte(`{"requests":[{"name":"api","key":"user:42","limit":10,"duration_ms":60000}]}`))
	f.Add([]byte(`{"requests":[{"name":"a","key":"k","hits":0,"limit":1,"duration_ms":1,"algorithm":"sliding_log","behavior":"global","burst":3,"reset":true,"created_at_ms":1}],"all":true}`))
	f.Add([]byte(`{"requests":[{"key":"\ud83d\ude00\u00e9\n\"\\\/","policy":"d/k=v","charge_refused":true,"hits":null}]}`))
	f.Add([]byte(` {"requests" : [ {"limit":-0,"burst":1e3}, {"algorithm":"nope"} ] } `))
	f.Add([]byte(`{"requests":[{"name":"a","key":"k","min_interval_ms":1500},{"min_interval_ms":null,"limit":1,"min_interval_ms":2}]}`))
	f.Add([]byte(`{"requests":[{"min_interval_ms":1.5},{"algorithm":"SPACING"},{"min_interval_ms":"1s"}]}`))
	f.Add([]byte(`{"requests":[{"n\u0061me":"x"},]}`))
	f.Add([]byte(`{"requests":[{"name":"a","key":"k","limit":1,"ceiling":3,"parent":{"key":"all","limit":10,"duration_ms":1000}}]}`))
	f.Add([]byte(`{"requests":[{"parent":{}},{"parent":null,"ceiling":null},{"parent":{"key":null,"limit":1e2}},{"parent":{"Key":"x"}},{"parent":[]}]}`))
	f.Add([]byte(`{"requests":[{"parent":{"key":"a","key":"b"}},{"parent":{"duration_ms":"1"}}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		d, err := Decode(bytes.NewReader(body))
		if !json.Valid(body) {
			if err == nil {
				t.Fatalf("accepted malformed JSON %q", body)
			}
			return
		}
		if err != nil {
			return
		}
		var ref checkRequestJSON
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ref); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", body, err)
		}
		if ref.All != d.Request.All || len(ref.Requests) != len(d.pos)+len(d.itemErr) {
			t.Fatalf("%q: all %t and %d items, encoding/json: all %t and %d items", body, d.Request.All, len(d.pos)+len(d.itemErr), ref.All, len(ref.Requests))
		}
		for j, p := range d.pos {
			r := ref.Requests[p]
			want := &pb.CheckItem{Name: r.Name, Key: r.Key, Hits: r.Hits, Limit: r.Limit, DurationMs: r.DurationMs, Burst: r.Burst,
				Reset_: r.Reset, CreatedAtMs: r.CreatedAtMs, ChargeRefused: r.ChargeRefused, Policy: r.Policy, MinIntervalMs: r.MinIntervalMs,
				Ceiling: r.Ceiling, ReserveTtlMs: r.ReserveTTLMs}
			if p := r.Parent; p != nil {
				want.Parent = &pb.ParentLimit{Key: p.Key, Limit: p.Limit, DurationMs: p.DurationMs}
			}
			if r.Algorithm != "" {
				k, err := algorithms.ParseKind(r.Algorithm)
				if err != nil {
					t.Fatalf("%q: item %d: algorithm %q accepted", body, p, r.Algorithm)
				}
				want.Algorithm = pb.Algorithm(k)
			}
			want.Behavior = pb.Behavior(pb.Behavior_value[strings.ToUpper(r.Behavior)])
			if !proto.Equal(d.Request.Requests[j], want) {
				t.Fatalf("%q: item %d decoded as %v, encoding/json: %v", body, p, d.Request.Requests[j], want)
			}
		}
		for _, e := range d.itemErr {
			var fe *checks.FieldError
			if !errors.As(e.err, &fe) || (fe.Field != "algorithm" && fe.Field != "behavior") {
				t.Fatalf("%q: item %d: error %v, want an unknown enum", body, e.pos, e.err)
			}
		}
	})
}

// unquote decodes a JSON string, quotes included, as the scanner's
// callers do.
func unquote(raw []byte) (string, error) {
	b, err := decodeText(raw[1 : len(raw)-1])
	return string(b), err
}

// bodyOf is the body of req's items as a client writes it, with their
// name, key, limit and duration (ASCII).
func bodyOf(req *pb.CheckRequest) []byte {
	b := []byte(`{"requests":[`)
	for i, it := range req.Requests {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"name":%q,"key":%q,"limit":%d,"duration_ms":%d}`, it.Name, it.Key, it.Limit, it.DurationMs)
	}
	return append(b, "]}"...)
}

// TestCheckJSONAllocs keeps the JSON path's allocations in check: to
// decode 100 items, one for each distinct key and a few for the request
// (the scanner, slabs of items), where encoding/json took 50 an item; to
// write their answer into a buffer that has the room, none.
func TestCheckJSONAllocs(t *testing.T) {
	req, resp := &pb.CheckRequest{}, &pb.CheckResponse{}
	for i := range 100 {
		req.Requests = append(req.Requests, &pb.CheckItem{Name: "api", Key: fmt.Sprint("user:", i), Limit: 1_000_000_000, DurationMs: 1000})
		resp.Responses = append(resp.Responses, &pb.CheckResult{Limit: 1_000_000_000, Remaining: 999_999_999, ResetTimeMs: 1_763_900_000_000})
	}
	body := bodyOf(req)
	var r bytes.Reader
	decode := func() {
		r.Reset(body)
		if d, err := Decode(&r); err != nil || len(d.Request.Requests) != 100 {
			t.Fatalf("decode: %d items, %v", len(d.Request.GetRequests()), err)
		}
	}
	// 124 with Go 1.26, 134 under the race detector: a second allocation
	// an item would make it 224.
	if n := testing.AllocsPerRun(100, decode); n > 100+50 {
		t.Errorf("decoding 100 items of distinct keys allocates %v times, want at most 150: one a key, a few a request", n)
	}
	d, _ := Decode(bytes.NewReader(body))
	buf := AppendResponse(nil, d, resp)
	if n := testing.AllocsPerRun(100, func() { buf = AppendResponse(buf[:0], d, resp) }); n != 0 {
		t.Errorf("writing the answer to 100 items allocates %v times, want 0", n)
	}
}

func TestUnquoteMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{`""`, `"plain"`, `"\"\\\/\b\f\n\r\t"`, `"\u00e9\u20ac"`, `"\ud83d\ude00"`, `"é€😀"`, `"\uFFFD"`, "\"\xef\xbf\xbd\""} {
		var want string
		if err := json.Unmarshal([]byte(s), &want); err != nil {
			t.Fatal(err)
		}
		if got, err := unquote([]byte(s)); got != want || err != nil {
			t.Errorf("unquote(%s) = %q, %v; want %q", s, got, err, want)
		}
	}
	for _, s := range []string{`"\ud83d"`, `"\ude00"`, `"\ud83d\u0041"`, `"\ud83dx"`, "\"\xff\"", "\"\xed\xa0\x80\""} {
		if got, err := unquote([]byte(s)); err == nil {
			t.Errorf("unquote(%s) = %q, want an error", s, got)
		}
	}
}
