package main

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/tollgate-io/tollgate/server"
	"github.com/tollgate-io/tollgate/tlsutil"
)

// The Kubernetes manifests (deployments/kubernetes) are decoded strictly into
// the k8s.io/api types (an unknown or misspelt field fails, as the API server
// would refuse it), the kustomize overlays are rendered the way kustomize
// applies their JSON patches, and the pieces are checked against each other and
// against the server: every pod's command line, environment and mounted files
// are loaded by `tollgate server`'s own flag set and config loader.

const k8sDir = "../../deployments/kubernetes"

// kustomization is the part of kustomize's Kustomization these manifests use;
// decoded strictly, so a field this test does not apply fails it.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Patches    []struct {
		Path   string `json:"path"`
		Target struct {
			Group   string `json:"group"`
			Version string `json:"version"`
			Kind    string `json:"kind"`
			Name    string `json:"name"`
		} `json:"target"`
	} `json:"patches"`
}

// manifest is one rendered object: its generic form (what patches apply to)
// and where it came from.
type manifest struct {
	file string
	obj  map[string]any
}

func (m manifest) kind() string { s, _ := m.obj["kind"].(string); return s }
func (m manifest) name() string {
	md, _ := m.obj["metadata"].(map[string]any)
	s, _ := md["name"].(string)
	return s
}

// render builds a kustomization directory: its resources (files or other
// kustomizations), then its JSON patches.
func render(t *testing.T, dir string) []manifest {
	t.Helper()
	var k kustomization
	readStrict(t, filepath.Join(dir, "kustomization.yaml"), &k)
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Fatalf("%s/kustomization.yaml: apiVersion/kind %q/%q", dir, k.APIVersion, k.Kind)
	}
	var out []manifest
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			out = append(out, render(t, p)...)
			continue
		}
		out = append(out, readManifests(t, p)...)
	}
	for _, p := range k.Patches {
		var ops []jsonPatchOp
		readStrict(t, filepath.Join(dir, p.Path), &ops)
		hit := 0
		for _, m := range out {
			gv := p.Target.Version
			if p.Target.Group != "" {
				gv = p.Target.Group + "/" + p.Target.Version
			}
			if m.kind() != p.Target.Kind || m.name() != p.Target.Name || m.obj["apiVersion"] != gv {
				continue
			}
			hit++
			for i, op := range ops {
				if err := op.apply(m.obj); err != nil {
					t.Fatalf("%s: patch %s op %d (%s %s): %v", dir, p.Path, i, op.Op, op.Path, err)
				}
			}
		}
		if hit != 1 {
			t.Fatalf("%s: patch %s targets %d objects, want 1", dir, p.Path, hit)
		}
	}
	return out
}

