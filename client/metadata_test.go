package client

import (
	"testing"

	"github.com/ringlimit/ringlimit/api"
	"github.com/ringlimit/ringlimit/service"
)

// The client keeps its own copies of the server's metadata keys, so that
// it does not import the server's packages; these keep them in step.

func TestMetadataKeyMatchesService(t *testing.T) {
	if metadataDecidedBy != service.MetadataDecidedBy {
		t.Errorf("client reads %q, the service writes %q", metadataDecidedBy, service.MetadataDecidedBy)
	}
}

func TestRingHeaderMatchesAPI(t *testing.T) {
	if ringHeader != api.RingHeader {
		t.Errorf("client sends %q, the API reads %q", ringHeader, api.RingHeader)
	}
}
