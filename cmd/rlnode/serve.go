package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"sync"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/cluster"
	"github.com/ringlimit/ringlimit/internal/admit"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/peer"
	"github.com/ringlimit/ringlimit/policy"
	"github.com/ringlimit/ringlimit/ring"
	"github.com/ringlimit/ringlimit/rls"
	"github.com/ringlimit/ringlimit/service"
)

// listeners are a node's sockets, opened before anything is served so that
// a port conflict fails fast and tests can use port 0.
type listeners struct {
	http, grpc, peer net.Listener
}

// started reports the addresses a node listens on, once it is serving.
// Tests use it with ports set to 0.
type started func(n *node)

// node is a serving rlnode's parts, for tests.
type node struct {
	httpAddr, grpcAddr string
	cluster            *cluster.Cluster
}

// serve runs a node until ctx is cancelled, then shuts down within
// conf.ShutdownTimeout, one step after another (see shutdownSteps).
func serve(ctx context.Context, conf Config, log *slog.Logger, onStart started) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	lis, err := listen(conf)
	if err != nil {
		return err
	}
	defer lis.close()
	lis = lis.limit(conf.MaxConns)

	tr, err := newTransport(conf, log)
	if err != nil {
		return err
	}
	policies, err := loadPolicies(conf.PolicyFile, log, reg)
	if err != nil {
		return err
	}
	store := limiter.New(limiter.Config{MaxKeys: conf.MaxKeys, MaxLogEntries: conf.MaxLogEntries, Registerer: reg})
	// Replicas of other owners' counters are kept apart, under the same
	// bounds (package replica exports their metrics).
	replicas := limiter.New(limiter.Config{MaxKeys: conf.MaxKeys, MaxLogEntries: conf.MaxLogEntries})
	snaps, err := openSnapshots(conf, store, log, reg)
	if err != nil {
		return err
	}
	pool := peer.NewPool(peer.Config{BatchWait: conf.BatchWait, BatchLimit: conf.BatchLimit, Registerer: reg, DialOptions: tr.peerDial, Name: conf.NodeName})
	defer pool.Close()
	// Ring changes only signal ringChanged; the loop below reacts to them,
	// so that nothing is wired to a part before the part exists.
	ringChanged := make(chan struct{}, 1)
	members, err := cluster.New(cluster.Config{
		NodeName:      conf.NodeName,
		BindAddr:      conf.GossipAddr,
		AdvertiseAddr: conf.AdvertiseAddr,
		Join:          conf.Join,
		Keys:          conf.GossipKeys,
		PeerAddr:      lis.peer.Addr().String(),
		GRPCAddr:      lis.grpc.Addr().String(),
		HTTPAddr:      lis.http.Addr().String(),
		Logger:        log,
		Registerer:    reg,
		OnChange: func(_, _ *ring.Ring) {
			select {
			case ringChanged <- struct{}{}:
			default: // a change is pending already; the loop reads the newest ring
			}
		},
	})
	if err != nil {
		return err
	}
	svc := service.New(service.Config{
		Store: store, Replicas: replicas, Cluster: members, Peers: pool,
		MaxClockSkew: conf.MaxClockSkew, GlobalSync: conf.GlobalSync, HandOffWait: conf.HandOffWait,
		ReplicateInterval: conf.ReplicateInterval, HandedOff: snaps.handedOff(),
		Logger: log, Registerer: reg, Policies: policies, Leases: conf.Leases,
	})
	// Before anything serves or joins: the node reports ready, and decides
	// checks, with its counters.
	snaps.load(ctx, svc.Intake())
	gate := admit.New(admit.Config{Max: conf.MaxInflight, Streams: []string{api.CheckStreamMethod}, MaxStreams: conf.MaxStreams, Registerer: reg})
	faces := api.New(api.Config{
		Checker: svc, Leases: svc, Registerer: reg, Gatherer: reg, Admit: gate.HTTP, AdmitMessage: gate.Message,
		Ready: members.Ready, ReadyNote: tr.insecure(conf),
		Members: func() []api.Member { return apiMembers(members) },
		Ring:    members.Ring,
	})

	// Stream workers reuse goroutines whose stacks have grown already,
	// rather than starting one per RPC. gRPC starts a goroutine for an RPC
	// that finds every worker busy, and a node has as many RPCs in flight
	// as clients wait on it (or on its owners), not as it has cores:
	// with one worker a core, most RPCs of 50 concurrent clients started
	// a goroutine and grew its stack (7% of a node's CPU). An idle worker
	// costs its stack, a few KB.
	workers := grpc.NumStreamWorkers(uint32(streamWorkersPerCore * runtime.GOMAXPROCS(0)))
	// The client port's codec refuses the 1,001st item, or descriptor,
	// before building it.
	rlsBound := api.BoundOf(&rlspb.RateLimitRequest{}, "descriptors", rls.MaxDescriptors)
	grpcSrv := grpc.NewServer(append(append(api.ServerOptions(rlsBound), tr.grpcServer()...), workers, grpc.InTapHandle(gate.Tap))...)
	health := faces.RegisterGRPC(grpcSrv)
	rls.New(rls.Config{Checker: svc, Policies: policies}).Register(grpcSrv)
	guard := peer.NewGuard(peer.GuardConfig{Members: members, Certificates: tr.peerTLS, Logger: log, Registerer: reg})
	peerSrv := grpc.NewServer(append(append(peer.ServerOptions(), tr.peerServer...), workers, grpc.ChainUnaryInterceptor(guard.Unary), grpc.ChainStreamInterceptor(guard.Stream))...)
	peerFace := peer.NewServer(svc.Owner(), reg)
	peerFace.Register(peerSrv)
	// Timeouts bound what a slow or idle client can hold: a body of
	// api.MaxBodyBytes arrives well within ReadTimeout on any link, and
	// a check needs no headers of more than a few KB.
	httpSrv := &http.Server{Handler: faces.Handler(), ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10,
		ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, TLSConfig: tr.public}

	g, gctx := errgroup.WithContext(ctx)
	// The background loops run until their step of shutdown stops them,
	// not until ctx ends.
	gossip := startLoop(g, members.Run)
	loops := startLoop(g, func(ctx context.Context) error {
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-ringChanged:
					r := members.Ring()
					svc.RingChanged()
					pool.Retain(peerAddrs(r))
				}
			}
		})
		return svc.Run(ctx)
	})
	peers := startLoop(g, pool.Run)
	snaps.start(g)
	g.Go(func() error { return ignoreCanceled(policies.Run(gctx)) }) // policies stay in force once it stops
	g.Go(func() error { return serveHTTP(httpSrv, lis.http) })
	g.Go(func() error { return grpcSrv.Serve(lis.grpc) })
	g.Go(func() error { return peerSrv.Serve(lis.peer) })

	if w := tr.insecure(conf); w != "" {
		log.Warn("INSECURE: " + w)
	}
	log.Info("rlnode serving", "node", conf.NodeName, "http", lis.http.Addr().String(), "grpc", lis.grpc.Addr().String(),
		"peer", lis.peer.Addr().String(), "join", conf.Join)
	if onStart != nil {
		onStart(&node{httpAddr: lis.http.Addr().String(), grpcAddr: lis.grpc.Addr().String(), cluster: members})
	}

	// shutdownSteps run in order when ctx ends (or a server fails), all
	// within conf.ShutdownTimeout (but the final snapshot's write).
	beginSnapshot, finishSnapshot := snaps.steps()
	shutdownSteps := []*step{
		{"stop accepting checks", func(ctx context.Context) error {
			health.Shutdown() // NOT_SERVING, so that balancers stop sending
			faces.Drain()     // clients end their streams, which GracefulStop waits for
			stopGRPC(ctx, grpcSrv)
			return httpSrv.Shutdown(ctx)
		}},
		// The final snapshot begins before any counter leaves: each
		// counter an owner takes goes into it as it is taken, so that
		// when the whole cluster stops at once, every node's snapshot
		// holds the counters it owned, whether the owners they went to
		// kept them or not (see package snapshot).
		beginSnapshot,
		// Counters go before gossip does, so that no key's new owner
		// decides it before its counter is there: until the others see
		// this node leave, it relays what they forward to it to the new
		// owners (see service.Service.Leave).
		{"hand off counters", func(ctx context.Context) error {
			svc.Leave()
			sent, left := svc.HandOffAll(ctx)
			// What is left (counters others handed here meanwhile, as when a
			// whole cluster stops at once) goes in the last hand-off.
			log.Info("handed off counters", "counters", sent, "left", left)
			return nil
		}},
		{"leave the cluster", func(ctx context.Context) error {
			return gossip.stop(ctx) // others stop routing to this node
		}},
		{"hand off counters that arrived meanwhile", func(ctx context.Context) error {
			return handOffRest(ctx, svc, log, snaps != nil) // from others' hand-offs, before they saw this node leave
		}},
		{"flush GLOBAL hits", func(ctx context.Context) error {
			err := loops.stop(ctx)
			svc.FlushGlobal(ctx)
			return err
		}},
		// Once no loop can hand a counter off any more: the counters this
		// node still holds (refused, not delivered, or handed here by
		// others as they stopped) join those handed off.
		finishSnapshot,
		{"close peers", func(ctx context.Context) error {
			peerFace.Drain()
			stopGRPC(ctx, peerSrv)
			return peers.stop(ctx)
		}},
	}
	g.Go(func() error {
		<-gctx.Done()
		log.Info("shutting down", "timeout", conf.ShutdownTimeout)
		ctx, cancel := context.WithTimeout(context.Background(), conf.ShutdownTimeout)
		defer cancel()
		return runSteps(ctx, log, shutdownSteps)
	})
	return g.Wait()
}

