package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/limiter"
	"github.com/ringlimit/ringlimit/service"
)

// listeners are a node's sockets, opened before anything is served so that
// a port conflict fails fast and tests can use port 0.
type listeners struct {
	http, grpc net.Listener
}

// started reports the addresses a node listens on, once it is serving.
// Tests use it with ports set to 0.
type started func(httpAddr, grpcAddr string)

// serve runs a node until ctx is cancelled, then shuts down within
// conf.ShutdownTimeout.
func serve(ctx context.Context, conf Config, log *slog.Logger, onStart started) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	store := limiter.New(limiter.Config{MaxKeys: conf.MaxKeys, Registerer: reg})
	svc := service.New(service.Config{Store: store, MaxClockSkew: conf.MaxClockSkew, Registerer: reg})
	faces := api.New(api.Config{
		Checker:    svc,
		Registerer: reg,
		Gatherer:   reg,
		Members: func() []api.Member {
			return []api.Member{{Name: conf.NodeName, GRPCAddr: conf.GRPCAddr, State: "alive", Share: 1, Self: true}}
		},
	})

	lis, err := listen(conf)
	if err != nil {
		return err
	}
	grpcSrv := grpc.NewServer()
	health := faces.RegisterGRPC(grpcSrv)
	httpSrv := &http.Server{Handler: faces.Handler(), ReadHeaderTimeout: 10 * time.Second}

	log.Info("rlnode serving", "node", conf.NodeName, "http", lis.http.Addr().String(), "grpc", lis.grpc.Addr().String())
	if onStart != nil {
		onStart(lis.http.Addr().String(), lis.grpc.Addr().String())
	}

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := httpSrv.Serve(lis.http); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http: %w", err)
		}
		return nil
	})
	g.Go(func() error { return grpcSrv.Serve(lis.grpc) })
	g.Go(func() error {
		<-ctx.Done()
		log.Info("shutting down", "timeout", conf.ShutdownTimeout)
		health.Shutdown() // every service NOT_SERVING, so balancers stop sending
		drainCtx, cancel := context.WithTimeout(context.Background(), conf.ShutdownTimeout)
		defer cancel()
		stopGRPC(drainCtx, grpcSrv)
		return httpSrv.Shutdown(drainCtx)
	})
	return g.Wait()
}

// stopGRPC stops srv gracefully, or at once when ctx ends first.
func stopGRPC(ctx context.Context, srv *grpc.Server) {
	stop := context.AfterFunc(ctx, srv.Stop)
	defer stop()
	srv.GracefulStop()
}

func listen(conf Config) (listeners, error) {
	h, err := net.Listen("tcp", conf.HTTPAddr)
	if err != nil {
		return listeners{}, fmt.Errorf("--http-addr: %w", err)
	}
	g, err := net.Listen("tcp", conf.GRPCAddr)
	if err != nil {
		h.Close()
		return listeners{}, fmt.Errorf("--grpc-addr: %w", err)
	}
	return listeners{http: h, grpc: g}, nil
}
