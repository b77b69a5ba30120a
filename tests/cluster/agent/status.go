package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Container state changes, called by runners and probes.

func (w *podWorker) withStatus(name string, f func(s *corev1.ContainerStatus)) {
	w.mu.Lock()
	if s, ok := w.statuses[name]; ok {
		f(s)
	}
	w.mu.Unlock()
	w.markDirty()
}

func (w *podWorker) hasProbe(name string, kind string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range allContainers(w.pod) {
		if c.Name == name {
			switch kind {
			case "readiness":
				return c.ReadinessProbe != nil
			case "startup":
				return c.StartupProbe != nil
			}
		}
	}
	return false
}

func (w *podWorker) setWaiting(name, reason, msg string) {
	w.withStatus(name, func(s *corev1.ContainerStatus) {
		s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
		s.Ready = false
		s.Started = ptr(false)
	})
}

func (w *podWorker) setRunning(name string, at time.Time) {
	ready := !w.hasProbe(name, "readiness") && !w.hasProbe(name, "startup")
	started := !w.hasProbe(name, "startup")
	w.mu.Lock()
	w.everStarted[name] = true
	w.mu.Unlock()
	w.withStatus(name, func(s *corev1.ContainerStatus) {
		s.State = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(at)}}
		s.ContainerID = containerID(string(w.uid), name, s.RestartCount)
		s.Ready = ready
		s.Started = ptr(started)
	})
}

func (w *podWorker) setTerminated(name string, exit int32, reason string, startedAt time.Time) {
	if reason == "" {
		reason = "Completed"
		if exit != 0 {
			reason = "Error"
		}
	}
	w.withStatus(name, func(s *corev1.ContainerStatus) {
		s.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: exit, Reason: reason, StartedAt: metav1.NewTime(startedAt), FinishedAt: now(),
			ContainerID: s.ContainerID,
		}}
		s.Ready = false
		s.Started = ptr(false)
	})
	w.event("container %s exited with %d (%s)", name, exit, reason)
}

func (w *podWorker) setBackoff(name string, wait time.Duration) {
	w.withStatus(name, func(s *corev1.ContainerStatus) {
		s.LastTerminationState = s.State
		s.State = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
			Reason:  "CrashLoopBackOff",
			Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", wait, name, w.name, w.ns, w.uid),
		}}
	})
}

func (w *podWorker) incRestart(name string) {
	w.withStatus(name, func(s *corev1.ContainerStatus) { s.RestartCount++ })
}

func (w *podWorker) restartCount(name string) int32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if s, ok := w.statuses[name]; ok {
		return s.RestartCount
	}
	return 0
}

func (w *podWorker) setReady(name string, ready bool) {
	changed := false
	w.withStatus(name, func(s *corev1.ContainerStatus) {
		if s.State.Running != nil && s.Ready != ready {
			s.Ready, changed = ready, true
		}
	})
	if changed {
		w.event("container %s ready=%v", name, ready)
	}
}

func (w *podWorker) setStarted(name string) {
	w.withStatus(name, func(s *corev1.ContainerStatus) {
		if s.State.Running != nil {
			s.Started = ptr(true)
		}
	})
}

func ptr[T any](v T) *T { return &v }

