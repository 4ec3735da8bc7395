package algorithms_test

import (
	"bytes"
	"encoding"
	"encoding/hex"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

// state is what every algorithm state offers for moving between nodes
// and for following a changed limit.
type state interface {
	counter
	encoding.BinaryAppender
	encoding.BinaryUnmarshaler
	Validate(now time.Time, l algorithms.Limit, skew time.Duration) error
	Clamp(now time.Time, l algorithms.Limit)
}

// states lists a zero-valued state of each algorithm, by Kind.
func states() [algorithms.NumKinds]func() state {
	return [algorithms.NumKinds]func() state{
		algorithms.KindTokenBucket:   func() state { return new(algorithms.TokenBucket) },
		algorithms.KindGCRA:          func() state { return new(algorithms.GCRA) },
		algorithms.KindLeakyBucket:   func() state { return new(algorithms.LeakyBucket) },
		algorithms.KindFixedWindow:   func() state { return new(algorithms.FixedWindow) },
		algorithms.KindSlidingWindow: func() state { return new(algorithms.SlidingWindow) },
		algorithms.KindSlidingLog:    func() state { return new(algorithms.SlidingLog) },
		algorithms.KindSpacing:       func() state { return new(algorithms.Spacing) },
	}
}

func encode(t *testing.T, s state) []byte {
	t.Helper()
	b, err := s.AppendBinary(nil)
	if err != nil {
		t.Fatalf("AppendBinary(%+v): %v", s, err)
	}
	return b
}

func logOf(entries ...int64) *algorithms.SlidingLog {
	s := new(algorithms.SlidingLog)
	for i := 0; i+1 < len(entries); i += 2 {
		s.Append(entries[i], entries[i+1])
	}
	return s
}

// TestStateGolden pins every layout byte for byte. If this test fails, a
// layout changed: that is a new format, so bump StateVersion (and keep a
// decoder for the old one for as long as a rolling upgrade needs it),
// then update these bytes and CODEC.md.
func TestStateGolden(t *testing.T) {
	if algorithms.StateVersion != 1 {
		t.Fatalf("StateVersion = %d: update the golden bytes below to the new layouts", algorithms.StateVersion)
	}
	for _, tc := range []struct {
		name string
		s    state
		hex  string
	}{
		{"TokenBucket", &algorithms.TokenBucket{Full: 0x0102030405060708, FullFrac: 3},
			"0100" + "0807060504030201" + "0300000000000000"},
		{"GCRA", &algorithms.GCRA{TAT: 0x0102030405060708, TATFrac: 4},
			"0101" + "0807060504030201" + "0400000000000000"},
		{"LeakyBucket", &algorithms.LeakyBucket{Drained: 0x0102030405060708, DrainedFrac: 5},
			"0102" + "0807060504030201" + "0500000000000000"},
		{"FixedWindow", &algorithms.FixedWindow{Start: 60e9, Count: 7},
			"0103" + "005847f80d000000" + "0700000000000000"},
		{"SlidingWindow", &algorithms.SlidingWindow{Start: 60e9, Prev: 2, Curr: -1, Period: 60e9},
			"0104" + "005847f80d000000" + "0200000000000000" + "ffffffffffffffff" + "005847f80d000000"},
		{"SlidingLog", logOf(10, 2, 0x0102, 1),
			"0105" + "02000000" + "0a00000000000000" + "0200000000000000" + "0201000000000000" + "0100000000000000"},
		{"empty SlidingLog", new(algorithms.SlidingLog), "0105" + "00000000"},
		{"Spacing", &algorithms.Spacing{Next: 0x0102030405060708}, "0106" + "0807060504030201"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := hex.EncodeToString(encode(t, tc.s)); got != tc.hex {
				t.Errorf("AppendBinary = %s, want %s", got, tc.hex)
			}
		})
	}
}

