// Command rlnode is a ringlimit node, and the clients that talk to one.
//
//	rlnode [flags]            serve (no flags: a one-node cluster on the default ports)
//	rlnode check [flags]      ask a node whether a request may go ahead
//	rlnode members [flags]    list a node's view of the cluster
//	rlnode top [flags]        who is being limited, live
//	rlnode bench [flags]      measure a node or cluster with a bounded load
//	rlnode bench-rlqs [flags] simulated Envoys on one quota bucket
//	rlnode policy check PATH  validate policy files offline
//	rlnode help [command]     say how to use rlnode, or a command
//	rlnode help flags         list every serving flag, by group
//	rlnode version            print the build: module version, VCS revision, Go version
//
// Exit status: 0 on success, 1 when `rlnode check` was refused or
// `rlnode policy check` found the files invalid, 2 on any other error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	// The first signal starts an orderly stop, at whatever stage the node
	// is; a second one ends the process at once, as signals do by default.
	context.AfterFunc(ctx, stop)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// errRefused is what `rlnode check` returns, after printing its verdict,
// when the check was refused, so that its exit status tells scripts.
var errRefused = errors.New("refused")

// invalid is a command's verdict that what it was given to check is
// wrong, as `rlnode policy check` says of a broken policy file: exit
// status 1, with its message, where an error of the command's use or run
// exits 2.
type invalid struct{ err error }

func (e invalid) Error() string { return e.err.Error() }
func (e invalid) Unwrap() error { return e.err }

// exitCode is the exit status for run's error, which it reports on stderr
// unless the user asked for help or a verdict was already printed.
func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp): // -h printed the usage already
		return 0
	case errors.Is(err, errRefused):
		return 1
	case errors.As(err, new(invalid)):
		fmt.Fprintln(stderr, "rlnode:", err)
		return 1
	}
	fmt.Fprintln(stderr, "rlnode:", err)
	return 2
}

// run dispatches to a subcommand, or serves.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "help", "-h", "-help", "--help":
			return runHelp(ctx, args[1:], getenv, stdout)
		case "version", "-version", "--version":
			switch {
			case len(args) == 2 && isHelpFlag(args[1]):
				_, err := io.WriteString(stdout, "Usage: rlnode version\n\nPrints the build: module version, VCS revision and time, Go version.\n")
				return err
			case len(args) > 1:
				return fmt.Errorf("version: unexpected argument %q (rlnode version takes none)", args[1])
			}
			return writeVersion(stdout)
		case "check":
			return runCheck(ctx, args[1:], stdout, stderr)
		case "members":
			return runMembers(ctx, args[1:], stdout, stderr)
		case "top":
			return runTop(ctx, args[1:], stdout, stderr)
		case "bench":
			return runBench(ctx, args[1:], stdout, stderr)
		case "bench-rlqs":
			return runRLQSBench(ctx, args[1:], stdout, stderr)
		case "policy":
			return runPolicy(args[1:], stdout, stderr)
		}
		if !strings.HasPrefix(args[0], "-") {
			return unknownCommand(args[0])
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
	// The memory limit is the process's, so it is set here, where the
	// process starts, rather than by serve, which tests run several of.
	limit, source, err := memoryLimit(conf.MemoryLimit, getenv, os.ReadFile)
	if err != nil {
		return err
	}
	if limit > 0 {
		debug.SetMemoryLimit(limit)
	}
	// The node holds its counters and requests within the limit in force,
	// whichever set it (see node.Config.MemoryLimit).
	if limit = debug.SetMemoryLimit(-1); limit < math.MaxInt64 {
		conf.Config.MemoryLimit = limit
	}
	log.Info("memory limit", "bytes", limit, "from", source)
	return serve(ctx, conf, log, nil)
}
