package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/ringlimit/ringlimit/api"
)

// runMembers is `rlnode members`: a node's view of the cluster as a table.
func runMembers(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("rlnode members", flag.ContinueOnError)
	fs.SetOutput(stderr)
	withUsage(fs, `Usage: rlnode members [--addr HOST:PORT] [--tls-ca FILE ...]

Prints a node's view of the cluster: each member's name, state, gRPC and
gossip addresses, and share of the ring, from its GET /v1/members.

Flags:
`)
	addr := fs.String("addr", "localhost:8080", "HTTP address of a node")
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this long")
	tlsFlags := addClientTLS(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	base, tr, err := httpBase(tlsFlags.config(), *addr, http.DefaultTransport.(*http.Transport))
	if err != nil {
		return err
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/members", nil)
	if err != nil {
		return fmt.Errorf("--addr: %w", err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return fmt.Errorf("members: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("members: %s", resp.Status)
	}
	var body struct {
		Members []api.Member `json:"members"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("members: %w", err)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NAME\tSTATE\tGRPC\tGOSSIP\tSHARE")
	for _, m := range body.Members {
		name := m.Name
		if m.Self {
			name += " (self)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.1f%%\n", name, m.State, m.GRPCAddr, m.GossipAddr, 100*m.Share)
	}
	return w.Flush()
}
