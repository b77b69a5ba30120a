package main

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestIsProjectImage(t *testing.T) {
	for image, want := range map[string]bool{
		"h3-ingress":                                   true,
		"h3-ingress:0.1.0":                             true,
		"ghcr.io/h3-ingress/h3-ingress:0.1.0":          true,
		"registry.local:5000/h3-ingress":               true,
		"registry.local:5000/team/h3-ingress@sha256:0": true,
		"ghcr.io/h3-ingress/other:0.1.0":               false,
		"my-h3-ingress:1":                              false,
		"busybox:1.36.1":                               false,
		"h3-ingress-tools:1":                           false,
	} {
		if got := isProjectImage(image, "h3-ingress"); got != want {
			t.Errorf("isProjectImage(%q) = %v, want %v", image, got, want)
		}
	}
}

func TestExpandVars(t *testing.T) {
	env := map[string]string{"A": "x", "NODE": "n1"}
	look := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for in, want := range map[string]string{
		"--node=$(NODE)":   "--node=n1",
		"$(A)$(A)":         "xx",
		"$$(A)":            "$(A)",
		"$(MISSING)":       "$(MISSING)",
		"$(unterminated":   "$(unterminated",
		"cost: $5":         "cost: $5",
		"trailing $":       "trailing $",
		"$(A)-$$-$(NODE)!": "x-$-n1!",
	} {
		if got := expandVars(in, look); got != want {
			t.Errorf("expandVars(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestComposeArgv(t *testing.T) {
	cfg := &Config{Binary: "/repo/target/debug/h3-ingress", ImageSuffix: "h3-ingress"}
	proj := &corev1.Container{Image: "ghcr.io/h3-ingress/h3-ingress:0.1.0"}
	cases := []struct {
		c             *corev1.Container
		command, args []string
		want          string
		err           string
	}{
		{proj, nil, []string{"proxy", "--listener", "x"}, "/repo/target/debug/h3-ingress proxy --listener x", ""},
		{proj, nil, nil, "/repo/target/debug/h3-ingress --help", ""},
		{proj, []string{"/h3-ingress", "demo"}, []string{"--x"}, "/repo/target/debug/h3-ingress demo --x", ""},
		{proj, []string{"sh", "-c", "true"}, nil, "", "not found in image"},
		{&corev1.Container{Image: "busybox:1.36.1"}, []string{"sh", "-c", "echo hi"}, nil, "sh -c echo hi", ""},
		{&corev1.Container{Image: "nginx:1.27"}, nil, nil, "", "only when the container sets command"},
	}
	for _, tc := range cases {
		argv, err := composeArgv(tc.c, tc.command, tc.args, cfg)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v %v: error %v, want one containing %q", tc.command, tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || strings.Join(argv, " ") != tc.want {
			t.Errorf("%v %v: got %q (%v), want %q", tc.command, tc.args, argv, err, tc.want)
		}
	}
}

func TestTagBinaries(t *testing.T) {
	cfg := &Config{Binary: "/work/h3-ingress", ImageSuffix: "h3-ingress",
		TagBinaries: map[string]string{"0.1.0-d0332e8aaaaa": "/cache/release-d0332e8aaaaa/h3-ingress"}}
	for image, want := range map[string]string{
		"registry.h3i.test/h3-ingress:0.1.0-d0332e8aaaaa":      "/cache/release-d0332e8aaaaa/h3-ingress",
		"registry.local:5000/h3-ingress:0.1.0-d0332e8aaaaa":    "/cache/release-d0332e8aaaaa/h3-ingress",
		"h3-ingress:0.1.0-d0332e8aaaaa":                        "/cache/release-d0332e8aaaaa/h3-ingress",
		"registry.h3i.test/h3-ingress:0.1.0-b88e66d00000":      "/work/h3-ingress",
		"registry.h3i.test/h3-ingress:0.1.0":                   "/work/h3-ingress",
		"registry.local:5000/h3-ingress":                       "/work/h3-ingress", // the port is no tag
		"registry.h3i.test/h3-ingress@sha256:0d0332e8aaaaa":    "/work/h3-ingress",
		"registry.h3i.test/h3-ingress:0.1.0-d0332e8aaaaa-next": "/work/h3-ingress",
	} {
		argv, err := composeArgv(&corev1.Container{Image: image}, nil, []string{"proxy"}, cfg)
		if err != nil || argv[0] != want {
			t.Errorf("%s: argv %q (%v), want it to run %s", image, argv, err, want)
		}
	}
	for _, tc := range []struct {
		tags map[string]string
		err  string
	}{
		{map[string]string{"0.1.0-x": "/bin/x"}, ""},
		{map[string]string{"": "/bin/x"}, `tagBinaries: "" is not an image tag`},
		{map[string]string{"reg/h3-ingress:1": "/bin/x"}, "is not an image tag"},
		{map[string]string{"1": "bin/x"}, `tagBinaries["1"]: "bin/x" is not an absolute path`},
	} {
		c := Config{Server: "s", CAFile: "ca", StateDir: "/s", Binary: "/b", ImageSuffix: "h3-ingress",
			Nodes: []NodeConf{{Name: "n", Netns: "n", IPv4: "10.0.0.1"}}, PodNetwork: PodNetwork{First: 1, Last: 2},
			TagBinaries: tc.tags}
		err := c.validate()
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("tagBinaries %v: validate() = %v, want %q", tc.tags, err, tc.err)
		}
	}
}

func TestPodFieldValueAndResources(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u1", Labels: map[string]string{"app": "a"}},
		Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: "sa", Containers: []corev1.Container{{
			Name: "c",
			Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
				corev1.ResourceMemory: resource.MustParse("256Mi"), corev1.ResourceCPU: resource.MustParse("1500m")}},
		}}},
		Status: corev1.PodStatus{PodIP: "10.77.0.64", PodIPs: []corev1.PodIP{{IP: "10.77.0.64"}, {IP: "fd77::40"}},
			HostIP: "10.77.0.1"},
	}
	for path, want := range map[string]string{
		"metadata.name": "p", "metadata.namespace": "ns", "metadata.uid": "u1", "spec.nodeName": "n1",
		"spec.serviceAccountName": "sa", "status.podIP": "10.77.0.64", "status.podIPs": "10.77.0.64,fd77::40",
		"status.hostIP": "10.77.0.1", "metadata.labels['app']": "a", "metadata.labels": `app="a"`,
	} {
		if got, err := podFieldValue(pod, path); err != nil || got != want {
			t.Errorf("%s = %q (%v), want %q", path, got, err, want)
		}
	}
	if _, err := podFieldValue(pod, "spec.bogus"); err == nil {
		t.Error("an unknown fieldPath must be an error")
	}
	mi := resource.MustParse("1Mi")
	for _, tc := range []struct {
		ref  corev1.ResourceFieldSelector
		want string
	}{
		{corev1.ResourceFieldSelector{Resource: "limits.memory"}, "268435456"},
		{corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: mi}, "256"},
		{corev1.ResourceFieldSelector{Resource: "limits.cpu"}, "2"}, // rounded up
		{corev1.ResourceFieldSelector{Resource: "requests.cpu"}, "0"},
		{corev1.ResourceFieldSelector{Resource: "requests.memory", Divisor: mi}, "32768"}, // node allocatable
	} {
		if got, err := resourceFieldValue(pod, &tc.ref, "c"); err != nil || got != tc.want {
			t.Errorf("%s = %q (%v), want %q", tc.ref.Resource, got, err, tc.want)
		}
	}
}

