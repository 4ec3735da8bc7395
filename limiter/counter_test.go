package limiter

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// TestCounterGolden pins the record layouts: version 1, which every
// counter of RoleLimit without reservations is still written in, version
// 2, with a role, version 3, with reservations (TestCounterGoldenV3), and
// version 4, with stand-in hits (TestCounterGoldenV4). If it fails, a
// layout changed: bump CounterVersion, then update these bytes and the
// layout in AppendBinary's doc.
func TestCounterGolden(t *testing.T) {
	if CounterVersion != 4 {
		t.Fatalf("CounterVersion = %d: update the golden bytes to the new layout", CounterVersion)
	}
	c := Counter{Name: "api", Key: "u:1", Algorithm: FixedWindow,
		Limit: algorithms.Limit{Count: 10, Period: time.Second, Burst: 2}, Last: 0x0102030405060708,
		State: []byte{0xaa, 0xbb}}
	rest := "0300" + hex.EncodeToString([]byte("api")) + "0300" + hex.EncodeToString([]byte("u:1")) +
		"0a00000000000000" + "00ca9a3b00000000" + "0200000000000000" + "0807060504030201" + "aabb"
	for _, tc := range []struct {
		role Role
		want string
	}{
		{RoleLimit, "01" + "03" + rest},
		{RoleCeiling, "02" + "03" + "01" + rest},
	} {
		c.Role = tc.role
		b, err := c.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := hex.EncodeToString(b); got != tc.want {
			t.Errorf("AppendBinary of role %s = %s, want %s", tc.role, got, tc.want)
		}
		var back Counter
		if err := back.UnmarshalBinary(b); err != nil || back.Role != tc.role || back.Name != c.Name || back.Key != c.Key ||
			back.Limit != c.Limit || back.Last != c.Last || !bytes.Equal(back.State, c.State) {
			t.Errorf("UnmarshalBinary of role %s = %+v, %v; want %+v", tc.role, back, err, c)
		}
	}
}

// goldenReservation is a settled reservation with every field set.
var goldenReservation = Reservation{
	ID:    ReservationID{0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f},
	Limit: algorithms.Limit{Count: 10, Period: time.Second, Burst: 20}, Hits: 6,
	TakenAt: 0x0102030405060708, Expires: 0x0102030405060709,
	Settled: true, Cost: 9,
	Outcome: Settled{Forced: 3, Decision: algorithms.Decision{Remaining: 1, ResetAfter: 2 * time.Second}},
}

// TestCounterGoldenV3 pins version 3, a counter with reservations, to
// testdata/counter-v3.hex (hex, one field a line, with comments after
// '#'), an open reservation and a settled one. If it fails, the layout
// changed: see TestCounterGolden.
func TestCounterGoldenV3(t *testing.T) {
	open := goldenReservation
	open.ID[15] = 0xff
	open.Settled, open.Cost, open.Outcome = false, 0, Settled{}
	testCounterGoldenFile(t, "testdata/counter-v3.hex", Counter{Name: "api", Key: "u:1", Algorithm: FixedWindow,
		Limit: algorithms.Limit{Count: 10, Period: time.Second, Burst: 2}, Last: 0x0102030405060708,
		State: []byte{0xaa, 0xbb}, Reservations: []Reservation{open, goldenReservation}})
}

// TestCounterGoldenV4 pins version 4, a counter with stand-in hits, to
// testdata/counter-v4.hex, as TestCounterGoldenV3 does version 3.
func TestCounterGoldenV4(t *testing.T) {
	testCounterGoldenFile(t, "testdata/counter-v4.hex", Counter{Name: "api", Key: "u:1", Algorithm: FixedWindow,
		Role: RoleCeiling, Limit: algorithms.Limit{Count: 10, Period: time.Second, Burst: 2}, Last: 0x0102030405060708,
		State: []byte{0xaa, 0xbb}, StandInHits: 7})
}

