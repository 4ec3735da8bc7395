package snapshot

import (
	"bytes"
	"testing"
	"time"

	"github.com/ringlimit/ringlimit/internal/peerpb"
	"github.com/ringlimit/ringlimit/limiter"
)

// FuzzDecode feeds Decode arbitrary files, under small limits so that the
// bounds are reached too: it must never panic nor pass on a record longer
// than a counter; a file it accepts must be exactly what the encoder
// writes for its header and records (one encoding per snapshot); and its
// records, taken into a store as Load takes them, must never panic nor
// take the store past its bound on reservations.
func FuzzDecode(f *testing.F) {
	h := Header{Node: "n1", Written: t0}
	good := encodeFile(f, h, roomy, record(f, "a"), record(f, "b"))
	f.Add(good)
	f.Add(good[:len(good)-3])
	f.Add(encodeFile(f, h, roomy))
	f.Add(encodeFile(f, h, roomy, recordOf(f, "r", true))) // a counter with a reservation
	f.Add([]byte(magic))
	f.Add([]byte{})
	lim := Limits{Counters: 8, Bytes: 4096}
	f.Fuzz(func(t *testing.T, data []byte) {
		store := limiter.New(limiter.Config{MaxKeys: 64, MaxReservations: 2})
		var records [][]byte
		got, err := Decode(bytes.NewReader(data), lim, func(r []byte) error {
			if len(r) == 0 || len(r) > limiter.MaxCounterBytes {
				t.Fatalf("Decode passed on a record of %d bytes", len(r))
			}
			records = append(records, bytes.Clone(r))
			return nil
		})
		for _, r := range records {
			intake.Merge(store, []*peerpb.CounterState{{Counter: r}}, t0.Add(time.Second))
		}
		if store.Reservations() > 2 {
			t.Fatalf("the store holds %d reservations, beyond its bound of 2", store.Reservations())
		}
		if err != nil {
			return
		}
		var buf bytes.Buffer
		e, err := NewEncoder(&buf, got, lim)
		if err != nil {
			t.Fatalf("Decode accepted header %+v, which NewEncoder refuses: %v", got, err)
		}
		for _, r := range records {
			if err := e.Add(r); err != nil {
				t.Fatalf("Decode accepted a record Add refuses: %v", err)
			}
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), data) {
			t.Fatalf("Decode accepted %x, which encodes as %x", data, buf.Bytes())
		}
	})
}
