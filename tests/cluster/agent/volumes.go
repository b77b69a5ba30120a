package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// tokenTTL: requested lifetime of projected service account tokens without their
// own expirationSeconds (the kubelet's default is 1 h too); refreshed at 80 %.
const tokenTTL = time.Hour

// volumeSet materialises a pod's volumes as directories under the pod's state dir.
// Supported: emptyDir, hostPath, secret, configMap, downwardAPI and projected
// (serviceAccountToken, secret, configMap, downwardAPI). Anything else is an error
// that keeps the pod in ContainerCreating, like a volume the kubelet cannot mount.
type volumeSet struct {
	dir    string // <state>/pods/<ns>/<pod>/volumes
	client kubernetes.Interface
	// files written per volume, so keys removed from a Secret disappear on refresh.
	written map[string]map[string]bool
	// token refresh deadlines per token file.
	tokenDue map[string]time.Time
	// tokenFiles: volume name -> host path of its API-audience token, if any.
	tokenFiles map[string]string
	// mu: sync runs in the pod's refresh loop, containerMounts in container runners.
	mu sync.Mutex
}

func newVolumeSet(dir string, c kubernetes.Interface) *volumeSet {
	return &volumeSet{dir: dir, client: c, written: map[string]map[string]bool{},
		tokenDue: map[string]time.Time{}, tokenFiles: map[string]string{}}
}

// hostSource is where volume v lives on the host.
func (vs *volumeSet) hostSource(v *corev1.Volume) string {
	if v.HostPath != nil {
		return v.HostPath.Path
	}
	return filepath.Join(vs.dir, v.Name)
}

// sync creates or refreshes every volume of pod.
func (vs *volumeSet) sync(ctx context.Context, pod *corev1.Pod) error {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if err := vs.syncOne(ctx, pod, v); err != nil {
			return fmt.Errorf("volume %q: %w", v.Name, err)
		}
	}
	return nil
}

func (vs *volumeSet) syncOne(ctx context.Context, pod *corev1.Pod, v *corev1.Volume) error {
	dir := filepath.Join(vs.dir, v.Name)
	switch {
	case v.EmptyDir != nil:
		return os.MkdirAll(dir, 0o777)
	case v.HostPath != nil:
		return ensureHostPath(v.HostPath)
	case v.Secret != nil:
		files, err := vs.secretFiles(ctx, pod.Namespace, v.Secret.SecretName, v.Secret.Items, v.Secret.Optional)
		if err != nil {
			return err
		}
		return vs.writeFiles(v.Name, files, mode(v.Secret.DefaultMode))
	case v.ConfigMap != nil:
		files, err := vs.configMapFiles(ctx, pod.Namespace, v.ConfigMap.Name, v.ConfigMap.Items, v.ConfigMap.Optional)
		if err != nil {
			return err
		}
		return vs.writeFiles(v.Name, files, mode(v.ConfigMap.DefaultMode))
	case v.DownwardAPI != nil:
		files, err := downwardFiles(pod, v.DownwardAPI.Items)
		if err != nil {
			return err
		}
		return vs.writeFiles(v.Name, files, mode(v.DownwardAPI.DefaultMode))
	case v.Projected != nil:
		files, err := vs.projectedFiles(ctx, pod, v)
		if err != nil {
			return err
		}
		return vs.writeFiles(v.Name, files, mode(v.Projected.DefaultMode))
	}
	return fmt.Errorf("this volume type is not supported by h3i-node-agent (supported: emptyDir, hostPath, secret, configMap, downwardAPI, projected)")
}

func mode(m *int32) os.FileMode {
	if m == nil {
		return 0o644
	}
	return os.FileMode(*m)
}