// TestStateRoundTrip plays a timeline on every algorithm, encodes the
// state after each step, and checks that the decoded state encodes to the
// same bytes and decides the next request as the original does.
func TestStateRoundTrip(t *testing.T) {
	l := algorithms.Limit{Count: 3, Period: time.Second, Burst: 5}
	for k, newState := range states() {
		t.Run(algorithms.Kind(k).String(), func(t *testing.T) {
			s, now := newState(), t0
			for i := range 40 {
				now = now.Add(time.Duration(i%7) * 90 * time.Millisecond)
				s.Take(now, l, int64(i%3))
				b := encode(t, s)
				got := newState()
				if err := got.UnmarshalBinary(b); err != nil {
					t.Fatalf("step %d: UnmarshalBinary(%x): %v", i, b, err)
				}
				if again := encode(t, got); !bytes.Equal(again, b) {
					t.Fatalf("step %d: re-encoded %x, want %x", i, again, b)
				}
				next := now.Add(100 * time.Millisecond)
				if want, d := s.Check(next, l, 1), got.Check(next, l, 1); d != want {
					t.Fatalf("step %d: decoded state decides %+v, the original %+v", i, d, want)
				}
				if err := got.Validate(now, l, 0); err != nil {
					t.Fatalf("step %d: a state Take made is refused: %v", i, err)
				}
			}
		})
	}
}

// TestStateSizes checks the bounds others size their buffers and files
// by: a state without sliding-log entries encodes to at most
// MaxFixedStateBytes, a log to LogEntryBytes more a entry, and a full log
// to exactly MaxStateBytes.
func TestStateSizes(t *testing.T) {
	l := algorithms.Limit{Count: 3, Period: time.Second, Burst: 5}
	for k, newState := range states() {
		s := newState()
		s.Take(t0, l, 2)
		if n := len(encode(t, s)); algorithms.Kind(k) != algorithms.KindSlidingLog && n > algorithms.MaxFixedStateBytes {
			t.Errorf("%s: %d bytes, more than MaxFixedStateBytes %d", algorithms.Kind(k), n, algorithms.MaxFixedStateBytes)
		}
	}
	full := new(algorithms.SlidingLog)
	for i := range algorithms.MaxSlidingLogLimit {
		full.Append(int64(i+1), 1)
	}
	b := encode(t, full)
	if len(b) != algorithms.MaxStateBytes {
		t.Errorf("a full sliding log: %d bytes, want MaxStateBytes %d", len(b), algorithms.MaxStateBytes)
	}
	if n := len(encode(t, logOf(1, 1, 2, 1))); n != len(encode(t, logOf()))+2*algorithms.LogEntryBytes || n > algorithms.MaxFixedStateBytes+2*algorithms.LogEntryBytes {
		t.Errorf("a log of 2 entries: %d bytes, want LogEntryBytes a entry over an empty log's", n)
	}
}

