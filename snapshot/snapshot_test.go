package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/ringlimit/ringlimit/algorithms"
	"github.com/ringlimit/ringlimit/checks"
	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/internal/syncbuf"
	"github.com/ringlimit/ringlimit/limiter"
)

const skew = 10 * time.Minute

// intake is how the tests load, as rlnode does: each counter validated as
// a check's.
var intake = checks.Intake{MaxClockSkew: skew}

var minute = algorithms.Limit{Count: 10, Period: time.Minute}

// limitOf is the limit of the counters of a in these tests: minute, or
// for a spacing one request a minute, the only limit a spacing counter
// has.
func limitOf(a limiter.Algorithm) algorithms.Limit {
	if a == limiter.Spacing {
		return limiter.SpacingLimit(time.Minute)
	}
	return minute
}

// testDir is a Dir on a temporary directory with a clock tests move.
type testDir struct {
	*Dir
	store *limiter.Store
	now   time.Time
	logs  *syncbuf.Buffer
}

func openDir(t *testing.T, dir, node string, store *limiter.Store) *testDir {
	t.Helper()
	td := &testDir{store: store, now: t0, logs: &syncbuf.Buffer{}}
	d, err := Open(Config{Dir: dir, Node: node, Store: store, Now: func() time.Time { return td.now },
		Logger: slog.New(slog.NewTextHandler(td.logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	td.Dir = d
	return td
}

// written returns a Dir of node on a new directory, whose store holds
// keys charged 4 hits each at t0, once it has written a snapshot of
// them, and the snapshot's bytes.
func written(t *testing.T, node string, keys ...string) (*testDir, string, []byte) {
	t.Helper()
	dir := t.TempDir()
	d := openDir(t, dir, node, limiter.New(limiter.Config{}))
	spend(d.store, t0, 4, keys...)
	if err := d.Write(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	return d, dir, b
}

// spend charges hits of a 10-a-minute limit (one a minute for a spacing)
// on each key, for every algorithm, at now.
func spend(s *limiter.Store, now time.Time, hits int64, keys ...string) {
	for a := range limiter.NumAlgorithms {
		for _, k := range keys {
			r := limiter.Request{Name: "api", Key: k, Algorithm: a, Hits: hits, Now: now, Limit: limitOf(a)}
			s.Decide(&r)
		}
	}
}

// spent is what remaining reports of counters that spend charged: left
// of each limit, and 0 of a spacing, which one request spends whole.
func spent(left int64) []int64 {
	var out []int64
	for a := range limiter.NumAlgorithms {
		if a == limiter.Spacing {
			out = append(out, 0)
		} else {
			out = append(out, left)
		}
	}
	return out
}

// remaining peeks at every algorithm's counter for key at now.
func remaining(s *limiter.Store, now time.Time, key string) []int64 {
	var out []int64
	for a := range limiter.NumAlgorithms {
		r := limiter.Request{Name: "api", Key: key, Algorithm: a, Now: now, Limit: limitOf(a)}
		out = append(out, s.Check(&r).Remaining)
	}
	return out
}

func TestWriteThenLoad(t *testing.T) {
	dir := t.TempDir()
	src := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
	spend(src.store, t0, 4, "a", "b")
	spend(src.store, t0, 10, "spent")
	if err := src.Write(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(src.metrics.written); got != float64(3*limiter.NumAlgorithms) {
		t.Errorf("counters written %v, want %d", got, 3*limiter.NumAlgorithms)
	}
	info, err := os.Stat(filepath.Join(dir, FileName))
	if err != nil || testutil.ToFloat64(src.metrics.bytes) != float64(info.Size()) || info.Mode().Perm() != 0o600 {
		t.Errorf("snapshot file %v (%v), metric says %v bytes; want it there, of that size, 0600", info, err, testutil.ToFloat64(src.metrics.bytes))
	}

	later := t0.Add(time.Second)
	dst := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
	dst.now = later
	if n := dst.Load(context.Background(), intake); n != 3*int(limiter.NumAlgorithms) {
		t.Errorf("Load took %d counters, want %d", n, 3*limiter.NumAlgorithms)
	}
	for _, k := range []string{"a", "b", "spent", "never"} {
		if got, want := remaining(dst.store, later, k), remaining(src.store, later, k); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: loaded counters have %v remaining, the originals %v", k, got, want)
		}
	}
	if got := testutil.ToFloat64(dst.metrics.loaded); got != float64(3*limiter.NumAlgorithms) {
		t.Errorf("counters loaded metric %v", got)
	}
}

// TestReservationsWriteThenLoad: a counter's reservations (record version
// 3) are written with it and loaded back, to be settled after the
// restart; one whose time-to-live ran out while the node was down is
// charged in full.
func TestReservationsWriteThenLoad(t *testing.T) {
	dir := t.TempDir()
	src := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
	reserve := func(key string, ttl time.Duration) limiter.ReservationID {
		t.Helper()
		r := limiter.Request{Name: "api", Key: key, Algorithm: limiter.SlidingWindow, Hits: 6, Now: t0, Limit: minute}
		_, id, err := src.store.Reserve(&r, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	kept, short := reserve("a", time.Minute), reserve("b", time.Second)
	if err := src.Write(context.Background()); err != nil {
		t.Fatal(err)
	}

	later := t0.Add(2 * time.Second)
	dst := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
	dst.now = later
	if n := dst.Load(context.Background(), intake); n != 2 {
		t.Fatalf("Load took %d counters, want 2", n)
	}
	if held := dst.store.Reservations(); held != 1 {
		t.Errorf("the store holds %d reservations, want 1 (the other expired while the node was down)", held)
	}
	settle := func(id limiter.ReservationID, key string) (limiter.Settled, error) {
		return dst.store.Settle(&limiter.Settlement{ID: id, Name: "api", Key: key, Cost: 1, Now: later})
	}
	if got, err := settle(kept, "a"); err != nil || got.GivenBack != 5 || got.Decision.Remaining != 9 {
		t.Errorf("settle for 1 after the load: %+v, %v; want 5 given back, 9 remaining", got, err)
	}
	if _, err := settle(short, "b"); !errors.Is(err, limiter.ErrUnknownReservation) {
		t.Errorf("settle of one expired while the node was down: %v, want ErrUnknownReservation", err)
	}
	if got := remaining(dst.store, later, "b")[limiter.SlidingWindow]; got != 4 {
		t.Errorf("the expired reservation's counter: %d remaining, want 4 (charged in full)", got)
	}
}

// TestCeilingCountersWriteThenLoad: a check's ceiling counter (role
// ceiling, record version 2) is written beside its own and loaded back
// as a ceiling, apart from it.
func TestCeilingCountersWriteThenLoad(t *testing.T) {
	dir := t.TempDir()
	src := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
	own := limiter.Request{Name: "api", Key: "k", Algorithm: limiter.GCRA, Hits: 2, Now: t0, Limit: minute}
	ceiling := own
	ceiling.Role, ceiling.Hits, ceiling.Limit.Count = limiter.RoleCeiling, 7, 30
	src.store.Decide(&own)
	src.store.Decide(&ceiling)
	if err := src.Write(context.Background()); err != nil {
		t.Fatal(err)
	}
	dst := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
	if n := dst.Load(context.Background(), intake); n != 2 {
		t.Fatalf("Load took %d counters, want the own and the ceiling counter", n)
	}
	own.Hits, ceiling.Hits = 0, 0
	if got := [2]int64{dst.store.Check(&own).Remaining, dst.store.Check(&ceiling).Remaining}; got != [2]int64{8, 23} {
		t.Errorf("loaded: %v remaining of the own and the ceiling counter, want [8 23]", got)
	}
}

// TestFullCountersNotWritten: a counter back to full when the snapshot is
// written carries nothing, and is not written.
func TestFullCountersNotWritten(t *testing.T) {
	dir := t.TempDir()
	d := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
	spend(d.store, t0, 1, "old")
	spend(d.store, t0.Add(2*time.Minute), 4, "new")
	d.now = t0.Add(2 * time.Minute) // every algorithm's "old" counter is full again by then
	if err := d.Write(context.Background()); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, FileName))
	if err != nil {
		t.Fatal(err)
	}
	_, records, err := decodeAll(data, roomy)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range records {
		var c limiter.Counter
		if err := c.UnmarshalBinary(r); err != nil || c.Key != "new" {
			t.Errorf("written: %+v %v; want only the counters of key new", c, err)
		}
	}
	if len(records) != int(limiter.NumAlgorithms) {
		t.Errorf("%d counters written, want %d", len(records), limiter.NumAlgorithms)
	}
}

// TestLoadRefusesBadFiles: a file that is not a whole snapshot of this
// node is refused whole: nothing is loaded, a line is logged, the reason
// is counted, and the file is moved aside.
func TestLoadRefusesBadFiles(t *testing.T) {
	_, _, ours := written(t, "n1", "a", "b", "c")
	_, _, theirs := written(t, "n2", "a", "b", "c")
	flipped := bytes.Clone(ours)
	flipped[len(flipped)/2] ^= 0x10
	for _, tc := range []struct {
		name, reason string
		data         []byte
	}{
		{"corrupt byte", "corrupt", flipped},
		{"truncated", "truncated", ours[:len(ours)-7]},
		{"another node's", "foreign", theirs},
		{"not a snapshot", "foreign", []byte("{\"counters\": []}\n")},
		{"unknown version", "version", append(append([]byte(magic), 9, 0), ours[len(magic)+2:]...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, FileName), tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			d := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
			d.now = t0.Add(time.Second)
			if n := d.Load(context.Background(), intake); n != 0 || d.store.Len() != 0 {
				t.Errorf("Load took %d counters, the store holds %d; want none", n, d.store.Len())
			}
			if got := testutil.ToFloat64(d.metrics.loadErrors.WithLabelValues(tc.reason)); got != 1 {
				t.Errorf("load errors{reason=%q} = %v, want 1", tc.reason, got)
			}
			if logs := d.logs.String(); !strings.Contains(logs, "snapshot refused") || !strings.Contains(logs, "reason="+tc.reason) {
				t.Errorf("log does not say the snapshot was refused and why:\n%s", logs)
			}
			if _, err := os.Stat(filepath.Join(dir, FileName)); !os.IsNotExist(err) {
				t.Errorf("the refused file is still the snapshot: %v", err)
			}
			if aside, err := os.ReadFile(filepath.Join(dir, refusedName)); err != nil || !bytes.Equal(aside, tc.data) {
				t.Errorf("the refused file was not kept aside as %s: %v", refusedName, err)
			}
			// The node goes on: its next snapshot is written as usual.
			spend(d.store, d.now, 1, "x")
			if err := d.Write(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestLoadValidatesCounters: a snapshot whose checksum is right may still
// hold counters no node could have made (a forged file, a clock set
// back): each is validated as a counter handed off by a peer, and the
// impossible ones are refused one by one, counted and logged; the rest
// load.
func TestLoadValidatesCounters(t *testing.T) {
	enc := func(s algorithms.FixedWindow) []byte {
		b, err := s.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	now := t0.Add(time.Second)
	window := t0.Truncate(time.Minute)
	counter := func(key string, last time.Time, count int64) []byte {
		c := limiter.Counter{Name: "api", Key: key, Algorithm: limiter.FixedWindow, Limit: minute, Last: last.UnixNano(),
			State: enc(algorithms.FixedWindow{Start: window.UnixNano(), Count: count})}
		b, err := c.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	dir := t.TempDir()
	file := encodeFile(t, Header{Node: "n1", Written: t0}, LimitsFor(limiter.New(limiter.Config{}).Bounds()),
		counter("good", t0, 4),
		counter("future", now.Add(skew+time.Hour), 4), // evaluated an hour past the clock's skew
		counter("over", t0, 50),                       // 50 hits in a window of a limit of 10
		[]byte("not a counter"),
	)
	if err := os.WriteFile(filepath.Join(dir, FileName), file, 0o600); err != nil {
		t.Fatal(err)
	}
	d := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
	d.now = now
	if n := d.Load(context.Background(), intake); n != 1 || d.store.Len() != 1 {
		t.Fatalf("Load took %d, the store holds %d; want only the good counter", n, d.store.Len())
	}
	r := limiter.Request{Name: "api", Key: "good", Algorithm: limiter.FixedWindow, Now: now, Limit: minute}
	if got := d.store.Check(&r).Remaining; got != 6 {
		t.Errorf("the good counter has %d remaining, want 6", got)
	}
	if got := testutil.ToFloat64(d.metrics.refused.WithLabelValues("invalid")); got != 3 {
		t.Errorf("counters refused{reason=invalid} = %v, want 3", got)
	}
	if logs := d.logs.String(); !strings.Contains(logs, "counters refused") {
		t.Errorf("no log line of the refused counters:\n%s", logs)
	}
}

// TestLeftoverTempFileIgnored: a write killed part way leaves a temporary
// file, never the snapshot: the next start loads the last whole snapshot
// and removes the leftover.
func TestLeftoverTempFileIgnored(t *testing.T) {
	_, dir, whole := written(t, "n1", "a")
	leftover := filepath.Join(dir, FileName+".12345.tmp")
	if err := os.WriteFile(leftover, whole[:len(whole)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	d2 := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
	d2.now = t0.Add(time.Second)
	if n := d2.Load(context.Background(), intake); n != int(limiter.NumAlgorithms) {
		t.Errorf("Load took %d counters, want the %d of the whole snapshot", n, limiter.NumAlgorithms)
	}
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Errorf("leftover temporary file still there: %v", err)
	}
}

// TestWriteAbandonedKeepsTheLast: a write that stops part way (its
// context ends) leaves the last snapshot as it was, and no temporary file.
func TestWriteAbandonedKeepsTheLast(t *testing.T) {
	d, dir, before := written(t, "n1", "a")
	spend(d.store, t0, 4, "b")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := d.Write(ctx); err == nil {
		t.Fatal("a write under an ended context succeeded")
	}
	after, _ := os.ReadFile(filepath.Join(dir, FileName))
	if !bytes.Equal(before, after) {
		t.Error("an abandoned write changed the snapshot")
	}
	if tmp, _ := filepath.Glob(filepath.Join(dir, tempPattern)); len(tmp) != 0 {
		t.Errorf("temporary files left: %v", tmp)
	}
	if got := testutil.ToFloat64(d.metrics.writes.WithLabelValues("canceled")); got != 1 {
		t.Errorf("writes{result=canceled} = %v, want 1", got)
	}
}

// TestFinalKeepsHandedOffCounters: the final snapshot of a node shutting
// down holds the counters it handed off (the owners may be stopping too,
// and past their own final snapshot) as well as those it still holds.
func TestFinalKeepsHandedOffCounters(t *testing.T) {
	dir := t.TempDir()
	d := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
	spend(d.store, t0, 4, "moved", "stays")
	if err := d.StartFinal(); err != nil {
		t.Fatal(err)
	}
	var records [][]byte
	for c := range d.store.Extract(func(key string) bool { return key == "moved" }) {
		b, err := c.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		records = append(records, b)
	}
	d.HandedOff(records)
	if err := d.FinishFinal(); err != nil {
		t.Fatal(err)
	}
	d.HandedOff(records) // after the final snapshot: nothing to do
	loaded := openDir(t, dir, "n1", limiter.New(limiter.Config{}))
	loaded.now = t0.Add(time.Second)
	if n := loaded.Load(context.Background(), intake); n != 2*int(limiter.NumAlgorithms) {
		t.Errorf("loaded %d counters, want %d: those handed off and those kept", n, 2*limiter.NumAlgorithms)
	}
	for _, k := range []string{"moved", "stays"} {
		if got, want := remaining(loaded.store, loaded.now, k), spent(6); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %v remaining after loading, want %v", k, got, want)
		}
	}
	// Outside a final snapshot, HandedOff does nothing, and writes go on.
	d.HandedOff(records)
	if err := d.Write(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestRunWritesEveryInterval: Run writes once an interval, and stops when
// its context ends.
func TestRunWritesEveryInterval(t *testing.T) {
	dir := t.TempDir()
	synctest.Test(t, func(t *testing.T) {
		store := limiter.New(limiter.Config{})
		d, err := Open(Config{Dir: dir, Node: "n1", Store: store, Interval: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		spend(store, time.Now(), 4, "a")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- d.Run(ctx) }()
		time.Sleep(25 * time.Second)
		synctest.Wait()
		if got := testutil.ToFloat64(d.metrics.writes.WithLabelValues("ok")); got != 2 {
			t.Errorf("%v writes in 25s at an interval of 10s, want 2", got)
		}
		if got := testutil.ToFloat64(d.metrics.lastWritten); got != float64(time.Now().Add(-5*time.Second).Unix()) {
			t.Errorf("last written at %v, want the second write's start, 5s ago (%v)", got, time.Now().Add(-5*time.Second).Unix())
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v", err)
		}
	})
}

func TestOpenRefusesAnUnusableDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, conf := range []Config{
		{Dir: filepath.Join(file, "sub"), Node: "n1"},
		{Dir: t.TempDir(), Node: ""},
		{Dir: t.TempDir(), Node: strings.Repeat("n", peerpb.MaxNodeNameLen+1)},
	} {
		conf.Store = limiter.New(limiter.Config{})
		if _, err := Open(conf); err == nil {
			t.Errorf("Open(%q, node of %d bytes) succeeded", conf.Dir, len(conf.Node))
		}
	}
	dir := filepath.Join(t.TempDir(), "made", "here")
	if _, err := Open(Config{Dir: dir, Node: "n1", Store: limiter.New(limiter.Config{})}); err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(dir); err != nil || info.Mode().Perm() != 0o700 {
		t.Errorf("Open did not make %s, 0700: %v %v", dir, info, err)
	}
}