// streamWorkersPerCore is how many gRPC stream workers a node keeps per
// core (grpc.NumStreamWorkers).
const streamWorkersPerCore = 32

// restBudget bounds the last hand-off of shutdown when no member takes
// anything: the others are stopping too.
const restBudget = 2 * time.Second

// handOffRest is the last hand-off of shutdown: it hands off every counter
// this node still holds (those others handed it while it left) and
// reports, as an error, those it could not, which are lost when it exits.
// If no member took any counter within restBudget, the others are gone or
// going (a whole cluster stopping at once, as helm uninstall does): the
// counters are lost as the last node's are, logged, and not an error.
// With a snapshot, the counters are kept in it, to be loaded if this node
// starts again, and the log says so; the cluster running on has lost them
// all the same.
func handOffRest(ctx context.Context, svc *service.Service, log *slog.Logger, snapshot bool) error {
	lost := "they are lost when this node exits"
	if snapshot {
		lost = "they are kept only in this node's final snapshot"
	}
	budget, cancel := context.WithTimeout(ctx, restBudget)
	defer cancel()
	sent, left := svc.HandOffAll(budget)
	if left > 0 && sent > 0 { // some member answers: go on until ctx ends
		more, rest := svc.HandOffAll(ctx)
		sent, left = sent+more, rest
	}
	switch {
	case left == 0:
		log.Info("handed off counters", "counters", sent, "left", left)
		return nil
	case sent == 0 && ctx.Err() == nil:
		log.Error("no member took the counters this node still holds: the cluster is stopping; "+lost,
			"left", left, "waited", restBudget)
		return nil
	default:
		log.Error("counters not handed off; "+lost, "left", left, "handed_off", sent)
		return fmt.Errorf("%d counters not handed off", left)
	}
}

