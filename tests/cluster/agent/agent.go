package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

type agent struct {
	cfg  *Config
	ipam *ipam

	mu      sync.Mutex
	workers map[types.UID]*podWorker
}

// run registers the nodes, then watches their pods until ctx ends; on the way out
// it stops every container (a restarted agent starts them again).
func run(ctx context.Context, cfg *Config) error {
	a := &agent{cfg: cfg, ipam: newIPAM(cfg.PodNetwork.First, cfg.PodNetwork.Last),
		workers: map[types.UID]*podWorker{}}
	var wg sync.WaitGroup
	for _, n := range cfg.Nodes {
		c, err := nodeClient(cfg, n)
		if err != nil {
			return err
		}
		if err := retry(ctx, 60, func() error { return registerNode(ctx, c, cfg, n) }); err != nil {
			return err
		}
		if err := renewLease(ctx, c, n); err != nil {
			log.Printf("node %s: first lease: %v", n.Name, err)
		}
		log.Printf("node %s registered (%s %s, netns %s)", n.Name, n.IPv4, n.IPv6, n.Netns)
		wg.Add(2)
		go func() { defer wg.Done(); keepNodeAlive(ctx, c, cfg, n) }()
		go func() { defer wg.Done(); a.watchPods(ctx, c, n) }()
		if cfg.KubeletPort > 0 {
			if err := a.serveKubeletAPI(ctx, n); err != nil {
				return fmt.Errorf("node %s kubelet API: %w", n.Name, err)
			}
		}
	}
	<-ctx.Done()
	log.Printf("stopping: terminating all pods' containers")
	a.mu.Lock()
	ws := make([]*podWorker, 0, len(a.workers))
	for _, w := range a.workers {
		ws = append(ws, w)
	}
	a.mu.Unlock()
	for _, w := range ws {
		w.shutdown()
	}
	for _, w := range ws {
		<-w.done
	}
	wg.Wait()
	return nil
}

func retry(ctx context.Context, tries int, f func() error) error {
	var err error
	for i := 0; i < tries; i++ {
		if err = f(); err == nil {
			return nil
		}
		log.Printf("retrying: %v", err)
		if !sleepCtx(ctx, time.Second) {
			break
		}
	}
	return err
}

// watchPods runs an informer on the pods bound to node n (the field selector the
// Node authorizer requires of a node).
func (a *agent) watchPods(ctx context.Context, c kubernetes.Interface, n NodeConf) {
	sel := fields.OneTermEqualSelector("spec.nodeName", n.Name).String()
	f := informers.NewSharedInformerFactoryWithOptions(c, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = sel }))
	inf := f.Core().V1().Pods().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { a.onPod(c, n, o.(*corev1.Pod)) },
		UpdateFunc: func(_, o any) { a.onPod(c, n, o.(*corev1.Pod)) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if p, ok := o.(*corev1.Pod); ok {
				a.onPodGone(p)
			}
		},
	})
	f.Start(ctx.Done())
	<-ctx.Done()
	f.Shutdown()
}

func (a *agent) onPod(c kubernetes.Interface, n NodeConf, pod *corev1.Pod) {
	a.mu.Lock()
	w, ok := a.workers[pod.UID]
	if !ok {
		terminal := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
		if terminal {
			a.mu.Unlock()
			if pod.DeletionTimestamp != nil {
				a.deleteNow(c, pod)
			}
			return
		}
		w = newPodWorker(a, n, c, pod)
		a.workers[pod.UID] = w
		a.mu.Unlock()
		w.event("bound to %s: starting", n.Name)
		w.update(pod)
		go func() {
			w.run()
			a.mu.Lock()
			delete(a.workers, pod.UID)
			a.mu.Unlock()
		}()
		return
	}
	a.mu.Unlock()
	w.update(pod)
}

func (a *agent) onPodGone(pod *corev1.Pod) {
	a.mu.Lock()
	w, ok := a.workers[pod.UID]
	a.mu.Unlock()
	if ok {
		w.forget()
	}
}

// deleteNow finalises a terminated pod nobody runs any more.
func (a *agent) deleteNow(c kubernetes.Interface, pod *corev1.Pod) {
	zero := int64(0)
	uid := pod.UID
	err := c.CoreV1().Pods(pod.Namespace).Delete(context.Background(), pod.Name,
		metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		log.Printf("pod %s/%s: delete: %v", pod.Namespace, pod.Name, err)
	}
}

// shutdown stops the pod's containers because the agent stops (the pod stays).
func (w *podWorker) shutdown() {
	w.mu.Lock()
	w.gone = true // do not remove the pod from the API
	w.agentStopping = true
	w.deleting = true
	w.deletionGrace = 5 * time.Second
	cancel := w.cancelRun
	w.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// preferredIndex keeps a pod's address across agent restarts (pod IPs never change).
func (a *agent) preferredIndex(pod *corev1.Pod) int {
	ip := pod.Status.PodIP
	if !strings.HasPrefix(ip, a.cfg.PodNetwork.Prefix4) {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimPrefix(ip, a.cfg.PodNetwork.Prefix4))
	if err != nil || net.ParseIP(ip) == nil {
		return 0
	}
	return n
}

// ipam hands out the host part of pod addresses on the pod bridge.
type ipam struct {
	mu          sync.Mutex
	first, last int
	used        map[int]types.UID
}

func newIPAM(first, last int) *ipam {
	return &ipam{first: first, last: last, used: map[int]types.UID{}}
}

func (p *ipam) allocate(uid types.UID, prefer int) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, u := range p.used {
		if u == uid {
			return n, nil
		}
	}
	if prefer >= p.first && prefer <= p.last {
		if _, taken := p.used[prefer]; !taken {
			p.used[prefer] = uid
			return prefer, nil
		}
	}
	for n := p.first; n <= p.last; n++ {
		if _, taken := p.used[n]; !taken {
			p.used[n] = uid
			return n, nil
		}
	}
	return 0, fmt.Errorf("pod address range %d-%d exhausted", p.first, p.last)
}

func (p *ipam) release(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, u := range p.used {
		if u == uid {
			delete(p.used, n)
		}
	}
}