// testCounterGoldenFile checks that c's record is the one in file (hex,
// one field a line, with comments after '#'), and decodes back to c.
func testCounterGoldenFile(t *testing.T, file string, c Counter) {
	t.Helper()
	text, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for line := range strings.Lines(string(text)) {
		line, _, _ = strings.Cut(line, "#")
		want.WriteString(strings.Join(strings.Fields(line), ""))
	}
	b, err := c.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := hex.EncodeToString(b); got != want.String() {
		t.Errorf("AppendBinary = %s, want %s", got, want.String())
	}
	var back Counter
	if err := back.UnmarshalBinary(b); err != nil || !reflect.DeepEqual(back, c) {
		t.Errorf("UnmarshalBinary = %+v, %v; want %+v", back, err, c)
	}
}

func TestCounterRoundTrip(t *testing.T) {
	c := Counter{Name: strings.Repeat("n", MaxNameLen), Key: strings.Repeat("k", MaxKeyLen), Algorithm: SlidingLog,
		Role: RoleCeiling, Limit: algorithms.Limit{Count: 3, Period: time.Minute}, Last: 42, State: []byte{1, 5, 0, 0, 0, 0}}
	b, err := c.AppendBinary([]byte("prefix"))
	if err != nil {
		t.Fatal(err)
	}
	var got Counter
	if err := got.UnmarshalBinary(b[len("prefix"):]); err != nil {
		t.Fatal(err)
	}
	if got.Name != c.Name || got.Key != c.Key || got.Algorithm != c.Algorithm || got.Role != c.Role || got.Limit != c.Limit ||
		got.Last != c.Last || !bytes.Equal(got.State, c.State) {
		t.Errorf("round trip gave %+v, want %+v", got, c)
	}
	// The longest name and key, in version 2 (a role): with no entries, a
	// sliding log's record is within MaxFixedCounterBytes; with a full
	// log, the most reservations and stand-in hits, in version 4, it is
	// MaxCounterBytes.
	if n := len(b) - len("prefix"); n > MaxFixedCounterBytes {
		t.Errorf("record of an empty log: %d bytes, more than MaxFixedCounterBytes %d", n, MaxFixedCounterBytes)
	}
	c.State = make([]byte, algorithms.MaxStateBytes)
	c.Role = RoleLimit
	c.StandInHits = 1
	c.Reservations = make([]Reservation, MaxCounterReservations)
	for i := range c.Reservations {
		c.Reservations[i] = goldenReservation
		c.Reservations[i].ID[0], c.Reservations[i].ID[1] = byte(i), byte(i>>8)
	}
	b, err = c.AppendBinary(nil)
	if err != nil || len(b) != MaxCounterBytes {
		t.Errorf("record of a full log with %d reservations: %d bytes, %v; want MaxCounterBytes %d", len(c.Reservations), len(b), err, MaxCounterBytes)
	}
	if err := got.UnmarshalBinary(b); err != nil || !reflect.DeepEqual(got, c) {
		t.Errorf("round trip of a full log with %d reservations: %v", len(c.Reservations), err)
	}
}

// v4 rewrites good's version 1 record b in version 4's layout with the
// given stand-in hits and count of reservations (and none of them).
func v4(b []byte, good Counter, hits int64, reservations uint16) []byte {
	head := b[2 : len(b)-len(good.State)] // name, key, limit, last
	out := append([]byte{4, b[1], byte(RoleLimit)}, head...)
	out = binary.LittleEndian.AppendUint64(out, uint64(hits))
	out = binary.LittleEndian.AppendUint16(out, reservations)
	return append(out, good.State...)
}

