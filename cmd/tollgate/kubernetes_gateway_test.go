package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// TestKubernetesGatewayManifests: deployments/kubernetes/gateway decodes
// strictly into the API types; the pod's arguments, environment and mounted
// config file load with `tollgate gateway`'s own flag set and loader; the
// probes, the Service and the HPA point at what exists; the drain fits the
// grace period; the gateway talks to the cluster's client Service.
func TestKubernetesGatewayManifests(t *testing.T) {
	var (
		dep *appsv1.Deployment
		svc *corev1.Service
		hpa *autoscalingv2.HorizontalPodAutoscaler
		cm  *corev1.ConfigMap
	)
	for _, m := range render(t, filepath.Join(k8sDir, "gateway")) {
		j, err := yaml.Marshal(m.obj)
		if err != nil {
			t.Fatal(err)
		}
		into := func(v any) {
			if err := yaml.UnmarshalStrict(j, v); err != nil {
				t.Fatalf("%s: %s %s: %v", m.file, m.kind(), m.name(), err)
			}
		}
		switch m.kind() + " " + fmt.Sprint(m.obj["apiVersion"]) {
		case "Deployment apps/v1":
			dep = &appsv1.Deployment{}
			into(dep)
		case "Service v1":
			svc = &corev1.Service{}
			into(svc)
		case "HorizontalPodAutoscaler autoscaling/v2":
			hpa = &autoscalingv2.HorizontalPodAutoscaler{}
			into(hpa)
		case "ConfigMap v1":
			cm = &corev1.ConfigMap{}
			into(cm)
		default:
			t.Fatalf("%s: %s: a kind this test does not check", m.file, m.kind())
		}
	}
	if dep == nil || svc == nil || hpa == nil || cm == nil {
		t.Fatal("want a Deployment, a Service, a HorizontalPodAutoscaler and a ConfigMap")
	}
	pod := dep.Spec.Template
	sel, err := metav1.LabelSelectorAsSelector(dep.Spec.Selector)
	if err != nil || !sel.Matches(labelsSet(pod.Labels)) {
		t.Fatalf("Deployment selector %v does not select its pods %v (%v)", dep.Spec.Selector, pod.Labels, err)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]

	// The config file, as mounted: the ConfigMap's key at the mount path.
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = "from-" + e.Name
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("env %s: only Secret references are checked here", e.Name)
		}
	}
	args := append([]string(nil), c.Args...)
	for i, a := range args {
		for _, vm := range c.VolumeMounts {
			if rest, ok := strings.CutPrefix(a, vm.MountPath+"/"); ok {
				data, ok := cm.Data[rest]
				if !ok {
					t.Fatalf("argument %s: ConfigMap %s has no key %s", a, cm.Name, rest)
				}
				args[i] = writeFile(t, rest, data)
			}
		}
	}
	if len(args) == 0 || args[0] != "gateway" {
		t.Fatalf("container args %v: want `tollgate gateway …`", c.Args)
	}
	var s *gatewaySettings
	cmd := newGatewayCmdWith(func(k string) (string, bool) { v, ok := env[k]; return v, ok },
		func(_ *cobra.Command, got *gatewaySettings) error { s = got; return nil })
	cmd.SetArgs(args[1:])
	cmd.SilenceErrors, cmd.SilenceUsage = true, true
	if err := cmd.Execute(); err != nil {
		t.Fatalf("tollgate gateway %v: %v", c.Args, err)
	}
	for name := range env {
		known := false
		for _, o := range s.options() {
			known = known || o.env() == name
		}
		if !known {
			t.Errorf("env %s is no setting of tollgate gateway", name)
		}
	}
	if s.token != "from-TOLLGATE_CLIENT_TOKEN" {
		t.Errorf("the client token does not come from the Secret: %q", s.token)
	}
	if !strings.HasPrefix(s.addrs, "tollgate:7300") {
		t.Errorf("addr %q: want the cluster's client Service tollgate:7300", s.addrs)
	}
	_, port, _ := strings.Cut(s.listen, ":")
	var cport *corev1.ContainerPort
	for i := range c.Ports {
		if fmt.Sprint(c.Ports[i].ContainerPort) == port {
			cport = &c.Ports[i]
		}
	}
	if cport == nil {
		t.Fatalf("listen %s: no container port %s", s.listen, port)
	}
	for what, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.String() != cport.Name {
			t.Errorf("%s probe %+v: want an HTTP GET on port %s", what, p, cport.Name)
		}
	}
	if c.ReadinessProbe.HTTPGet.Path != "/readyz" || c.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("probes on %s and %s, want /readyz and /healthz", c.ReadinessProbe.HTTPGet.Path, c.LivenessProbe.HTTPGet.Path)
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || float64(*g) <= s.shutdownTimeout.Seconds() {
		t.Errorf("terminationGracePeriodSeconds %v must exceed shutdown_timeout %v, or the drain is cut", g, s.shutdownTimeout)
	}
	if _, ok := c.Resources.Requests[corev1.ResourceCPU]; !ok {
		t.Error("no CPU request: the HPA's utilization target needs one")
	}
	// The Service selects the pods and targets the port.
	if !metav1Selects(svc.Spec.Selector, pod.Labels) || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != cport.Name {
		t.Errorf("Service %s: selector %v ports %+v do not reach the gateway", svc.Name, svc.Spec.Selector, svc.Spec.Ports)
	}
	ref := hpa.Spec.ScaleTargetRef
	if ref.Kind != "Deployment" || ref.Name != dep.Name || ref.APIVersion != "apps/v1" {
		t.Errorf("HPA scales %+v, want the Deployment %s", ref, dep.Name)
	}
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 2 || hpa.Spec.MaxReplicas < *hpa.Spec.MinReplicas {
		t.Errorf("HPA replicas %v..%d: want at least 2", hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
	}
}

func metav1Selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}