func ensureHostPath(h *corev1.HostPathVolumeSource) error {
	t := corev1.HostPathUnset
	if h.Type != nil {
		t = *h.Type
	}
	st, err := os.Stat(h.Path)
	switch t {
	case corev1.HostPathDirectoryOrCreate:
		if os.IsNotExist(err) {
			return os.MkdirAll(h.Path, 0o755)
		}
	case corev1.HostPathFileOrCreate:
		if os.IsNotExist(err) {
			f, ferr := os.OpenFile(h.Path, os.O_CREATE|os.O_WRONLY, 0o644)
			if ferr == nil {
				f.Close()
			}
			return ferr
		}
	case corev1.HostPathDirectory:
		if err != nil || !st.IsDir() {
			return fmt.Errorf("hostPath %s is not a directory", h.Path)
		}
	case corev1.HostPathFile:
		if err != nil || !st.Mode().IsRegular() {
			return fmt.Errorf("hostPath %s is not a file", h.Path)
		}
	case corev1.HostPathUnset:
		// No check, and the mount point must exist for a bind mount.
		if os.IsNotExist(err) {
			return os.MkdirAll(h.Path, 0o755)
		}
	}
	return nil
}

func keyFiles[V string | []byte](data map[string]V, items []corev1.KeyToPath, what string) (map[string][]byte, error) {
	out := map[string][]byte{}
	if len(items) == 0 {
		for k, v := range data {
			out[k] = []byte(v)
		}
		return out, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			return nil, fmt.Errorf("%s has no key %q", what, it.Key)
		}
		out[it.Path] = []byte(v)
	}
	return out, nil
}

func (vs *volumeSet) secretFiles(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional *bool) (map[string][]byte, error) {
	s, err := vs.client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && optional != nil && *optional {
			return map[string][]byte{}, nil
		}
		return nil, fmt.Errorf("secret %s: %w", name, err)
	}
	return keyFiles(s.Data, items, "secret "+name)
}

func (vs *volumeSet) configMapFiles(ctx context.Context, ns, name string, items []corev1.KeyToPath, optional *bool) (map[string][]byte, error) {
	cm, err := vs.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) && optional != nil && *optional {
			return map[string][]byte{}, nil
		}
		return nil, fmt.Errorf("configmap %s: %w", name, err)
	}
	files, err := keyFiles(cm.Data, items, "configmap "+name)
	if err != nil {
		return nil, err
	}
	bin, err := keyFiles(cm.BinaryData, nil, "configmap "+name)
	if err != nil {
		return nil, err
	}
	for k, v := range bin {
		if len(items) == 0 {
			files[k] = v
		}
	}
	return files, nil
}

func downwardFiles(pod *corev1.Pod, items []corev1.DownwardAPIVolumeFile) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil:
			v, err = podFieldValue(pod, it.FieldRef.FieldPath)
		case it.ResourceFieldRef != nil:
			v, err = resourceFieldValue(pod, it.ResourceFieldRef, "")
		default:
			err = fmt.Errorf("downwardAPI item %s has no source", it.Path)
		}
		if err != nil {
			return nil, err
		}
		out[it.Path] = []byte(v)
	}
	return out, nil
}

func (vs *volumeSet) projectedFiles(ctx context.Context, pod *corev1.Pod, v *corev1.Volume) (map[string][]byte, error) {
	out := map[string][]byte{}
	merge := func(m map[string][]byte) {
		for k, b := range m {
			out[k] = b
		}
	}
	for _, src := range v.Projected.Sources {
		switch {
		case src.ServiceAccountToken != nil:
			t := src.ServiceAccountToken
			path := filepath.Join(vs.dir, v.Name, t.Path)
			if t.Audience == "" {
				vs.tokenFiles[v.Name] = path
			}
			tok, err := vs.token(ctx, pod, t, path)
			if err != nil {
				return nil, err
			}
			out[t.Path] = tok
		case src.Secret != nil:
			m, err := vs.secretFiles(ctx, pod.Namespace, src.Secret.Name, src.Secret.Items, src.Secret.Optional)
			if err != nil {
				return nil, err
			}
			merge(m)
		case src.ConfigMap != nil:
			m, err := vs.configMapFiles(ctx, pod.Namespace, src.ConfigMap.Name, src.ConfigMap.Items, src.ConfigMap.Optional)
			if err != nil {
				return nil, err
			}
			merge(m)
		case src.DownwardAPI != nil:
			m, err := downwardFiles(pod, src.DownwardAPI.Items)
			if err != nil {
				return nil, err
			}
			merge(m)
		default:
			return nil, fmt.Errorf("projected source not supported by h3i-node-agent (clusterTrustBundle, podCertificate)")
		}
	}
	return out, nil
}

