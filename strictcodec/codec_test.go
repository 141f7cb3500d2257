package strictcodec

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/tollgate-io/tollgate/api"
)

// trackRequest encodes a TrackSeriesRequest by hand, so that its tenant can
// hold bytes proto.Marshal would refuse.
func trackRequest(tenant []byte) []byte {
	fields := (&api.TrackSeriesRequest{}).ProtoReflect().Descriptor().Fields()
	var b []byte
	b = protowire.AppendTag(b, fields.ByName("tenant").Number(), protowire.BytesType)
	b = protowire.AppendBytes(b, tenant)
	b = protowire.AppendTag(b, fields.ByName("partition").Number(), protowire.VarintType)
	b = protowire.AppendVarint(b, 1)
	return b
}

// TestInvalidUTF8FieldPath: the field named is the one holding the bad
// bytes, and a valid message names none. (The server's own tests send such
// bytes over real gRPC and check the InvalidArgument answer.)
func TestInvalidUTF8FieldPath(t *testing.T) {
	desc := (&api.TrackSeriesRequest{}).ProtoReflect().Descriptor()
	if got := invalidUTF8Field(desc, trackRequest([]byte("fine")), 0); got != "" {
		t.Errorf("valid message: %q", got)
	}
	if got := invalidUTF8Field(desc, trackRequest([]byte{0x80}), 0); got != "tenant" {
		t.Errorf("invalid tenant: %q", got)
	}
}
