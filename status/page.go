package status

import (
	"cmp"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// pageRows is how many keys each table of the page shows.
const pageRows = 20

// DefaultRefresh is how often the page reloads itself (a meta tag, no
// script); ?refresh=0 stops it.
const DefaultRefresh = 5

// row is one key of the page's tables.
type row struct {
	Limit, Key        string
	Truncated         bool
	ChecksPerSecond   float64
	RefusalsPerSecond float64
	Checks, Refusals  uint64
}

// page is what the template renders. Every string in it is escaped by
// html/template for where it lands: keys and names are the clients'.
type page struct {
	View
	Self    string
	Now     time.Time
	Refresh int
	Hot     []row
	Refused []row
	Changes []Change
	Alive   int
}

func (s *Status) handlePage(w http.ResponseWriter, r *http.Request) {
	refresh := DefaultRefresh
	if q := r.URL.Query().Get("refresh"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 0 || n > 3600 {
			http.Error(w, fmt.Sprintf("refresh: %.20q, want seconds from 0 (never) to 3600", q), http.StatusBadRequest)
			return
		}
		refresh = n
	}
	v := s.view(r.Context(), pageRows)
	p := page{View: v, Now: s.conf.Now().UTC(), Refresh: refresh}
	for _, n := range v.Nodes {
		if n.Self {
			p.Self = n.Name
		}
		if n.State == "alive" {
			p.Alive++
		}
	}
	if s.conf.Changes != nil {
		p.Changes = s.conf.Changes.Log()
	}
	p.Hot, p.Refused = rows(v)
	// The page loads nothing: no script, no style sheet, no image, no
	// frame; its one style is inline.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	pageTemplate.Execute(w, p) // the client may have gone; nothing to do about it
}

// rows flattens v's limits into the page's two tables: the hottest keys
// of every limit by checks/s, and the most refused by refusals/s.
func rows(v View) (hot, refused []row) {
	for _, l := range v.Limits {
		for _, k := range l.Hot {
			hot = append(hot, row{Limit: l.Name, Key: k.Key, Truncated: k.Truncated, ChecksPerSecond: k.ChecksPerSecond,
				RefusalsPerSecond: k.RefusalsPerSecond, Checks: k.Checks, Refusals: k.Refusals})
		}
		for _, k := range l.Refused {
			if k.Refusals > 0 {
				refused = append(refused, row{Limit: l.Name, Key: k.Key, Truncated: k.Truncated, ChecksPerSecond: k.ChecksPerSecond,
					RefusalsPerSecond: k.RefusalsPerSecond, Checks: k.Checks, Refusals: k.Refusals})
			}
		}
	}
	// By rates, which are what the page shows: a merged count sums
	// intervals of different lengths, a merged rate does not.
	slices.SortStableFunc(hot, func(a, b row) int { return cmp.Compare(b.ChecksPerSecond, a.ChecksPerSecond) })
	slices.SortStableFunc(refused, func(a, b row) int { return cmp.Compare(b.RefusalsPerSecond, a.RefusalsPerSecond) })
	return hot[:min(len(hot), pageRows)], refused[:min(len(refused), pageRows)]
}

var pageTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"rate":    func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"percent": func(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) },
	"lag": func(s float64) string {
		return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
	},
	"when": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	"join": func(names []string) string { return strings.Join(names, ", ") },
}).Parse(pageHTML))

