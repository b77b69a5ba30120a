package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

const netnsDir = "/run/netns"

// mountSpec is one volume mount of a container: SRC (a path the agent owns) appears
// at DST inside the container's private mount namespace.
type mountSpec struct {
	Src, Dst string
	ReadOnly bool
}

func (m mountSpec) flag() string {
	s := m.Src + ":" + m.Dst
	if m.ReadOnly {
		s += ":ro"
	}
	return s
}

func parseMount(s string) (mountSpec, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || !filepath.IsAbs(parts[1]) {
		return mountSpec{}, fmt.Errorf("--mount %q: want SRC:/DST[:ro]", s)
	}
	m := mountSpec{Src: parts[0], Dst: parts[1]}
	if len(parts) == 3 {
		if parts[2] != "ro" {
			return mountSpec{}, fmt.Errorf("--mount %q: the third field may only be ro", s)
		}
		m.ReadOnly = true
	}
	return m, nil
}

// launchMain runs in a fresh process of the agent (so no other goroutine shares its
// namespaces): private mount namespace, the volume bind mounts, the pod's network
// namespace, then exec. Namespaces belong to the OS thread, hence the lock; execve
// from this thread carries them into the new program.
func launchMain(args []string) error {
	runtime.LockOSThread()
	var netns, workdir string
	var mounts []mountSpec
	i := 0
	for ; i < len(args) && args[i] != "--"; i++ {
		if i+1 >= len(args) {
			return fmt.Errorf("flag %s needs a value", args[i])
		}
		switch args[i] {
		case "--netns":
			netns = args[i+1]
		case "--workdir":
			workdir = args[i+1]
		case "--mount":
			m, err := parseMount(args[i+1])
			if err != nil {
				return err
			}
			mounts = append(mounts, m)
		default:
			return fmt.Errorf("unknown flag %s", args[i])
		}
		i++
	}
	if i >= len(args)-1 {
		return errors.New("no command after --")
	}
	argv := args[i+1:]
	// A volume may be mounted over the directory that holds the program (an emptyDir on
	// /tmp hides a checkout under /tmp), so keep a handle on it from before the mounts.
	early := openProgram(argv[0])
	if early != nil {
		defer early.Close()
	}
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare mount namespace: %w", err)
	}
	// Our mounts must not propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	for _, m := range mounts {
		if err := bindMount(m); err != nil {
			return err
		}
	}
	if netns != "" {
		if err := enterNetns(netns); err != nil {
			return err
		}
		// As `ip netns exec` does: /sys then shows this namespace's interfaces.
		if err := unix.Unmount("/sys", unix.MNT_DETACH); err == nil {
			_ = unix.Mount("sysfs", "/sys", "sysfs", 0, "")
		}
	}
	if workdir != "" {
		if err := os.Chdir(workdir); err != nil {
			return fmt.Errorf("workingDir %s: %w", workdir, err)
		}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		if early == nil {
			return fmt.Errorf("executable %q: %w", argv[0], err)
		}
		// The kernel resolves /proc/self/fd/N before it closes the close-on-exec
		// descriptor, which is enough for a binary (not for a #! script).
		path = fmt.Sprintf("/proc/self/fd/%d", early.Fd())
	}
	return unix.Exec(path, argv, os.Environ())
}

// openProgram opens the program as the host's mount namespace sees it, or returns nil.
func openProgram(name string) *os.File {
	path, err := exec.LookPath(name)
	if err != nil {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	return f
}

func bindMount(m mountSpec) error {
	st, err := os.Stat(m.Src)
	if err != nil {
		return fmt.Errorf("mount source: %w", err)
	}
	// The mount point has to exist; on the host file system it stays as an empty
	// directory or file after the pod is gone (there is no container root to put it in).
	if st.IsDir() {
		err = os.MkdirAll(m.Dst, 0o755)
	} else if _, e := os.Stat(m.Dst); errors.Is(e, os.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(m.Dst), 0o755); err == nil {
			var f *os.File
			if f, err = os.OpenFile(m.Dst, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
				f.Close()
			}
		}
	}
	if err != nil {
		return fmt.Errorf("mount point %s: %w", m.Dst, err)
	}
	if err := unix.Mount(m.Src, m.Dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", m.Src, m.Dst, err)
	}
	if m.ReadOnly {
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
		if err := unix.Mount("", m.Dst, "", flags, ""); err != nil {
			return fmt.Errorf("read-only %s: %w", m.Dst, err)
		}
	}
	return nil
}

