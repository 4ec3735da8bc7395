package peer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
)

// check returns a request of n items whose first key is key.
func check(key string, n int) *pb.CheckRequest {
	req := &pb.CheckRequest{}
	for range n {
		req.Requests = append(req.Requests, &pb.CheckItem{Name: "test", Key: key, Limit: 10, DurationMs: 1000})
	}
	return req
}

// echo answers each request with one result whose metadata names the
// request's first key, so that callers can tell their answer apart.
func echo(reqs []*pb.CheckRequest) []*pb.CheckResponse {
	out := make([]*pb.CheckResponse, len(reqs))
	for i, r := range reqs {
		out[i] = &pb.CheckResponse{Responses: []*pb.CheckResult{{
			Metadata: map[string]string{"key": r.GetRequests()[0].GetKey()},
		}}}
	}
	return out
}

func keyOf(resp *pb.CheckResponse) string {
	return resp.GetResponses()[0].GetMetadata()["key"]
}

// sent is one batch as the fake peer saw it: when, and the item count of
// each request.
type sent struct {
	at    time.Duration
	items []int
}

// fakePeer records batches. If block is non-nil, sends wait for it to be
// closed or for their ctx to end.
type fakePeer struct {
	t0    time.Time
	block chan struct{}

	mu      sync.Mutex
	batches []sent
	keys    [][]string
}

func (f *fakePeer) send(ctx context.Context, reqs []*pb.CheckRequest) ([]*pb.CheckResponse, error) {
	s := sent{at: time.Since(f.t0)}
	var keys []string
	for _, r := range reqs {
		s.items = append(s.items, len(r.GetRequests()))
		keys = append(keys, r.GetRequests()[0].GetKey())
	}
	f.mu.Lock()
	f.batches = append(f.batches, s)
	f.keys = append(f.keys, keys)
	f.mu.Unlock()
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return echo(reqs), nil
}

func (f *fakePeer) sent() ([]sent, [][]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.batches), slices.Clone(f.keys)
}

// startBatcher runs a batcher in the current bubble until the test's cleanup.
func startBatcher(t *testing.T, wait time.Duration, limit int, f *fakePeer) (*batcher, context.CancelFunc) {
	t.Helper()
	b := newBatcher(wait, limit, maxInFlight, f.send, prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- b.run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run returned %v, want nil", err)
		}
	})
	return b, cancel
}

// TestBatcherTimeline checks when batches leave, against a virtual clock:
// each arrival is a caller sending a request of the given size at the given
// time after t0.
func TestBatcherTimeline(t *testing.T) {
	const wait = time.Millisecond
	type arrival struct {
		at    time.Duration
		items int
	}
	tests := []struct {
		name     string
		limit    int
		arrivals []arrival
		want     []sent
	}{{
		name:     "lone request waits BatchWait",
		limit:    10,
		arrivals: []arrival{{0, 1}},
		want:     []sent{{wait, []int{1}}},
	}, {
		name:     "full batch leaves at once",
		limit:    3,
		arrivals: []arrival{{0, 1}, {0, 1}, {0, 1}, {0, 1}},
		want:     []sent{{0, []int{1, 1, 1}}, {wait, []int{1}}},
	}, {
		name:     "limit counts items, not requests",
		limit:    10,
		arrivals: []arrival{{0, 4}, {0, 4}, {0, 4}},
		want:     []sent{{0, []int{4, 4}}, {wait, []int{4}}},
	}, {
		name:     "request over the limit goes alone and at once",
		limit:    10,
		arrivals: []arrival{{0, 15}},
		want:     []sent{{0, []int{15}}},
	}, {
		name:     "timer starts with the first request",
		limit:    10,
		arrivals: []arrival{{0, 1}, {wait / 2, 1}},
		want:     []sent{{wait, []int{1, 1}}},
	}, {
		name:     "next batch has its own timer",
		limit:    10,
		arrivals: []arrival{{0, 1}, {wait * 3 / 2, 1}},
		want:     []sent{{wait, []int{1}}, {wait * 5 / 2, []int{1}}},
	}, {
		name:     "exact fill after a partial batch",
		limit:    4,
		arrivals: []arrival{{0, 2}, {wait / 4, 2}, {wait / 2, 1}},
		want:     []sent{{wait / 4, []int{2, 2}}, {wait * 3 / 2, []int{1}}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakePeer{t0: time.Now()}
				b, _ := startBatcher(t, wait, tt.limit, f)
				errs := make(chan error, len(tt.arrivals))
				for i, a := range tt.arrivals {
					time.Sleep(a.at - time.Since(f.t0))
					key := fmt.Sprint(i)
					go func() {
						resp, err := b.do(t.Context(), check(key, a.items))
						if err == nil && keyOf(resp) != key {
							err = fmt.Errorf("caller %s got the answer for %s", key, keyOf(resp))
						}
						errs <- err
					}()
					synctest.Wait() // the caller is in the batcher, in order
				}
				for range tt.arrivals {
					if err := <-errs; err != nil {
						t.Error(err)
					}
				}
				got, _ := f.sent()
				if !slices.EqualFunc(got, tt.want, func(a, b sent) bool {
					return a.at == b.at && slices.Equal(a.items, b.items)
				}) {
					t.Errorf("batches = %v, want %v", got, tt.want)
				}
			})
		})
	}
}

func TestBatcherCallerLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{t0: time.Now()}
		b, _ := startBatcher(t, time.Hour, 2, f)

		ctx, cancel := context.WithCancel(t.Context())
		errA := make(chan error, 1)
		go func() {
			_, err := b.do(ctx, check("a", 1))
			errA <- err
		}()
		synctest.Wait()
		cancel()
		synctest.Wait()
		select {
		case err := <-errA:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled caller got %v, want context.Canceled", err)
			}
		default:
			t.Fatal("cancelled caller still waiting")
		}

		// b fills the batch; only b is sent, since a has left.
		if _, err := b.do(t.Context(), check("b", 1)); err != nil {
			t.Fatal(err)
		}
		if _, keys := f.sent(); len(keys) != 1 || !slices.Equal(keys[0], []string{"b"}) {
			t.Errorf("sent %v, want [[b]]", keys)
		}
	})
}

func TestBatcherStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{t0: time.Now(), block: make(chan struct{})}
		b, stop := startBatcher(t, time.Hour, 2, f)
		errs := make(chan error, 3)
		for _, key := range []string{"a", "b", "c"} { // a and b in flight, c collected
			go func() {
				_, err := b.do(t.Context(), check(key, 1))
				errs <- err
			}()
			synctest.Wait()
		}
		stop()
		synctest.Wait()
		for range 3 {
			select {
			case err := <-errs:
				if !errors.Is(err, ErrClosed) {
					t.Errorf("caller got %v, want ErrClosed", err)
				}
			default:
				t.Fatal("a caller is still waiting after run stopped")
			}
		}
	})
}

func TestBatcherRetire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{t0: time.Now()}
		b, _ := startBatcher(t, time.Hour, 10, f)
		pending := make(chan error, 1)
		go func() {
			_, err := b.do(t.Context(), check("a", 1))
			pending <- err
		}()
		synctest.Wait()
		errGone := errors.New("gone")
		b.retire(errGone)
		if err := <-pending; !errors.Is(err, errGone) {
			t.Errorf("pending caller got %v, want %v", err, errGone)
		}
		if _, err := b.do(t.Context(), check("b", 1)); !errors.Is(err, errGone) {
			t.Errorf("later caller got %v, want %v", err, errGone)
		}
		if got, _ := f.sent(); len(got) != 0 {
			t.Errorf("sent %v after retiring, want nothing", got)
		}
	})
}

// TestBatcherBytes: a batch closes at its byte bound too, whatever its
// item limit allows, so that a batch of large items stays under the peer
// server's receive limit. (The bound is lowered here to two requests'
// worth; MaxForwardBytes is checked against MaxMessageBytes below.)
func TestBatcherBytes(t *testing.T) {
	if MaxForwardBytes+MaxRequestItems*(maxItemBytes) > MaxMessageBytes {
		t.Fatalf("a full batch plus one request (%d bytes) exceeds MaxMessageBytes", MaxForwardBytes+MaxRequestItems*maxItemBytes)
	}
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{t0: time.Now()}
		b := newBatcher(time.Hour, 100, maxInFlight, f.send, prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}))
		b.maxBytes = 2 * proto.Size(check("0", 4))
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- b.run(ctx) }()
		errs := make(chan error, 3)
		for i := range 3 {
			go func() {
				_, err := b.do(t.Context(), check(fmt.Sprint(i), 4))
				errs <- err
			}()
			synctest.Wait()
		}
		got, _ := f.sent()
		if len(got) != 1 || !slices.Equal(got[0].items, []int{4, 4}) {
			t.Errorf("batches = %v, want one of [4 4] sent at its byte bound", got)
		}
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		answered := 0
		for range 3 {
			if err := <-errs; err == nil {
				answered++
			} else if !errors.Is(err, ErrClosed) {
				t.Error(err)
			}
		}
		if answered != 2 {
			t.Errorf("%d callers answered, want the 2 sent", answered)
		}
	})
}

// maxItemBytes is the most a valid check item takes encoded: a name
// of 256 bytes, a key of 1,024, and ten fields of at most 11 bytes each.
const maxItemBytes = 3 + 256 + 3 + 1024 + 10*11
