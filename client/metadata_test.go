package client

import (
	"testing"

	"github.com/ringlimit/ringlimit/service"
)

func TestMetadataKeyMatchesService(t *testing.T) {
	if metadataDecidedBy != service.MetadataDecidedBy {
		t.Errorf("client reads %q, the service writes %q", metadataDecidedBy, service.MetadataDecidedBy)
	}
}