func TestBackoffAndRestartPolicy(t *testing.T) {
	cfg := &Config{BackoffInitialSeconds: 1, BackoffMaxSeconds: 30}
	want := []time.Duration{1, 2, 4, 8, 16, 30, 30}
	for i, w := range want {
		if got := cfg.backoff(int32(i)); got != w*time.Second {
			t.Errorf("backoff(%d) = %s, want %s", i, got, w*time.Second)
		}
	}
	if !runPerPolicy.restarts(corev1.RestartPolicyAlways, 0) || runPerPolicy.restarts(corev1.RestartPolicyNever, 1) ||
		runPerPolicy.restarts(corev1.RestartPolicyOnFailure, 0) || !runPerPolicy.restarts(corev1.RestartPolicyOnFailure, 2) {
		t.Error("app container restart policy")
	}
	if runOnce.restarts(corev1.RestartPolicyAlways, 0) || !runOnce.restarts(corev1.RestartPolicyAlways, 1) ||
		runOnce.restarts(corev1.RestartPolicyNever, 1) {
		t.Error("init container restart policy")
	}
}

func TestTailLinesAndMounts(t *testing.T) {
	log := []byte("a\nb\nc\n")
	for n, want := range map[int]string{0: "", 1: "c\n", 2: "b\nc\n", 5: "a\nb\nc\n"} {
		if got := string(tailLines(log, n)); got != want {
			t.Errorf("tailLines(%d) = %q, want %q", n, got, want)
		}
	}
	m, err := parseMount("/state/v:/tmp:ro")
	if err != nil || m != (mountSpec{Src: "/state/v", Dst: "/tmp", ReadOnly: true}) || m.flag() != "/state/v:/tmp:ro" {
		t.Errorf("parseMount: %+v %v", m, err)
	}
	for _, bad := range []string{"/a", "/a:rel", "/a:/b:rw", ":/b"} {
		if _, err := parseMount(bad); err == nil {
			t.Errorf("parseMount(%q) must fail", bad)
		}
	}
}

func TestOpenProgramBeforeTheMounts(t *testing.T) {
	if f := openProgram("/no/such/program"); f != nil {
		t.Fatalf("opened a program that does not exist: %v", f.Name())
	}
	f := openProgram("sh")
	if f == nil {
		t.Fatal("sh was not found on PATH")
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.Mode()&0o111 == 0 {
		t.Fatalf("not an executable: %v %v", st, err)
	}
}