// TestUnmarshalStateRefuses feeds each decoder bytes it must refuse, and
// checks the error wraps the right sentinel and leaves the state as it was.
func TestUnmarshalStateRefuses(t *testing.T) {
	tb := encode(t, &algorithms.TokenBucket{Full: 1})
	for _, tc := range []struct {
		name string
		k    algorithms.Kind
		data string // hex
		want error
	}{
		{"empty", algorithms.KindTokenBucket, "", algorithms.ErrBadState},
		{"header only", algorithms.KindTokenBucket, "0100", algorithms.ErrBadState},
		{"version 0", algorithms.KindTokenBucket, "00" + hex.EncodeToString(tb[1:]), algorithms.ErrUnknownVersion},
		{"version 2", algorithms.KindTokenBucket, "02" + hex.EncodeToString(tb[1:]), algorithms.ErrUnknownVersion},
		{"another algorithm's tag", algorithms.KindGCRA, hex.EncodeToString(tb), algorithms.ErrBadState},
		{"one byte short", algorithms.KindTokenBucket, hex.EncodeToString(tb[:len(tb)-1]), algorithms.ErrBadState},
		{"one byte long", algorithms.KindTokenBucket, hex.EncodeToString(tb) + "00", algorithms.ErrBadState},
		{"spacing one byte short", algorithms.KindSpacing, "0106" + "08070605040302", algorithms.ErrBadState},
		{"spacing with a token bucket's length", algorithms.KindSpacing, "0106" + "0807060504030201" + "0000000000000000", algorithms.ErrBadState},
		{"spacing tagged as GCRA", algorithms.KindSpacing, "0101" + "0807060504030201", algorithms.ErrBadState},
		{"GCRA tagged as spacing", algorithms.KindGCRA, "0106" + "0807060504030201" + "0000000000000000", algorithms.ErrBadState},
		{"log without a count", algorithms.KindSlidingLog, "0105000000", algorithms.ErrBadState},
		{"log of too many entries", algorithms.KindSlidingLog, "0105" + "11270000", algorithms.ErrBadState}, // 10001
		{"log of 2^32-1 entries", algorithms.KindSlidingLog, "0105" + "ffffffff", algorithms.ErrBadState},
		{"log shorter than its count", algorithms.KindSlidingLog, "0105" + "01000000" + "0a00000000000000", algorithms.ErrBadState},
		{"log with a negative time", algorithms.KindSlidingLog,
			"0105" + "01000000" + "ffffffffffffffff" + "0100000000000000", algorithms.ErrBadState},
		{"log with zero hits", algorithms.KindSlidingLog,
			"0105" + "01000000" + "0a00000000000000" + "0000000000000000", algorithms.ErrBadState},
		{"log out of order", algorithms.KindSlidingLog,
			"0105" + "02000000" + "0a00000000000000" + "0100000000000000" + "0a00000000000000" + "0100000000000000", algorithms.ErrBadState},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := hex.DecodeString(tc.data)
			if err != nil {
				t.Fatal(err)
			}
			s := states()[tc.k]()
			before := encode(t, s)
			err = s.UnmarshalBinary(data)
			if !errors.Is(err, tc.want) {
				t.Fatalf("UnmarshalBinary(%s) = %v, want %v", tc.data, err, tc.want)
			}
			if after := encode(t, s); !bytes.Equal(after, before) {
				t.Errorf("a refused UnmarshalBinary changed the state to %x", after)
			}
		})
	}
}

