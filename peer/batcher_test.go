package peer

import (
	"cmp"
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
	"github.com/ringlimit/ringlimit/checks"
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

// compareSent orders batches by time, then by their requests' sizes.
func compareSent(a, b sent) int {
	return cmp.Or(cmp.Compare(a.at, b.at), slices.Compare(a.items, b.items))
}

func sameSent(a, b sent) bool { return compareSent(a, b) == 0 }

// fakePeer records batches. Each send takes latency (virtual time in a
// bubble) before it answers, or ends with its ctx.
type fakePeer struct {
	t0      time.Time
	latency time.Duration

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
	select {
	case <-time.After(f.latency):
		return echo(reqs), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (f *fakePeer) sent() ([]sent, [][]string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.batches), slices.Clone(f.keys)
}

// newTestBatcher returns a batcher that sends to f, with the Pool's bounds
// on batches in flight and their bytes.
func newTestBatcher(wait time.Duration, limit int, f *fakePeer) *batcher {
	return newBytesBatcher(wait, limit, MaxForwardBytes, f)
}

// newBytesBatcher is newTestBatcher with a bound of maxBytes bytes.
func newBytesBatcher(wait time.Duration, limit, maxBytes int, f *fakePeer) *batcher {
	return newBatcher(wait, limit, maxBytes, f.send, prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x"}))
}

// startBatcher runs b in the current bubble until the test's cleanup.
func startBatcher(t *testing.T, b *batcher) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run returned %v, want nil", err)
		}
	})
	return cancel
}

// ask starts a caller that sends b a request of n items with the given
// key, and puts on errs its error, or an error if it got another's answer.
func ask(ctx context.Context, b *batcher, key string, n int, errs chan<- error) {
	go func() {
		resp, err := b.do(ctx, check(key, n))
		if err == nil && keyOf(resp) != key {
			err = fmt.Errorf("caller %s got the answer for %s", key, keyOf(resp))
		}
		errs <- err
	}()
}

// TestBatcherTimeline checks when batches leave, against a virtual clock:
// each arrival is a caller sending a request of the given size at the given
// time after t0, and the peer answers each batch latency after it left.
func TestBatcherTimeline(t *testing.T) {
	const wait = time.Millisecond
	type arrival struct {
		at    time.Duration
		items int
	}
	tests := []struct {
		name     string
		limit    int
		latency  time.Duration
		arrivals []arrival
		want     []sent
	}{{
		name:     "lone request goes at once",
		limit:    10,
		latency:  wait / 2,
		arrivals: []arrival{{0, 1}},
		want:     []sent{{0, []int{1}}},
	}, {
		name:     "requests apart each go at once",
		limit:    10,
		latency:  wait / 4,
		arrivals: []arrival{{0, 1}, {wait / 2, 1}},
		want:     []sent{{0, []int{1}}, {wait / 2, []int{1}}},
	}, {
		name:     "requests during a flight leave together when it returns",
		limit:    10,
		latency:  wait / 2,
		arrivals: []arrival{{0, 1}, {wait / 8, 1}, {wait / 4, 2}},
		want:     []sent{{0, []int{1}}, {wait / 2, []int{1, 2}}},
	}, {
		name:     "batch wait sends while a batch is still in flight",
		limit:    10,
		latency:  2 * wait,
		arrivals: []arrival{{0, 1}, {wait / 4, 1}},
		want:     []sent{{0, []int{1}}, {wait * 5 / 4, []int{1}}},
	}, {
		name:     "a return with another still in flight sends nothing",
		limit:    10,
		latency:  2 * wait,
		arrivals: []arrival{{0, 1}, {wait / 4, 1}, {wait * 3 / 2, 1}},
		want:     []sent{{0, []int{1}}, {wait * 5 / 4, []int{1}}, {wait * 5 / 2, []int{1}}},
	}, {
		name:     "full batch leaves at once",
		limit:    3,
		latency:  wait,
		arrivals: []arrival{{0, 1}, {0, 1}, {0, 1}, {0, 1}},
		want:     []sent{{0, []int{1}}, {0, []int{1, 1, 1}}},
	}, {
		name:     "limit counts items, not requests",
		limit:    10,
		latency:  wait / 2,
		arrivals: []arrival{{0, 4}, {0, 4}, {0, 4}, {0, 4}},
		want:     []sent{{0, []int{4}}, {0, []int{4, 4}}, {wait / 2, []int{4}}},
	}, {
		name:     "request over the limit goes alone and at once",
		limit:    10,
		latency:  wait / 2,
		arrivals: []arrival{{0, 1}, {0, 15}},
		want:     []sent{{0, []int{1}}, {0, []int{15}}},
	}, {
		name:     "at most maxInFlight (4) batches in flight",
		limit:    1,
		latency:  wait,
		arrivals: []arrival{{0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}},
		want:     []sent{{0, []int{1}}, {0, []int{1}}, {0, []int{1}}, {0, []int{1}}, {wait, []int{1}}, {wait, []int{1}}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := &fakePeer{t0: time.Now(), latency: tt.latency}
				b := newTestBatcher(wait, tt.limit, f)
				startBatcher(t, b)
				errs := make(chan error, len(tt.arrivals))
				for i, a := range tt.arrivals {
					time.Sleep(a.at - time.Since(f.t0))
					ask(t.Context(), b, fmt.Sprint(i), a.items, errs)
					synctest.Wait() // the caller is in the batcher, in order
				}
				for range tt.arrivals {
					if err := <-errs; err != nil {
						t.Error(err)
					}
				}
				got, _ := f.sent()
				// Batches that leave at the same instant may reach the
				// peer in either order.
				slices.SortFunc(got, compareSent)
				slices.SortFunc(tt.want, compareSent)
				if !slices.EqualFunc(got, tt.want, sameSent) {
					t.Errorf("batches = %v, want %v", got, tt.want)
				}
			})
		})
	}
}

