package algorithms_test

import (
	"fmt"
	"time"

	"github.com/ringlimit/ringlimit/algorithms"
)

func ExampleTokenBucket_Take() {
	l := algorithms.Limit{Count: 2, Period: time.Second} // burst 2, then one per 500ms
	var b algorithms.TokenBucket
	now := time.Unix(0, 0)
	for _, at := range []time.Duration{0, 0, 0, 500 * time.Millisecond} {
		d := b.Take(now.Add(at), l, 1)
		fmt.Printf("%v: allowed %v, remaining %d, retry after %v\n", at, d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// 0s: allowed true, remaining 1, retry after 0s
	// 0s: allowed true, remaining 0, retry after 0s
	// 0s: allowed false, remaining 0, retry after 500ms
	// 500ms: allowed true, remaining 0, retry after 0s
}

func ExampleGCRA_Take() {
	l := algorithms.Limit{Count: 2, Period: time.Second}
	var g algorithms.GCRA
	now := time.Unix(0, 0)
	for range 3 {
		d := g.Take(now, l, 1)
		fmt.Printf("allowed %v, remaining %d, retry after %v\n", d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// allowed true, remaining 1, retry after 0s
	// allowed true, remaining 0, retry after 0s
	// allowed false, remaining 0, retry after 500ms
}

// Callers of a leaky bucket wait Delay before proceeding, so that a burst
// leaves evenly spaced.
func ExampleLeakyBucket_Take() {
	l := algorithms.Limit{Count: 10, Period: time.Second, Burst: 5}
	var q algorithms.LeakyBucket
	now := time.Unix(0, 0)
	for range 6 {
		d := q.Take(now, l, 1)
		fmt.Printf("allowed %v, delay %v, retry after %v\n", d.Allowed, d.Delay, d.RetryAfter)
	}
	// Output:
	// allowed true, delay 0s, retry after 0s
	// allowed true, delay 100ms, retry after 0s
	// allowed true, delay 200ms, retry after 0s
	// allowed true, delay 300ms, retry after 0s
	// allowed true, delay 400ms, retry after 0s
	// allowed false, delay 0s, retry after 100ms
}

func ExampleFixedWindow_Take() {
	l := algorithms.Limit{Count: 2, Period: time.Minute}
	var w algorithms.FixedWindow
	noon := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, at := range []time.Duration{50 * time.Second, 55 * time.Second, 58 * time.Second, 61 * time.Second} {
		d := w.Take(noon.Add(at), l, 1)
		fmt.Printf("%s allowed %v, retry after %v, reset after %v\n",
			noon.Add(at).Format(time.TimeOnly), d.Allowed, d.RetryAfter, d.ResetAfter)
	}
	// Output:
	// 12:00:50 allowed true, retry after 0s, reset after 10s
	// 12:00:55 allowed true, retry after 0s, reset after 5s
	// 12:00:58 allowed false, retry after 2s, reset after 2s
	// 12:01:01 allowed true, retry after 0s, reset after 59s
}

func ExampleSlidingWindow_Take() {
	l := algorithms.Limit{Count: 100, Period: time.Minute}
	var w algorithms.SlidingWindow
	noon := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	w.Take(noon, l, 100)
	// 15 s into the next window, the previous window's 100 hits still
	// weigh 100·45/60 = 75.
	d := w.Take(noon.Add(75*time.Second), l, 25)
	fmt.Printf("allowed %v, remaining %d\n", d.Allowed, d.Remaining)
	// Output:
	// allowed true, remaining 0
}

func ExampleSlidingLog_Take() {
	l := algorithms.Limit{Count: 2, Period: time.Minute}
	var s algorithms.SlidingLog
	noon := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, at := range []time.Duration{50 * time.Second, 55 * time.Second, 61 * time.Second, 111 * time.Second} {
		d := s.Take(noon.Add(at), l, 1)
		fmt.Printf("t+%v allowed %v, retry after %v\n", at, d.Allowed, d.RetryAfter)
	}
	// Output:
	// t+50s allowed true, retry after 0s
	// t+55s allowed true, retry after 0s
	// t+1m1s allowed false, retry after 49s
	// t+1m51s allowed true, retry after 0s
}

// A request charged against several limits must pass all or none: Check
// them all, then Take only if every one allows it.
func ExampleGCRA_Check() {
	perSecond := algorithms.Limit{Count: 5, Period: time.Second}
	perMinute := algorithms.Limit{Count: 6, Period: time.Minute}
	var second, minute algorithms.GCRA
	now := time.Unix(0, 0)
	for i := range 8 {
		now = now.Add(300 * time.Millisecond)
		if second.Check(now, perSecond, 1).Allowed && minute.Check(now, perMinute, 1).Allowed {
			second.Take(now, perSecond, 1)
			minute.Take(now, perMinute, 1)
			fmt.Println(i, "allowed")
		} else {
			fmt.Println(i, "refused")
		}
	}
	// Output:
	// 0 allowed
	// 1 allowed
	// 2 allowed
	// 3 allowed
	// 4 allowed
	// 5 allowed
	// 6 refused
	// 7 refused
}

// A SlidingLog is serialised as its entries and rebuilt with Append.
func ExampleSlidingLog_Entries() {
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	var s algorithms.SlidingLog
	s.Take(time.Unix(100, 0), l, 2)
	s.Take(time.Unix(130, 0), l, 1)

	var words []int64
	for ts, n := range s.Entries() {
		words = append(words, ts, n)
	}
	var copied algorithms.SlidingLog
	for i := 0; i < len(words); i += 2 {
		copied.Append(words[i], words[i+1])
	}
	fmt.Println(words)
	fmt.Println(copied.Check(time.Unix(140, 0), l, 0).Remaining)
	// Output:
	// [100000000000 2 130000000000 1]
	// 7
}

// A reservation takes an estimate up front and gives back what the work
// did not use: here 1,000 tokens reserved, 400 spent.
func ExampleTokenBucket_GiveBack() {
	l := algorithms.Limit{Count: 20_000, Period: time.Minute}
	var b algorithms.TokenBucket
	now := time.Unix(0, 0)
	fmt.Println(b.Take(now, l, 1000).Remaining)
	b.GiveBack(now, now, l, 1000, 1000-400)
	fmt.Println(b.Check(now, l, 0).Remaining)
	b.GiveBack(now, now, l, 1000, 1000) // the rest: never above capacity
	fmt.Println(b.Check(now, l, 0).Remaining)
	// Output:
	// 19000
	// 19600
	// 20000
}

// A fixed window takes hits back only into the window they were counted
// in: once it has ended, they went with it.
func ExampleFixedWindow_GiveBack() {
	l := algorithms.Limit{Count: 10, Period: time.Minute}
	var w algorithms.FixedWindow
	t0 := time.Unix(0, 0)
	w.Take(t0, l, 6)
	w.GiveBack(t0, t0, l, 6, 4)
	fmt.Println(w.Check(t0, l, 0).Remaining)
	next := t0.Add(time.Minute)
	w.Take(next, l, 3)
	w.GiveBack(next, t0, l, 6, 2) // taken in the window before: nothing to give
	fmt.Println(w.Check(next, l, 0).Remaining)
	// Output:
	// 8
	// 7
}
