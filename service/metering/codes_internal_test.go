package metering

import (
	"net/http"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRESTCodesOfLeaderErrors: what a group leader answers a forwarded
// read or write reaches the REST client as the caller's fault when it is
// (a refused credential once came back as "503 … retry"), and as 503 when
// it is the service's state.
func TestRESTCodesOfLeaderErrors(t *testing.T) {
	for _, c := range []struct {
		code        codes.Code
		read, write int
	}{
		{codes.PermissionDenied, http.StatusForbidden, http.StatusForbidden},
		{codes.Unauthenticated, http.StatusUnauthorized, http.StatusUnauthorized},
		{codes.InvalidArgument, http.StatusBadRequest, http.StatusBadRequest},
		{codes.Unavailable, http.StatusServiceUnavailable, http.StatusServiceUnavailable},
		{codes.AlreadyExists, http.StatusServiceUnavailable, http.StatusConflict},
		{codes.OK, http.StatusServiceUnavailable, http.StatusCreated},
	} {
		err := status.Error(c.code, "x")
		if c.code == codes.OK {
			err = nil
		}
		if got := httpCode(err); got != c.write {
			t.Errorf("write refused with %s: %d, want %d", c.code, got, c.write)
		}
		if err != nil && readCode(err) != c.read {
			t.Errorf("read refused with %s: %d, want %d", c.code, readCode(err), c.read)
		}
	}
}
