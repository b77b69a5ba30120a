package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// projectEntrypoint is the image's ENTRYPOINT (Dockerfile); its CMD is ["--help"].
const projectEntrypoint = "/h3-ingress"

var projectDefaultArgs = []string{"--help"}

const hostPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// errUnsupportedImage: the agent cannot run this container; the pod stays Pending with
// the message in the container's Waiting state.
type errUnsupportedImage struct{ msg string }

func (e errUnsupportedImage) Error() string { return e.msg }

// composeArgv builds the process argv the way a container runtime would from the
// image's ENTRYPOINT/CMD and the container's command/args (already $(VAR)-expanded).
func composeArgv(c *corev1.Container, command, args []string, cfg *Config) ([]string, error) {
	if isProjectImage(c.Image, cfg.ImageSuffix) {
		bin := cfg.binaryFor(c.Image)
		switch {
		case len(command) == 0:
			if len(args) == 0 {
				args = projectDefaultArgs
			}
			return append([]string{bin}, args...), nil
		case command[0] == projectEntrypoint || command[0] == filepath.Base(projectEntrypoint):
			return append(append([]string{bin}, command[1:]...), args...), nil
		default:
			// The image is FROM scratch: no shell, nothing to run but /h3-ingress.
			return nil, fmt.Errorf("exec: %q: not found in image %s (it holds only %s)", command[0], c.Image, projectEntrypoint)
		}
	}
	if len(command) == 0 {
		return nil, errUnsupportedImage{fmt.Sprintf(
			"h3i-node-agent runs image %s only when the container sets command (run as a host program); the image's own entrypoint is unknown here", c.Image)}
	}
	exe := command[0]
	if _, err := os.Stat(exe); err != nil {
		exe = filepath.Base(exe) // /bin/busybox-style paths: use the host's program of that name
	}
	return append(append([]string{exe}, command[1:]...), args...), nil
}

// expandVars applies Kubernetes' $(VAR) expansion: $(NAME) becomes NAME's value when
// defined and stays verbatim otherwise; $$ is an escaped $.
func expandVars(s string, lookup func(string) (string, bool)) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// envBuilder keeps the container's environment in definition order.
type envBuilder struct {
	names []string
	vals  map[string]string
}

func (e *envBuilder) set(k, v string) {
	if e.vals == nil {
		e.vals = map[string]string{}
	}
	if _, ok := e.vals[k]; !ok {
		e.names = append(e.names, k)
	}
	e.vals[k] = v
}

func (e *envBuilder) lookup(k string) (string, bool) { v, ok := e.vals[k]; return v, ok }

func (e *envBuilder) list() []string {
	out := make([]string, 0, len(e.names))
	for _, k := range e.names {
		out = append(out, k+"="+e.vals[k])
	}
	return out
}

// podFieldValue resolves a downward-API fieldRef.
func podFieldValue(pod *corev1.Pod, path string) (string, error) {
	if k, ok := subscript(path, "metadata.labels"); ok {
		return pod.Labels[k], nil
	}
	if k, ok := subscript(path, "metadata.annotations"); ok {
		return pod.Annotations[k], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP":
		return pod.Status.HostIP, nil
	case "status.hostIPs":
		return joinIPs(pod.Status.HostIPs, func(i corev1.HostIP) string { return i.IP }), nil
	case "status.podIP":
		return pod.Status.PodIP, nil
	case "status.podIPs":
		return joinIPs(pod.Status.PodIPs, func(i corev1.PodIP) string { return i.IP }), nil
	case "metadata.labels", "metadata.annotations":
		return formatMap(pod, path), nil
	}
	return "", fmt.Errorf("fieldRef %q is not supported", path)
}

func subscript(path, prefix string) (string, bool) {
	if !strings.HasPrefix(path, prefix+"['") || !strings.HasSuffix(path, "']") {
		return "", false
	}
	return path[len(prefix)+2 : len(path)-2], true
}

func joinIPs[T any](xs []T, f func(T) string) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = f(x)
	}
	return strings.Join(s, ",")
}

// formatMap renders labels/annotations as the downward API's volume files do.
func formatMap(pod *corev1.Pod, path string) string {
	m := pod.Labels
	if path == "metadata.annotations" {
		m = pod.Annotations
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	lines := make([]string, len(keys))
	for i, k := range keys {
		lines[i] = k + "=" + strconv.Quote(m[k])
	}
	return strings.Join(lines, "\n")
}

// resourceFieldValue resolves a resourceFieldRef: the container's limit (its request
// for requests.*), or the node's allocatable when no limit is set, divided by divisor
// and rounded up, as the kubelet does.
func resourceFieldValue(pod *corev1.Pod, ref *corev1.ResourceFieldSelector, self string) (string, error) {
	name := ref.ContainerName
	if name == "" {
		name = self
	}
	var ctr *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			ctr = &pod.Spec.Containers[i]
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			ctr = &pod.Spec.InitContainers[i]
		}
	}
	if ctr == nil {
		return "", fmt.Errorf("resourceFieldRef: no container %q", name)
	}
	res, list, _ := strings.Cut(ref.Resource, ".")
	key := corev1.ResourceName(list)
	var q resource.Quantity
	var ok bool
	switch res {
	case "limits":
		q, ok = ctr.Resources.Limits[key]
	case "requests":
		q, ok = ctr.Resources.Requests[key]
	default:
		return "", fmt.Errorf("resourceFieldRef %q is not supported", ref.Resource)
	}
	if !ok || q.IsZero() {
		if res == "requests" && key == corev1.ResourceCPU {
			return "0", nil
		}
		q, ok = nodeAllocatable[key]
		if !ok {
			return "", fmt.Errorf("resourceFieldRef %q: unknown resource", ref.Resource)
		}
	}
	div := ref.Divisor
	if div.IsZero() {
		div = resource.MustParse("1")
	}
	v := math.Ceil(float64(q.MilliValue()) / float64(div.MilliValue()))
	return strconv.FormatInt(int64(v), 10), nil
}

