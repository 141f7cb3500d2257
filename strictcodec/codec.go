package strictcodec

import (
	"context"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	gproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Codec is the server's proto codec. A proto3 string that is not
// valid UTF-8 fails to decode, and grpc-go turns every decode error into
// codes.Internal before any handler or interceptor runs — telling the client
// "server bug" for what is bad input. grpc-go wraps whatever the codec returns,
// so the codec cannot return the status itself: instead it accepts the message
// (left empty), remembers the error for it, and the interceptors installed with
// it answer InvalidArgument naming the field before the handler sees the
// request. Any other decode error (bytes that are not a message of the
// method's type) is answered InvalidArgument the same way.
type Codec struct {
	base encoding.CodecV2

	pending atomic.Int32 // len(bad), read without the lock on every request
	mu      sync.Mutex
	bad     map[any]error // decoded message (pointer) → its InvalidArgument
}

// New returns a codec with nothing pending.
func New() *Codec {
	return &Codec{base: encoding.GetCodecV2(gproto.Name), bad: map[any]error{}}
}

// ServerOptions installs the codec and the interceptors that report what it
// found; they must come before the server's other options so these
// interceptors run first.
func (c *Codec) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(c),
		grpc.ChainUnaryInterceptor(c.unary),
		grpc.ChainStreamInterceptor(c.stream),
	}
}

// Name is the proto codec's name: the codec replaces it.
func (c *Codec) Name() string { return c.base.Name() }

// Marshal encodes v; a *Shared is sent as its parts, uncopied.
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(*Shared); ok {
		// Read-only slice buffers: their Ref and Free do nothing, and the
		// transport only reads them, so every stream can queue the same
		// bytes. The parts are sent back to back as one message.
		bs := make(mem.BufferSlice, 0, len(m.Parts))
		for _, p := range m.Parts {
			if len(p) > 0 {
				bs = append(bs, mem.SliceBuffer(p))
			}
		}
		return bs, nil
	}
	return c.base.Marshal(v)
}

// Shared is a message marshalled once and sent as is on many streams
// (the cluster view): a stream whose client does not read queues
// references to the bytes, not a copy of them. Its Parts are encodings
// that concatenate into the message (a message's encoding followed by more
// of its fields' encodings); nobody may change them once sent.
type Shared struct{ Parts [][]byte }

// Unmarshal decodes into v; a decode error is kept for the interceptors
// to answer InvalidArgument (see Codec).
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.base.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	desc := m.ProtoReflect().Descriptor()
	// Bytes that are not a message of the method's type are the client's
	// fault too: InvalidArgument, naming the field when one is at fault.
	bad := status.Errorf(codes.InvalidArgument, "request is not a valid %s message: %v", desc.FullName(), err)
	if field := invalidUTF8Field(desc, data.Materialize(), 0); field != "" {
		bad = status.Errorf(codes.InvalidArgument,
			"%s: field %q is not valid UTF-8; string fields must be UTF-8 (tenant ids: 1–150 bytes of letters, digits and !-_.*'())",
			desc.Name(), field)
	}
	proto.Reset(m) // the handler never sees it; leave nothing half-decoded
	c.mu.Lock()
	c.bad[v] = bad
	c.pending.Store(int32(len(c.bad)))
	c.mu.Unlock()
	return nil
}

// take returns (and forgets) the error recorded for a decoded message.
func (c *Codec) take(msg any) error {
	if c.pending.Load() == 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	err, ok := c.bad[msg]
	if ok {
		delete(c.bad, msg)
		c.pending.Store(int32(len(c.bad)))
	}
	return err
}

func (c *Codec) unary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := c.take(req); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (c *Codec) stream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, &utf8CheckedStream{ServerStream: ss, c: c})
}

type utf8CheckedStream struct {
	grpc.ServerStream
	c *Codec
}

func (s *utf8CheckedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return s.c.take(m)
}

// maxNesting bounds the walk over nested messages in a hostile input.
const maxNesting = 32

// invalidUTF8Field returns the path (e.g. "tenant" or "header.node_id") of the
// first string field in b that is not valid UTF-8, or "" when there is none or
// b is not well-formed.
func invalidUTF8Field(desc protoreflect.MessageDescriptor, b []byte, depth int) string {
	if depth > maxNesting {
		return ""
	}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		fd := desc.Fields().ByNumber(num)
		if fd == nil || typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return ""
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.Valid(v) {
				return string(fd.Name())
			}
		case protoreflect.MessageKind:
			if inner := invalidUTF8Field(fd.Message(), v, depth+1); inner != "" {
				return string(fd.Name()) + "." + inner
			}
		}
	}
	return ""
}