// buildStatus derives the pod status from the worker's state.
func (w *podWorker) buildStatus() corev1.PodStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := corev1.PodStatus{
		HostIP:    w.node.IPv4,
		HostIPs:   hostIPs(w.node),
		StartTime: &w.startTime,
		Message:   w.message,
	}
	for _, ip := range w.podIPs {
		st.PodIPs = append(st.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(w.podIPs) > 0 {
		st.PodIP = w.podIPs[0]
	}
	appReady, appStarted := true, true
	for _, c := range w.pod.Spec.Containers {
		s := *w.statuses[c.Name]
		st.ContainerStatuses = append(st.ContainerStatuses, s)
		appReady = appReady && s.Ready
		appStarted = appStarted && w.everStarted[c.Name]
	}
	for _, c := range w.pod.Spec.InitContainers {
		s := *w.statuses[c.Name]
		if t := s.State.Terminated; t != nil && t.ExitCode == 0 {
			s.Ready = true
		}
		st.InitContainerStatuses = append(st.InitContainerStatuses, s)
	}
	switch {
	case w.terminal != "":
		st.Phase = w.terminal
		appReady = false
	case w.initialized && appStarted:
		st.Phase = corev1.PodRunning
	default:
		st.Phase = corev1.PodPending
	}
	for _, g := range w.pod.Spec.ReadinessGates {
		ok := false
		for _, c := range w.pod.Status.Conditions {
			ok = ok || (c.Type == g.ConditionType && c.Status == corev1.ConditionTrue)
		}
		appReady = appReady && ok
	}
	st.Conditions = []corev1.PodCondition{
		w.cond(corev1.PodReadyToStartContainers, w.sandboxReady, ""),
		w.cond(corev1.PodInitialized, w.initialized, "ContainersNotInitialized"),
		w.cond(corev1.ContainersReady, appReady, "ContainersNotReady"),
		w.cond(corev1.PodReady, appReady, "ContainersNotReady"),
	}
	if w.terminal != "" {
		for i := range st.Conditions[2:] {
			st.Conditions[2+i].Reason = "PodCompleted"
		}
	}
	return st
}

// cond keeps lastTransitionTime stable while the condition's status does not change.
func (w *podWorker) cond(t corev1.PodConditionType, ok bool, falseReason string) corev1.PodCondition {
	s := corev1.ConditionFalse
	reason := falseReason
	if ok {
		s, reason = corev1.ConditionTrue, ""
	}
	m, seen := w.condTimes[t]
	if !seen || m.status != s {
		m = condMark{status: s, at: now()}
		w.condTimes[t] = m
	}
	return corev1.PodCondition{Type: t, Status: s, Reason: reason, LastTransitionTime: m.at}
}

// diverged reports whether the API's phase or Ready condition of pod differs from
// what this worker last wrote (older informer events may say so too: a rewrite of the
// same status is harmless).
func (w *podWorker) diverged(pod *corev1.Pod) bool {
	w.mu.Lock()
	last := w.lastSentStatus
	w.mu.Unlock()
	if last == "" {
		return false
	}
	var sent corev1.PodStatus
	if json.Unmarshal([]byte(last), &sent) != nil {
		return false
	}
	if sent.Phase != pod.Status.Phase {
		return true
	}
	return podReady(sent) != podReady(pod.Status)
}

func podReady(st corev1.PodStatus) corev1.ConditionStatus {
	for _, c := range st.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status
		}
	}
	return ""
}

// patchStatus writes the status subresource; metadata.uid makes the patch fail for
// a newer pod of the same name (the kubelet does the same).
func (w *podWorker) patchStatus(ctx context.Context, st corev1.PodStatus) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": w.uid}, "status": st})
	if err != nil {
		return err
	}
	_, err = w.client.CoreV1().Pods(w.ns).Patch(ctx, w.name, types.StrategicMergePatchType, body,
		metav1.PatchOptions{}, "status")
	return err
}

// statusLoop pushes status changes, coalescing bursts and retrying after errors
// (for example while the API server restarts).
func (w *podWorker) statusLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.dirty:
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return
		}
		st := w.buildStatus()
		js, _ := json.Marshal(st)
		w.mu.Lock()
		same := string(js) == w.lastSentStatus
		w.mu.Unlock()
		if same && !w.forceStatus.Swap(false) {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := w.patchStatus(pctx, st)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				log.Printf("pod %s: status: %v", w.key(), err)
			}
			go func() {
				if sleepCtx(ctx, 2*time.Second) {
					w.markDirty()
				}
			}()
			continue
		}
		w.mu.Lock()
		w.lastSentStatus = string(js)
		w.mu.Unlock()
	}
}
