package api

import (
	"context"

	"google.golang.org/grpc"
)

// RateAdmit is a unary service beside RateLimit: a lease client whose lease
// does not cover a request asks the key's owner to decide it now (a
// sliding-window key: an Envoy rule). It is written by hand and carries the
// RateLimit messages, so no generated code changes:
//
//	request  RateReport: new_names[0] the key, consumed_total[0] the tokens,
//	         client_id the asking client, bucket_consumed (optional) its
//	         consumed total and lease cap for the key as it asks.
//	response RateUpdate: cap[0] 1 admitted / 0 refused, cap[1] what could
//	         still be admitted now (beyond what clients hold),
//	         blocked_for_nanos[0] until the oldest admitted token leaves the
//	         window; redirects names the leader when this node is not the
//	         owner (then cap is empty).
//
// Errors: InvalidArgument (not one key, a bad key, a key without a
// sliding-window limit), Unavailable (shutting down).
const RateAdmitMethod = "/tollgate.v1.RateAdmit/Admit"

// RateAdmitServer is the server side of RateAdmit.
type RateAdmitServer interface {
	Admit(context.Context, *RateReport) (*RateUpdate, error)
}

// RegisterRateAdmitServer registers srv on s.
func RegisterRateAdmitServer(s grpc.ServiceRegistrar, srv RateAdmitServer) {
	s.RegisterService(&rateAdmitDesc, srv)
}

var rateAdmitDesc = grpc.ServiceDesc{
	ServiceName: "tollgate.v1.RateAdmit",
	HandlerType: (*RateAdmitServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Admit",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(RateReport)
			if err := dec(in); err != nil {
				return nil, err
			}
			if icpt == nil {
				return srv.(RateAdmitServer).Admit(ctx, in)
			}
			info := &grpc.UnaryServerInfo{Server: srv, FullMethod: RateAdmitMethod}
			return icpt(ctx, in, info, func(ctx context.Context, req any) (any, error) {
				return srv.(RateAdmitServer).Admit(ctx, req.(*RateReport))
			})
		},
	}},
	Metadata: "api/rateadmit.go",
}

// InvokeRateAdmit calls RateAdmit.Admit on cc.
func InvokeRateAdmit(ctx context.Context, cc grpc.ClientConnInterface, in *RateReport, opts ...grpc.CallOption) (*RateUpdate, error) {
	out := new(RateUpdate)
	if err := cc.Invoke(ctx, RateAdmitMethod, in, out, opts...); err != nil {
		return nil, err
	}
	return out, nil
}
