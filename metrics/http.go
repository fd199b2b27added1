package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/a2a-moe/a2a/a2a"
)

// shutdownGrace bounds how long Serve waits for in-flight scrapes once its
// context is done.
const shutdownGrace = 5 * time.Second

// Handler returns the HTTP handler exposing g's metrics in the Prometheus
// text format (or OpenMetrics when the scraper asks for it). A collector
// failing to gather does not hide the others' series.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	})
}

// Serve serves g's metrics on http://addr/metrics until ctx is done, and
// returns the address it listens on (addr ":0" picks a free port). It returns
// once listening; the server stops in the background when ctx is done.
func Serve(ctx context.Context, addr string, g prometheus.Gatherer) (boundAddr string, err error) {
	if g == nil {
		return "", fmt.Errorf("%w: metrics.Serve: nil Gatherer", a2a.ErrInvalidArgument)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", Handler(g))
	return ServeHandler(ctx, addr, mux)
}

// ServeHandler serves h on addr as Serve serves the metrics alone, for a
// process that serves more on the same listener (a2ad serve: /metrics and
// its live view /ui/, with Handler at /metrics).
func ServeHandler(ctx context.Context, addr string, h http.Handler) (boundAddr string, err error) {
	if h == nil {
		return "", fmt.Errorf("%w: metrics.ServeHandler: nil Handler", a2a.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("metrics.Serve: %w", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return "", fmt.Errorf("metrics.Serve: %w", err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(slog.Default().Handler(), slog.LevelWarn),
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Default().Warn("metrics server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
	}()
	return ln.Addr().String(), nil
}
