package main

import (
	"image/png"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"gonum.org/v1/plot"
)

func TestDrawCharts(t *testing.T) {
	raw := benchJSON(t)
	var runs []run
	for _, m := range modes {
		for i, c := range []int{1, 2, 4} {
			runs = append(runs, run{Mode: m.Name, Concurrency: c, Report: withFigures(t, raw, float64(1000*(i+1)), float64(100*(i+1)), 10)})
		}
	}
	dir := t.TempDir()
	if err := drawCharts(results{CPUs: 2, DurationS: 3, Runs: runs}, dir); err != nil {
		t.Fatal(err)
	}
	for _, c := range charts {
		f, err := os.Open(filepath.Join(dir, c.file))
		if err != nil {
			t.Fatal(err)
		}
		conf, err := png.DecodeConfig(f)
		f.Close()
		if err != nil || conf.Width != 864 || conf.Height != 528 {
			t.Errorf("%s: %+v, %v; want an 864x528 PNG", c.file, conf, err)
		}
	}
}

func TestDrawChartsNothing(t *testing.T) {
	raw := benchJSON(t)
	for _, runs := range [][]run{
		nil,
		{{Mode: "grpc", Concurrency: 1, Report: withFigures(t, raw, 0, 0, 0)}},
	} {
		if err := drawCharts(results{Runs: runs}, t.TempDir()); err == nil || !strings.Contains(err.Error(), "nothing to draw") {
			t.Errorf("drawCharts(%d runs that answered nothing): %v, want nothing to draw", len(runs), err)
		}
	}
	bad := []run{{Mode: "grpc", Concurrency: 1, Report: withFigures(t, raw, 10, 0, 5)}} // answered, p99 0
	if err := drawCharts(results{Runs: bad}, t.TempDir()); err == nil || !strings.Contains(err.Error(), "want > 0 on a log scale") {
		t.Errorf("drawCharts(p99 0): %v, want an error", err)
	}
}

func TestTicks125(t *testing.T) {
	var labels []string
	for _, tk := range (ticks125{}).Ticks(0.04, 25) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	want := []string{"0.05", "0.1", "0.2", "0.5", "1", "2", "5", "10", "20"}
	if !reflect.DeepEqual(labels, want) {
		t.Errorf("ticks125 labels %q, want %q", labels, want)
	}
}

func TestThousands(t *testing.T) {
	var labels []string
	for _, tk := range (thousands{}).Ticks(0, 30000) {
		if tk.Label != "" {
			labels = append(labels, tk.Label)
		}
	}
	if want := []string{"0", "10k", "20k", "30k"}; !reflect.DeepEqual(labels, want) {
		t.Errorf("thousands labels %q, want %q", labels, want)
	}
}

var _ plot.Ticker = ticks125{}
var _ plot.Ticker = thousands{}
