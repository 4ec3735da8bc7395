package loadgen

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ringlimit/ringlimit/status"
)

// Top returns the cluster's counts of who is being limited, as the node
// merged them, with at most keys keys per list: its GET /v1/top.
func (n Node) Top(ctx context.Context, keys int) (status.View, error) {
	text, err := n.get(ctx, fmt.Sprintf("/v1/top?keys=%d", keys), "application/json")
	if err != nil {
		return status.View{}, err
	}
	var v status.View
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		return status.View{}, fmt.Errorf("GET %s/v1/top: %w", n.addr, err)
	}
	return v, nil
}