func enterNetns(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	defer f.Close()
	if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns %s: %w", path, err)
	}
	return nil
}

// inNetns runs fn on an OS thread moved into the network namespace at path. Sockets
// created by fn stay in that namespace after the thread moves back. If moving back
// fails the thread stays locked and Go discards it when the goroutine ends.
func inNetns(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := enterNetns(path); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := fn()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- ferr
	}()
	return <-errc
}

// dialInNetns connects from inside a network namespace, as a kubelet probe from the
// node would; addr must be an IP literal with port.
func dialInNetns(ctx context.Context, nsPath, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := inNetns(nsPath, func() error {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		conn = c
		return err
	})
	return conn, err
}

// listenInNetns opens a TCP listener inside a network namespace.
func listenInNetns(nsPath, addr string) (net.Listener, error) {
	var l net.Listener
	err := inNetns(nsPath, func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

func netnsPath(name string) string { return filepath.Join(netnsDir, name) }

// runIP runs iproute2; the error carries its output.
func runIP(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// podSandbox is the network of a non-hostNetwork pod: namespace h3ic-p-<uid8>, a veth
// pair whose host end sits on the pod bridge, one IPv4 and (if configured) one IPv6
// address with default routes via the bridge.
type podSandbox struct {
	Netns string
	Veth  string
	IPs   []string
}

func sandboxNames(uid string) (netns, veth string) {
	short := strings.ReplaceAll(uid, "-", "")
	if len(short) > 8 {
		short = short[:8]
	}
	return "h3ic-p-" + short, "h3icv" + short
}

func createSandbox(pn PodNetwork, uid string, n int) (*podSandbox, error) {
	ns, veth := sandboxNames(uid)
	deleteSandbox(uid) // leftovers of an earlier agent
	sb := &podSandbox{Netns: ns, Veth: veth}
	ip4 := fmt.Sprintf("%s%d", pn.Prefix4, n)
	sb.IPs = []string{ip4}
	steps := [][]string{
		{"netns", "add", ns},
		{"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"link", "set", veth, "master", pn.Bridge, "up"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "addr", "add", fmt.Sprintf("%s/%d", ip4, pn.PrefixLen4), "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "route", "add", "default", "via", pn.Gateway4},
	}
	if pn.Prefix6 != "" {
		ip6 := fmt.Sprintf("%s%x", pn.Prefix6, n)
		sb.IPs = append(sb.IPs, ip6)
		steps = append(steps,
			[]string{"-n", ns, "-6", "addr", "add", fmt.Sprintf("%s/%d", ip6, pn.PrefixLen6), "dev", "eth0", "nodad"},
			[]string{"-n", ns, "-6", "route", "add", "default", "via", pn.Gateway6})
	}
	for _, s := range steps {
		if err := runIP(s...); err != nil {
			deleteSandbox(uid)
			return nil, err
		}
	}
	// The addresses are reused (lowest free first) by a pod with a new veth MAC, while the
	// host's neighbour cache may still hold the previous pod's MAC as STALE: the host's
	// first packets would then go nowhere for the ~8 s of DELAY and PROBE, long enough for
	// a client's connect to time out. A real CNI plugin announces the new MAC; forgetting
	// the old entry has the same effect here.
	for _, ip := range sb.IPs {
		_ = exec.Command("ip", "neigh", "flush", "to", ip, "dev", pn.Bridge).Run()
	}
	return sb, nil
}

// deleteSandbox kills what still runs in the pod's namespace, then removes it (the
// veth pair goes with it).
func deleteSandbox(uid string) {
	ns, veth := sandboxNames(uid)
	killNetnsProcesses(ns)
	_ = exec.Command("ip", "netns", "del", ns).Run()
	_ = exec.Command("ip", "link", "del", veth).Run()
}

func killNetnsProcesses(ns string) {
	out, err := exec.Command("ip", "netns", "pids", ns).Output()
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(out)) {
		var pid int
		if _, err := fmt.Sscan(f, &pid); err == nil && pid > 1 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
