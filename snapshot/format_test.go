package snapshot

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
)

var t0 = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// roomy is Limits no test file comes near.
var roomy = Limits{Counters: 1000, Bytes: 1 << 20}

// encodeFile writes a snapshot of records under h.
func encodeFile(t testing.TB, h Header, lim Limits, records ...[]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	e, err := NewEncoder(&buf, h, lim)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range records {
		if err := e.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if int64(buf.Len()) != e.Bytes() {
		t.Fatalf("Encoder.Bytes() = %d, wrote %d", e.Bytes(), buf.Len())
	}
	return buf.Bytes()
}

// decodeAll decodes a file and returns its header and copies of its
// records.
func decodeAll(data []byte, lim Limits) (Header, [][]byte, error) {
	var records [][]byte
	h, err := Decode(bytes.NewReader(data), lim, func(r []byte) error {
		records = append(records, bytes.Clone(r))
		return nil
	})
	return h, records, err
}

// record is the binary form of a counter of 4 hits of 10 a minute on key.
func record(t testing.TB, key string) []byte { return recordOf(t, key, false) }

// recordOf is record, with the 4 hits held by a reservation of a minute
// if reserved.
func recordOf(t testing.TB, key string, reserved bool) []byte {
	t.Helper()
	s := limiter.New(limiter.Config{})
	r := limiter.Request{Name: "api", Key: key, Hits: 4, Now: t0, Limit: algorithms.Limit{Count: 10, Period: time.Minute}}
	if reserved {
		if _, _, err := s.Reserve(&r, time.Minute); err != nil {
			t.Fatal(err)
		}
	} else {
		s.Decide(&r)
	}
	for c := range s.Counters() {
		b, err := c.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	t.Fatal("no counter")
	return nil
}

// TestFormatGolden pins the file layout byte for byte. If it fails, the
// layout changed: bump Version (and keep reading the old one for a
// release), then update these bytes and FORMAT.md.
func TestFormatGolden(t *testing.T) {
	if Version != 1 {
		t.Fatalf("Version = %d: update the golden bytes to the new layout", Version)
	}
	got := hex.EncodeToString(encodeFile(t, Header{Node: "n1", Written: time.Unix(0, 0x0102030405060708)}, roomy,
		[]byte{0xaa, 0xbb}))
	want := "89524c534e41500a" + "0100" + "0200" + "6e31" + "0807060504030201" + // magic, version, node name, written
		"02000000" + "aabb" + // one record
		"00000000" + "0100000000000000" + // the end mark, the count
		"c9ee0695" // CRC-32C of all the above (checked with an independent implementation)
	if got != want {
		t.Errorf("file = %s\nwant   %s", got, want)
	}
}

func TestRoundTrip(t *testing.T) {
	h := Header{Node: strings.Repeat("n", peerpb.MaxNodeNameLen), Written: t0}
	var records [][]byte
	for i := range 50 {
		records = append(records, record(t, fmt.Sprint("user:", i)))
	}
	long := make([]byte, limiter.MaxCounterBytes)
	records = append(records, long)
	got, decoded, err := decodeAll(encodeFile(t, h, roomy, records...), roomy)
	if err != nil {
		t.Fatal(err)
	}
	if got.Node != h.Node || !got.Written.Equal(h.Written) {
		t.Errorf("header %+v, want %+v", got, h)
	}
	if len(decoded) != len(records) {
		t.Fatalf("%d records, want %d", len(decoded), len(records))
	}
	for i := range records {
		if !bytes.Equal(decoded[i], records[i]) {
			t.Errorf("record %d differs", i)
		}
	}
	// An empty snapshot is a snapshot.
	if _, decoded, err := decodeAll(encodeFile(t, h, roomy), roomy); err != nil || len(decoded) != 0 {
		t.Errorf("empty snapshot: %d records, %v", len(decoded), err)
	}
}

// TestDecodeRefuses: every way a file can be wrong is refused with its
// sentinel, and no record of a refused file is ever trusted before the
// checksum (each sees records, but Decode's error tells the caller not to
// use them).
func TestDecodeRefuses(t *testing.T) {
	h := Header{Node: "n1", Written: t0}
	good := encodeFile(t, h, roomy, record(t, "a"), record(t, "b"))
	headerLen := headerFixed + len(h.Node)
	patch := func(off int, b ...byte) []byte {
		out := bytes.Clone(good)
		copy(out[off:], b)
		return out
	}
	hugeLength := append(bytes.Clone(good[:headerLen]), 0xff, 0xff, 0xff, 0xff)
	for _, tc := range []struct {
		name string
		data []byte
		lim  Limits
		want error
	}{
		{"empty", nil, roomy, ErrTruncated},
		{"magic cut short", good[:3], roomy, ErrTruncated},
		{"text", []byte("counters: 12\n"), roomy, ErrForeign},
		{"another magic", patch(1, 'X'), roomy, ErrForeign},
		{"unknown version", patch(len(magic), 2, 0), roomy, ErrUnknownVersion},
		{"no node name", patch(len(magic)+2, 0, 0), roomy, ErrCorrupt},
		{"node name too long", patch(len(magic)+2, 0x01, 0x01), roomy, ErrCorrupt},
		{"a byte of a record flipped", patch(headerLen+10, good[headerLen+10]^0x01), roomy, ErrCorrupt},
		{"the written time changed", patch(headerLen-1, 0x7f), roomy, ErrCorrupt},
		{"checksum flipped", patch(len(good)-1, good[len(good)-1]^0x80), roomy, ErrCorrupt},
		{"count off by one", patch(len(good)-12, 3), roomy, ErrCorrupt},
		{"a length beyond any counter", hugeLength, roomy, ErrCorrupt},
		{"bytes after the checksum", append(bytes.Clone(good), 0), roomy, ErrCorrupt},
		{"more records than allowed", good, Limits{Counters: 1, Bytes: roomy.Bytes}, ErrTooLarge},
		{"more bytes than allowed", good, Limits{Counters: 10, Bytes: int64(len(good) - 1)}, ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := decodeAll(tc.data, tc.lim)
			if !errors.Is(err, tc.want) {
				t.Errorf("Decode: %v, want %v", err, tc.want)
			}
		})
	}
	// Cut short anywhere: truncated, whatever the place.
	for n := range len(good) {
		if _, _, err := decodeAll(good[:n], roomy); !errors.Is(err, ErrTruncated) {
			t.Errorf("the first %d of %d bytes: %v, want ErrTruncated", n, len(good), err)
		}
	}
	// Any one bit flipped anywhere: refused (CRC-32C catches every
	// single-bit error; the header's own checks come first).
	for i := range len(good) {
		for bit := range 8 {
			if _, _, err := decodeAll(patch(i, good[i]^1<<bit), roomy); err == nil {
				t.Fatalf("byte %d, bit %d flipped: decoded without error", i, bit)
			}
		}
	}
}

// TestDecodeAllocatesBoundedly: a length prefix of 4 GiB is refused before
// anything is allocated for it.
func TestDecodeAllocatesBoundedly(t *testing.T) {
	h := Header{Node: "n1", Written: t0}
	huge := append(encodeFile(t, h, roomy)[:headerFixed+2], 0xff, 0xff, 0xff, 0xff)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 5 {
		if _, err := Decode(bytes.NewReader(huge), roomy, nil); !errors.Is(err, ErrCorrupt) {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if perRun := (after.TotalAlloc - before.TotalAlloc) / 5; perRun > 1<<20 {
		t.Errorf("decoding a 4 GiB length prefix allocates %d bytes a run, want well under 1 MiB", perRun)
	}
}

// TestEncoderKeepsToLimits: the encoder refuses to write what Decode would
// refuse, and what it wrote before refusing still decodes.
func TestEncoderKeepsToLimits(t *testing.T) {
	lim := Limits{Counters: 2, Bytes: roomy.Bytes}
	var buf bytes.Buffer
	e, err := NewEncoder(&buf, Header{Node: "n1", Written: t0}, lim)
	if err != nil {
		t.Fatal(err)
	}
	r := record(t, "a")
	for i := range 3 {
		err := e.Add(r)
		if (i < 2) != (err == nil) || (i == 2 && !errors.Is(err, ErrTooLarge)) {
			t.Errorf("Add %d: %v", i+1, err)
		}
	}
	for _, bad := range [][]byte{nil, make([]byte, limiter.MaxCounterBytes+1)} {
		if err := e.Add(bad); err == nil {
			t.Errorf("Add of %d bytes accepted", len(bad))
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, records, err := decodeAll(buf.Bytes(), lim); err != nil || len(records) != 2 {
		t.Errorf("decoded %d records, %v; want the 2 added", len(records), err)
	}
	if _, err := NewEncoder(&buf, Header{Node: strings.Repeat("n", peerpb.MaxNodeNameLen+1)}, lim); err == nil {
		t.Error("NewEncoder took a node name longer than peerpb.MaxNodeNameLen")
	}
}

// TestLimitsHoldAFullStore: the final snapshot of a store at its bounds
// (every counter the longest name and key, the logs as full as the store
// lets them be), with every counter in it twice (handed off, and back),
// fits the limits derived from the store's bounds: no node writes a file
// it would refuse to load.
func TestLimitsHoldAFullStore(t *testing.T) {
	s := limiter.New(limiter.Config{MaxKeys: 4096, MaxLogEntries: 40_000})
	l := algorithms.Limit{Count: algorithms.MaxSlidingLogLimit, Period: time.Hour}
	name := strings.Repeat("n", limiter.MaxNameLen)
	for i := range 6000 {
		key := fmt.Sprintf("%0*d", limiter.MaxKeyLen, i)
		a := limiter.Algorithm(i % int(limiter.NumAlgorithms))
		for j := range 1 + i%3*40 {
			r := limiter.Request{Name: name, Key: key, Algorithm: a, Hits: 1, Now: t0.Add(time.Duration(j) * time.Millisecond), Limit: l}
			s.Decide(&r)
		}
	}
	lim := LimitsFor(s.Bounds())
	var buf bytes.Buffer
	e, err := NewEncoder(&buf, Header{Node: strings.Repeat("n", peerpb.MaxNodeNameLen), Written: t0}, lim)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range 2 {
		for c := range s.Counters() {
			b, err := c.AppendBinary(nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Add(b); err != nil {
				t.Fatalf("record %d: %v", n, err)
			}
			n++
		}
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(&buf, lim, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d records, %d bytes; limits %d records, %d bytes", n, e.Bytes(), lim.Counters, lim.Bytes)
}
