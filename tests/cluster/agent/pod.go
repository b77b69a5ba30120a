package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// volumeRefreshEvery: how often Secret/ConfigMap/projected volumes are rewritten from
// the API (the kubelet's sync period is about a minute; shorter here for tests).
const volumeRefreshEvery = 10 * time.Second

// podWorker runs one pod from its first sighting to its removal.
type podWorker struct {
	a      *agent
	node   NodeConf
	client kubernetes.Interface
	uid    types.UID
	ns     string
	name   string
	dir    string // <state>/pods/<ns>/<name>
	vols   *volumeSet

	mu             sync.Mutex
	pod            *corev1.Pod
	netns          string
	ownSandbox     bool
	ipIndex        int
	podIPs         []string
	startTime      metav1.Time
	sandboxReady   bool
	initialized    bool
	terminal       corev1.PodPhase
	message        string
	statuses       map[string]*corev1.ContainerStatus
	everStarted    map[string]bool
	condTimes      map[corev1.PodConditionType]condMark
	deleting       bool
	gone           bool // removed from the API already (forced deletion)
	agentStopping  bool // stopped because the agent stops: the pod stays in the API
	deletionGrace  time.Duration
	lastSentStatus string
	// forceStatus: the API shows a status other than ours (the node-lifecycle controller
	// marks pods of an unknown node not Ready): write ours again even if unchanged.
	forceStatus atomic.Bool

	dirty     chan struct{}
	cancelRun context.CancelFunc
	runners   sync.WaitGroup
	done      chan struct{}
}

type condMark struct {
	status corev1.ConditionStatus
	at     metav1.Time
}

func newPodWorker(a *agent, n NodeConf, c kubernetes.Interface, pod *corev1.Pod) *podWorker {
	dir := filepath.Join(a.cfg.StateDir, "pods", pod.Namespace, pod.Name)
	w := &podWorker{
		a: a, node: n, client: c, uid: pod.UID, ns: pod.Namespace, name: pod.Name, dir: dir,
		vols:        newVolumeSet(filepath.Join(dir, "volumes"), c),
		pod:         pod.DeepCopy(),
		statuses:    map[string]*corev1.ContainerStatus{},
		everStarted: map[string]bool{},
		condTimes:   map[corev1.PodConditionType]condMark{},
		dirty:       make(chan struct{}, 1),
		done:        make(chan struct{}),
	}
	// An earlier agent ran this pod: keep its restart counts, and count its
	// running containers (killed when that agent stopped) as restarted.
	old := map[string]corev1.ContainerStatus{}
	for _, s := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		old[s.Name] = s
	}
	for _, c := range allContainers(pod) {
		s := &corev1.ContainerStatus{Name: c.Name, Image: c.Image, ImageID: "h3i-node-agent://" + c.Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}
		if o, ok := old[c.Name]; ok {
			s.RestartCount = o.RestartCount
			if o.State.Running != nil || o.State.Terminated != nil {
				s.RestartCount++
			}
			s.LastTerminationState = o.LastTerminationState
		}
		w.statuses[c.Name] = s
	}
	if pod.Status.StartTime != nil {
		w.startTime = *pod.Status.StartTime
	} else {
		w.startTime = now()
	}
	return w
}

func allContainers(pod *corev1.Pod) []corev1.Container {
	return append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...)
}

func (w *podWorker) key() string { return w.ns + "/" + w.name }

func (w *podWorker) logPath(c string) string { return filepath.Join(w.dir, c+".log") }
func (w *podWorker) pidPath(c string) string { return filepath.Join(w.dir, c+".pid") }

// appendAgentLog records what the agent did with this pod in _events.log (a name no
// container can have), next to the containers' logs.
func (w *podWorker) appendAgentLog(line string) {
	_ = os.MkdirAll(w.dir, 0o755)
	f, err := os.OpenFile(filepath.Join(w.dir, "_events.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err == nil {
		_, _ = f.WriteString(line)
		f.Close()
	}
}

func (w *podWorker) event(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	log.Printf("pod %s: %s", w.key(), msg)
	w.appendAgentLog(time.Now().UTC().Format(time.RFC3339Nano) + " " + msg + "\n")
}

func (w *podWorker) markDirty() {
	select {
	case w.dirty <- struct{}{}:
	default:
	}
}

// update receives each newer version of the pod from the informer.
func (w *podWorker) update(pod *corev1.Pod) {
	w.mu.Lock()
	w.pod = pod.DeepCopy()
	begin := pod.DeletionTimestamp != nil && !w.deleting
	if begin {
		w.deleting = true
		w.deletionGrace = 30 * time.Second
		if pod.DeletionGracePeriodSeconds != nil {
			w.deletionGrace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		}
	}
	cancel := w.cancelRun
	w.mu.Unlock()
	if w.diverged(pod) {
		w.forceStatus.Store(true)
	}
	if begin {
		w.event("deletion requested (grace %s): stopping containers", w.grace())
		if cancel != nil {
			cancel()
		}
	}
	w.markDirty()
}

// forget: the pod was removed from the API without us (force deletion).
func (w *podWorker) forget() {
	w.mu.Lock()
	already := w.deleting
	w.gone, w.deleting = true, true
	if already {
		// Our own final delete, or a forced one while we were stopping anyway.
		w.mu.Unlock()
		return
	}
	w.deletionGrace = 2 * time.Second
	cancel := w.cancelRun
	w.mu.Unlock()
	w.event("pod removed from the API: stopping containers")
	if cancel != nil {
		cancel()
	}
}

func (w *podWorker) grace() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deletionGrace
}

