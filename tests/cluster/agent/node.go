package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	// kubelet defaults: Lease renewed every 10 s and valid for 40 s; the node
	// lifecycle controller declares a node unknown after its grace period without one.
	leaseDuration   = 40 * time.Second
	leaseRenewEvery = 10 * time.Second
	// Ready's lastHeartbeatTime is refreshed this often (kubelet: 5 min with Leases).
	statusEvery = time.Minute
	// KubeletVersion reported in the node status: the control plane's version.
	kubeletVersion = "v1.37.2"
)

// Allocatable of each simulated node: enough for many pods with requests/limits.
var nodeAllocatable = corev1.ResourceList{
	corev1.ResourceCPU:              resource.MustParse("16"),
	corev1.ResourceMemory:           resource.MustParse("32Gi"),
	corev1.ResourcePods:             resource.MustParse("110"),
	corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
}

// nodeClient is the API client with the node's own identity, so Node authorization
// and NodeRestriction admission judge it exactly as they judge a kubelet.
func nodeClient(cfg *Config, n NodeConf) (kubernetes.Interface, error) {
	rc := &rest.Config{
		Host: cfg.Server,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile:   cfg.CAFile,
			CertFile: n.CertFile,
			KeyFile:  n.KeyFile,
		},
		QPS:       50,
		Burst:     100,
		UserAgent: "h3i-node-agent/" + n.Name,
	}
	return kubernetes.NewForConfig(rc)
}

func nodeAddresses(n NodeConf) []corev1.NodeAddress {
	a := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IPv4}}
	if n.IPv6 != "" {
		a = append(a, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: n.IPv6})
	}
	return append(a, corev1.NodeAddress{Type: corev1.NodeHostName, Address: n.Name})
}

func kernelVersion() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// registerNode creates the Node (as a kubelet registers itself) or refreshes its
// labels, then writes its status.
func registerNode(ctx context.Context, c kubernetes.Interface, cfg *Config, n NodeConf) error {
	labels := map[string]string{
		"kubernetes.io/os":       "linux",
		"kubernetes.io/arch":     runtime.GOARCH,
		"kubernetes.io/hostname": n.Name,
		"beta.kubernetes.io/os":  "linux",
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: labels}}
	_, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
		_, err = c.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	}
	if err != nil {
		return fmt.Errorf("register node %s: %w", n.Name, err)
	}
	return patchNodeStatus(ctx, c, cfg, n)
}

func patchNodeStatus(ctx context.Context, c kubernetes.Interface, cfg *Config, n NodeConf) error {
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg,
			LastHeartbeatTime: now, LastTransitionTime: now}
	}
	status := corev1.NodeStatus{
		Capacity:    nodeAllocatable,
		Allocatable: nodeAllocatable,
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "h3i-node-agent is posting ready status"),
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "not measured by h3i-node-agent"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "not measured by h3i-node-agent"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "not measured by h3i-node-agent"),
		},
		Addresses:       nodeAddresses(n),
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(cfg.KubeletPort)}},
		NodeInfo: corev1.NodeSystemInfo{
			KubeletVersion:          kubeletVersion,
			OperatingSystem:         "linux",
			Architecture:            runtime.GOARCH,
			ContainerRuntimeVersion: "h3i-node-agent://" + kubeletVersion,
			OSImage:                 "h3i-node-agent (local processes)",
			KernelVersion:           kernelVersion(),
		},
	}
	// lastTransitionTime must only move on a change; keep the existing ones.
	if cur, err := c.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{}); err == nil {
		for i := range status.Conditions {
			for _, old := range cur.Status.Conditions {
				if old.Type == status.Conditions[i].Type && old.Status == status.Conditions[i].Status {
					status.Conditions[i].LastTransitionTime = old.LastTransitionTime
				}
			}
		}
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	// A JSON merge patch replaces lists whole: a strategic one would merge the two
	// InternalIP addresses by their shared type into a duplicate.
	_, err = c.CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

// renewLease creates or renews kube-node-lease/NAME with the node's identity.
func renewLease(ctx context.Context, c kubernetes.Interface, n NodeConf) error {
	leases := c.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	secs := int32(leaseDuration / time.Second)
	l, err := leases.Get(ctx, n.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, gerr := c.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		l = &coordv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: corev1.NamespaceNodeLease,
				// Owned by the Node as the kubelet does, so deleting the Node removes it.
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: node.UID}}},
			Spec: coordv1.LeaseSpec{HolderIdentity: &n.Name, LeaseDurationSeconds: &secs, RenewTime: &now},
		}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.HolderIdentity = &n.Name
	l.Spec.LeaseDurationSeconds = &secs
	l.Spec.RenewTime = &now
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

func nodeReadyInAPI(ctx context.Context, c kubernetes.Interface, name string) bool {
	node, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return true // unknown: the next tick asks again
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

// keepNodeAlive renews the Lease and refreshes the node status until ctx ends; errors
// (an API server restart, say) are logged and retried on the next tick.
func keepNodeAlive(ctx context.Context, c kubernetes.Interface, cfg *Config, n NodeConf) {
	leaseTick := time.NewTicker(leaseRenewEvery)
	statusTick := time.NewTicker(statusEvery)
	defer leaseTick.Stop()
	defer statusTick.Stop()
	needStatus := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-leaseTick.C:
			if err := renewLease(ctx, c, n); err != nil {
				log.Printf("node %s: lease: %v", n.Name, err)
				needStatus = true // the node may have been declared unknown meanwhile
				continue
			}
			// The node-lifecycle controller sets Ready=Unknown when it missed our Lease
			// (an API server outage longer than its grace period): say Ready again now.
			if !needStatus && !nodeReadyInAPI(ctx, c, n.Name) {
				log.Printf("node %s: Ready is not True in the API, posting status", n.Name)
				needStatus = true
			}
			if needStatus && patchNodeStatus(ctx, c, cfg, n) == nil {
				needStatus = false
			}
		case <-statusTick.C:
			if err := patchNodeStatus(ctx, c, cfg, n); err != nil {
				log.Printf("node %s: status: %v", n.Name, err)
				needStatus = true
			}
		}
	}
}
