package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultDebounce is how long a Reloader waits after the last change
// before reloading, so that an editor's or a ConfigMap's burst of events
// costs one reload.
const DefaultDebounce = 200 * time.Millisecond

// ReloaderConfig configures a Reloader.
type ReloaderConfig struct {
	// Path is a policy file or directory, as for Load.
	Path string
	// Debounce: zero means DefaultDebounce.
	Debounce time.Duration
	// Logger receives reload logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives the reload metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Reloader holds the policies in force and reloads them when their files
// change. Policies is safe for concurrent use; Run is its only writer
// after NewReloader.
type Reloader struct {
	path     string
	debounce time.Duration
	log      *slog.Logger
	set      atomic.Pointer[Set]
	loads    prometheus.Counter
	errors   prometheus.Counter
	domains  prometheus.Gauge
}

// NewReloader loads the policies at conf.Path and returns a Reloader that
// serves them. A broken file is an error: a node does not start without
// the policies it was given. It starts nothing; Run watches the files.
func NewReloader(conf ReloaderConfig) (*Reloader, error) {
	r := &Reloader{path: conf.Path, debounce: conf.Debounce, log: conf.Logger,
		loads: prometheus.NewCounter(prometheus.CounterOpts{Name: "ringlimit_policy_reloads_total",
			Help: "Policy loads that succeeded, the first included."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "ringlimit_policy_reload_errors_total",
			Help: "Policy reloads rejected because a file is broken; the previous policies stay in force."}),
		domains: prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringlimit_policy_domains",
			Help: "Policy domains in force."}),
	}
	if r.debounce <= 0 {
		r.debounce = DefaultDebounce
	}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if conf.Registerer != nil {
		conf.Registerer.MustRegister(r.loads, r.errors, r.domains)
	}
	set, err := Load(r.path)
	if err != nil {
		return nil, err
	}
	r.publish(set)
	r.log.Info("policies loaded", logAttrs(r.path, set)...)
	return r, nil
}

// maxLogged bounds the domain names and policy references that the log
// line of a load names: enough to recognise a set, bounded for a large one.
const maxLogged = 20

// logAttrs describes set, loaded from path, for the log line of a load:
// how many domains and policies it holds, and the first maxLogged of each.
func logAttrs(path string, set *Set) []any {
	refs := make([]string, 0, min(len(set.Policies()), maxLogged+1))
	for _, p := range set.Policies() {
		if len(refs) > maxLogged {
			break
		}
		refs = append(refs, p.Ref)
	}
	return []any{"path", path, "domains", len(set.domains), "policies", len(set.policies),
		"domain_names", firstOf(set.Domains(), len(set.domains)), "refs", firstOf(refs, len(set.policies))}
}

// firstOf joins the first maxLogged of names, of total, saying how many
// more there are.
func firstOf(names []string, total int) string {
	if total <= maxLogged {
		return strings.Join(names, ",")
	}
	return fmt.Sprintf("%s (+%d more)", strings.Join(names[:maxLogged], ","), total-maxLogged)
}

// Policies returns the policies in force: an immutable snapshot. A nil
// Reloader (no policy file) has none: nil.
func (r *Reloader) Policies() *Set {
	if r == nil {
		return nil
	}
	return r.set.Load()
}

// ErrNoPolicies reports a policy reference when no policy file is loaded.
var ErrNoPolicies = errors.New("no --policy-file is loaded")

// Resolve resolves a policy reference against the policies in force; see
// Set.Resolve.
func (r *Reloader) Resolve(ref string) (*Limit, error) {
	if r == nil {
		return nil, ErrNoPolicies
	}
	return r.Policies().Resolve(ref)
}

func (r *Reloader) publish(set *Set) {
	r.set.Store(set)
	r.loads.Inc()
	r.domains.Set(float64(len(set.domains)))
}

// Reload loads the files again and puts them in force; if one is broken,
// it logs the error (file, line and field), counts it, keeps the policies
// in force and returns the error.
func (r *Reloader) Reload() error {
	set, err := Load(r.path)
	if err != nil {
		r.log.Error("policy reload rejected; the previous policies stay in force", "path", r.path, "err", err)
		r.errors.Inc() // after the log: whoever sees the count finds the line
		return err
	}
	r.publish(set)
	r.log.Info("policies reloaded", logAttrs(r.path, set)...)
	return nil
}

// Run watches the policy files and reloads them after they change, until
// ctx ends. It watches the directory (a file's parent), not the files:
// Kubernetes updates a ConfigMap by swapping a symlink, which replaces
// the files rather than writing them, and editors often do the same.
// Any event in the directory reloads, after a quiet period.
//
// A nil Reloader watches nothing and returns when ctx ends.
func (r *Reloader) Run(ctx context.Context) error {
	if r == nil {
		<-ctx.Done()
		return ctx.Err()
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("policy watch: %w", err)
	}
	defer w.Close()
	dir := r.path
	if info, err := os.Stat(r.path); err == nil && !info.IsDir() {
		dir = filepath.Dir(r.path)
	}
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("policy watch %s: %w", dir, err)
	}
	return r.loop(ctx, w.Events, w.Errors)
}

// loop reloads r.debounce after the last of a burst of events.
func (r *Reloader) loop(ctx context.Context, events <-chan fsnotify.Event, errs <-chan error) error {
	timer := time.NewTimer(r.debounce)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-events:
			if !ok {
				return nil
			}
			r.log.Debug("policy files changed", "event", ev.String())
			timer.Reset(r.debounce)
		case err, ok := <-errs:
			if !ok {
				return nil
			}
			r.log.Warn("policy watch", "err", err)
		case <-timer.C:
			_ = r.Reload() // logged and counted; the old policies stay
		}
	}
}
