package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

var httpClient = &http.Client{Timeout: 10 * time.Second}

// gauge reads one unlabelled sample of a data-plane pod's /metrics: its value, or why not
// ("absent" when the scrape answered without it).
func gauge(node string, port int, name string) (float64, string) {
	resp, err := httpClient.Get("http://" + net.JoinHostPort(node, strconv.Itoa(port)) + "/metrics")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0, err.Error()
			}
			return f, ""
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err.Error()
	}
	return 0, "absent"
}

// listenerStatus: what the listener says, read only from status.hostsSummary and the Ready
// condition (the rest of the status is the implementation's to change).
func listenerStatus(ctx context.Context, k *kube, name string) (summary, ready, reason string, err error) {
	obj, err := k.dyn.Resource(gvrListener).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", "", "", err
	}
	summary, _, _ = unstructured.NestedString(obj.Object, "status", "hostsSummary")
	conds, _, _ := unstructured.NestedSlice(obj.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" {
			ready, _ = m["status"].(string)
			reason, _ = m["reason"].(string)
		}
	}
	return summary, ready, reason, nil
}

// proof: the sweep's verdict on a set of targets, from t0 (the last create) on.
type proof struct {
	gaugeAt     time.Duration // every node's h3_ingress_hosts reached the want; -1: never
	servedAt    time.Duration // every target proven; -1: not within the deadline
	firstPass   time.Duration // the first full sweep's duration
	firstFailed int
	ok, total   int
	example     string // one failing target and why
	gauge       string // what the gauge said last
	kinds       string // the failures left, by kind
	// retried: first attempts that failed and were checked again a second later, with one
	// of them and why (the first sweep's transient failures).
	retried      int
	retryExample string
}