// step is one step of an orderly shutdown.
type step struct {
	name string
	run  func(ctx context.Context) error
}

// runSteps runs steps in order, each with what is left of ctx, logging
// each; a failed step does not stop the later ones, and a nil one (a part
// the node runs without) is skipped. It returns the errors.
func runSteps(ctx context.Context, log *slog.Logger, steps []*step) error {
	var errs []error
	for _, s := range steps {
		if s == nil {
			continue
		}
		start := time.Now()
		err := s.run(ctx)
		log.Info("shutdown step done", "step", s.name, "took", time.Since(start), "err", err)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.name, err))
		}
	}
	return errors.Join(errs...)
}

// loop is a background part of a node that runs until its step of
// shutdown stops it.
type loop struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error // run's error, once done is closed
}

// startLoop runs run in g until the loop is stopped.
func startLoop(g *errgroup.Group, run func(context.Context) error) *loop {
	ctx, cancel := context.WithCancel(context.Background())
	l := &loop{cancel: cancel, done: make(chan struct{})}
	g.Go(func() error {
		defer close(l.done)
		l.err = ignoreCanceled(run(ctx))
		return l.err
	})
	return l
}

// stop ends the loop and waits for it to return, or for ctx to end.
func (l *loop) stop(ctx context.Context) error {
	l.cancel()
	select {
	case <-l.done:
		return l.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loadPolicies loads --policy-file; without one it returns a nil Reloader,
// which holds no policies.
func loadPolicies(path string, log *slog.Logger, reg prometheus.Registerer) (*policy.Reloader, error) {
	if path == "" {
		return nil, nil
	}
	r, err := policy.NewReloader(policy.ReloaderConfig{Path: path, Logger: log, Registerer: reg})
	if err != nil {
		return nil, fmt.Errorf("--policy-file: %w", err)
	}
	return r, nil
}

func serveHTTP(srv *http.Server, lis net.Listener) error {
	serve := srv.Serve
	if srv.TLSConfig != nil {
		serve = func(l net.Listener) error { return srv.ServeTLS(l, "", "") } // the certificate comes from TLSConfig
	}
	if err := serve(lis); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http: %w", err)
	}
	return nil
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// stopGRPC stops srv gracefully, or at once when ctx ends first.
func stopGRPC(ctx context.Context, srv *grpc.Server) {
	stop := context.AfterFunc(ctx, srv.Stop)
	defer stop()
	srv.GracefulStop()
}

func peerAddrs(r *ring.Ring) []string {
	var addrs []string
	for _, m := range r.Members() {
		addrs = append(addrs, m.PeerAddr)
	}
	return addrs
}

func apiMembers(c *cluster.Cluster) []api.Member {
	self := c.LocalMember().Name
	var out []api.Member
	for _, m := range c.Members() {
		out = append(out, api.Member{
			Name: m.Name, GossipAddr: m.GossipAddr, GRPCAddr: m.GRPCAddr, PeerAddr: m.PeerAddr, HTTPAddr: m.HTTPAddr,
			State: string(m.State), Share: m.Share, Self: m.Name == self,
		})
	}
	return out
}

func listen(conf Config) (lis listeners, err error) {
	defer func() {
		if err != nil {
			lis.close()
		}
	}()
	if lis.http, err = net.Listen("tcp", conf.HTTPAddr); err != nil {
		return lis, fmt.Errorf("--http-addr: %w", err)
	}
	if lis.grpc, err = net.Listen("tcp", conf.GRPCAddr); err != nil {
		return lis, fmt.Errorf("--grpc-addr: %w", err)
	}
	if lis.peer, err = net.Listen("tcp", conf.PeerAddr); err != nil {
		return lis, fmt.Errorf("--peer-addr: %w", err)
	}
	return lis, nil
}

// close closes the listeners that are open; servers that took them close
// them too, which is harmless.
func (l listeners) close() {
	for _, c := range []net.Listener{l.http, l.grpc, l.peer} {
		if c != nil {
			c.Close()
		}
	}
}