func TestCounterRefuses(t *testing.T) {
	good := Counter{Name: "api", Key: "k", Algorithm: GCRA, Limit: algorithms.Limit{Count: 1, Period: time.Second}}
	b, err := good.AppendBinary(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		data []byte
		want error
	}{
		{"empty", nil, ErrBadCounter},
		{"version 5", append([]byte{5}, b[1:]...), ErrUnknownVersion},
		{"version 4 of no stand-in hits", v4(b, good, 0, 0), ErrBadCounter},
		{"version 4 of negative stand-in hits", v4(b, good, -1, 0), ErrBadCounter},
		{"version 4 of more reservations than allowed", v4(b, good, 1, MaxCounterReservations+1), ErrBadCounter},
		{"version 4 of a reservation it does not hold", v4(b, good, 1, 1), ErrBadCounter},
		{"version 4 truncated in its hits", v4(b, good, 1, 0)[:len(b)+1-len(good.State)+4], ErrBadCounter},
		{"version 3 of no reservations", append(append([]byte{3}, b[1:len(b)-len(good.State)]...), 0, 0), ErrBadCounter},
		{"version 0", append([]byte{0}, b[1:]...), ErrUnknownVersion},
		{"unknown algorithm", append([]byte{1, byte(NumAlgorithms)}, b[2:]...), ErrBadCounter},
		{"version 2 of RoleLimit, which is written in version 1", append([]byte{2, b[1], byte(RoleLimit)}, b[2:]...), ErrBadCounter},
		{"unknown role", append([]byte{2, b[1], byte(numRoles)}, b[2:]...), ErrBadCounter},
		{"a ceiling of a spacing", append([]byte{2, byte(Spacing), byte(RoleCeiling)}, b[2:]...), ErrBadCounter},
		{"version 2 truncated", append([]byte{2, b[1], byte(RoleCeiling)}, b[2:len(b)-1]...), ErrBadCounter},
		{"truncated", b[:len(b)-1], ErrBadCounter},
		{"name longer than the record", append([]byte{1, 1, 0xff, 0xff}, b[4:]...), ErrBadCounter},
		{"empty name", append([]byte{1, 1, 0, 0}, b[7:]...), ErrBadCounter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Counter
			if err := c.UnmarshalBinary(tc.data); !errors.Is(err, tc.want) {
				t.Errorf("UnmarshalBinary(%x) = %v, want %v", tc.data, err, tc.want)
			}
		})
	}
	for _, c := range []Counter{
		{Name: strings.Repeat("n", MaxNameLen+1), Key: "k"},
		{Name: "n", Key: strings.Repeat("k", MaxKeyLen+1)},
		{Name: "n", Key: "k", Algorithm: NumAlgorithms},
		{Name: "n", Key: "k", Role: numRoles},
		{Name: "n", Key: "k", Algorithm: Spacing, Role: RoleCeiling},
		{Name: "n", Key: "k", StandInHits: -1},
	} {
		if _, err := c.AppendBinary(nil); !errors.Is(err, ErrBadCounter) {
			t.Errorf("AppendBinary(name %d bytes, key %d bytes, %s) = %v, want ErrBadCounter", len(c.Name), len(c.Key), c.Algorithm, err)
		}
	}
}