const pageHTML = `<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{{if .Refresh}}<meta http-equiv="refresh" content="{{.Refresh}}">{{end}}
<title>ringlimit · {{.Self}}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1d2330; background: #fbfbfd; }
h1 { font-size: 1.4em; margin: 0 0 .2em; }
h2 { font-size: 1.1em; margin: 1.6em 0 .4em; }
p.sub { color: #5a6275; margin: 0; }
table { border-collapse: collapse; min-width: 40em; background: #fff; }
th, td { text-align: left; padding: .3em .8em; border-bottom: 1px solid #e3e6ee; }
th { background: #eef1f7; font-weight: 600; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
td.key { font-family: ui-monospace, monospace; word-break: break-all; max-width: 40em; }
.bar { display: inline-block; height: .7em; background: #4a7bd0; vertical-align: middle; margin-right: .4em; }
.err { color: #b3261e; }
.refused { color: #b3261e; }
.empty { color: #5a6275; font-style: italic; }
.totals span { margin-right: 2em; }
</style>
</head>
<body>
<h1>ringlimit status</h1>
<p class="sub">node <b id="self">{{.Self}}</b> · {{.Alive}} of {{len .Nodes}} members alive · {{when .Now}}{{if .KeysHidden}} · keys hidden (keyed hashes){{end}}{{if .Refresh}} · refreshes every {{.Refresh}}s{{end}}</p>
<p class="totals"><span>cluster: <b>{{rate .ChecksPerSecond}}</b> checks/s</span><span><b class="refused">{{rate .RefusalsPerSecond}}</b> refusals/s</span><span>over the last {{rate .Seconds}}s</span></p>

<h2>Members</h2>
<table id="members">
<tr><th>name</th><th>state</th><th>share of the ring</th><th>checks/s</th><th>refusals/s</th><th>replication lag</th><th>HTTP</th></tr>
{{range .Nodes}}<tr>
<td>{{.Name}}{{if .Self}} (this node){{end}}</td>
<td>{{.State}}</td>
<td><span class="bar" style="width: {{percent .Share}}px"></span>{{percent .Share}}%</td>
{{if .Error}}<td class="err" colspan="3">not answered: {{.Error}}</td>{{else}}<td class="n">{{rate .ChecksPerSecond}}</td><td class="n">{{rate .RefusalsPerSecond}}</td><td class="n">{{lag .ReplicationLagSeconds}}</td>{{end}}
<td>{{.HTTPAddr}}</td>
</tr>{{end}}
</table>

<h2>Hottest keys</h2>
{{if .Hot}}<table id="hot">
<tr><th>limit</th><th>key</th><th>checks/s</th><th>refusals/s</th></tr>
{{range .Hot}}<tr><td>{{.Limit}}</td><td class="key">{{.Key}}{{if .Truncated}}…{{end}}</td><td class="n">{{rate .ChecksPerSecond}}</td><td class="n">{{rate .RefusalsPerSecond}}</td></tr>
{{end}}</table>{{else}}<p class="empty">No checks in the last interval.</p>{{end}}

<h2>Most refused keys</h2>
{{if .Refused}}<table id="refused">
<tr><th>limit</th><th>key</th><th>refusals/s</th><th>checks/s</th></tr>
{{range .Refused}}<tr><td>{{.Limit}}</td><td class="key">{{.Key}}{{if .Truncated}}…{{end}}</td><td class="n refused">{{rate .RefusalsPerSecond}}</td><td class="n">{{rate .ChecksPerSecond}}</td></tr>
{{end}}</table>{{else}}<p class="empty">No refusals in the last interval.</p>{{end}}

{{if .UnknownDomains}}<h2>Domains no policy file has</h2>
<p id="unknown-domains">Envoy asked this node for these domains, which no policy file has: their requests are not limited. Check the filters' <code>domain</code>: {{join .UnknownDomains}}</p>
{{end}}
<h2>Recent ring changes</h2>
{{if .Changes}}<table id="changes">
<tr><th>time</th><th>joined</th><th>left</th><th>members after</th></tr>
{{range .Changes}}<tr><td>{{when .Time}}</td><td>{{join .Joined}}</td><td>{{join .Left}}</td><td class="n">{{.Members}}{{if .More}} ({{.More}} more not named){{end}}</td></tr>
{{end}}</table>{{else}}<p class="empty">No ring change seen since this node started.</p>{{end}}

<p class="sub">Counts are estimates from bounded sketches on each node (see docs/operations.md); the same data as JSON: <a href="/v1/top">/v1/top</a>.</p>
</body>
</html>
`
