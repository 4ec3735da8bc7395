// Command rlnode is a ringlimit node, and the clients that talk to one.
//
//	rlnode [flags]            serve (no flags: a one-node cluster on the default ports)
//	rlnode check [flags]      ask a node whether a request may go ahead
//	rlnode members [flags]    list a node's view of the cluster
//	rlnode bench [flags]      measure a node or cluster with a bounded load
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) { // -h printed the usage already
		fmt.Fprintln(os.Stderr, "rlnode:", err)
		os.Exit(1)
	}
}

// run dispatches to a subcommand, or serves.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "check":
			return runCheck(ctx, args[1:], stdout, stderr)
		case "members":
			return runMembers(ctx, args[1:], stdout, stderr)
		case "bench":
			return runBench(ctx, args[1:], stdout, stderr)
		case "policy":
			return runPolicy(args[1:], stdout)
		}
	}
	conf, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(conf.LogLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	return serve(ctx, conf, log, nil)
}