// FuzzCounter feeds arbitrary bytes to the record decoder and, when they
// decode, to Merge: nothing panics, errors wrap the sentinels, a decoded
// record encodes back to the same bytes, and a refused counter is not
// stored.
func FuzzCounter(f *testing.F) {
	for _, c := range []Counter{
		{Name: "api", Key: "k", Algorithm: TokenBucket, Limit: algorithms.Limit{Count: 1, Period: time.Second},
			Last: t0.UnixNano(), State: []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{Name: "api", Key: "k", Algorithm: SlidingLog, Limit: algorithms.Limit{Count: 1, Period: time.Second},
			Last: t0.UnixNano(), State: []byte{1, 5, 0, 0, 0, 0}},
		{Name: "api", Key: "k", Algorithm: Spacing, Limit: SpacingLimit(time.Second),
			Last: t0.UnixNano(), State: []byte{1, 6, 0, 0, 0, 0, 0, 0, 0, 0}},
		{Name: "api", Key: "k", Algorithm: GCRA, Role: RoleCeiling, Limit: algorithms.Limit{Count: 3, Period: time.Second},
			Last: t0.UnixNano(), State: []byte{1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{Name: "api", Key: "k", Algorithm: FixedWindow, Limit: algorithms.Limit{Count: 10, Period: time.Second},
			Last: t0.UnixNano(), State: []byte{1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			Reservations: []Reservation{fuzzReservation(0, false), fuzzReservation(1, true)}},
		{Name: "api", Key: "k", Algorithm: FixedWindow, Limit: algorithms.Limit{Count: 10, Period: time.Second},
			Last: t0.UnixNano(), State: []byte{1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
			Reservations: []Reservation{fuzzReservation(0, false)}, StandInHits: 3},
		{Name: "api", Key: "k", Algorithm: TokenBucket, Role: RoleCeiling, Limit: algorithms.Limit{Count: 1, Period: time.Second},
			Last: t0.UnixNano(), State: []byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, StandInHits: 1},
	} {
		b, err := c.AppendBinary(nil)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var c Counter
		if err := c.UnmarshalBinary(data); err != nil {
			if !errors.Is(err, ErrBadCounter) && !errors.Is(err, ErrUnknownVersion) {
				t.Fatalf("UnmarshalBinary error %v wraps no sentinel", err)
			}
			return
		}
		if b, err := c.AppendBinary(nil); err != nil || !bytes.Equal(b, data) {
			t.Fatalf("decoded %x, re-encoded %x, %v", data, b, err)
		}
		s := New(Config{})
		err := s.Merge(c, t0, time.Minute)
		switch {
		case err != nil && !errors.Is(err, ErrBadCounter) && !errors.Is(err, ErrUnknownVersion):
			t.Fatalf("Merge error %v wraps no sentinel", err)
		case err != nil && s.Len() != 0:
			t.Fatalf("refused counter stored: %v", err)
		case err == nil && s.Len() != 1:
			t.Fatalf("accepted counter not stored")
		case err != nil && s.Reservations() != 0:
			t.Fatalf("refused counter's reservations kept: %v", err)
		case s.Reservations() > len(c.Reservations):
			t.Fatalf("%d reservations kept of %d", s.Reservations(), len(c.Reservations))
		}
		// Into a store that holds the key's counter, charged: whatever
		// the record says, its stand-in hits included, merging never
		// refills it.
		if err != nil || c.Role != RoleLimit || c.Algorithm == Spacing {
			return
		}
		held := New(Config{})
		r := Request{Name: c.Name, Key: c.Key, Algorithm: c.Algorithm, Limit: c.Limit, Hits: 1, Now: t0}
		held.Decide(&r)
		// Both peeks at the later of t0 and the record's Last: the merged
		// counter is evaluated no earlier than that, and what time refills
		// meanwhile is no refill by the merge.
		r.Hits, r.Now = 0, time.Unix(0, max(t0.UnixNano(), c.Last))
		before := held.Check(&r).Remaining
		if err := held.Merge(c, t0, time.Minute); err != nil {
			t.Fatalf("Merge into a store that holds the key: %v, after Merge into an empty one took it", err)
		}
		if after := held.Check(&r).Remaining; after > before {
			t.Fatalf("merging %+v refilled the counter: %d remaining before, %d after", c, before, after)
		}
	})
}

// fuzzReservation is goldenReservation valid at t0, with id i, settled
// or open.
func fuzzReservation(i byte, settled bool) Reservation {
	r := goldenReservation
	r.ID[0] = i
	r.TakenAt, r.Expires = t0.UnixNano(), t0.Add(time.Minute).UnixNano()
	if !settled {
		r.Settled, r.Cost, r.Outcome = false, 0, Settled{}
	}
	return r
}