func countKinds(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// prove waits (polling the cheap gauge) until every node says it loaded `want` hosts, then
// sweeps every target, and sweeps the failures again until all pass or the deadline. The
// time served is the gauge's when the first sweep after it proves every target (the sweep
// itself takes seconds per thousand hosts), else the last failing target's success. Without
// the gauge it sweeps from the start. Past the deadline it still completes one sweep, so a
// run that misses says how many hosts are served.
func prove(ctx context.Context, p *prober, nodes []string, hosts []Host, metricsPort int, t0, deadline time.Time, o sweepOpts) proof {
	want := float64(len(hosts))
	pr := proof{gaugeAt: -1, servedAt: -1, gauge: "not read (the deadline had passed)"}
	lastAnswer, lastWith := time.Now(), time.Now()
	for time.Now().Before(deadline) {
		all := true
		var seen []string
		for _, n := range nodes {
			v, why := gauge(n, metricsPort, "h3_ingress_hosts")
			switch why {
			case "":
				lastAnswer, lastWith = time.Now(), time.Now()
				seen = append(seen, fmt.Sprintf("%s=%.0f", n, v))
			case "absent":
				lastAnswer = time.Now()
				seen = append(seen, n+"=absent")
			default:
				seen = append(seen, n+": "+why)
			}
			all = all && why == "" && v >= want
		}
		pr.gauge = strings.Join(seen, " ")
		if all {
			pr.gaugeAt = time.Since(t0)
			break
		}
		// Without the gauge (another implementation may not export it) the sweeps alone
		// decide; a pod too busy to answer its scrape is waited for longer.
		if time.Since(lastWith) > 10*time.Second && time.Since(lastAnswer) < time.Second ||
			time.Since(lastAnswer) > 60*time.Second {
			pr.gauge += " (sweeping without the gauge)"
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	var pending []target
	for _, h := range hosts {
		for _, n := range nodes {
			pending = append(pending, target{node: n, host: h.Name})
		}
	}
	pr.total = len(pending)
	// Served: when the gauge said so, unless a target failed at first; then when the last of
	// those succeeded (its retry right away, or a later sweep's).
	var lastOK time.Duration
	var mu sync.Mutex
	retried := map[target]bool{}
	o.retry = time.Second
	o.onRetry = func(t target, out outcome) {
		mu.Lock()
		retried[t] = true
		pr.retried++
		if pr.retryExample == "" {
			pr.retryExample = fmt.Sprintf("%s on %s: %s %s", t.host, t.node, out.Kind, out.Detail)
		}
		mu.Unlock()
	}
	onOK := func(t target) {
		mu.Lock()
		if retried[t] || pr.gaugeAt < 0 {
			lastOK = max(lastOK, time.Since(t0))
		}
		mu.Unlock()
	}
	for pass := 0; ; pass++ {
		start := time.Now()
		failed := p.sweep(ctx, pending, o, onOK)
		mu.Lock()
		for t := range failed {
			retried[t] = true
		}
		mu.Unlock()
		if pass == 0 {
			pr.firstPass, pr.firstFailed = time.Since(start), len(failed)
		}
		pending = pending[:0]
		kinds := map[string]int{}
		pr.example = ""
		for t, out := range failed {
			pending = append(pending, t)
			kinds[out.Kind]++
			if pr.example == "" || out.Kind != "skipped" {
				pr.example = fmt.Sprintf("%s on %s: %s %s", t.host, t.node, out.Kind, out.Detail)
			}
		}
		pr.kinds = countKinds(kinds)
		if len(pending) == 0 || !time.Now().Before(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	pr.ok = pr.total - len(pending)
	switch {
	case len(pending) > 0:
	case pr.gaugeAt >= 0 && pr.firstFailed == 0 && pr.retried == 0:
		pr.servedAt = pr.gaugeAt
	default:
		pr.servedAt = max(lastOK, pr.gaugeAt)
	}
	return pr
}

func cmdServed(args []string) error {
	fs := flag.NewFlagSet("served", flag.ExitOnError)
	var c common
	c.register(fs)
	listener := fs.String("listener", "", "the Http3Listener whose status to watch")
	timeout := fs.Duration("timeout", 120*time.Second, "deadline, counted from the last create")
	o := sweepOpts{}
	o.register(fs)
	_ = fs.Parse(args)
	st, k, p, err := c.open(true, true)
	if err != nil {
		return err
	}
	ctx := context.Background()
	hosts := st.annotated()
	t0 := time.UnixMilli(st.LastCreate)
	deadline := t0.Add(*timeout)
	want := fmt.Sprintf("%d/%d", len(hosts), len(hosts))
	statusAt, statusLast := time.Duration(-1), "never read"
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for time.Now().Before(deadline) {
			s, r, why, err := listenerStatus(ctx, k, *listener)
			if err != nil {
				statusLast = "error: " + err.Error()
			} else {
				statusLast = fmt.Sprintf("%s Ready=%s %s", s, r, why)
				if s == want && r == "True" {
					statusAt = time.Since(t0)
					return
				}
			}
			time.Sleep(2 * time.Second)
		}
	}()
	pr := prove(ctx, p, c.nodeList(), hosts, c.metricsPort, t0, deadline, o)
	wg.Wait()
	fmt.Printf("served over HTTP/3: %s (gauge: %s; last %s); sweep %d/%d ok, first pass %.1fs with %d failures%s\n",
		fmtDur(pr.servedAt, *timeout), fmtDur(pr.gaugeAt, *timeout), pr.gauge, pr.ok, pr.total, secs(pr.firstPass), pr.firstFailed, pr.failures())
	fmt.Printf("listener status %s: %s (last seen: %s)\n", want, fmtDur(statusAt, *timeout), statusLast)
	return mergeResults(c.results, c.col, map[string]any{
		"served_s": durOrNil(pr.servedAt), "gauge_s": durOrNil(pr.gaugeAt), "sweep_s": secs(pr.firstPass),
		"sweep_ok": pr.ok, "sweep_total": pr.total, "sweep_first_failed": pr.firstFailed, "sweep_example": pr.example, "sweep_failures": pr.kinds, "gauge_last": pr.gauge,
		"status_s": durOrNil(statusAt), "status_last": statusLast, "served_timeout_s": secs(*timeout),
		"hosts": len(hosts),
	})
}

func (pr proof) failures() string {
	retried := ""
	if pr.retried > 0 {
		retried = fmt.Sprintf("; %d checked again a second after failing, e.g. %s", pr.retried, pr.retryExample)
	}
	if pr.ok == pr.total {
		return retried
	}
	return fmt.Sprintf("%s; not served: %s; e.g. %s", retried, pr.kinds, pr.example)
}

func durOrNil(d time.Duration) any {
	if d < 0 {
		return nil
	}
	return secs(d)
}

func fmtDur(d, cap time.Duration) string {
	if d < 0 {
		return fmt.Sprintf("not within %.0fs", cap.Seconds())
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return -1
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// cmdSweep: prove every annotated host of the state once (or until the timeout) and print
// the verdict; for looking at a kept run by hand.
func cmdSweep(args []string) error {
	fs := flag.NewFlagSet("sweep", flag.ExitOnError)
	var c common
	c.register(fs)
	timeout := fs.Duration("timeout", 30*time.Second, "deadline")
	o := sweepOpts{}
	o.register(fs)
	_ = fs.Parse(args)
	st, _, p, err := c.open(false, true)
	if err != nil {
		return err
	}
	t0 := time.Now()
	pr := prove(context.Background(), p, c.nodeList(), st.annotated(), c.metricsPort, t0, t0.Add(*timeout), o)
	fmt.Printf("served: %s (gauge: %s; last %s); %d/%d ok, first pass %.1fs with %d failures%s\n", fmtDur(pr.servedAt, *timeout),
		fmtDur(pr.gaugeAt, *timeout), pr.gauge, pr.ok, pr.total, secs(pr.firstPass), pr.firstFailed, pr.failures())
	if pr.ok != pr.total {
		return fmt.Errorf("%d of %d not served", pr.total-pr.ok, pr.total)
	}
	return nil
}
