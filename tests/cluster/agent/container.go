package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// process is one started container process (its own process group).
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	exit int32
}

func exitCode(err error, st *os.ProcessState) int32 {
	if st == nil {
		return 128
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int32(ws.Signal())
	}
	if err != nil && st.ExitCode() < 0 {
		return 128
	}
	return int32(st.ExitCode())
}

// startProcess runs argv through `h3i-node-agent launch` so it gets the pod's mounts
// and network namespace; stdout and stderr are appended to logPath.
func startProcess(argv, env []string, mounts []mountSpec, netns, workdir, logPath, pidPath string) (*process, error) {
	args := []string{"launch"}
	if netns != "" {
		args = append(args, "--netns", netnsPath(netns))
	}
	for _, m := range mounts {
		args = append(args, "--mount", m.flag())
	}
	if workdir != "" {
		args = append(args, "--workdir", workdir)
	}
	args = append(append(args, "--"), argv...)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	// /proc/self/exe: still this agent even if its file was replaced by a rebuild.
	cmd := exec.Command("/proc/self/exe", args...)
	cmd.Env = env
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Stdin = nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	_ = os.WriteFile(pidPath, []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		p.exit = exitCode(err, cmd.ProcessState)
		_ = os.Remove(pidPath)
		close(p.done)
	}()
	return p, nil
}

// stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
	// Children that left the group's leader behind die with it.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// killLeftover kills a process group recorded by an earlier agent in pidPath.
func killLeftover(pidPath string) {
	b, err := os.ReadFile(pidPath)
	if err != nil {
		return
	}
	if pid, err := strconv.Atoi(string(trimNL(b))); err == nil && pid > 1 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = os.Remove(pidPath)
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// runMode says when a container restarts after it exits.
type runMode int

const (
	runOnce       runMode = iota // init container: until it exits 0 (or once, under Never)
	runPerPolicy                 // app container: per the pod's restartPolicy
	runAlwaysSide                // sidecar (init container with restartPolicy Always)
)

func (m runMode) restarts(policy corev1.RestartPolicy, exit int32) bool {
	switch m {
	case runAlwaysSide:
		return true
	case runOnce:
		return exit != 0 && policy != corev1.RestartPolicyNever
	}
	switch policy {
	case corev1.RestartPolicyNever:
		return false
	case corev1.RestartPolicyOnFailure:
		return exit != 0
	}
	return true
}

// runner supervises one container: start, probes, exit, backoff, restart.
type runner struct {
	w       *podWorker
	ctr     corev1.Container
	mode    runMode
	started chan struct{} // closed when the first process is running
	result  chan int32    // the final exit code when the runner gives up restarting
}

func (w *podWorker) newRunner(c corev1.Container, mode runMode) *runner {
	return &runner{w: w, ctr: c, mode: mode, started: make(chan struct{}), result: make(chan int32, 1)}
}

// run loops until ctx ends (pod deleted) or the container is done for good.
func (r *runner) run(ctx context.Context) {
	name := r.ctr.Name
	closedStarted := false
	var lastExit int32
	for attempt := 0; ; attempt++ {
		p, err := r.start(ctx)
		if err != nil {
			var unsupported errUnsupportedImage
			reason := "RunContainerError"
			if errors.As(err, &unsupported) {
				reason = "ImageNotSupported"
			}
			r.w.setWaiting(name, reason, err.Error())
			log.Printf("pod %s container %s: %s: %v", r.w.key(), name, reason, err)
			if reason == "ImageNotSupported" {
				<-ctx.Done()
				r.result <- -1
				return
			}
			if !sleepCtx(ctx, r.w.a.cfg.backoff(r.w.restartCount(name))) {
				r.result <- -1
				return
			}
			continue
		}
		started := time.Now()
		r.w.setRunning(name, started)
		if !closedStarted {
			close(r.started)
			closedStarted = true
		}
		probeCtx, cancelProbes := context.WithCancel(ctx)
		readyCtx, cancelReady := context.WithCancel(context.Background())
		kill := make(chan string, 1)
		r.w.startProbes(probeCtx, readyCtx, &r.ctr, kill)
		var reason string
		select {
		case <-p.done:
		case <-ctx.Done():
			p.stop(r.w.grace())
		case why := <-kill:
			log.Printf("pod %s container %s: %s, restarting", r.w.key(), name, why)
			p.stop(r.w.terminationGrace())
			reason = "Error"
		}
		cancelProbes()
		cancelReady()
		lastExit = p.exit
		r.w.setTerminated(name, p.exit, reason, started)
		if ctx.Err() != nil || !r.mode.restarts(r.w.restartPolicy(), p.exit) {
			r.result <- lastExit
			return
		}
		wait := r.w.a.cfg.backoff(r.w.restartCount(name))
		if time.Since(started) > 10*time.Duration(r.w.a.cfg.BackoffMaxSeconds)*time.Second {
			wait = r.w.a.cfg.backoff(0) // ran long enough: the crash loop is over
		}
		r.w.setBackoff(name, wait)
		if !sleepCtx(ctx, wait) {
			r.result <- lastExit
			return
		}
		r.w.incRestart(name)
	}
}

// start prepares env, mounts and argv, then the process.
func (r *runner) start(ctx context.Context) (*process, error) {
	w := r.w
	pod := w.snapshot()
	mounts, token, err := w.vols.containerMounts(pod, &r.ctr)
	if err != nil {
		return nil, err
	}
	kubeconfig := ""
	if token != "" {
		kubeconfig, err = w.writeKubeconfig(token)
		if err != nil {
			return nil, err
		}
	}
	env, eb, err := containerEnv(ctx, w.client, w.a.cfg, pod, &r.ctr, kubeconfig)
	if err != nil {
		return nil, err
	}
	command := make([]string, len(r.ctr.Command))
	for i, s := range r.ctr.Command {
		command[i] = expandVars(s, eb.lookup)
	}
	args := make([]string, len(r.ctr.Args))
	for i, s := range r.ctr.Args {
		args[i] = expandVars(s, eb.lookup)
	}
	argv, err := composeArgv(&r.ctr, command, args, w.a.cfg)
	if err != nil {
		return nil, err
	}
	logPath := w.logPath(r.ctr.Name)
	stamp := fmt.Sprintf("%s h3i-node-agent: starting %s (restart %d): %q\n",
		time.Now().UTC().Format(time.RFC3339Nano), r.ctr.Name, w.restartCount(r.ctr.Name), argv)
	w.appendAgentLog(stamp)
	return startProcess(argv, env, mounts, w.netns, r.ctr.WorkingDir, logPath, w.pidPath(r.ctr.Name))
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func containerID(uid string, name string, restart int32) string {
	return fmt.Sprintf("h3i://%s-%s-%d", uid, name, restart)
}

func now() metav1.Time { return metav1.NewTime(time.Now()) }
