package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
	"github.com/ringlimit/ringlimit/loadgen"
)

// settleArgs are the flags of `rlnode check --settle` and --release.
type settleArgs struct {
	addr, name, key, settle, release string
	cost                             int64
	asJSON                           bool
	timeout                          time.Duration
	tls                              *client.TLS
}

// runSettle is `rlnode check --settle ID --cost N` and `--release ID`:
// one Settle sent to a node, which relays it to the key's owner, and its
// answer printed. The node checks the id, name, key and cost, and names
// the field it refuses.
func runSettle(ctx context.Context, a settleArgs, stdout io.Writer) error {
	id := a.settle
	var cost *int64
	switch {
	case a.settle != "" && a.release != "":
		return errors.New("check: --settle and --release: one or the other")
	case a.key == "":
		return errors.New("check: --key is required: the reservation's")
	case a.release != "" && a.cost != -1:
		return errors.New("check: --release gives everything back: no --cost")
	case a.release != "":
		id = a.release
	case a.cost < 0:
		return errors.New("check: --settle needs --cost, the hits really spent (0 or more)")
	default:
		cost = &a.cost
	}
	opts, err := loadgen.DialOptions(a.tls, a.addr)
	if err != nil {
		return err
	}
	if opts == nil {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(a.addr, opts...)
	if err != nil {
		return fmt.Errorf("check %s: %w", a.addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	resp, err := pb.NewRateLimiterClient(conn).Settle(ctx, &pb.SettleRequest{ReservationId: id, Name: a.name, Key: a.key, Cost: cost})
	if err != nil {
		return fmt.Errorf("settle %s at %s: %w", id, a.addr, err)
	}
	d, err := client.DecisionOf(resp.GetState())
	if err != nil {
		return fmt.Errorf("settle %s at %s: %w", id, a.addr, err)
	}
	if a.asJSON {
		out := checkJSON(d)
		out["given_back"], out["forced"], out["replayed"] = resp.GetGivenBack(), resp.GetForced(), resp.GetReplayed()
		return json.NewEncoder(stdout).Encode(out)
	}
	_, err = fmt.Fprintln(stdout, describeSettled(resp, d, cost, time.Now()))
	return err
}

// describeSettled says what a settle did, then the counter's state as a
// check's verdict says it.
func describeSettled(resp *pb.SettleResponse, d client.Decision, cost *int64, now time.Time) string {
	verb := "RELEASED"
	if cost != nil {
		verb = fmt.Sprintf("SETTLED for %d", *cost)
	}
	line := fmt.Sprintf("%s: %d given back, %d forced", verb, resp.GetGivenBack(), resp.GetForced())
	if resp.GetReplayed() {
		line += " (settled before: nothing charged now)"
	}
	return line + "; " + strings.TrimPrefix(describe(d, now), "ALLOWED  ")
}
