package batch

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// call is a test's call: n items of 10 bytes each, answered on res.
type call struct {
	ctx   context.Context
	items int
	res   chan error // cap 1: a call is answered once
}

func newCall(ctx context.Context, items int) *call {
	return &call{ctx: ctx, items: items, res: make(chan error, 1)}
}

func (c *call) Size() (items, bytes int) { return c.items, 10 * c.items }
func (c *call) Left() error              { return c.ctx.Err() }
func (c *call) Fail(err error)           { c.res <- err }

// sent is one batch as the destination saw it: when, and the items of
// each call.
type sent struct {
	at    time.Duration
	items []int
}

func compareSent(a, b sent) int {
	return cmp.Or(cmp.Compare(a.at, b.at), slices.Compare(a.items, b.items))
}

// dest records batches and answers each latency after it left, or fails
// it when its ctx ends; with hold set, it answers when hold yields
// instead.
type dest struct {
	t0      time.Time
	latency time.Duration
	hold    chan struct{}

	mu      sync.Mutex
	batches []sent
}

func (d *dest) send(ctx context.Context, calls []*call) {
	s := sent{at: time.Since(d.t0)}
	for _, c := range calls {
		s.items = append(s.items, c.items)
	}
	d.mu.Lock()
	d.batches = append(d.batches, s)
	d.mu.Unlock()
	var err error
	if d.hold != nil {
		<-d.hold
	} else {
		select {
		case <-time.After(d.latency):
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	for _, c := range calls {
		c.res <- err
	}
}

// sent returns the batches sent so far, in order of time and then size
// (batches that leave at one instant may reach d in any order).
func (d *dest) sent() []sent {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := slices.Clone(d.batches)
	slices.SortFunc(out, compareSent)
	return out
}

// newBatcher returns a Batcher of conf that sends to d, started in the
// current bubble until the test ends.
func newBatcher(t *testing.T, conf Config[*call], d *dest) *Batcher[*call] {
	conf.Send = d.send
	b := New(conf)
	b.Start(t.Context())
	return b
}

// add adds a call of n items to b, and returns it.
func add(ctx context.Context, b *Batcher[*call], n int) *call {
	c := newCall(ctx, n)
	b.Add(c)
	return c
}

// TestTimeline checks when batches go, by each option, against a
// virtual clock: each arrival is a call of the given items at the given
// time after t0, and the destination answers a batch a second after it
// left.
func TestTimeline(t *testing.T) {
	const latency = time.Second
	type arrival struct {
		at    time.Duration
		items int
	}
	tests := []struct {
		name     string
		conf     Config[*call]
		arrivals []arrival
		want     []sent
	}{{
		name:     "a lone call goes at once",
		conf:     Config[*call]{MaxFlying: 4},
		arrivals: []arrival{{0, 1}},
		want:     []sent{{0, []int{1}}},
	}, {
		name:     "without Wait, a gathered batch waits for the one in flight",
		conf:     Config[*call]{MaxFlying: 4},
		arrivals: []arrival{{0, 1}, {time.Millisecond, 1}, {latency / 2, 2}},
		want:     []sent{{0, []int{1}}, {latency, []int{1, 2}}},
	}, {
		name:     "Wait sends a gathered batch while one is in flight",
		conf:     Config[*call]{MaxFlying: 4, Wait: 100 * time.Millisecond},
		arrivals: []arrival{{0, 1}, {time.Millisecond, 1}},
		want:     []sent{{0, []int{1}}, {101 * time.Millisecond, []int{1}}},
	}, {
		name:     "SendAt sends a gathered batch while one is in flight",
		conf:     Config[*call]{MaxFlying: 4, SendAt: 2},
		arrivals: []arrival{{0, 1}, {0, 1}, {0, 1}, {0, 1}},
		want:     []sent{{0, []int{1}}, {0, []int{1, 1}}, {latency, []int{1}}},
	}, {
		name:     "with MaxFlying in flight, a batch past SendAt gathers on",
		conf:     Config[*call]{MaxFlying: 2, SendAt: 2},
		arrivals: []arrival{{0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}},
		want:     []sent{{0, []int{1}}, {0, []int{1, 1}}, {latency, []int{1, 1, 1}}},
	}, {
		name:     "while callers are Few, each batch goes at once",
		conf:     Config[*call]{MaxFlying: 4, SendAt: 16, Few: 4},
		arrivals: []arrival{{0, 1}, {0, 1}, {0, 1}, {0, 1}},
		want:     []sent{{0, []int{1}}, {0, []int{1}}, {0, []int{1}}, {latency, []int{1}}},
	}, {
		name:     "Few counts the items in flight, not the batches",
		conf:     Config[*call]{MaxFlying: 4, SendAt: 16, Few: 4},
		arrivals: []arrival{{0, 2}, {0, 1}, {0, 1}, {0, 1}},
		want:     []sent{{0, []int{2}}, {0, []int{1}}, {latency, []int{1, 1}}},
	}, {
		name: "callers that were more a moment ago are not few: the first back do not go at once",
		conf: Config[*call]{MaxFlying: 4, SendAt: 100, Few: 4},
		arrivals: []arrival{{0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1},
			{2*latency + time.Millisecond, 1}, {2*latency + 2*time.Millisecond, 1}},
		want: []sent{{0, []int{1}}, {0, []int{1}}, {0, []int{1}}, {latency, []int{1, 1, 1, 1, 1}},
			{2*latency + time.Millisecond, []int{1}}, {3*latency + time.Millisecond, []int{1}}},
	}, {
		name:     "Few sends no more than MaxFlying at once",
		conf:     Config[*call]{MaxFlying: 2, Few: 100},
		arrivals: []arrival{{0, 1}, {0, 1}, {0, 1}},
		want:     []sent{{0, []int{1}}, {0, []int{1}}, {latency, []int{1}}},
	}, {
		name:     "MaxFlying zero is one batch at a time",
		conf:     Config[*call]{SendAt: 1},
		arrivals: []arrival{{0, 1}, {0, 1}, {0, 1}},
		want:     []sent{{0, []int{1}}, {latency, []int{1, 1}}},
	}, {
		name:     "SendAt zero is MaxItems: a closed batch goes",
		conf:     Config[*call]{MaxFlying: 4, MaxItems: 3},
		arrivals: []arrival{{0, 1}, {0, 2}, {0, 1}, {0, 1}},
		want:     []sent{{0, []int{1}}, {0, []int{2, 1}}, {latency, []int{1}}},
	}, {
		name:     "MaxCalls closes a batch",
		conf:     Config[*call]{MaxFlying: 4, MaxCalls: 2},
		arrivals: []arrival{{0, 1}, {0, 1}, {0, 1}, {0, 1}},
		want:     []sent{{0, []int{1}}, {0, []int{1, 1}}, {latency, []int{1}}},
	}, {
		name:     "a call that would take a batch over MaxBytes starts the next",
		conf:     Config[*call]{MaxFlying: 4, MaxBytes: 25},
		arrivals: []arrival{{0, 1}, {0, 1}, {0, 1}, {0, 1}},
		want:     []sent{{0, []int{1}}, {0, []int{1, 1}}, {latency, []int{1}}},
	}, {
		name:     "a call over the bounds goes in a batch of its own",
		conf:     Config[*call]{MaxFlying: 4, MaxItems: 3},
		arrivals: []arrival{{0, 1}, {0, 5}, {0, 1}},
		want:     []sent{{0, []int{1}}, {0, []int{5}}, {latency, []int{1}}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d := &dest{t0: time.Now(), latency: latency}
				b := newBatcher(t, tt.conf, d)
				var calls []*call
				for _, a := range tt.arrivals {
					time.Sleep(a.at - time.Since(d.t0))
					calls = append(calls, add(t.Context(), b, a.items))
					synctest.Wait()
				}
				for i, c := range calls {
					if err := <-c.res; err != nil {
						t.Errorf("call %d: %v", i, err)
					}
				}
				want := slices.Clone(tt.want)
				slices.SortFunc(want, compareSent)
				if got := d.sent(); !slices.EqualFunc(got, want, func(a, b sent) bool { return compareSent(a, b) == 0 }) {
					t.Errorf("batches = %v, want %v", got, want)
				}
			})
		})
	}
}