func readStrict(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func readManifests(t *testing.T, path string) []manifest {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []manifest
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var obj map[string]any
		if err := yaml.UnmarshalStrict([]byte(doc), &obj); err != nil {
			t.Fatalf("%s document %d: %v", path, i, err)
		}
		out = append(out, manifest{file: path, obj: obj})
	}
	return out
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// jsonPatchOp is one RFC 6902 operation; add, replace, and test and remove on
// object members are what the overlays use, anything else fails the test
// rather than being ignored.
type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

func (op jsonPatchOp) apply(doc map[string]any) error {
	if op.Op != "add" && op.Op != "replace" && op.Op != "test" && op.Op != "remove" {
		return fmt.Errorf("op %q is not supported here", op.Op)
	}
	parts := strings.Split(strings.TrimPrefix(op.Path, "/"), "/")
	for i := range parts {
		parts[i] = strings.NewReplacer("~1", "/", "~0", "~").Replace(parts[i])
	}
	var parent any = doc
	for _, p := range parts[:len(parts)-1] {
		switch n := parent.(type) {
		case map[string]any:
			v, ok := n[p]
			if !ok {
				return fmt.Errorf("no %q", p)
			}
			parent = v
		case []any:
			i, err := strconv.Atoi(p)
			if err != nil || i < 0 || i >= len(n) {
				return fmt.Errorf("bad index %q", p)
			}
			parent = n[i]
		default:
			return fmt.Errorf("%q is inside a scalar", p)
		}
	}
	last := parts[len(parts)-1]
	switch n := parent.(type) {
	case map[string]any:
		v, ok := n[last]
		switch op.Op {
		case "test":
			if !ok || fmt.Sprint(v) != fmt.Sprint(op.Value) {
				return fmt.Errorf("test: %q is %v, want %v", last, v, op.Value)
			}
			return nil
		case "remove", "replace":
			if !ok {
				return fmt.Errorf("%s: no %q", op.Op, last)
			}
			if op.Op == "remove" {
				delete(n, last)
				return nil
			}
		}
		n[last] = op.Value
		return nil
	case []any:
		// Appending to a slice inside a map needs the map entry updated: find
		// it again from the top (the overlays only append with "-").
		if last != "-" || op.Op != "add" {
			return fmt.Errorf("only add with - is supported on lists")
		}
		return appendAt(doc, parts[:len(parts)-1], op.Value)
	}
	return fmt.Errorf("cannot set %q", last)
}

func appendAt(doc map[string]any, path []string, v any) error {
	var cur any = doc
	for i, p := range path {
		switch n := cur.(type) {
		case map[string]any:
			if i == len(path)-1 {
				l, _ := n[p].([]any)
				n[p] = append(l, v)
				return nil
			}
			cur = n[p]
		case []any:
			j, _ := strconv.Atoi(p)
			if i == len(path)-1 {
				l, _ := n[j].([]any)
				n[j] = append(l, v)
				return nil
			}
			cur = n[j]
		}
	}
	return fmt.Errorf("append: bad path")
}

// rendered is a kustomization's objects decoded into their API types.
type rendered struct {
	configMaps map[string]*corev1.ConfigMap
	services   map[string]*corev1.Service
	sts        *appsv1.StatefulSet
	pdb        *policyv1.PodDisruptionBudget
}

func decodeAll(t *testing.T, ms []manifest) rendered {
	t.Helper()
	r := rendered{configMaps: map[string]*corev1.ConfigMap{}, services: map[string]*corev1.Service{}}
	for _, m := range ms {
		j, err := yaml.Marshal(m.obj)
		if err != nil {
			t.Fatal(err)
		}
		into := func(v any) {
			if err := yaml.UnmarshalStrict(j, v); err != nil {
				t.Fatalf("%s: %s %s: %v", m.file, m.kind(), m.name(), err)
			}
		}
		switch av := m.obj["apiVersion"]; m.kind() + " " + fmt.Sprint(av) {
		case "ConfigMap v1":
			var cm corev1.ConfigMap
			into(&cm)
			r.configMaps[cm.Name] = &cm
		case "Service v1":
			var s corev1.Service
			into(&s)
			r.services[s.Name] = &s
		case "StatefulSet apps/v1":
			if r.sts != nil {
				t.Fatal("more than one StatefulSet: this test checks one")
			}
			r.sts = &appsv1.StatefulSet{}
			into(r.sts)
		case "PodDisruptionBudget policy/v1":
			r.pdb = &policyv1.PodDisruptionBudget{}
			into(r.pdb)
		default:
			t.Fatalf("%s: %s %s (%v): a kind this test does not check; add it", m.file, m.kind(), m.name(), av)
		}
	}
	if r.sts == nil || r.pdb == nil {
		t.Fatal("want a StatefulSet and a PodDisruptionBudget")
	}
	return r
}

// k8sNamespace is the namespace the pods are rendered in (the README's);
// nothing in the manifests may depend on it.
const k8sNamespace = "tollgate"

// kustomizations lists every directory under deployments/kubernetes with a
// kustomization.yaml, relative to it: each is rendered and checked, so an
// overlay added later is tested without touching this file.
func kustomizations(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(k8sDir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Name() == "kustomization.yaml" {
			rel, err := filepath.Rel(k8sDir, filepath.Dir(p))
			if err != nil {
				return err
			}
			dirs = append(dirs, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(dirs, "base") || !slices.Contains(dirs, "overlays/tls") {
		t.Fatalf("kustomizations %v: want base and overlays/tls among them", dirs)
	}
	return dirs
}

func TestKubernetesManifests(t *testing.T) {
	for _, dir := range kustomizations(t) {
		if dir == "gateway" {
			// The remote-write gateway's Deployment, not a Tollgate node:
			// TestKubernetesGatewayManifests checks it.
			continue
		}
		t.Run(strings.ReplaceAll(dir, "/", "_"), func(t *testing.T) {
			r := decodeAll(t, render(t, filepath.Join(k8sDir, dir)))
			// overlays/single-zone is the one that may double up a zone
			// (for kind and other one-zone clusters; its file says so).
			checkKubernetes(t, r, strings.Contains(dir, "tls"), dir != "overlays/single-zone")
		})
	}
}

// zoneSpreadAdmits simulates the scheduler's PodTopologySpread filter with
// DoNotSchedule constraints over zones: pods already placed per zone, the
// zones that have a schedulable node, and whether a new pod may go to zone.
// Kubernetes' rule: skew = pods in the zone after placing − the global
// minimum over eligible zones, where the minimum is 0 when fewer zones are
// eligible than minDomains; a pod fits when skew ≤ maxSkew for every
// constraint.
func zoneSpreadAdmits(cs []corev1.TopologySpreadConstraint, podLabels labels.Set, placed map[string]int, zones []string, zone string) bool {
	for _, c := range cs {
		s, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
		if err != nil || c.TopologyKey != corev1.LabelTopologyZone || c.WhenUnsatisfiable != corev1.DoNotSchedule || !s.Matches(podLabels) {
			continue
		}
		minDomains := int32(1)
		if c.MinDomains != nil {
			minDomains = *c.MinDomains
		}
		globalMin := -1
		for _, z := range zones {
			if globalMin < 0 || placed[z] < globalMin {
				globalMin = placed[z]
			}
		}
		if int32(len(zones)) < minDomains {
			globalMin = 0
		}
		if placed[zone]+1-globalMin > int(c.MaxSkew) {
			return false
		}
	}
	return true
}

func checkKubernetes(t *testing.T, r rendered, wantTLS, wantOnePerZone bool) {
	sts := r.sts
	pod := sts.Spec.Template
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		t.Fatalf("StatefulSet replicas %v, want 3 (one per zone)", sts.Spec.Replicas)
	}
	replicas := int(*sts.Spec.Replicas)
	sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	podLabels := labelsSet(pod.Labels)
	if !sel.Matches(podLabels) {
		t.Fatalf("StatefulSet selector %v does not select its pods %v", sts.Spec.Selector, pod.Labels)
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Errorf("podManagementPolicy %q: the pods must start together (bootstrap_expect), want Parallel", sts.Spec.PodManagementPolicy)
	}
	// One pod per zone: a hard spread over zones selecting these pods.
	zoneSpread := false
	for _, c := range pod.Spec.TopologySpreadConstraints {
		s, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
		if err != nil {
			t.Fatal(err)
		}
		if c.TopologyKey == corev1.LabelTopologyZone && c.MaxSkew == 1 && c.WhenUnsatisfiable == corev1.DoNotSchedule && s.Matches(podLabels) {
			zoneSpread = true
		}
	}
	if !zoneSpread {
		t.Error("no topologySpreadConstraint with maxSkew 1 over topology.kubernetes.io/zone (DoNotSchedule) selecting the pods")
	}
	// One pod per zone, enforced: with one pod in each of two zones and no
	// third zone with room, the third pod must stay Pending rather than
	// join a zone (losing that zone would then lose every group's quorum).
	// maxSkew 1 alone admits it (skew 2−1).
	two := map[string]int{"zone-a": 1, "zone-b": 1}
	doubles := zoneSpreadAdmits(pod.Spec.TopologySpreadConstraints, podLabels, two, []string{"zone-a", "zone-b"}, "zone-a")
	if wantOnePerZone && doubles {
		t.Error("the zone spread lets a second pod into a zone when only two zones have room: want minDomains equal to the replicas")
	}
	if !zoneSpreadAdmits(pod.Spec.TopologySpreadConstraints, podLabels, two, []string{"zone-a", "zone-b", "zone-c"}, "zone-c") {
		t.Error("the zone spread refuses the third pod in an empty third zone")
	}
	if !wantOnePerZone && !zoneSpreadAdmits(pod.Spec.TopologySpreadConstraints, podLabels, map[string]int{"zone-a": 2}, []string{"zone-a"}, "zone-a") {
		t.Error("a single-zone overlay must let all pods into one zone")
	}

	// Services: the headless one is the StatefulSet's, both select the pods,
	// and every port targets a container port of the same protocol.
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	cports := map[string]corev1.ContainerPort{}
	for _, p := range c.Ports {
		cports[p.Name] = p
	}
	headless := r.services[sts.Spec.ServiceName]
	if headless == nil {
		t.Fatalf("serviceName %q: no such Service", sts.Spec.ServiceName)
	}
	if headless.Spec.ClusterIP != corev1.ClusterIPNone || !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s: want clusterIP None and publishNotReadyAddresses (peers must resolve before they are ready)", headless.Name)
	}
	var client *corev1.Service
	for _, s := range r.services {
		if !labelsSet(s.Spec.Selector).AsSelector().Matches(podLabels) || len(s.Spec.Selector) == 0 {
			t.Errorf("Service %s selector %v does not select the pods", s.Name, s.Spec.Selector)
		}
		for _, p := range s.Spec.Ports {
			cp, ok := cports[p.TargetPort.StrVal]
			if p.TargetPort.Type != intstr.String || !ok {
				t.Errorf("Service %s port %s: targetPort %v is not a named container port", s.Name, p.Name, p.TargetPort)
				continue
			}
			if proto(p.Protocol) != proto(cp.Protocol) || p.Port != cp.ContainerPort {
				t.Errorf("Service %s port %s: %d/%s, container port %s is %d/%s", s.Name, p.Name, p.Port, proto(p.Protocol), cp.Name, cp.ContainerPort, proto(cp.Protocol))
			}
		}
		if s != headless {
			client = s
		}
	}
	if client == nil || !hasPort(client, "grpc") || !hasPort(client, "http") {
		t.Error("want a client Service with the grpc and http ports")
	}
	for _, want := range []string{"grpc", "raft", "gossip-tcp", "gossip-udp"} {
		if !hasPort(headless, want) {
			t.Errorf("headless Service %s lacks port %s", headless.Name, want)
		}
	}

	// Probes: readiness is /readyz, liveness /healthz, on the HTTP port.
	probe := func(what string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe: want an httpGet probe", what)
			return
		}
		if p.HTTPGet.Path != path || cports[p.HTTPGet.Port.StrVal].Name != "http" {
			t.Errorf("%s probe: %s on port %v, want %s on the http port", what, p.HTTPGet.Path, p.HTTPGet.Port, path)
		}
		want := corev1.URISchemeHTTP
		if wantTLS {
			want = corev1.URISchemeHTTPS
		}
		if got := p.HTTPGet.Scheme; got != want && !(got == "" && want == corev1.URISchemeHTTP) {
			t.Errorf("%s probe scheme %q, want %q", what, got, want)
		}
	}
	probe("readiness", c.ReadinessProbe, "/readyz")
	probe("liveness", c.LivenessProbe, "/healthz")
	probe("startup", c.StartupProbe, "/healthz")
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Error("want CPU and memory requests")
	}
	if l := c.Resources.Limits.Memory(); l.IsZero() || l.Cmp(*c.Resources.Requests.Memory()) < 0 {
		t.Error("want a memory limit at or above the request")
	}
	if !c.Resources.Limits.Cpu().IsZero() {
		t.Error("a CPU limit throttles a node past its leader lease; leave it out")
	}

	// Every pod's command line, as the kubelet expands it, with its mounted
	// files, loads with `tollgate server`'s own flags and config loader.
	var dataMount string
	for _, m := range c.VolumeMounts {
		if m.Name == "data" {
			dataMount = m.MountPath
		}
	}
	if len(sts.Spec.VolumeClaimTemplates) != 1 || sts.Spec.VolumeClaimTemplates[0].Name != "data" || dataMount == "" {
		t.Fatal("want one volumeClaimTemplate, data, mounted in the container")
	}
	if sts.Spec.VolumeClaimTemplates[0].Spec.Resources.Requests.Storage().IsZero() {
		t.Error("volumeClaimTemplate data requests no storage")
	}
	var last *serverSettings
	for i := range replicas {
		podName := fmt.Sprintf("%s-%d", sts.Name, i)
		s := loadPodSettings(t, r, c, podName, fmt.Sprintf("10.1.0.%d", 10+i))
		cfg := s.cfg
		if cfg.Node.ID != podName {
			t.Errorf("%s: node id %q", podName, cfg.Node.ID)
		}
		if cfg.Node.Zone == "" || (last != nil && cfg.Node.Zone == last.cfg.Node.Zone) {
			t.Errorf("%s: zone %q must be set and differ between pods", podName, cfg.Node.Zone)
		}
		for _, a := range []struct{ flag, addr, port string }{
			{"grpc_addr", cfg.Node.GRPCAddr, "grpc"}, {"raft_addr", cfg.Raft.Addr, "raft"},
			{"gossip_addr", cfg.Gossip.Addr, "gossip-tcp"}, {"gossip_addr", cfg.Gossip.Addr, "gossip-udp"},
			{"http_addr", cfg.Node.HTTPAddr, "http"},
		} {
			if got := portOf(t, a.addr); got != cports[a.port].ContainerPort {
				t.Errorf("%s: %s %s listens on %d, container port %s is %d", podName, a.flag, a.addr, got, a.port, cports[a.port].ContainerPort)
			}
			if host, _, _ := net.SplitHostPort(a.addr); host != "0.0.0.0" {
				t.Errorf("%s: %s %s must listen on every interface of the pod", podName, a.flag, a.addr)
			}
		}
		// Advertised names are fully qualified: clients learn them from the
		// cluster view, and one in another namespace cannot resolve a short
		// name. The cluster domain comes from the ConfigMap (configurable).
		domain := r.configMaps["tollgate-config"].Data["cluster-domain"]
		if domain == "" {
			t.Fatalf("ConfigMap tollgate-config: no cluster-domain")
		}
		peer := podName + "." + headless.Name + "." + k8sNamespace + ".svc." + domain
		for _, a := range []struct{ flag, addr, port string }{
			{"grpc_advertise", cfg.Node.GRPCAdvertise, "grpc"}, {"raft_advertise", cfg.Raft.Advertise, "raft"},
		} {
			if a.addr != net.JoinHostPort(peer, fmt.Sprint(cports[a.port].ContainerPort)) {
				t.Errorf("%s: %s %q, want the pod's fully qualified name %s and port %s", podName, a.flag, a.addr, peer, a.port)
			}
		}
		if wantTLS {
			// The documented certificate is valid for the name peers dial.
			blk, _ := pem.Decode([]byte(testSecret(t, "tollgate-tls", "tls.crt")))
			cert, err := x509.ParseCertificate(blk.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			if err := cert.VerifyHostname(peer); err != nil {
				t.Errorf("%s: the certificate README.md makes does not cover the advertised name: %v", podName, err)
			}
		}
		if host, _, _ := net.SplitHostPort(cfg.Gossip.Advertise); net.ParseIP(host) == nil {
			t.Errorf("%s: gossip_advertise %q: serf advertises an IP (the pod IP)", podName, cfg.Gossip.Advertise)
		}
		var wantJoin []string
		for j := range replicas {
			wantJoin = append(wantJoin, fmt.Sprintf("%s-%d.%s:%d", sts.Name, j, headless.Name, cports["gossip-tcp"].ContainerPort))
		}
		if !slices.Equal(cfg.Gossip.Join, wantJoin) {
			t.Errorf("%s: join %v, want every pod %v", podName, cfg.Gossip.Join, wantJoin)
		}
		if cfg.Cluster.BootstrapExpect != replicas || cfg.Cluster.Replicas != replicas {
			t.Errorf("%s: bootstrap_expect %d, replicas %d; want %d (the StatefulSet's replicas)", podName, cfg.Cluster.BootstrapExpect, cfg.Cluster.Replicas, replicas)
		}
		if cfg.Access.AdminToken == "" {
			t.Errorf("%s: no admin token: the admin API would be open to every loopback client", podName)
		}
		if !strings.HasSuffix(cfg.Node.DataDir, filepath.FromSlash(dataMount)) {
			t.Errorf("%s: data_dir %s is not the data volume (%s)", podName, cfg.Node.DataDir, dataMount)
		}
		if cfg.Limits.File == "" {
			t.Errorf("%s: no limits file", podName)
		} else if b, err := os.ReadFile(cfg.Limits.File); err != nil {
			t.Errorf("%s: limits file: %v", podName, err)
		} else if _, err := server.ParseLimits(b, server.TenantLimits{MaxSeries: cfg.Tracking.DefaultMaxSeries}); err != nil {
			t.Errorf("%s: limits file does not parse: %v", podName, err)
		}
		if got := cfg.Access.TLS.GRPC != nil && cfg.Access.TLS.HTTP != nil && cfg.Access.TLS.RaftServer != nil && len(cfg.Access.TLS.GossipKeys) > 0; got != wantTLS {
			t.Errorf("%s: gRPC, HTTP, raft TLS and gossip keys all on = %v, want %v", podName, got, wantTLS)
		}
		if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || float64(*g) <= s.shutdownTimeout.Seconds() {
			t.Errorf("terminationGracePeriodSeconds %v must exceed shutdown_timeout %v", g, s.shutdownTimeout)
		}
		last = s
	}

	// The PDB selects the pods and never lets a voluntary disruption take a
	// group's quorum: with one voter per pod, replicas − maxUnavailable ≥ a
	// majority of the voters.
	ps, err := metav1.LabelSelectorAsSelector(r.pdb.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !ps.Matches(podLabels) || ps.Empty() {
		t.Errorf("PodDisruptionBudget selector %v does not select the pods", r.pdb.Spec.Selector)
	}
	quorum := last.cfg.Cluster.Replicas/2 + 1
	switch {
	case r.pdb.Spec.MaxUnavailable != nil:
		mu, err := intstr.GetScaledValueFromIntOrPercent(r.pdb.Spec.MaxUnavailable, replicas, true)
		if err != nil || replicas-mu < quorum || mu < 1 {
			t.Errorf("PDB maxUnavailable %v of %d pods leaves fewer than a quorum of %d (or blocks every drain)", r.pdb.Spec.MaxUnavailable, replicas, quorum)
		}
	case r.pdb.Spec.MinAvailable != nil:
		ma, err := intstr.GetScaledValueFromIntOrPercent(r.pdb.Spec.MinAvailable, replicas, true)
		if err != nil || ma < quorum || ma >= replicas {
			t.Errorf("PDB minAvailable %v of %d pods: want at least the quorum %d and below %d", r.pdb.Spec.MinAvailable, replicas, quorum, replicas)
		}
	default:
		t.Error("PDB sets neither maxUnavailable nor minAvailable")
	}
	// Readiness is cluster-wide (every group has a leader): when a quorum
	// is lost every pod is unready, and AlwaysAllow would let a drain evict
	// them all. Unset is IfHealthyBudget.
	if p := r.pdb.Spec.UnhealthyPodEvictionPolicy; p != nil && *p == policyv1.AlwaysAllow {
		t.Error("PDB unhealthyPodEvictionPolicy AlwaysAllow: with a cluster-wide readiness every pod is unready when a quorum is lost, and all could be evicted; want IfHealthyBudget")
	}
}

// loadPodSettings expands the container's command line as the kubelet does for
// one pod, materializes every mounted ConfigMap and Secret in a temporary
// directory (paths in the command line, environment and config file are
// moved there), and runs `tollgate server`'s own flag parsing and loader on
// it, without starting a node.
func loadPodSettings(t *testing.T, r rendered, c corev1.Container, podName, podIP string) *serverSettings {
	t.Helper()
	root := t.TempDir()
	move := map[string]string{} // mount path → temp dir
	vols := map[string]corev1.Volume{}
	for _, v := range r.sts.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	for _, m := range c.VolumeMounts {
		dir := filepath.Join(root, m.Name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		move[m.MountPath] = dir
	}
	rewrite := func(s string) string {
		for from, to := range move {
			s = strings.ReplaceAll(s, from+"/", to+"/")
			if s == from {
				s = to
			}
		}
		return s
	}
	for _, m := range c.VolumeMounts {
		dir := move[m.MountPath]
		if m.Name == "data" {
			continue
		}
		v, ok := vols[m.Name]
		if !ok {
			t.Fatalf("volumeMount %s: no such volume", m.Name)
		}
		writeVolume(t, r, v, dir, rewrite)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = rewrite(expandK8s(e.Value, env))
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = podName
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			env[e.Name] = podIP
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			env[e.Name] = k8sNamespace
		case e.ValueFrom.ConfigMapKeyRef != nil:
			cm := r.configMaps[e.ValueFrom.ConfigMapKeyRef.Name]
			v, ok := "", false
			if cm != nil {
				v, ok = cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
			}
			if !ok {
				t.Fatalf("env %s: ConfigMap %s has no key %s", e.Name, e.ValueFrom.ConfigMapKeyRef.Name, e.ValueFrom.ConfigMapKeyRef.Key)
			}
			env[e.Name] = v
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = testSecret(t, e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
		default:
			t.Fatalf("env %s: a source this test does not resolve", e.Name)
		}
	}
	if len(c.Command) != 0 || len(c.Args) == 0 || c.Args[0] != "server" {
		t.Fatalf("want the image's entrypoint (tollgate) with args starting with server, got command %v args %v", c.Command, c.Args)
	}
	args := make([]string, len(c.Args))
	for i, a := range c.Args {
		args[i] = rewrite(expandK8s(a, env))
		if strings.Contains(args[i], "$(") {
			t.Fatalf("arg %q refers to a variable the container does not define", c.Args[i])
		}
	}
	var got *serverSettings
	root2 := newRootCmd()
	for _, sub := range root2.Commands() {
		if sub.Name() == "server" {
			root2.RemoveCommand(sub)
		}
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	root2.AddCommand(newServerCmdWith(lookup, func(_ *cobra.Command, s *serverSettings) error { got = s; return nil }))
	root2.SetArgs(args)
	root2.SetOut(new(strings.Builder))
	if err := root2.Execute(); err != nil {
		t.Fatalf("%s: tollgate %s: %v", podName, strings.Join(args, " "), err)
	}
	if got == nil {
		t.Fatal("the server command did not run")
	}
	return got
}

// writeVolume writes what the kubelet would mount: a ConfigMap's data
// (with mount paths moved), or for Secrets, which the operator creates, test
// content of the documented shape.
func writeVolume(t *testing.T, r rendered, v corev1.Volume, dir string, rewrite func(string) string) {
	t.Helper()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	switch {
	case v.ConfigMap != nil:
		cm := r.configMaps[v.ConfigMap.Name]
		if cm == nil {
			t.Fatalf("volume %s: ConfigMap %s is not in the manifests", v.Name, v.ConfigMap.Name)
		}
		for k, d := range cm.Data {
			write(k, rewrite(d))
		}
	case v.Projected != nil:
		for _, src := range v.Projected.Sources {
			if src.Secret == nil {
				t.Fatalf("volume %s: only Secret projections are expected", v.Name)
			}
			for _, it := range src.Secret.Items {
				write(it.Path, testSecret(t, src.Secret.Name, it.Key))
			}
		}
	default:
		t.Fatalf("volume %s: a source this test does not know", v.Name)
	}
}

var testPKI = map[string]string{}

// testSecret returns a file of the tollgate-tls or tollgate-gossip-key Secret
// as README.md tells the operator to make it: one certificate for every pod,
// valid for every pod's stable name.
func testSecret(t *testing.T, secret, key string) string {
	t.Helper()
	if len(testPKI) == 0 {
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("tollgate-k8s-pki-%d", os.Getpid()))
		t.Cleanup(func() { os.RemoveAll(dir) })
		files, err := tlsutil.InitDev(tlsutil.DevOptions{Dir: dir, Nodes: []string{"tollgate"},
			Hosts: readmeCertHosts(t), Force: true})
		if err != nil {
			t.Fatal(err)
		}
		read := func(p string) string {
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
		testPKI["tollgate-tls/tls.crt"] = read(files.Nodes["tollgate"][0])
		testPKI["tollgate-tls/tls.key"] = read(files.Nodes["tollgate"][1])
		testPKI["tollgate-tls/ca.crt"] = read(files.CA)
		testPKI["tollgate-gossip-key/gossip.key"] = read(files.GossipKey)
		// The certificate's names cover what nodes dial each other by.
		blk, _ := pem.Decode([]byte(testPKI["tollgate-tls/tls.crt"]))
		cert, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if err := cert.VerifyHostname("tollgate-2.tollgate-peer.tollgate.svc.cluster.local"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { clear(testPKI) })
	}
	if secret == "tollgate-admin-token" && key == "token" {
		return "k8s-test-token"
	}
	v, ok := testPKI[secret+"/"+key]
	if !ok {
		t.Fatalf("Secret %s key %s: not a Secret README.md describes", secret, key)
	}
	return v
}

// expandK8s expands $(VAR) as the kubelet does: defined variables are
// replaced, $$ is a literal $, anything else is left as written.
func expandK8s(s string, env map[string]string) string {
	return regexp.MustCompile(`\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)`).ReplaceAllStringFunc(s, func(m string) string {
		if m == "$$" {
			return "$"
		}
		if v, ok := env[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

func portOf(t *testing.T, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%q: %v", addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return int32(n)
}

func labelsSet(m map[string]string) labels.Set { return labels.Set(m) }

func proto(p corev1.Protocol) corev1.Protocol {
	if p == "" {
		return corev1.ProtocolTCP
	}
	return p
}

func hasPort(s *corev1.Service, name string) bool {
	for _, p := range s.Spec.Ports {
		if p.Name == name {
			return true
		}
	}
	return false
}

// readmeCertHosts returns the --hosts of README.md's `tollgate tls init`:
// the test's certificate is the one the operator is told to make.
func readmeCertHosts(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(k8sDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`--hosts '([^']+)'`).FindSubmatch(b)
	if m == nil {
		t.Fatal("deployments/kubernetes/README.md: no `tollgate tls init ... --hosts '...'`")
	}
	return strings.Split(string(m[1]), ",")
}

func TestKubernetesReadmeNamesSecrets(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(k8sDir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"tollgate-admin-token", "tollgate-tls", "tollgate-gossip-key", "tls.crt", "ca.crt", "gossip.key"} {
		if !strings.Contains(string(b), s) {
			t.Errorf("deployments/kubernetes/README.md does not tell the operator to create %s", s)
		}
	}
}
