package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

const (
	dashboardFile = "monitoring/grafana-dashboard.json"
	rulesFile     = "monitoring/prometheus-rules.yaml"
)

// ruleFile is a Prometheus rule file, decoded strictly: a misspelt key
// (expr as exp, for as four) would make Prometheus refuse the file.
type ruleFile struct {
	Groups []struct {
		Name     string `json:"name"`
		Interval string `json:"interval,omitempty"`
		Rules    []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// query is a PromQL expression and where it comes from.
type query struct{ where, expr string }

// dashboardQueries returns every PromQL expression of the dashboard: panel
// targets and templating queries. It checks the panels' shape as it goes.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID         int    `json:"id"`
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			GridPos struct{ X, W int } `json:"gridPos"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" {
		t.Errorf("%s: no uid or title", dashboardFile)
	}
	var qs []query
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q is wider than the 24-column grid", p.Title)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: datasource %q, %d targets: want ${datasource} and a query", p.Title, p.Datasource.UID, len(p.Targets))
		}
		for _, tg := range p.Targets {
			qs = append(qs, query{"panel " + p.Title, tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			qs = append(qs, query{"variable " + v.Name, fmt.Sprint(q["query"])})
		}
	}
	return qs
}

// ruleQueries returns the alert rules' expressions, checking that each
// rule says how bad it is and what to do.
func ruleQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	var qs []query
	seen := map[string]bool{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || seen[r.Alert] {
				t.Errorf("rule %q: want a unique alert name", r.Alert)
			}
			seen[r.Alert] = true
			if _, err := time.ParseDuration(r.For); err != nil {
				t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
			}
			if !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]) {
				t.Errorf("%s: severity %q", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: want a summary and a description", r.Alert)
			}
			qs = append(qs, query{"alert " + r.Alert, r.Expr})
		}
	}
	if len(qs) == 0 {
		t.Fatalf("%s has no rules", rulesFile)
	}
	return qs
}

var (
	// The metrics a node exports: ours, and the Go and process collectors'.
	metricName = regexp.MustCompile(`\b(?:ringlimit|process|go)_[a-zA-Z0-9_]+\b`)
	selector   = regexp.MustCompile(`\b((?:ringlimit|process|go)_[a-zA-Z0-9_]+)\{([^}]*)\}`)
	matcher    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
	grouping   = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? `)
	labelPair  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
)

// targetLabels are added by Prometheus at scrape time, not by the node.
var targetLabels = []string{"job", "instance", "namespace", "pod", "service", "container", "endpoint"}

// exposition is a /metrics scrape: each metric family's type, and the
// values each label takes in its samples.
type exposition struct {
	types  map[string]string
	labels map[string]map[string]map[string]bool // family -> label -> values
}

func parseExposition(text string) exposition {
	e := exposition{types: map[string]string{}, labels: map[string]map[string]map[string]bool{}}
	for line := range strings.Lines(text) {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			e.types[f[2]] = f[3]
			continue
		}
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		family := e.family(m[1])
		if e.labels[family] == nil {
			e.labels[family] = map[string]map[string]bool{}
		}
		for _, p := range labelPair.FindAllStringSubmatch(m[2], -1) {
			if e.labels[family][p[1]] == nil {
				e.labels[family][p[1]] = map[string]bool{}
			}
			e.labels[family][p[1]][p[2]] = true
		}
	}
	return e
}

// family maps a series name to its metric family: a histogram's _bucket,
// _sum and _count series belong to the histogram's base name.
func (e exposition) family(name string) string {
	if t, ok := e.types[name]; ok {
		if t == "histogram" {
			return "" // only its _bucket, _sum and _count are series
		}
		return name
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if t := e.types[base]; ok && (t == "histogram" || t == "summary") {
			return base
		}
	}
	return ""
}

// problems lists what q references that the scrape does not have: metric
// names, label names (in selectors and by/without), and label values of
// exact matchers.
func (e exposition) problems(q query) []string {
	var out []string
	families := map[string]bool{}
	for _, name := range metricName.FindAllString(q.expr, -1) {
		f := e.family(name)
		if f == "" || e.labels[f] == nil {
			out = append(out, fmt.Sprintf("%s: metric %s is not exported", q.where, name))
			continue
		}
		families[f] = true
	}
	hasLabel := func(f, label string) bool {
		_, ok := e.labels[f][label]
		return ok || slices.Contains(targetLabels, label) || (label == "le" && e.types[f] == "histogram")
	}
	for _, s := range selector.FindAllStringSubmatch(q.expr, -1) {
		f := e.family(s[1])
		if f == "" {
			continue // reported above
		}
		for _, m := range matcher.FindAllStringSubmatch(s[2], -1) {
			label, op, value := m[1], m[2], m[3]
			switch {
			case !hasLabel(f, label):
				out = append(out, fmt.Sprintf("%s: %s has no label %s", q.where, f, label))
			case op == "=" && !slices.Contains(targetLabels, label) && !e.labels[f][label][value]:
				out = append(out, fmt.Sprintf("%s: %s has no series with %s=%q", q.where, f, label, value))
			}
		}
	}
	for _, g := range grouping.FindAllStringSubmatch(q.expr, -1) {
		for label := range strings.SplitSeq(g[1], ",") {
			label = strings.TrimSpace(label)
			found := slices.Contains(targetLabels, label)
			for f := range families {
				found = found || hasLabel(f, label)
			}
			if !found {
				out = append(out, fmt.Sprintf("%s: no metric in it has the label %s it groups by", q.where, label))
			}
		}
	}
	return out
}

