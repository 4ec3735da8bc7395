package main

import (
	"fmt"
	"math"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// The charts' size: 864x528 pixels at the PNG default of 96 dpi.
const (
	chartWidth  = 9 * vg.Inch
	chartHeight = 5.5 * vg.Inch
)

// legendRoom is the share of a chart's height kept free above the data
// for the legend, which sits in the top left corner, inside the axes.
const legendRoom = 0.3

// chart is one of the PNGs: which figure of a point it draws, and how.
type chart struct {
	file, title, y string
	value          func(point) float64
	logY           bool
}

// charts are the PNGs drawCharts writes.
var charts = []chart{
	// Log scale: a leased client's checks/s are 30-60 times Redis's.
	{"checks-per-second.png", "Checks per second against concurrent callers, one check a call", "checks/s (log scale)",
		func(p point) float64 { return p.ChecksPerSec }, true},
	{"p99.png", "p99 latency of a call against concurrent callers, one check a call", "p99 latency (ms, log scale)",
		func(p point) float64 { return p.P99Ms }, true},
}

// drawCharts writes the charts to dir, from res.
func drawCharts(res results, dir string) error {
	ss, err := seriesOf(res.Runs)
	if err != nil {
		return err
	}
	if len(ss) == 0 {
		return fmt.Errorf("no run answered a check: nothing to draw")
	}
	for _, c := range charts {
		p, err := c.plot(ss, fmt.Sprintf("one rlnode, one redis-server and the load on %d shared CPUs; the median of %d runs of %gs", res.CPUs, max(res.Rounds, 1), res.DurationS))
		if err != nil {
			return fmt.Errorf("%s: %w", c.file, err)
		}
		if err := p.Save(chartWidth, chartHeight, filepath.Join(dir, c.file)); err != nil {
			return fmt.Errorf("%s: %w", c.file, err)
		}
	}
	return nil
}

// plot draws one line a series, against concurrency on a log scale.
func (c chart) plot(ss []series, subtitle string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = c.title + "\n" + subtitle
	p.X.Label.Text = "concurrent callers (log scale)"
	p.Y.Label.Text = c.y
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = levelTicks(ss)
	p.X.Min, p.X.Max = levelRange(ss)
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.XOffs, p.Legend.YOffs = vg.Points(8), vg.Points(-14)
	p.Add(plotter.NewGrid())
	var lines []any
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		xys := make(plotter.XYs, len(s.Points))
		for i, pt := range s.Points {
			v := c.value(pt)
			xys[i] = plotter.XY{X: float64(pt.Concurrency), Y: v}
			lo, hi = min(lo, v), max(hi, v)
		}
		lines = append(lines, s.Mode.Label, xys)
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return nil, err
	}
	if c.logY {
		if lo <= 0 {
			return nil, fmt.Errorf("%s: %v, want > 0 on a log scale", c.y, lo)
		}
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = ticks125{}
		p.Y.Min = lo / 1.2
		p.Y.Max = hi * math.Pow(hi/p.Y.Min, legendRoom/(1-legendRoom))
	} else {
		p.Y.Tick.Marker = thousands{}
		p.Y.Min = 0
		p.Y.Max = max(hi, 1) / (1 - legendRoom) // max: an axis from 0 to 0 has no scale
	}
	return p, nil
}

// levelTicks marks the concurrency levels that were measured.
func levelTicks(ss []series) plot.ConstantTicks {
	seen := map[int]bool{}
	var ticks plot.ConstantTicks
	for _, s := range ss {
		for _, p := range s.Points {
			if !seen[p.Concurrency] {
				seen[p.Concurrency] = true
				ticks = append(ticks, plot.Tick{Value: float64(p.Concurrency), Label: strconv.Itoa(p.Concurrency)})
			}
		}
	}
	return ticks
}

// levelRange is the concurrency axis's range: the levels measured, or,
// when only one was, a factor of two either side of it, since a log axis
// needs a range and gonum's default for one value (v-1 to v+1) reaches 0.
func levelRange(ss []series) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		for _, p := range s.Points {
			lo, hi = min(lo, float64(p.Concurrency)), max(hi, float64(p.Concurrency))
		}
	}
	if lo == hi {
		return lo / 2, hi * 2
	}
	return lo, hi
}

// thousands is the default ticker with labels in thousands ("20k"), which
// read faster than "20000" on a checks/s axis.
type thousands struct{}

func (thousands) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i, t := range ticks {
		if t.Label != "" && t.Value != 0 {
			ticks[i].Label = strconv.FormatFloat(t.Value/1000, 'f', -1, 64) + "k"
		}
	}
	return ticks
}

// ticks125 labels a log axis at 1, 2 and 5 times each power of ten, with
// unlabelled ticks between: plot.LogTicks labels the powers of ten only,
// which leaves a latency axis spanning 0.1ms to 20ms with three labels.
// min must be > 0.
type ticks125 struct{}

func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for exp := math.Floor(math.Log10(lo)); math.Pow(10, exp) <= hi; exp++ {
		decade := math.Pow(10, exp)
		for m := 1; m <= 9; m++ {
			v := float64(m) * decade
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if m == 1 || m == 2 || m == 5 {
				t.Label = strconv.FormatFloat(v, 'f', max(0, -int(exp)), 64) // 0.05, not 0.05000000000000001
			}
			ticks = append(ticks, t)
		}
	}
	return ticks
}
