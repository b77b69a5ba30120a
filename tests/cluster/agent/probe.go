package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// startProbes runs the container's startup, readiness and liveness probes from the
// node's network namespace, where a kubelet's probes come from. A failed liveness or
// startup probe asks the runner to restart the container through kill. As a kubelet does
// (its prober's StopLivenessAndStartup), termination stops the liveness and startup probes
// (ctx ends) while the readiness probe goes on until the container exits (readyCtx ends):
// the DaemonSet controller counts a node's oldest pod, so a draining pod's readiness is
// what it sees during a surge roll.
func (w *podWorker) startProbes(ctx, readyCtx context.Context, c *corev1.Container, kill chan<- string) {
	name := c.Name
	go func() {
		if p := c.StartupProbe; p != nil {
			ok, msg := w.probeUntil(ctx, c, p)
			if ctx.Err() != nil {
				return
			}
			if !ok {
				kill <- "startup probe failed: " + msg
				return
			}
			w.setStarted(name)
			if c.ReadinessProbe == nil {
				w.setReady(name, true)
			}
		}
		if p := c.ReadinessProbe; p != nil {
			go w.probeLoop(readyCtx, c, p, func(ok bool, msg string) bool {
				if !ok {
					w.event("readiness probe of %s failed: %s", name, msg)
				}
				w.setReady(name, ok)
				return false
			})
		}
		if p := c.LivenessProbe; p != nil {
			go w.probeLoop(ctx, c, p, func(ok bool, msg string) bool {
				if !ok {
					kill <- "liveness probe failed: " + msg
				}
				return !ok
			})
		}
	}()
}

type probeTiming struct {
	delay, period, timeout time.Duration
	success, failure       int32
}

func timing(p *corev1.Probe) probeTiming {
	t := probeTiming{
		delay:   time.Duration(p.InitialDelaySeconds) * time.Second,
		period:  time.Duration(p.PeriodSeconds) * time.Second,
		timeout: time.Duration(p.TimeoutSeconds) * time.Second,
		success: p.SuccessThreshold, failure: p.FailureThreshold,
	}
	if t.period <= 0 {
		t.period = 10 * time.Second
	}
	if t.timeout <= 0 {
		t.timeout = time.Second
	}
	if t.success <= 0 {
		t.success = 1
	}
	if t.failure <= 0 {
		t.failure = 3
	}
	return t
}

// probeLoop probes every period and calls report when the result crosses a threshold
// (success or failure) and changes; it stops when report returns true.
func (w *podWorker) probeLoop(ctx context.Context, c *corev1.Container, p *corev1.Probe, report func(bool, string) bool) {
	t := timing(p)
	if !sleepCtx(ctx, t.delay) {
		return
	}
	var succ, fail int32
	var last *bool
	for {
		ok, msg := w.probeOnce(ctx, c, p, t.timeout)
		if ctx.Err() != nil {
			return
		}
		if ok {
			succ, fail = succ+1, 0
		} else {
			succ, fail = 0, fail+1
		}
		var result *bool
		if succ >= t.success {
			result = ptr(true)
		} else if fail >= t.failure {
			result = ptr(false)
		}
		if result != nil && (last == nil || *last != *result) {
			last = result
			if report(*result, msg) {
				return
			}
		}
		if !sleepCtx(ctx, t.period) {
			return
		}
	}
}

// probeUntil runs a startup probe until success or failureThreshold failures.
func (w *podWorker) probeUntil(ctx context.Context, c *corev1.Container, p *corev1.Probe) (bool, string) {
	t := timing(p)
	if !sleepCtx(ctx, t.delay) {
		return false, "stopped"
	}
	var fail int32
	for {
		ok, msg := w.probeOnce(ctx, c, p, t.timeout)
		if ok {
			return true, ""
		}
		if fail++; fail >= t.failure {
			return false, msg
		}
		if !sleepCtx(ctx, t.period) {
			return false, "stopped"
		}
	}
}

func (w *podWorker) probeOnce(ctx context.Context, c *corev1.Container, p *corev1.Probe, timeout time.Duration) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	host := ""
	if snap := w.snapshot(); snap.Status.PodIP != "" {
		host = snap.Status.PodIP
	}
	nodeNS := netnsPath(w.node.Netns)
	switch {
	case p.HTTPGet != nil:
		return httpProbe(ctx, nodeNS, host, c, p.HTTPGet)
	case p.TCPSocket != nil:
		h := p.TCPSocket.Host
		if h == "" {
			h = host
		}
		port, err := resolvePort(p.TCPSocket.Port, c)
		if err != nil {
			return false, err.Error()
		}
		conn, err := dialInNetns(ctx, nodeNS, "tcp", net.JoinHostPort(h, strconv.Itoa(port)))
		if err != nil {
			return false, err.Error()
		}
		conn.Close()
		return true, ""
	case p.Exec != nil:
		return w.execProbe(ctx, c, p.Exec.Command)
	}
	return false, "probe type not supported by h3i-node-agent (httpGet, tcpSocket and exec are)"
}

func resolvePort(port intstr.IntOrString, c *corev1.Container) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(port.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("no container port named %q", port.StrVal)
}

func httpProbe(ctx context.Context, nodeNS, podIP string, c *corev1.Container, g *corev1.HTTPGetAction) (bool, string) {
	host := g.Host
	if host == "" {
		host = podIP
	}
	port, err := resolvePort(g.Port, c)
	if err != nil {
		return false, err.Error()
	}
	scheme := "http"
	if g.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	path := g.Path
	if path == "" || path[0] != '/' {
		path = "/" + path
	}
	url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(port)), path)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialInNetns(ctx, nodeNS, network, addr)
		},
		// The kubelet does not verify probe certificates either.
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err.Error()
	}
	req.Header.Set("User-Agent", "kube-probe/1.37")
	for _, h := range g.HTTPHeaders {
		req.Header.Set(h.Name, h.Value)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
	if resp.StatusCode >= 200 && resp.StatusCode < 400 {
		return true, ""
	}
	return false, fmt.Sprintf("HTTP probe failed with statuscode: %d", resp.StatusCode)
}

// execProbe runs the probe command like a container process (same namespaces and
// mounts) and succeeds on exit 0.
func (w *podWorker) execProbe(ctx context.Context, c *corev1.Container, command []string) (bool, string) {
	pod := w.snapshot()
	mounts, _, err := w.vols.containerMounts(pod, c)
	if err != nil {
		return false, err.Error()
	}
	cc := *c
	argv, err := composeArgv(&cc, command, nil, w.a.cfg)
	if err != nil {
		return false, err.Error()
	}
	env, _, err := containerEnv(ctx, w.client, w.a.cfg, pod, c, "")
	if err != nil {
		return false, err.Error()
	}
	args := []string{"launch", "--netns", netnsPath(w.netnsName())}
	for _, m := range mounts {
		args = append(args, "--mount", m.flag())
	}
	args = append(append(args, "--"), argv...)
	cmd := exec.CommandContext(ctx, "/proc/self/exe", args...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out, err := cmd.CombinedOutput()
	if err != nil {
		return false, fmt.Sprintf("%v: %s", err, truncate(string(out), 200))
	}
	return true, ""
}

func (w *podWorker) netnsName() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.netns
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