// TestMonitoringUsesExportedMetrics runs a node, sends it checks over HTTP
// and gRPC (valid, invalid, GLOBAL), with a policy file, so that labelled series appear, and
// checks that every metric, label and label value the dashboard and the
// alert rules use is in its /metrics.
func TestMonitoringUsesExportedMetrics(t *testing.T) {
	qs := append(dashboardQueries(t), ruleQueries(t)...)
	// Policy metrics are exported only with --policy-file.
	policies := t.TempDir() + "/api.yaml"
	if err := os.WriteFile(policies, []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Snapshot metrics are exported only with --snapshot-dir.
	n := startNode(t, "--global-sync=20ms", "--policy-file="+policies, "--snapshot-dir="+t.TempDir())
	for _, body := range []string{
		`{"requests":[{"name":"m","key":"k1","limit":1,"duration_ms":60000},{"name":"m","key":"k1","limit":1,"duration_ms":60000}]}`,
		`{"requests":[{"name":"m","key":"k2","limit":5,"duration_ms":60000,"behavior":"GLOBAL"}]}`,
		`{"requests":[{"name":"m","key":"","limit":5,"duration_ms":60000}]}`,
	} {
		if code, resp, err := post("http://"+n.http+"/v1/check", body); err != nil || code != 200 {
			t.Fatalf("POST /v1/check: %d %s %v", code, resp, err)
		}
	}
	if _, err := command(bin.rlnode, "check", "--addr", n.grpc, "--key", "k3", "--limit", "5"); err != nil {
		t.Fatal(err)
	}
	// Poll: GLOBAL rounds run in the background.
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, text, err := get("http://" + n.http + "/metrics")
		if err != nil || code != 200 {
			t.Fatalf("GET /metrics: %d %v", code, err)
		}
		e := parseExposition(text)
		var missing []string
		for _, q := range qs {
			missing = append(missing, e.problems(q)...)
		}
		if len(missing) == 0 {
			t.Logf("%d queries checked against %d exported metrics", len(qs), len(e.types))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dashboard or alert rules use what a node does not export:\n%s", strings.Join(slices.Compact(missing), "\n"))
		}
		time.Sleep(100 * time.Millisecond) // polling a process, not timing logic
	}
}

// TestExpositionProblems checks the checker: a renamed metric, a label the
// metric lacks, a value it never takes, and a histogram's series names.
func TestExpositionProblems(t *testing.T) {
	e := parseExposition(`# TYPE ringlimit_checks_total counter
ringlimit_checks_total{route="local",status="OVER_LIMIT"} 1
# TYPE ringlimit_lat_seconds histogram
ringlimit_lat_seconds_bucket{mode="a",le="+Inf"} 1
ringlimit_lat_seconds_sum{mode="a"} 1
ringlimit_lat_seconds_count{mode="a"} 1
`)
	for expr, want := range map[string]int{
		`sum by (route) (rate(ringlimit_checks_total{job=~"$job", status="OVER_LIMIT"}[5m]))`:     0,
		`histogram_quantile(0.9, sum by (le, mode) (rate(ringlimit_lat_seconds_bucket[5m])))`:     0,
		`rate(ringlimit_lat_seconds_sum[5m]) / rate(ringlimit_lat_seconds_count[5m])`:             0,
		`rate(ringlimit_check_total[5m])`:                                                         1, // misspelt
		`rate(ringlimit_lat_seconds[5m])`:                                                         1, // a histogram has no bare series
		`sum by (mode) (rate(ringlimit_checks_total[5m]))`:                                        1, // no such label
		`rate(ringlimit_checks_total{status="REFUSED"}[5m])`:                                      1, // no such value
		`rate(ringlimit_checks_total{route="local", status="OVER_LIMIT", algo="GCRA"}[5m])`:       1,
		`sum by (instance) (rate(ringlimit_checks_total{instance=~".+", namespace="x"}[5m])) > 0`: 0,
	} {
		if got := e.problems(query{"test", expr}); len(got) != want {
			t.Errorf("%s: %d problems %q, want %d", expr, len(got), got, want)
		}
	}
}
