package clientlib

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/tollgate-io/tollgate/api"
)

// Config configures a Client.
type Config struct {
	// Addrs are gRPC addresses of Tollgate nodes; the first reachable one is asked
	// first, and NotLeader answers redirect to the group leader.
	Addrs []string
	// Partitions must equal the cluster's P (default api.DefaultPartitions).
	Partitions int
	// Groups must equal the cluster's G (default api.DefaultGroups).
	Groups int
	// MaxRedirects bounds NotLeader hops per call (default 3).
	MaxRedirects int
	// DialOptions are added to every connection (TLS, interceptors...). Without
	// transport credentials the connection is plaintext.
	DialOptions []grpc.DialOption
}

// Client is safe for concurrent use.
type Client struct {
	cfg Config

	mu      sync.Mutex
	conns   map[string]*grpc.ClientConn
	leaders map[int]string // group → gRPC address of its last known leader
}

// New validates cfg; connections are opened lazily.
func New(cfg Config) (*Client, error) {
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("clientlib: no node addresses")
	}
	if cfg.Partitions == 0 {
		cfg.Partitions = api.DefaultPartitions
	}
	if cfg.Groups == 0 {
		cfg.Groups = api.DefaultGroups
	}
	if cfg.MaxRedirects == 0 {
		cfg.MaxRedirects = 3
	}
	if err := api.ValidateLayout(cfg.Partitions, cfg.Groups, 1); err != nil {
		return nil, fmt.Errorf("clientlib: %w", err)
	}
	return &Client{cfg: cfg, conns: map[string]*grpc.ClientConn{}, leaders: map[int]string{}}, nil
}

// Close closes every connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, cc := range c.conns {
		errs = append(errs, cc.Close())
	}
	c.conns = map[string]*grpc.ClientConn{}
	return errors.Join(errs...)
}

func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, c.cfg.DialOptions...)
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("clientlib: dial %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// TrackSeries tracks hashes for a tenant and returns the rejected ones. Hashes
// are split by partition and sent in parallel; the first error is returned (with
// the rejections gathered from the partitions that answered).
func (c *Client) TrackSeries(ctx context.Context, tenant string, hashes []uint64) ([]uint64, error) {
	if err := api.ValidateTenantID(tenant); err != nil {
		return nil, err
	}
	byPart := map[int][]uint64{}
	for _, h := range hashes {
		p := api.Partition(h, c.cfg.Partitions)
		byPart[p] = append(byPart[p], h)
	}
	type result struct {
		rejected []uint64
		err      error
	}
	results := make(chan result, len(byPart))
	for p, hs := range byPart {
		go func() {
			rej, err := c.TrackPartition(ctx, tenant, p, hs)
			results <- result{rej, err}
		}()
	}
	var rejected []uint64
	var firstErr error
	for range byPart {
		r := <-results
		rejected = append(rejected, r.rejected...)
		if r.err != nil && firstErr == nil {
			firstErr = r.err
		}
	}
	return rejected, firstErr
}

// TrackPartition sends one partition's hashes to the leader of its group,
// following NotLeader redirects.
func (c *Client) TrackPartition(ctx context.Context, tenant string, partition int, hashes []uint64) ([]uint64, error) {
	group := api.GroupOf(partition, c.cfg.Partitions, c.cfg.Groups)
	addr := c.leaderAddr(group)
	req := &api.TrackSeriesRequest{Tenant: tenant, Partition: uint32(partition), Hashes: hashes}
	var lastErr error
	for hop := 0; hop <= c.cfg.MaxRedirects; hop++ {
		cc, err := c.conn(addr)
		if err != nil {
			return nil, err
		}
		resp, err := api.NewTrackerClient(cc).TrackSeries(ctx, req)
		if err == nil {
			c.setLeader(group, addr)
			return resp.RejectedHashes, nil
		}
		lastErr = err
		next := LeaderHint(err)
		if next == "" || next == addr {
			return nil, err
		}
		addr = next
	}
	return nil, fmt.Errorf("clientlib: group %d: too many NotLeader redirects: %w", group, lastErr)
}

func (c *Client) leaderAddr(group int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if a := c.leaders[group]; a != "" {
		return a
	}
	return c.cfg.Addrs[group%len(c.cfg.Addrs)]
}

func (c *Client) setLeader(group int, addr string) {
	c.mu.Lock()
	c.leaders[group] = addr
	c.mu.Unlock()
}

// LeaderHint returns the leader address carried by a NotLeader error, or "".
func LeaderHint(err error) string {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.FailedPrecondition {
		return ""
	}
	for _, d := range st.Details() {
		if nl, ok := d.(*api.NotLeader); ok {
			return nl.LeaderGrpcAddress
		}
	}
	return ""
}
