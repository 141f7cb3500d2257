// Package strictcodec is the gRPC server's proto codec: a request that does
// not decode (a string field that is not valid UTF-8, or bytes that are not
// a message of the method's type) is answered InvalidArgument naming the
// field or the type, where grpc-go alone answers Internal ("server bug") for
// what is the caller's bad input.
//
// Install it with Codec.ServerOptions before any other server option, so its
// interceptors run first and no handler sees a message that failed to
// decode.
//
// It also sends a Shared message (encoded once, for many streams) without
// copying it per stream.
package strictcodec
