package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// config is what one run of the program measures, and where it writes.
type config struct {
	RLNode      string        // the rlnode binary
	Before      string        // an earlier rlnode build, whose client runs as mode client-before; "" for none
	RedisServer string        // the redis-server binary
	Out         string        // directory for results.json and the PNGs
	From        string        // a results.json to draw from, instead of measuring
	Concurrency []int         // concurrent callers at each step, ascending
	Modes       []mode        // the ways of asking to measure, in legend order
	Duration    time.Duration // each run's longest
	Rounds      int           // runs of each mode at each level; the median is drawn
	Warmup      time.Duration // each mode's unrecorded run before the first level; 0 for none
	BenchWarmup time.Duration // each rlnode bench run's unrecorded load before its clock starts (--warmup); 0 for none
	Count       int64         // each run's most calls
	Keys        int           // distinct keys bench:0 .. bench:<Keys-1>
	Timeout     time.Duration // one call's longest
}

// parseConfig reads the flags in args; usage and errors go to output.
func parseConfig(args []string, output io.Writer) (config, error) {
	fs := flag.NewFlagSet("plots", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		fmt.Fprint(output, `Usage: go run . -rlnode PATH [flags]

Starts one rlnode and one redis-server on free loopback ports, measures
checks per second and p99 latency at each -concurrency through the Go
client's Allow, raw gRPC, HTTP (rlnode bench --json), CL.THROTTLE on the
node's RESP port (go-redis) and go-redis/redis_rate,
and writes results.json, checks-per-second.png and p99.png to -out.

Flags:
`)
		fs.PrintDefaults()
	}
	var c config
	fs.StringVar(&c.RLNode, "rlnode", "", "the rlnode binary to start, and to run rlnode bench with (required unless -from)")
	fs.StringVar(&c.Before, "before", "", "an earlier rlnode build: its rlnode bench --client runs too, against the same node, as mode client-before (a client change's before and after in one run)")
	fs.StringVar(&c.RedisServer, "redis-server", "redis-server", "the redis-server binary (apt-get install redis-server)")
	fs.StringVar(&c.Out, "out", "../../docs/bench", "directory for results.json and the charts")
	fs.StringVar(&c.From, "from", "", "draw the charts from this results.json instead of measuring")
	levels := fs.String("concurrency", "1,2,4,8,16,32,64", "comma-separated concurrent callers, one run of each mode at each")
	names := fs.String("modes", "", "comma-separated modes to measure (results.json's names); default all, client-before only with -before")
	fs.DurationVar(&c.Duration, "duration", time.Second, "each run stops after this long")
	fs.IntVar(&c.Rounds, "rounds", 3, "runs of each mode at each level, in turn with the other modes'; the charts show the run of median checks/s")
	fs.DurationVar(&c.Warmup, "warmup", time.Second, "each mode runs once for this long, unrecorded, before the first level (0: no warm-up)")
	fs.DurationVar(&c.BenchWarmup, "bench-warmup", 100*time.Millisecond, "each rlnode bench run first runs its load for this long, unrecorded (its --warmup), so that its new process starts the clock with its connections open, as the Redis loads' are (0: none, for a -before build without --warmup)")
	fs.Int64Var(&c.Count, "count", 1_000_000, "each run stops after this many calls")
	fs.IntVar(&c.Keys, "keys", 10_000, "distinct keys")
	fs.DurationVar(&c.Timeout, "timeout", 5*time.Second, "give up on one call after this long")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var err error
	if c.Concurrency, err = parseLevels(*levels); err != nil {
		return config{}, fmt.Errorf("-concurrency: %w", err)
	}
	if c.Modes, err = parseModes(*names, c.Before != ""); err != nil {
		return config{}, fmt.Errorf("-modes: %w", err)
	}
	switch {
	case c.From == "" && c.RLNode == "":
		return config{}, errors.New("-rlnode: no binary given (make plots builds one)")
	case c.Duration <= 0:
		return config{}, fmt.Errorf("-duration: %v, want > 0", c.Duration)
	case c.Rounds < 1 || c.Rounds > maxRounds:
		return config{}, fmt.Errorf("-rounds: %d, want 1 to %d", c.Rounds, maxRounds)
	case c.Warmup < 0:
		return config{}, fmt.Errorf("-warmup: %v, want >= 0", c.Warmup)
	case c.BenchWarmup < 0:
		return config{}, fmt.Errorf("-bench-warmup: %v, want >= 0", c.BenchWarmup)
	case c.Count <= 0 || c.Count > maxCount:
		return config{}, fmt.Errorf("-count: %d, want 1 to %d", c.Count, maxCount)
	case c.Keys <= 0:
		return config{}, fmt.Errorf("-keys: %d, want > 0", c.Keys)
	case c.Timeout <= 0:
		return config{}, fmt.Errorf("-timeout: %v, want > 0", c.Timeout)
	case c.Out == "":
		return config{}, errors.New("-out: empty directory")
	}
	return c, nil
}

// maxCount bounds a run's calls, and so the memory of the Redis load,
// which keeps every call's latency: 8 bytes a call.
const maxCount = 10_000_000

// maxRounds bounds the runs of a mode at a level.
const maxRounds = 100

// maxLevel bounds a concurrency level: each caller is a goroutine and a
// connection, and rlnode bench's own workers are as many.
const maxLevel = 4096

// parseLevels parses a comma-separated list of concurrency levels, each
// 1 to maxLevel, and returns them ascending, without repeats.
func parseLevels(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > maxLevel {
			return nil, fmt.Errorf("%q, want a number from 1 to %d", f, maxLevel)
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// parseModes parses a comma-separated list of mode names and returns
// those modes in legend order; "" means every mode, but client-before
// unless before (a -before build is given). client-before needs one.
func parseModes(s string, before bool) ([]mode, error) {
	var out []mode
	if s == "" {
		for _, m := range modes {
			if !m.Before || before {
				out = append(out, m)
			}
		}
		return out, nil
	}
	var want []string
	for f := range strings.SplitSeq(s, ",") {
		name := strings.TrimSpace(f)
		i := slices.IndexFunc(modes, func(m mode) bool { return m.Name == name })
		switch {
		case i < 0:
			return nil, fmt.Errorf("%q, want some of %s", name, modeNames(modes))
		case modes[i].Before && !before:
			return nil, fmt.Errorf("%q needs -before", name)
		}
		want = append(want, name)
	}
	for _, m := range modes {
		if slices.Contains(want, m.Name) {
			out = append(out, m)
		}
	}
	return out, nil
}

// modeNames is the names of ms, comma-separated.
func modeNames(ms []mode) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name
	}
	return strings.Join(names, ",")
}