// TestBatcherCallerLeaves: a gathered caller whose context ends returns at
// once and is not sent.
func TestBatcherCallerLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{t0: time.Now(), latency: time.Second}
		b := newTestBatcher(time.Hour, 2, f)
		startBatcher(t, b)
		errs := make(chan error, 2)
		ask(t.Context(), b, "x", 1, errs) // in flight for a second
		synctest.Wait()

		ctx, cancel := context.WithCancel(t.Context())
		errA := make(chan error, 1)
		ask(ctx, b, "a", 1, errA) // gathered behind x
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

		// b fills the batch, which leaves at once with only b, since a has left.
		ask(t.Context(), b, "b", 1, errs)
		for range 2 {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		if _, keys := f.sent(); !slices.EqualFunc(keys, [][]string{{"x"}, {"b"}}, slices.Equal) {
			t.Errorf("sent %v, want [[x] [b]]", keys)
		}
	})
}

func TestBatcherStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{t0: time.Now(), latency: time.Hour}
		b := newTestBatcher(time.Hour, 2, f)
		stop := startBatcher(t, b)
		errs := make(chan error, 4)
		for _, key := range []string{"a", "b", "c", "d"} { // a, then b and c, in flight; d gathered
			ask(t.Context(), b, key, 1, errs)
			synctest.Wait()
		}
		if got, _ := f.sent(); len(got) != 2 {
			t.Fatalf("batches in flight = %v, want [a] and [b c]", got)
		}
		stop()
		synctest.Wait()
		for range 4 {
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

// TestBatcherRetire: retiring fails the gathered calls and refuses later
// ones; the batch in flight still gets its answer.
func TestBatcherRetire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakePeer{t0: time.Now(), latency: time.Second}
		b := newTestBatcher(time.Hour, 10, f)
		startBatcher(t, b)
		inFlight, pending := make(chan error, 1), make(chan error, 1)
		ask(t.Context(), b, "x", 1, inFlight)
		synctest.Wait()
		ask(t.Context(), b, "a", 1, pending)
		synctest.Wait()
		errGone := errors.New("gone")
		b.Close(errGone)
		if err := <-pending; !errors.Is(err, errGone) {
			t.Errorf("pending caller got %v, want %v", err, errGone)
		}
		if _, err := b.do(t.Context(), check("b", 1)); !errors.Is(err, errGone) {
			t.Errorf("later caller got %v, want %v", err, errGone)
		}
		if err := <-inFlight; err != nil {
			t.Errorf("caller in flight got %v, want its answer", err)
		}
		if _, keys := f.sent(); !slices.EqualFunc(keys, [][]string{{"x"}}, slices.Equal) {
			t.Errorf("sent %v, want only [[x]], sent before retiring", keys)
		}
	})
}

// TestBatcherBytes: a batch closes at its byte bound too, whatever its
// item limit allows, so that a batch of large items stays under the peer
// server's receive limit. (The bound is lowered here to two requests'
// worth; MaxForwardBytes is checked against MaxMessageBytes below.)
func TestBatcherBytes(t *testing.T) {
	if MaxForwardBytes+checks.MaxItems*(maxItemBytes) > MaxMessageBytes {
		t.Fatalf("a full batch plus one request (%d bytes) exceeds MaxMessageBytes", MaxForwardBytes+checks.MaxItems*maxItemBytes)
	}
	synctest.Test(t, func(t *testing.T) {
		const latency = time.Millisecond
		f := &fakePeer{t0: time.Now(), latency: latency}
		b := newBytesBatcher(time.Hour, 100, 2*proto.Size(check("0", 4)), f)
		startBatcher(t, b)
		errs := make(chan error, 4)
		for i := range 4 { // 0 in flight; 1 and 2 reach the byte bound; 3 waits for 0's return
			ask(t.Context(), b, fmt.Sprint(i), 4, errs)
			synctest.Wait()
		}
		for range 4 {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
		got, _ := f.sent()
		want := []sent{{0, []int{4}}, {0, []int{4, 4}}, {latency, []int{4}}}
		if !slices.EqualFunc(got, want, sameSent) {
			t.Errorf("batches = %v, want %v", got, want)
		}
	})
}

// maxItemBytes is the most a valid check item takes encoded: a name
// of 256 bytes, a key of 1,024, eleven fields of at most 11 bytes each,
// and a parent (a key of 256 bytes and two fields).
const maxItemBytes = 3 + 256 + 3 + 1024 + 11*11 + 3 + 3 + 256 + 2*11
