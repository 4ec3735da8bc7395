package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/ringlimit/ringlimit/policy"
)

// policyUsage is `rlnode policy check -h`.
const policyUsage = `Usage: rlnode policy check PATH

Loads the policy files at PATH (a YAML file, or a directory of *.yaml and
*.yml files) as a node would, lists their policies, and fails with the
first error (file:line: field: reason), for CI pipelines. A directory
without policy files, and files that hold no policy (no rate_limit), fail
too: a mistyped path must not pass.

Exit status: 0 the policies are valid, 1 they are not (or there are none),
2 bad usage.
`

// errPolicyUsage is the error of `rlnode policy` used wrongly.
var errPolicyUsage = errors.New("usage: rlnode policy check PATH (a YAML file or a directory of them; rlnode help policy says more)")

// runPolicy is `rlnode policy check PATH`: it loads a policy file or
// directory as a node would, prints the policies, and fails with the
// first error (file:line: field: reason), for CI pipelines. What it finds
// wrong in the files is invalid (exit 1); bad usage is an error (exit 2).
func runPolicy(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rlnode policy check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), policyUsage) }
	switch {
	case len(args) > 0 && args[0] == "check":
		args = args[1:]
	case len(args) == 0 || !isHelpFlag(args[0]):
		return errPolicyUsage
	}
	if err := parseFlags(fs, args, 1); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w; %w", err, errPolicyUsage)
	}
	if fs.NArg() != 1 {
		return errPolicyUsage
	}
	path := fs.Arg(0)
	set, err := policy.Load(path)
	if err != nil {
		return invalid{err}
	}
	if len(set.Policies()) == 0 {
		return invalid{fmt.Errorf("%s: no policy: its %d domain(s) set no rate_limit", path, len(set.Domains()))}
	}
	w := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(w, "POLICY\tLIMIT\tAT")
	for _, p := range set.Policies() {
		fmt.Fprintf(w, "%s\t%s\t%s:%d\n", p.Ref, p.Limit, p.File, p.Line)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s: OK, %d policies\n", path, len(set.Policies()))
	return err
}
