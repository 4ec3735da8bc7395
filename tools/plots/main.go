// Command plots measures one rlnode and a Redis+Lua limiter on this
// machine at rising concurrency and draws checks per second and p99
// latency against the number of concurrent callers, one line per way of
// asking (the Go client's Allow, raw gRPC and HTTP, CL.THROTTLE on the
// RESP port, go-redis/redis_rate), as PNG charts for BENCHMARKS.md and
// docs/bench/client.md. The ringlimit figures come from `rlnode bench
// --json`, run as a subprocess, so that the tool depends on the report's
// documented keys only; the Redis and RESP loads it drives itself, in the
// same shape (N callers, keys drawn from 10,000, limits that admit every
// check, runs bounded in count and time). Raw reports go to results.json,
// from which -from redraws the charts. It is its own module, so that the
// plotting library stays out of the product's go.mod.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := plots(ctx, os.Args[1:], os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return // -help: the usage is printed
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "plots:", err)
		os.Exit(1)
	}
}

// plots measures (or, with -from, reads) the results and writes them and
// the charts to the -out directory. Every process it starts has stopped
// when it returns, whether it succeeded, failed or ctx was cancelled.
func plots(ctx context.Context, args []string, log io.Writer) error {
	conf, err := parseConfig(args, log)
	if err != nil {
		return err
	}
	var res results
	if conf.From != "" {
		if res, err = readResults(conf.From); err != nil {
			return err
		}
	} else {
		if res, err = measure(ctx, conf, log); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(conf.Out, 0o755); err != nil {
		return err
	}
	if conf.From == "" {
		if err := writeResults(filepath.Join(conf.Out, "results.json"), res); err != nil {
			return err
		}
	}
	if err := drawCharts(res, conf.Out); err != nil {
		return err
	}
	fmt.Fprintf(log, "wrote %s\n", conf.Out)
	return nil
}