// token returns the current token at path, requesting a new one bound to the pod
// (TokenRequest on the pod's ServiceAccount, with the node's identity) when there is
// none yet or 80 % of its lifetime has passed.
func (vs *volumeSet) token(ctx context.Context, pod *corev1.Pod, t *corev1.ServiceAccountTokenProjection, path string) ([]byte, error) {
	if due, ok := vs.tokenDue[path]; ok && time.Now().Before(due) {
		if b, err := os.ReadFile(path); err == nil {
			return b, nil
		}
	}
	secs := int64(tokenTTL / time.Second)
	if t.ExpirationSeconds != nil {
		secs = *t.ExpirationSeconds
	}
	tr := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
		ExpirationSeconds: &secs,
		BoundObjectRef:    &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if t.Audience != "" {
		tr.Spec.Audiences = []string{t.Audience}
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	res, err := vs.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa, tr, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for serviceaccount %s: %w", sa, err)
	}
	life := time.Until(res.Status.ExpirationTimestamp.Time)
	vs.tokenDue[path] = time.Now().Add(life * 8 / 10)
	return []byte(res.Status.Token), nil
}

// writeFiles writes changed files atomically (temp file + rename, so a reader never
// sees half a certificate) and removes files of keys that went away.
func (vs *volumeSet) writeFiles(vol string, files map[string][]byte, m os.FileMode) error {
	base := filepath.Join(vs.dir, vol)
	if err := os.MkdirAll(base, 0o755); err != nil {
		return err
	}
	now := map[string]bool{}
	for rel, b := range files {
		if strings.Contains(rel, "..") || filepath.IsAbs(rel) {
			return fmt.Errorf("path %q escapes the volume", rel)
		}
		now[rel] = true
		p := filepath.Join(base, rel)
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, b) {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		tmp := p + ".h3i-tmp"
		if err := os.WriteFile(tmp, b, m); err != nil {
			return err
		}
		if err := os.Chmod(tmp, m); err != nil {
			return err
		}
		if err := os.Rename(tmp, p); err != nil {
			return err
		}
	}
	for rel := range vs.written[vol] {
		if !now[rel] {
			_ = os.Remove(filepath.Join(base, rel))
		}
	}
	vs.written[vol] = now
	return nil
}

// containerMounts lists the bind mounts of one container and the host path of the
// API token it sees, if any (for its kubeconfig).
func (vs *volumeSet) containerMounts(pod *corev1.Pod, c *corev1.Container) ([]mountSpec, string, error) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	byName := map[string]*corev1.Volume{}
	for i := range pod.Spec.Volumes {
		byName[pod.Spec.Volumes[i].Name] = &pod.Spec.Volumes[i]
	}
	var mounts []mountSpec
	token := ""
	for _, vm := range c.VolumeMounts {
		v, ok := byName[vm.Name]
		if !ok {
			return nil, "", fmt.Errorf("volumeMount %q: no such volume", vm.Name)
		}
		src := vs.hostSource(v)
		if vm.SubPath != "" {
			src = filepath.Join(src, vm.SubPath)
		}
		ro := vm.ReadOnly || v.Secret != nil || v.ConfigMap != nil || v.Projected != nil || v.DownwardAPI != nil
		mounts = append(mounts, mountSpec{Src: src, Dst: vm.MountPath, ReadOnly: ro})
		if t, ok := vs.tokenFiles[vm.Name]; ok && vm.SubPath == "" && token == "" {
			token = t
		}
	}
	return mounts, token, nil
}
