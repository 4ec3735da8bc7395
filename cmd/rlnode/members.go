package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/internal/nodeport"
	"github.com/ringlimit/ringlimit/loadgen"
)

// runMembers is `rlnode members`: a node's view of the cluster as a table.
func runMembers(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rlnode members", flag.ContinueOnError)
	fs.SetOutput(stderr)
	withUsage(fs, `Usage: rlnode members [--addr HOST:PORT] [--tls-ca FILE ...]

Prints a node's view of the cluster: each member's name, state, gRPC and
gossip addresses, and share of the ring, from its GET /v1/members (a
member alive in gossip that the node does not admit to its ring is "not
admitted", with the reason below the table); and
the replicas of other nodes' counters each alive member holds, from its
own GET /metrics (ringlimit_replicas; "-" when it cannot be read).
--addr is the node's HTTP port (its --http-addr), where rlnode check
takes its gRPC port.
`)
	addr := fs.String("addr", "localhost:8080", "HTTP address of a node (its --http-addr)")
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this long")
	tlsFlags := addClientTLS(fs)
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	n, err := loadgen.NewNode(*addr, tlsFlags.config())
	if err != nil {
		return err
	}
	defer n.Close()
	ms, err := n.Members(ctx)
	if err != nil {
		if err := wrongPort(ctx, err, "rlnode members", *addr, nodeport.HTTP, tlsFlags.config()); errors.Is(err, nodeport.ErrWrongPort) {
			return err
		}
		return fmt.Errorf("members: %w", err)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tSTATE\tGRPC\tGOSSIP\tSHARE\tREPLICAS")
	var notes []string
	for _, m := range ms {
		name, state := m.Name, m.State
		if m.Self {
			name += " (self)"
		}
		if m.Admission != "" {
			// Alive in gossip, not in this node's ring: the reason, long,
			// goes below the table.
			state = "not admitted"
			notes = append(notes, m.Name+": "+m.Admission)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.1f%%\t%s\n", name, state, m.GRPCAddr, m.GossipAddr, 100*m.Share,
			replicasOf(ctx, m, tlsFlags.config()))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintln(stdout, n)
	}
	return nil
}

// replicasOf returns how many replicas member m holds, read from its
// metrics, or "-" if it is not alive, did not gossip its HTTP address
// (an older node) or does not answer.
func replicasOf(ctx context.Context, m api.Member, t *client.TLS) string {
	if m.State != string(cluster.Alive) || m.HTTPAddr == "" {
		return "-"
	}
	n, err := loadgen.NewNode(m.HTTPAddr, t)
	if err != nil {
		return "-"
	}
	defer n.Close()
	r, err := n.Replicas(ctx)
	if err != nil {
		return "-"
	}
	return fmt.Sprint(int64(r))
}
