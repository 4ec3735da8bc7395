package node

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sync/errgroup"
)

// TestRunSteps: steps run in order, each with the shared context; a nil
// step (a part the node runs without) is skipped; a failed step does not
// stop the later ones, and every error comes back named by its step.
func TestRunSteps(t *testing.T) {
	type key struct{}
	ctx := context.WithValue(context.Background(), key{}, "shared")
	var ran []string
	mk := func(name string, err error) *step {
		return &step{name, func(ctx context.Context) error {
			if ctx.Value(key{}) != "shared" {
				t.Errorf("step %s did not get the shutdown's context", name)
			}
			ran = append(ran, name)
			return err
		}}
	}
	err := runSteps(ctx, slog.New(slog.DiscardHandler), []*step{
		mk("first", nil), nil, mk("second", errors.New("boom")), mk("third", nil), mk("fourth", errors.New("bang")),
	})
	if want := []string{"first", "second", "third", "fourth"}; !slices.Equal(ran, want) {
		t.Errorf("ran %v, want %v", ran, want)
	}
	if err == nil || !strings.Contains(err.Error(), "second: boom") || !strings.Contains(err.Error(), "fourth: bang") {
		t.Errorf("runSteps = %v, want both failures named by their steps", err)
	}
}

// TestLoopReportsItsError: a background loop that fails ends the group's
// context (which starts the node's leaving) and its error reaches both
// the group and the step that stops it; one that ends by being stopped is
// no error.
func TestLoopReportsItsError(t *testing.T) {
	g, gctx := errgroup.WithContext(context.Background())
	failure := errors.New("replica loop failed")
	failed := startLoop(g, func(context.Context) error { return failure })
	stopped := startLoop(g, func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	<-gctx.Done()
	if err := failed.stop(context.Background()); !errors.Is(err, failure) {
		t.Errorf("stop of the failed loop = %v, want its error", err)
	}
	if err := stopped.stop(context.Background()); err != nil {
		t.Errorf("stop of a loop that was stopped = %v, want nil", err)
	}
	if err := g.Wait(); !errors.Is(err, failure) {
		t.Errorf("group = %v, want the loop's error", err)
	}
}
