package main

import (
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/ringlimit/ringlimit/policy"
)

// runPolicy is `rlnode policy check PATH`: it loads a policy file or
// directory as a node would, prints the policies, and fails with the
// first error (file:line: field: reason), for CI pipelines.
func runPolicy(args []string, stdout io.Writer) error {
	if len(args) != 2 || args[0] != "check" {
		return errors.New("usage: rlnode policy check PATH (a YAML file or a directory of them)")
	}
	set, err := policy.Load(args[1])
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(w, "POLICY\tLIMIT\tAT")
	for _, p := range set.Policies() {
		fmt.Fprintf(w, "%s\t%s\t%s:%d\n", p.Ref, p.Limit, p.File, p.Line)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s: OK, %d policies\n", args[1], len(set.Policies()))
	return err
}
