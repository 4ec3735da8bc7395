package client

// ServeForTest is serve, for the package's external tests and benchmarks.
var ServeForTest = serve