// TestDo: a call that goes at once, alone, is sent before Do returns;
// one that is gathered returns at once, as Add does.
func TestDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dest{t0: time.Now(), hold: make(chan struct{})}
		b := newBatcher(t, Config[*call]{MaxFlying: 4}, d)
		first := newCall(t.Context(), 1)
		done := make(chan struct{})
		go func() {
			b.Do(first)
			close(done)
		}()
		synctest.Wait()
		select {
		case <-done:
			t.Fatal("Do returned while its call, sent alone, was in flight")
		default:
		}
		second := newCall(t.Context(), 1)
		b.Do(second) // gathered: returns at once
		if got := b.Gathered(); got != 1 {
			t.Errorf("%d calls gathered, want 1", got)
		}
		d.hold <- struct{}{} // the first returns; the second goes
		<-done
		if err := <-first.res; err != nil {
			t.Error(err)
		}
		d.hold <- struct{}{}
		if err := <-second.res; err != nil {
			t.Error(err)
		}
	})
}

// TestStart: nothing is sent before Start; then the oldest batch goes,
// and the rest as the rules say.
func TestStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dest{t0: time.Now(), latency: time.Second}
		b := New(Config[*call]{Send: d.send, MaxFlying: 4, MaxItems: 2})
		var calls []*call
		for range 3 {
			calls = append(calls, add(t.Context(), b, 1))
		}
		time.Sleep(time.Hour)
		if got := d.sent(); len(got) != 0 {
			t.Fatalf("sent %v before Start", got)
		}
		b.Start(t.Context())
		for _, c := range calls {
			if err := <-c.res; err != nil {
				t.Error(err)
			}
		}
		want := []sent{{time.Hour, []int{1, 1}}, {time.Hour + time.Second, []int{1}}}
		if got := d.sent(); !slices.EqualFunc(got, want, func(a, b sent) bool { return compareSent(a, b) == 0 }) {
			t.Errorf("batches = %v, want %v", got, want)
		}
	})
}

