package main

import (
	"context"
	"log/slog"
	"strings"

	"github.com/ringlimit/ringlimit/node"
)

// serve runs a node as conf says until ctx ends, and then until it has
// left the cluster (see package node). onStart, if not nil, is given the
// node once it is built and its ports are open, before it runs: tests
// read its addresses there.
func serve(ctx context.Context, conf Config, log *slog.Logger, onStart func(*node.Node)) error {
	if len(conf.loopback) > 0 {
		log.Warn(loopbackNote, "loopback", strings.Join(conf.loopback, " "))
	}
	n, err := node.New(conf.Config, log)
	if err != nil {
		return err
	}
	if onStart != nil {
		onStart(n)
	}
	return n.Run(ctx)
}
