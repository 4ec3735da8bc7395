package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"slices"
)

// command is a subcommand as usage lists it.
type command struct{ name, summary string }

// commands are rlnode's subcommands, in the order usage lists them.
func commands() []command {
	return []command{
		{"check", "ask a node whether a request may go ahead, or reserve and settle (exit 0 allowed, 1 refused, 2 error)"},
		{"members", "list a node's view of the cluster"},
		{"top", "who is being limited: the hottest and most refused keys across the cluster, live"},
		{"bench", "measure a node or cluster with a bounded load"},
		{"bench-rlqs", "simulated Envoys on one quota bucket of a cluster: admissions a second against the limit"},
		{"policy", "policy files: `rlnode policy check PATH` validates them offline"},
		{"help", "say how to use rlnode, or one command: rlnode help check"},
		{"version", "print the build: module version, VCS revision and time, Go version"},
	}
}

// writeUsage writes rlnode's usage to fs's output: the commands, then
// the serving flags fs defines. It is the serving flag set's Usage.
func writeUsage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprint(w, `rlnode is a ringlimit node, and the clients that talk to one.

Usage:
  rlnode [flags]              serve (no flags: a one-node cluster on the default ports)
  rlnode <command> [flags]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Exit status: 0 on success, 1 when rlnode check was refused (OVER_LIMIT) or
rlnode policy check found the files invalid, 2 on any other error (bad
usage, invalid input, an unreachable node, a failed server).
`)
	fmt.Fprintln(w, "\nFlags for serving (each also an RLNODE_* variable: --http-addr is RLNODE_HTTP_ADDR):")
	fs.PrintDefaults()
}

// withUsage makes text, then the flags, fs's usage: what -h prints.
func withUsage(fs *flag.FlagSet, text string) {
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), text)
		fs.PrintDefaults()
	}
}

// runHelp is `rlnode help [command]`: the usage, or a command's, on stdout.
func runHelp(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) == 0 {
		// The serving flags print through parseConfig's usage, which is
		// writeUsage.
		_, err := parseConfig([]string{"-h"}, getenv, stdout)
		return err
	}
	name := args[0]
	if !slices.ContainsFunc(commands(), func(c command) bool { return c.name == name }) {
		return fmt.Errorf("help: unknown command %q (rlnode help lists them)", name)
	}
	if name == "help" || name == "version" {
		return runHelp(ctx, nil, getenv, stdout)
	}
	return run(ctx, []string{name, "-h"}, getenv, stdout, stdout)
}

// writeVersion is `rlnode version`: the build information the Go toolchain
// recorded in the binary.
func writeVersion(w io.Writer) error {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		_, err := fmt.Fprintln(w, "rlnode: no build information (not built with module support)")
		return err
	}
	_, err := io.WriteString(w, formatVersion(bi))
	return err
}

// formatVersion says which rlnode bi is: its module version ("(devel)"
// when built from a checkout), the VCS revision, its time and whether the
// tree had local changes, and the Go version.
func formatVersion(bi *debug.BuildInfo) string {
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	version := bi.Main.Version
	if version == "" {
		version = "(unknown)"
	}
	s := fmt.Sprintf("rlnode %s\n  module    %s\n", version, bi.Main.Path)
	for _, kv := range []struct{ label, key string }{
		{"revision", "vcs.revision"}, {"time", "vcs.time"}, {"modified", "vcs.modified"},
	} {
		if v, ok := settings[kv.key]; ok {
			s += fmt.Sprintf("  %-9s %s\n", kv.label, v)
		}
	}
	return s + fmt.Sprintf("  go        %s\n", bi.GoVersion)
}