// TestLeft: a call whose caller has left is answered with Left's error
// and not sent; Observe counts the items sent.
func TestLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := &dest{t0: time.Now(), latency: time.Second}
		var observed []int
		b := newBatcher(t, Config[*call]{MaxFlying: 4, Observe: func(items int) { observed = append(observed, items) }}, d)
		first := add(t.Context(), b, 1)
		ctx, cancel := context.WithCancel(t.Context())
		leaves := add(ctx, b, 2)
		stays := add(t.Context(), b, 3)
		cancel()
		if err := <-leaves.res; !errors.Is(err, context.Canceled) {
			t.Errorf("the call whose caller left: %v, want context.Canceled", err)
		}
		for _, c := range []*call{first, stays} {
			if err := <-c.res; err != nil {
				t.Error(err)
			}
		}
		want := []sent{{0, []int{1}}, {time.Second, []int{3}}}
		if got := d.sent(); !slices.EqualFunc(got, want, func(a, b sent) bool { return compareSent(a, b) == 0 }) {
			t.Errorf("batches = %v, want %v", got, want)
		}
		if !slices.Equal(observed, []int{1, 3}) {
			t.Errorf("observed batches of %v items, want [1 3]", observed)
		}

		gone := add(ctx, b, 1) // alone and gone: nothing is sent
		if err := <-gone.res; !errors.Is(err, context.Canceled) {
			t.Errorf("a call whose caller had left: %v, want context.Canceled", err)
		}
		if got := d.sent(); len(got) != 2 {
			t.Errorf("batches = %v, want no third", got)
		}
	})
}

