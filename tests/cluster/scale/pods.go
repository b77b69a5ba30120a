package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// role: a pod of the product's namespace is "data-plane" when a DaemonSet controls it and
// "operator" otherwise (a Deployment's ReplicaSet), whatever its labels say.
func role(p *corev1.Pod) string {
	for _, o := range p.OwnerReferences {
		if o.Controller != nil && *o.Controller && o.Kind == "DaemonSet" {
			return "data-plane"
		}
	}
	return "operator"
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func restarts(p *corev1.Pod) int {
	n := 0
	for _, s := range p.Status.ContainerStatuses {
		n += int(s.RestartCount)
	}
	return n
}

// memory: VmRSS and VmHWM (MiB) of a pod's first container's process, from the pid file the
// node agent writes.
func memory(podLogs string, p *corev1.Pod) (rss, hwm float64, err error) {
	c := p.Spec.Containers[0].Name
	b, err := os.ReadFile(filepath.Join(podLogs, p.Namespace, p.Name, c+".pid"))
	if err != nil {
		return 0, 0, err
	}
	f, err := os.Open("/proc/" + strings.TrimSpace(string(b)) + "/status")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(fields[1], 64)
		switch fields[0] {
		case "VmRSS:":
			rss = kb / 1024
		case "VmHWM:":
			hwm = kb / 1024
		}
	}
	return rss, hwm, sc.Err()
}

// cmdProcs records the resident memory now (`--phase steady`) or the peak so far
// (`--phase peak`, VmHWM) of the operator and of each data-plane pod.
func cmdProcs(args []string) error {
	fs := flag.NewFlagSet("procs", flag.ExitOnError)
	var c common
	c.register(fs)
	phase := fs.String("phase", "steady", "steady (VmRSS) or peak (VmHWM)")
	podLogs := fs.String("pod-logs", os.Getenv("H3I_POD_LOGS"), "the node agent's pod directory")
	_ = fs.Parse(args)
	k, err := newKube(c.kubeconfig)
	if err != nil {
		return err
	}
	pods, err := k.cs.CoreV1().Pods(c.namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return err
	}
	best := map[string]float64{}
	var each []string
	dpRestarts := 0
	var dpEach []string
	for i := range pods.Items {
		p := &pods.Items[i]
		if role(p) == "data-plane" {
			dpRestarts += restarts(p)
		}
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		rss, hwm, err := memory(*podLogs, p)
		if err != nil {
			fmt.Printf("  %s: %v\n", p.Name, err)
			continue
		}
		v := rss
		if *phase == "peak" {
			v = hwm
		}
		r := role(p)
		best[r] = max(best[r], v)
		if r == "data-plane" {
			dpEach = append(dpEach, fmt.Sprintf("%.0f", v))
		}
		each = append(each, fmt.Sprintf("%s %s %.0f", r, p.Name, v))
	}
	sort.Strings(each)
	fmt.Printf("%s memory (MiB): %s; data-plane container restarts so far: %d\n", *phase, strings.Join(each, ", "), dpRestarts)
	sort.Strings(dpEach)
	kv := map[string]any{*phase + "_dp_restarts": dpRestarts, *phase + "_dp_each": strings.Join(dpEach, ", ")}
	for r, v := range best {
		kv[fmt.Sprintf("%s_%s_mib", *phase, r)] = v
	}
	return mergeResults(c.results, c.col, kv)
}

// cmdRestart deletes the data-plane pod of one node and times its replacement: Ready in the
// API, then proven to serve every host on that node; the new pod's restart count (a probe
// killing a pod that is still loading shows there) at the end.
func cmdRestart(args []string) error {
	fs := flag.NewFlagSet("restart", flag.ExitOnError)
	var c common
	c.register(fs)
	node := fs.String("node", "h3i-node-1", "node whose data-plane pod is deleted")
	nodeIP := fs.String("node-ip", "10.77.0.1", "its address")
	timeout := fs.Duration("timeout", 90*time.Second, "cap, counted from the deletion")
	o := sweepOpts{}
	o.register(fs)
	_ = fs.Parse(args)
	st, k, p, err := c.open(true, true)
	if err != nil {
		return err
	}
	ctx := context.Background()
	find := func(skipUID string) *corev1.Pod {
		pods, err := k.cs.CoreV1().Pods(c.namespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + *node})
		if err != nil {
			return nil
		}
		for i := range pods.Items {
			q := &pods.Items[i]
			if role(q) == "data-plane" && string(q.UID) != skipUID && q.DeletionTimestamp == nil {
				return q
			}
		}
		return nil
	}
	old := find("")
	if old == nil {
		return fmt.Errorf("no data-plane pod on %s", *node)
	}
	if err := k.cs.CoreV1().Pods(c.namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	t0 := time.Now()
	deadline := t0.Add(*timeout)
	readyAt := time.Duration(-1)
	var cur *corev1.Pod
	for time.Now().Before(deadline) {
		if cur = find(string(old.UID)); cur != nil && podReady(cur) {
			readyAt = time.Since(t0)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	pr := prove(ctx, p, []string{*nodeIP}, st.annotated(), c.metricsPort, t0, deadline, o)
	n, name := -1, "none"
	if cur = find(string(old.UID)); cur != nil {
		n, name = restarts(cur), cur.Name
	}
	fmt.Printf("pod %s deleted; replacement %s Ready: %s; serving all %d hosts: %s (gauge %s; sweep %d/%d ok%s); restarts %d\n",
		old.Name, name, fmtDur(readyAt, *timeout), len(st.annotated()), fmtDur(pr.servedAt, *timeout), pr.gauge, pr.ok, pr.total, pr.failures(), n)
	return mergeResults(c.results, c.col, map[string]any{
		"restart_ready_s": durOrNil(readyAt), "restart_served_s": durOrNil(pr.servedAt), "restart_restarts": n,
		"restart_sweep_ok": pr.ok, "restart_sweep_total": pr.total, "restart_timeout_s": secs(*timeout),
	})
}