// containerEnv builds the environment of one container: a root user's PATH, the
// API server as KUBERNETES_SERVICE_*, envFrom, env (with $(VAR) expansion and
// valueFrom), then KUBECONFIG when the container mounts a service account token.
func containerEnv(ctx context.Context, c kubernetes.Interface, cfg *Config, pod *corev1.Pod,
	ctr *corev1.Container, kubeconfig string) ([]string, *envBuilder, error) {
	e := &envBuilder{}
	e.set("PATH", hostPath)
	e.set("HOME", "/root")
	hostname := pod.Name
	if pod.Spec.HostNetwork {
		hostname = pod.Spec.NodeName
	}
	e.set("HOSTNAME", hostname)
	if cfg.APIServerHost != "" {
		port := strconv.Itoa(cfg.APIServerPort)
		e.set("KUBERNETES_SERVICE_HOST", cfg.APIServerHost)
		e.set("KUBERNETES_SERVICE_PORT", port)
		e.set("KUBERNETES_SERVICE_PORT_HTTPS", port)
		e.set("KUBERNETES_PORT", "tcp://"+hostPortString(cfg.APIServerHost, port))
	}
	for _, from := range ctr.EnvFrom {
		data, err := envFromData(ctx, c, pod.Namespace, from)
		if err != nil {
			return nil, nil, err
		}
		for k, v := range data {
			e.set(from.Prefix+k, v)
		}
	}
	for _, ev := range ctr.Env {
		v, err := envValue(ctx, c, pod, ctr, ev, e)
		if err != nil {
			return nil, nil, fmt.Errorf("env %s: %w", ev.Name, err)
		}
		e.set(ev.Name, v)
	}
	if kubeconfig != "" {
		if _, set := e.lookup("KUBECONFIG"); !set {
			e.set("KUBECONFIG", kubeconfig)
		}
	}
	return e.list(), e, nil
}

func hostPortString(h, p string) string {
	if strings.Contains(h, ":") {
		return "[" + h + "]:" + p
	}
	return h + ":" + p
}

func envValue(ctx context.Context, c kubernetes.Interface, pod *corev1.Pod, ctr *corev1.Container,
	ev corev1.EnvVar, e *envBuilder) (string, error) {
	if ev.ValueFrom == nil {
		return expandVars(ev.Value, e.lookup), nil
	}
	vf := ev.ValueFrom
	switch {
	case vf.FieldRef != nil:
		return podFieldValue(pod, vf.FieldRef.FieldPath)
	case vf.ResourceFieldRef != nil:
		return resourceFieldValue(pod, vf.ResourceFieldRef, ctr.Name)
	case vf.SecretKeyRef != nil:
		s, err := c.CoreV1().Secrets(pod.Namespace).Get(ctx, vf.SecretKeyRef.Name, metav1.GetOptions{})
		if err != nil {
			return optionalMissing(err, vf.SecretKeyRef.Optional)
		}
		v, ok := s.Data[vf.SecretKeyRef.Key]
		if !ok {
			return optionalMissing(fmt.Errorf("secret %s, key %s: %w", vf.SecretKeyRef.Name, vf.SecretKeyRef.Key, errMissingKey), vf.SecretKeyRef.Optional)
		}
		return string(v), nil
	case vf.ConfigMapKeyRef != nil:
		cm, err := c.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, vf.ConfigMapKeyRef.Name, metav1.GetOptions{})
		if err != nil {
			return optionalMissing(err, vf.ConfigMapKeyRef.Optional)
		}
		v, ok := cm.Data[vf.ConfigMapKeyRef.Key]
		if !ok {
			return optionalMissing(fmt.Errorf("configmap %s, key %s: %w", vf.ConfigMapKeyRef.Name, vf.ConfigMapKeyRef.Key, errMissingKey), vf.ConfigMapKeyRef.Optional)
		}
		return v, nil
	}
	return "", fmt.Errorf("valueFrom source not supported by h3i-node-agent")
}

// errMissingKey: the object exists but lacks the key.
var errMissingKey = errors.New("no such key")

// optionalMissing turns a missing object or key into "" for optional references.
func optionalMissing(err error, optional *bool) (string, error) {
	if optional != nil && *optional && (apierrors.IsNotFound(err) || errors.Is(err, errMissingKey)) {
		return "", nil
	}
	return "", err
}

func envFromData(ctx context.Context, c kubernetes.Interface, ns string, from corev1.EnvFromSource) (map[string]string, error) {
	out := map[string]string{}
	switch {
	case from.ConfigMapRef != nil:
		cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, from.ConfigMapRef.Name, metav1.GetOptions{})
		if err != nil {
			if _, oerr := optionalMissing(err, from.ConfigMapRef.Optional); oerr == nil {
				return out, nil
			}
			return nil, fmt.Errorf("envFrom configMap %s: %w", from.ConfigMapRef.Name, err)
		}
		return cm.Data, nil
	case from.SecretRef != nil:
		s, err := c.CoreV1().Secrets(ns).Get(ctx, from.SecretRef.Name, metav1.GetOptions{})
		if err != nil {
			if _, oerr := optionalMissing(err, from.SecretRef.Optional); oerr == nil {
				return out, nil
			}
			return nil, fmt.Errorf("envFrom secret %s: %w", from.SecretRef.Name, err)
		}
		for k, v := range s.Data {
			out[k] = string(v)
		}
	}
	return out, nil
}