// FuzzUnmarshalState feeds arbitrary bytes to every decoder: none panics,
// every error wraps ErrBadState or ErrUnknownVersion, and a state that
// decodes encodes back to exactly the same bytes (so there is one encoding
// of each state) and can be validated.
func FuzzUnmarshalState(f *testing.F) {
	f.Add([]byte{1, 0, 8, 7, 6, 5, 4, 3, 2, 1, 3, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 4, 0, 0x58, 0x47, 0xf8, 0x0d, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0x58, 0x47, 0xf8, 0x0d, 0, 0, 0})
	f.Add([]byte{1, 5, 1, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{1, 5, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{2, 3})
	f.Add([]byte{1, 6, 8, 7, 6, 5, 4, 3, 2, 1})
	f.Add([]byte{1, 6, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	f.Fuzz(func(t *testing.T, data []byte) {
		for k, newState := range states() {
			s := newState()
			err := s.UnmarshalBinary(data)
			if err != nil {
				if !errors.Is(err, algorithms.ErrBadState) && !errors.Is(err, algorithms.ErrUnknownVersion) {
					t.Fatalf("%s: UnmarshalBinary error %v wraps no sentinel", algorithms.Kind(k), err)
				}
				continue
			}
			if again := encode(t, s); !bytes.Equal(again, data) {
				t.Fatalf("%s: decoded %x, re-encoded %x", algorithms.Kind(k), data, again)
			}
			if err := s.Validate(t0, l, time.Minute); err != nil && !errors.Is(err, algorithms.ErrBadState) {
				t.Fatalf("%s: Validate error %v does not wrap ErrBadState", algorithms.Kind(k), err)
			}
		}
	})
}

// TestValidateState refuses, per algorithm, states no sequence of
// decisions under the limit can reach, and accepts the edge of what can.
func TestValidateState(t *testing.T) {
	now, skew := t0, 10*time.Second
	ns := now.UnixNano()
	perSec := algorithms.Limit{Count: 1, Period: time.Second}          // drains in 1s
	burst := algorithms.Limit{Count: 3, Period: time.Second, Burst: 6} // drains in 2s
	minute := algorithms.Limit{Count: 10, Period: time.Minute}         // windows
	year := 365 * 24 * time.Hour                                       //
	for _, tc := range []struct {
		name string
		s    state
		l    algorithms.Limit
		ok   bool
	}{
		{"token bucket at rest", &algorithms.TokenBucket{}, perSec, true},
		{"token bucket empty now", &algorithms.TokenBucket{Full: ns + 1e9}, perSec, true},
		{"token bucket empty at the skew's edge", &algorithms.TokenBucket{Full: ns + 1e9 + int64(skew)}, perSec, true},
		{"token bucket a tick past a full drain", &algorithms.TokenBucket{Full: ns + 2e9 + int64(skew), FullFrac: 1}, burst, false},
		{"token bucket at the edge of its burst", &algorithms.TokenBucket{Full: ns + 2e9 + int64(skew)}, burst, true},
		{"token bucket a year ahead", &algorithms.TokenBucket{Full: now.Add(year).UnixNano()}, perSec, false},
		{"token bucket negative", &algorithms.TokenBucket{Full: -1}, perSec, false},
		{"token bucket frac = count", &algorithms.TokenBucket{Full: ns, FullFrac: 3}, burst, false},
		{"token bucket frac negative", &algorithms.TokenBucket{Full: ns, FullFrac: -1}, burst, false},
		{"token bucket under an invalid limit", &algorithms.TokenBucket{}, algorithms.Limit{}, false},
		{"GCRA within tolerance", &algorithms.GCRA{TAT: ns + 2e9, TATFrac: 2}, burst, true},
		{"GCRA a year ahead", &algorithms.GCRA{TAT: now.Add(year).UnixNano()}, perSec, false},
		{"GCRA frac too large", &algorithms.GCRA{TAT: ns, TATFrac: 1}, perSec, false},
		{"leaky bucket full queue", &algorithms.LeakyBucket{Drained: ns + 1e9}, perSec, true},
		{"leaky bucket overfull", &algorithms.LeakyBucket{Drained: ns + 2e9 + int64(skew)}, perSec, false},
		{"leaky bucket negative", &algorithms.LeakyBucket{Drained: math.MinInt64}, perSec, false},
		{"fixed window at rest", &algorithms.FixedWindow{}, minute, true},
		{"fixed window full", &algorithms.FixedWindow{Start: ns, Count: 10}, minute, true},
		{"fixed window over its limit", &algorithms.FixedWindow{Start: ns, Count: 12}, minute, false},
		{"fixed window that counted refused hits", &algorithms.FixedWindow{Start: ns, Count: 11}, minute, true},
		{"fixed window negative count", &algorithms.FixedWindow{Start: ns, Count: -1}, minute, false},
		{"fixed window not aligned", &algorithms.FixedWindow{Start: ns + 1, Count: 1}, minute, false},
		{"fixed window in the future", &algorithms.FixedWindow{Start: ns + int64(time.Minute), Count: 1}, minute, false},
		{"fixed window negative start", &algorithms.FixedWindow{Start: -int64(time.Minute), Count: 1}, minute, false},
		{"sliding window full", &algorithms.SlidingWindow{Start: ns, Prev: 10, Curr: 10, Period: int64(time.Minute)}, minute, true},
		{"sliding window prev over", &algorithms.SlidingWindow{Start: ns, Prev: 11, Period: int64(time.Minute)}, minute, false},
		{"sliding window curr negative", &algorithms.SlidingWindow{Start: ns, Curr: -1, Period: int64(time.Minute)}, minute, false},
		{"sliding window another period", &algorithms.SlidingWindow{Start: ns, Curr: 1, Period: int64(time.Second)}, minute, false},
		{"sliding window in the future", &algorithms.SlidingWindow{Start: ns + int64(time.Hour), Curr: 1, Period: int64(time.Minute)}, minute, false},
		{"sliding window not aligned", &algorithms.SlidingWindow{Start: ns - 1, Curr: 1, Period: int64(time.Minute)}, minute, false},
		{"sliding log at rest", new(algorithms.SlidingLog), minute, true},
		{"sliding log full window", logOf(ns-59e9, 5, ns, 5), minute, true},
		{"sliding log full in two windows", logOf(ns-60e9, 10, ns, 10), minute, true},
		{"sliding log over its limit", logOf(ns-59e9, 6, ns, 5), minute, false},
		{"sliding log one entry over", logOf(ns, 11), minute, false},
		{"sliding log in the future", logOf(ns, 1, ns+int64(time.Hour), 1), minute, false},
		{"sliding log at the skew's edge", logOf(ns+int64(skew), 1), minute, true},
		{"spacing at rest", &algorithms.Spacing{}, perSec, true},
		{"spacing just admitted", &algorithms.Spacing{Next: ns + 1e9}, perSec, true},
		{"spacing at the skew's edge", &algorithms.Spacing{Next: ns + 1e9 + int64(skew)}, perSec, true},
		{"spacing a nanosecond past a period", &algorithms.Spacing{Next: ns + 1e9 + int64(skew) + 1}, perSec, false},
		{"spacing a year ahead", &algorithms.Spacing{Next: now.Add(year).UnixNano()}, perSec, false},
		{"spacing negative", &algorithms.Spacing{Next: -1}, perSec, false},
		{"spacing under an invalid limit", &algorithms.Spacing{}, algorithms.Limit{Count: 1}, false},
		{"sliding log above the maximum limit", new(algorithms.SlidingLog), algorithms.Limit{Count: algorithms.MaxSlidingLogLimit + 1, Period: time.Second}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.s.Validate(now, tc.l, skew)
			switch {
			case tc.ok && err != nil:
				t.Errorf("Validate(%+v, %+v) = %v, want nil", tc.s, tc.l, err)
			case !tc.ok && err == nil:
				t.Errorf("Validate(%+v, %+v) = nil, want an error", tc.s, tc.l)
			case !tc.ok && !errors.Is(err, algorithms.ErrBadState) && !errors.Is(err, algorithms.ErrInvalidLimit):
				t.Errorf("Validate(%+v, %+v) = %v, wraps neither ErrBadState nor ErrInvalidLimit", tc.s, tc.l, err)
			}
		})
	}
}

// TestValidateAcceptsReachableStates plays fuzz-like timelines with bursts
// of hits on every algorithm and checks that Validate accepts every state
// they reach, with no skew at all.
func TestValidateAcceptsReachableStates(t *testing.T) {
	for _, l := range []algorithms.Limit{
		{Count: 3, Period: time.Second},
		{Count: 7, Period: time.Minute, Burst: 20},
		{Count: 1, Period: time.Nanosecond * 3},
	} {
		for k, newState := range states() {
			s, now := newState(), t0
			for i := range 200 {
				now = now.Add(time.Duration(i*7919%13) * l.Period / 5)
				s.Take(now, l, int64(i*31%5))
				if err := s.Validate(now, l, 0); err != nil {
					t.Fatalf("%s under %+v, step %d: %v", algorithms.Kind(k), l, i, err)
				}
			}
		}
	}
}

func TestKind(t *testing.T) {
	for k := range algorithms.NumPublic {
		got, err := algorithms.ParseKind(k.String())
		if err != nil || got != k {
			t.Errorf("ParseKind(%q) = %v, %v; want %v", k.String(), got, err, k)
		}
	}
	if k, err := algorithms.ParseKind("sliding_log"); err != nil || k != algorithms.KindSlidingLog {
		t.Errorf("ParseKind is not case-insensitive: %v, %v", k, err)
	}
	if _, err := algorithms.ParseKind("LEAKY"); err == nil {
		t.Error("ParseKind(LEAKY) = nil error")
	}
	if algorithms.NumKinds.Valid() || algorithms.NumKinds.String() != "Kind(7)" {
		t.Errorf("NumKinds is Valid or named %q", algorithms.NumKinds.String())
	}
	// A spacing is a kind of counter, not an algorithm a check may name.
	if k := algorithms.KindSpacing; !k.Valid() || k.Public() || k.String() != "SPACING" {
		t.Errorf("KindSpacing: Valid %v, Public %v, named %q; want true, false, SPACING", k.Valid(), k.Public(), k)
	}
	if k, err := algorithms.ParseKind("SPACING"); err == nil {
		t.Errorf("ParseKind(SPACING) = %v, nil; want an error", k)
	}
}