func (w *podWorker) terminationGrace() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if g := w.pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return 30 * time.Second
}

func (w *podWorker) restartPolicy() corev1.RestartPolicy {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pod.Spec.RestartPolicy == "" {
		return corev1.RestartPolicyAlways
	}
	return w.pod.Spec.RestartPolicy
}

// snapshot: the pod as containers should see it, with the addresses this worker
// assigned even before the informer shows them.
func (w *podWorker) snapshot() *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.pod.DeepCopy()
	p.Status.HostIP = w.node.IPv4
	p.Status.HostIPs = hostIPs(w.node)
	if len(w.podIPs) > 0 {
		p.Status.PodIP = w.podIPs[0]
		p.Status.PodIPs = nil
		for _, ip := range w.podIPs {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
	}
	return p
}

func hostIPs(n NodeConf) []corev1.HostIP {
	ips := []corev1.HostIP{{IP: n.IPv4}}
	if n.IPv6 != "" {
		ips = append(ips, corev1.HostIP{IP: n.IPv6})
	}
	return ips
}

// run is the worker's goroutine.
func (w *podWorker) run() {
	defer close(w.done)
	runCtx, cancelRun := context.WithCancel(context.Background())
	w.mu.Lock()
	w.cancelRun = cancelRun
	deleting := w.deleting
	w.mu.Unlock()
	if deleting {
		cancelRun()
	}
	statusCtx, stopStatus := context.WithCancel(context.Background())
	statusDone := make(chan struct{})
	go func() { w.statusLoop(statusCtx); close(statusDone) }()
	w.markDirty()

	if w.setup(runCtx) {
		go w.refreshLoop(runCtx)
		w.runContainers(runCtx)
	}
	<-runCtx.Done() // a finished pod (restartPolicy Never) waits here for its deletion
	w.runners.Wait()
	stopStatus()
	<-statusDone
	w.teardown()
}

// setup creates the pod's network and volumes; false if the pod went away first.
func (w *podWorker) setup(ctx context.Context) bool {
	pod := w.snapshot()
	if pod.Spec.HostNetwork {
		w.mu.Lock()
		w.netns = w.node.Netns
		w.podIPs = []string{w.node.IPv4}
		if w.node.IPv6 != "" {
			w.podIPs = append(w.podIPs, w.node.IPv6)
		}
		w.mu.Unlock()
	} else {
		for {
			if err := w.createSandbox(pod); err == nil {
				break
			} else {
				w.setMessage("FailedCreatePodSandBox: " + err.Error())
				w.event("sandbox: %v", err)
			}
			if !sleepCtx(ctx, 3*time.Second) {
				return false
			}
		}
	}
	for _, c := range allContainers(pod) {
		killLeftover(w.pidPath(c.Name))
	}
	w.mu.Lock()
	w.sandboxReady = true
	w.mu.Unlock()
	w.markDirty()
	// Right after scheduling the Node authorizer may not yet relate this node to the
	// pod's Secrets and ServiceAccount (403): retry soon, then less often.
	for attempt := 0; ; attempt++ {
		err := w.vols.sync(ctx, w.snapshot())
		if err == nil {
			break
		}
		w.setMessage("FailedMount: " + err.Error())
		w.event("volumes: %v", err)
		if !sleepCtx(ctx, time.Duration(min(attempt+1, 5))*500*time.Millisecond) {
			return false
		}
	}
	w.setMessage("")
	return true
}

func (w *podWorker) createSandbox(pod *corev1.Pod) error {
	idx, err := w.a.ipam.allocate(w.uid, w.a.preferredIndex(pod))
	if err != nil {
		return err
	}
	sb, err := createSandbox(w.a.cfg.PodNetwork, string(w.uid), idx)
	if err != nil {
		w.a.ipam.release(w.uid)
		return err
	}
	w.mu.Lock()
	w.netns, w.ownSandbox, w.ipIndex, w.podIPs = sb.Netns, true, idx, sb.IPs
	w.mu.Unlock()
	w.event("sandbox %s with %s", sb.Netns, strings.Join(sb.IPs, ", "))
	return nil
}

func (w *podWorker) setMessage(m string) {
	w.mu.Lock()
	w.message = m
	w.mu.Unlock()
	w.markDirty()
}

