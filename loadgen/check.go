package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	pb "github.com/ringlimit/ringlimit/api/ringlimitv1"
	"github.com/ringlimit/ringlimit/client"
)

// checker sends one request of the worker's items and returns how many
// were admitted and refused; an item that failed is neither. An error
// means the request, or one of its items, failed.
type checker interface {
	check(ctx context.Context, keys []int) (under, over int64, err error)
}

// itemTally counts the results of one request's items: admitted, refused,
// or failed, which is neither, and keeps the first failure.
type itemTally struct {
	under, over int64
	err         error
}

func (t *itemTally) add(admitted bool, err error) {
	switch {
	case err != nil:
		if t.err == nil {
			t.err = err
		}
	case admitted:
		t.under++
	default:
		t.over++
	}
}

// itemError is the error a result's error text stands for, or nil.
func itemError(text string) error {
	if text == "" {
		return nil
	}
	return fmt.Errorf("item: %s", text)
}

// grpcChecker sends Check requests, one RPC each, over one shared gRPC
// connection per node.
type grpcChecker struct {
	rl pb.RateLimiterClient
	l  client.Limit
}

func (g grpcChecker) check(ctx context.Context, keys []int) (under, over int64, err error) {
	req := &pb.CheckRequest{Requests: make([]*pb.CheckItem, len(keys))}
	for i, k := range keys {
		req.Requests[i] = g.l.Item("bench:"+strconv.Itoa(k), 1)
	}
	resp, err := g.rl.Check(ctx, req)
	if err != nil {
		return 0, 0, err
	}
	if len(resp.Responses) != len(keys) {
		return 0, 0, fmt.Errorf("%d results for %d items", len(resp.Responses), len(keys))
	}
	var t itemTally
	for _, r := range resp.Responses {
		t.add(r.Status == pb.Status_UNDER_LIMIT, itemError(r.Error))
	}
	return t.under, t.over, t.err
}

// httpChecker sends requests as POST /v1/check through a shared client.
type httpChecker struct {
	hc  *http.Client
	url string
	o   Options
}

func (h *httpChecker) check(ctx context.Context, keys []int) (under, over int64, err error) {
	body := make([]byte, 0, 64+len(keys)*(128+len(h.o.Name)))
	body = append(body, `{"requests":[`...)
	for i, k := range keys {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, `{"name":`...)
		body = strconv.AppendQuote(body, h.o.Name)
		body = append(body, `,"key":"bench:`...)
		body = strconv.AppendInt(body, int64(k), 10)
		body = append(body, `","limit":`...)
		body = strconv.AppendInt(body, h.o.Limit, 10)
		body = append(body, `,"duration_ms":`...)
		body = strconv.AppendInt(body, h.o.Period.Milliseconds(), 10)
		body = append(body, `,"algorithm":"`...)
		body = append(body, h.o.Algorithm.String()...)
		body = append(body, `","behavior":"`...)
		body = append(body, h.o.Behavior.String()...)
		body = append(body, `"}`...)
	}
	body = append(body, `]}`...)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.hc.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(data))
	}
	var out struct {
		Responses []struct {
			Status string `json:"status"`
			Error  string `json:"error"`
		} `json:"responses"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return 0, 0, fmt.Errorf("response: %w", err)
	}
	if len(out.Responses) != len(keys) {
		return 0, 0, fmt.Errorf("%d results for %d items", len(out.Responses), len(keys))
	}
	var t itemTally
	for _, r := range out.Responses {
		t.add(r.Status == "UNDER_LIMIT", itemError(r.Error))
	}
	return t.under, t.over, t.err
}

// allowChecker asks through the Go client's Allow, one call per item, as
// an application does: with --client, a request is one call of one item.
type allowChecker struct {
	c *client.Client
	l client.Limit
}

func (a allowChecker) check(ctx context.Context, keys []int) (under, over int64, err error) {
	var t itemTally
	for _, k := range keys {
		t.add(a.c.Allow(ctx, a.l, "bench:"+strconv.Itoa(k)))
	}
	return t.under, t.over, t.err
}