// TestRunAndClose: Run fails the gathered calls with Stopped, or with
// its context's cause, and later calls too, and returns once the batches
// in flight have returned; Close does the same without a context, and
// lets batches in flight go on.
func TestRunAndClose(t *testing.T) {
	errStopped := errors.New("stopped")
	for _, tc := range []struct {
		name    string
		stopped error
		cause   error
		want    error
	}{
		{"Stopped", errStopped, context.Canceled, errStopped},
		{"cause", nil, errors.New("cause"), nil}, // want: the cause
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				want := cmp.Or(tc.want, tc.cause)
				d := &dest{t0: time.Now(), hold: make(chan struct{})}
				b := New(Config[*call]{Send: d.send, MaxFlying: 4, Stopped: tc.stopped})
				ctx, cancel := context.WithCancelCause(t.Context())
				ran := make(chan error)
				go func() { ran <- b.Run(ctx) }()
				synctest.Wait()
				inFlight := add(t.Context(), b, 1)
				gathered := add(t.Context(), b, 1)
				synctest.Wait()
				cancel(tc.cause)
				if err := <-gathered.res; !errors.Is(err, want) {
					t.Errorf("gathered call: %v, want %v", err, want)
				}
				if err := <-add(t.Context(), b, 1).res; !errors.Is(err, want) {
					t.Errorf("later call: %v, want %v", err, want)
				}
				synctest.Wait()
				select {
				case <-ran:
					t.Fatal("Run returned with a batch in flight")
				default:
				}
				close(d.hold) // the batch in flight returns (this dest ignores ctx)
				if err := <-ran; err != nil {
					t.Errorf("Run = %v, want nil", err)
				}
				if err := <-inFlight.res; err != nil {
					t.Errorf("call in flight: %v, want its answer", err)
				}
			})
		})
	}

	synctest.Test(t, func(t *testing.T) {
		d := &dest{t0: time.Now(), latency: time.Second}
		b := newBatcher(t, Config[*call]{MaxFlying: 4, Wait: time.Millisecond}, d)
		inFlight := add(t.Context(), b, 1)
		gathered := add(t.Context(), b, 1)
		errClosed := errors.New("closed")
		b.Close(errClosed)
		b.Close(errors.New("again")) // does nothing
		if err := <-gathered.res; !errors.Is(err, errClosed) {
			t.Errorf("gathered call: %v, want %v", err, errClosed)
		}
		if err := <-add(t.Context(), b, 1).res; !errors.Is(err, errClosed) {
			t.Errorf("later call: %v, want %v", err, errClosed)
		}
		if err := <-inFlight.res; err != nil {
			t.Errorf("call in flight: %v, want its answer", err)
		}
		if got := d.sent(); len(got) != 1 {
			t.Errorf("batches = %v, want only the one in flight as b closed", got)
		}
	})
}

// doIdle is a Batcher's Do of one call to an idle destination: the call
// goes at once, alone, from the caller's goroutine.
func doIdle(b *Batcher[*call], c *call) {
	b.Do(c)
	if err := <-c.res; err != nil {
		panic(err)
	}
}

// newIdleBatcher returns a started Batcher whose Send answers at once.
func newIdleBatcher(ctx context.Context) *Batcher[*call] {
	b := New(Config[*call]{
		Send: func(_ context.Context, calls []*call) {
			for _, c := range calls {
				c.res <- nil
			}
		},
		MaxFlying: 4, SendAt: 16, Few: 5, MaxItems: 1000,
	})
	b.Start(ctx)
	return b
}

// A call that goes alone costs the Batcher one allocation, its batch:
// not its slice of calls, the queue's array, or the list of batches due.
func TestDoAloneAllocatesItsBatchOnly(t *testing.T) {
	b := newIdleBatcher(t.Context())
	c := newCall(t.Context(), 1)
	if n := testing.AllocsPerRun(100, func() { doIdle(b, c) }); n != 1 {
		t.Errorf("Do of one call to an idle destination allocates %v times, want 1", n)
	}
}

// BenchmarkDoAlone measures Do of one call to an idle destination, the
// path of every check of a client with few callers.
func BenchmarkDoAlone(b *testing.B) {
	bt := newIdleBatcher(b.Context())
	c := newCall(b.Context(), 1)
	b.ReportAllocs()
	for b.Loop() {
		doIdle(bt, c)
	}
}
