package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/cluster"
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
// conf.ShutdownTimeout: it leaves the gossip (so others stop routing to
// it), hands its counters to their new owners, drains client requests,
// flushes GLOBAL hits, and stops.
func serve(ctx context.Context, conf Config, log *slog.Logger, onStart started) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	lis, err := listen(conf)
	if err != nil {
		return err
	}
	defer lis.close()

	policies, err := loadPolicies(conf.PolicyFile, log, reg)
	if err != nil {
		return err
	}
	store := limiter.New(limiter.Config{MaxKeys: conf.MaxKeys, Registerer: reg})
	pool := peer.NewPool(peer.Config{BatchWait: conf.BatchWait, BatchLimit: conf.BatchLimit, Registerer: reg})
	defer pool.Close()
	var svc *service.Service // set below; OnChange fires only once Run starts
	members, err := cluster.New(cluster.Config{
		NodeName:      conf.NodeName,
		BindAddr:      conf.GossipAddr,
		AdvertiseAddr: conf.AdvertiseAddr,
		Join:          conf.Join,
		PeerAddr:      lis.peer.Addr().String(),
		GRPCAddr:      lis.grpc.Addr().String(),
		Logger:        log,
		Registerer:    reg,
		OnChange: func(old, new *ring.Ring) {
			svc.RingChanged(old, new)
			pool.Retain(peerAddrs(new))
		},
	})
	if err != nil {
		return err
	}
	svc = service.New(service.Config{
		Store: store, Cluster: members, Peers: pool,
		MaxClockSkew: conf.MaxClockSkew, GlobalSync: conf.GlobalSync,
		Logger: log, Registerer: reg, Policies: policies,
	})
	faces := api.New(api.Config{
		Checker: svc, Registerer: reg, Gatherer: reg,
		Ready:   members.Ready,
		Members: func() []api.Member { return apiMembers(members) },
	})

	// Stream workers reuse goroutines whose stacks have grown already,
	// rather than starting one per RPC.
	workers := grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0)))
	grpcSrv := grpc.NewServer(workers)
	health := faces.RegisterGRPC(grpcSrv)
	rls.New(rls.Config{Checker: svc, Policies: policies}).Register(grpcSrv)
	peerSrv := grpc.NewServer(workers)
	peer.NewServer(svc.Owner()).Register(peerSrv)
	// Timeouts bound what a slow or idle client can hold.
	httpSrv := &http.Server{Handler: faces.Handler(), ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}

	// Each part has its own context, so that shutdown can stop them in
	// order rather than all at once.
	clusterCtx, leave := context.WithCancel(context.Background())
	svcCtx, stopService := context.WithCancel(context.Background())
	poolCtx, stopPool := context.WithCancel(context.Background())
	defer leave()
	defer stopService()
	defer stopPool()
	clusterDone := make(chan struct{})
	serviceDone := make(chan struct{})

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(clusterDone)
		return ignoreCanceled(members.Run(clusterCtx))
	})
	g.Go(func() error {
		defer close(serviceDone)
		return svc.Run(svcCtx)
	})
	g.Go(func() error { return ignoreCanceled(pool.Run(poolCtx)) })
	g.Go(func() error { return ignoreCanceled(policies.Run(gctx)) })
	g.Go(func() error { return serveHTTP(httpSrv, lis.http) })
	g.Go(func() error { return grpcSrv.Serve(lis.grpc) })
	g.Go(func() error { return peerSrv.Serve(lis.peer) })

	log.Info("rlnode serving", "node", conf.NodeName, "http", lis.http.Addr().String(), "grpc", lis.grpc.Addr().String(),
		"peer", lis.peer.Addr().String(), "join", conf.Join)
	if onStart != nil {
		onStart(&node{httpAddr: lis.http.Addr().String(), grpcAddr: lis.grpc.Addr().String(), cluster: members})
	}

	g.Go(func() error {
		<-gctx.Done()
		log.Info("shutting down", "timeout", conf.ShutdownTimeout)
		drainCtx, cancel := context.WithTimeout(context.Background(), conf.ShutdownTimeout)
		defer cancel()
		health.Shutdown() // NOT_SERVING, so that balancers stop sending
		leave()
		select {
		case <-clusterDone:
		case <-drainCtx.Done():
		}
		moved := svc.HandOff(drainCtx)
		log.Info("left the cluster and handed off counters", "counters", moved)
		stopGRPC(drainCtx, grpcSrv)
		err := httpSrv.Shutdown(drainCtx)
		stopService() // flushes GLOBAL hits to their owners
		select {
		case <-serviceDone:
		case <-drainCtx.Done():
		}
		stopGRPC(drainCtx, peerSrv)
		stopPool()
		return err
	})
	return g.Wait()
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
	if err := srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
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
			Name: m.Name, Addr: m.GossipAddr, GRPCAddr: m.GRPCAddr, PeerAddr: m.PeerAddr,
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
