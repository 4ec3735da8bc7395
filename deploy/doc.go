// Package deploy holds what runs ringlimit elsewhere than `go run`: the Helm
// chart (helm/ringlimit), the local cluster (docker-compose.yml), and the
// Grafana dashboard and Prometheus alert rules (monitoring/). It has no
// code of its own, only the tests that check those files against the real
// rlnode: the rendered chart decoded strictly into Kubernetes types, run
// as containers, and every metric the dashboards name scraped from a node.
//
// It is its own Go module so that the product's go.mod carries neither
// Kubernetes nor Helm. Helm is a pinned tool of this module:
//
//	cd deploy && go tool helm template rl helm/ringlimit
package deploy