// refreshLoop keeps Secret/ConfigMap/projected volumes and tokens current.
func (w *podWorker) refreshLoop(ctx context.Context) {
	for sleepCtx(ctx, volumeRefreshEvery) {
		if err := w.vols.sync(ctx, w.snapshot()); err != nil && ctx.Err() == nil {
			w.event("volume refresh: %v", err)
		}
	}
}

// runContainers runs init containers in order, then the app containers, and
// returns when ctx ends or every app container is done for good.
func (w *podWorker) runContainers(ctx context.Context) {
	pod := w.snapshot()
	for _, c := range pod.Spec.InitContainers {
		sidecar := c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		mode := runOnce
		if sidecar {
			mode = runAlwaysSide
		}
		r := w.newRunner(c, mode)
		w.goRunner(ctx, r)
		if sidecar {
			select {
			case <-r.started:
				continue
			case <-ctx.Done():
				return
			}
		}
		exit := <-r.result
		if ctx.Err() != nil {
			return
		}
		if exit != 0 {
			w.setTerminal(corev1.PodFailed, fmt.Sprintf("init container %s exited with %d", c.Name, exit))
			return
		}
	}
	w.mu.Lock()
	w.initialized = true
	w.mu.Unlock()
	w.markDirty()
	var results []chan int32
	for _, c := range pod.Spec.Containers {
		r := w.newRunner(c, runPerPolicy)
		w.goRunner(ctx, r)
		results = append(results, r.result)
	}
	failed := false
	for _, ch := range results {
		select {
		case exit := <-ch:
			failed = failed || exit != 0
		case <-ctx.Done():
			return
		}
	}
	if ctx.Err() == nil {
		phase := corev1.PodSucceeded
		if failed {
			phase = corev1.PodFailed
		}
		w.setTerminal(phase, "all containers exited")
	}
}

func (w *podWorker) goRunner(ctx context.Context, r *runner) {
	w.runners.Add(1)
	go func() {
		defer w.runners.Done()
		r.run(ctx)
	}()
}

func (w *podWorker) setTerminal(phase corev1.PodPhase, msg string) {
	w.mu.Lock()
	w.terminal = phase
	w.mu.Unlock()
	w.event("phase %s: %s", phase, msg)
	w.markDirty()
}

// teardown: final status, removal from the API (as the kubelet finalises a deleted
// pod), then the sandbox and volumes. Logs stay for the tests.
func (w *podWorker) teardown() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w.mu.Lock()
	if w.terminal == "" {
		w.terminal = corev1.PodSucceeded
		for _, s := range w.statuses {
			if t := s.State.Terminated; t != nil && t.ExitCode != 0 {
				w.terminal = corev1.PodFailed
			}
		}
	}
	gone := w.gone
	w.mu.Unlock()
	if !gone {
		for i := 0; ; i++ {
			err := w.patchStatus(ctx, w.buildStatus())
			if err == nil || apierrors.IsNotFound(err) || i >= 10 || ctx.Err() != nil {
				break
			}
			time.Sleep(time.Second)
		}
		zero := int64(0)
		opts := metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &w.uid}}
		for i := 0; ; i++ {
			err := w.client.CoreV1().Pods(w.ns).Delete(ctx, w.name, opts)
			if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
				break
			}
			if i >= 10 || ctx.Err() != nil {
				w.event("delete: %v", err)
				break
			}
			time.Sleep(time.Second)
		}
	}
	w.mu.Lock()
	own := w.ownSandbox
	w.mu.Unlock()
	if own {
		deleteSandbox(string(w.uid))
		w.a.ipam.release(w.uid)
	}
	_ = os.RemoveAll(filepath.Join(w.dir, "volumes"))
	_ = os.Remove(filepath.Join(w.dir, "kubeconfig"))
	w.mu.Lock()
	stopping := w.agentStopping
	w.mu.Unlock()
	if stopping {
		w.event("containers stopped: the agent stops (the pod stays; the next agent restarts it)")
	} else {
		w.event("removed")
	}
}

// writeKubeconfig writes the pod's kubeconfig: the API server, the cluster CA and the
// projected token file (re-read by kube-rs and kubectl, so refreshed tokens apply).
func (w *podWorker) writeKubeconfig(tokenPath string) (string, error) {
	path := filepath.Join(w.dir, "kubeconfig")
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: h3i-cluster
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    tokenFile: %s
contexts:
- name: pod
  context:
    cluster: h3i-cluster
    user: %s
    namespace: %s
current-context: pod
`, w.a.cfg.Server, w.a.cfg.CAFile, w.saName(), tokenPath, w.saName(), w.ns)
	if err := os.WriteFile(path+".tmp", []byte(body), 0o600); err != nil {
		return "", err
	}
	return path, os.Rename(path+".tmp", path)
}

func (w *podWorker) saName() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	sa := w.pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	return "system:serviceaccount:" + w.ns + ":" + sa
}
