package runtimecfg

import (
	"sync/atomic"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-io/tollgate/api"
	"github.com/tollgate-io/tollgate/fsm/runtimecfg"
)

// ViewCache keeps the wire form of the newest document for cluster views
// (the zero value is ready).
type ViewCache struct{ view atomic.Pointer[viewConfig] }

// viewConfig is the wire form of the newest document for cluster views,
// and what changed since the one before it: a WatchCluster stream that asked
// for deltas and carried version deltaFrom last gets deltaField (field
// runtime_config_delta of ClusterView, encoded once for every stream)
// instead of the whole document.
type viewConfig struct {
	doc        *runtimecfg.Document
	pb         *api.RuntimeConfig
	deltaFrom  uint64 // 0: no delta
	deltaField []byte
}

// configDeltaField encodes d as field runtime_config_delta of a ClusterView:
// appended to an encoded view without a runtime config, it makes the view
// carry the delta (protobuf concatenation is merge).
func configDeltaField(d *api.RuntimeConfigDelta) ([]byte, error) {
	b, err := proto.Marshal(d)
	if err != nil {
		return nil, err
	}
	num := (&api.ClusterView{}).ProtoReflect().Descriptor().Fields().ByName("runtime_config_delta").Number()
	out := protowire.AppendTag(nil, num, protowire.BytesType)
	return protowire.AppendBytes(out, b), nil
}

// Delta returns the encoded delta from version `from` to the
// config of view v, or nil when the node holds none (the stream sends the
// whole config).
func (c *ViewCache) Delta(v *api.ClusterView, from uint64) []byte {
	vc := c.view.Load()
	if vc == nil || vc.pb != v.RuntimeConfig || vc.deltaFrom == 0 || vc.deltaFrom != from {
		return nil
	}
	return vc.deltaField
}

// Set adds d, the newest configuration, to a cluster view.
func (c *ViewCache) Set(v *api.ClusterView, d *runtimecfg.Document) {
	if d.Version == 0 {
		return
	}
	vc := c.view.Load()
	if vc == nil || vc.doc != d {
		pb := ToProto(d)
		// Distributors have no use for the Envoy rate limit rules, which
		// can be large: every view would carry them to every client.
		pb.Envoy = nil
		next := &viewConfig{doc: d, pb: pb}
		if vc != nil && vc.pb.GetVersion() != 0 && vc.pb.GetVersion() < d.Version {
			// Once per version, one comparison per tenant; every stream
			// that holds the previous version then gets the change only.
			if f, err := configDeltaField(api.ConfigDelta(vc.pb, pb)); err == nil {
				next.deltaFrom, next.deltaField = vc.pb.GetVersion(), f
			}
		}
		vc = next
		c.view.Store(vc)
	}
	v.ConfigVersion, v.RuntimeConfig = d.Version, vc.pb
}
