package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
)

// table: the run's one table, each row with the 4-host baseline and the HOSTS figure side by
// side, the target scaled to HOSTS and whether it was met.
type table struct {
	r      Results
	hosts  int
	rows   [][5]string
	missed []string
	notes  []string
}

func (t *table) num(col, key string) (float64, bool) {
	v, ok := t.r[col+"."+key].(float64)
	return v, ok
}

func (t *table) str(col, key string) string {
	s, _ := t.r[col+"."+key].(string)
	return s
}

func (t *table) row(name, base, scale, target string, met *bool) {
	verdict := ""
	if met != nil {
		verdict = "ok"
		if !*met {
			verdict = "**missed**"
			t.missed = append(t.missed, fmt.Sprintf("%s: %s, target %s", name, scale, target))
		}
	}
	t.rows = append(t.rows, [5]string{name, base, scale, target, verdict})
}

func f(v float64, ok bool, format string) string {
	if !ok {
		return "–"
	}
	return fmt.Sprintf(format, v)
}

func bptr(b bool) *bool { return &b }

// timed: a duration figure, or "not within CAP s" when the wait ended without it.
func (t *table) timed(col, key, capKey string) (string, float64) {
	if v, ok := t.num(col, key); ok {
		return fmt.Sprintf("%.1f s", v), v
	}
	if c, ok := t.num(col, capKey); ok {
		return fmt.Sprintf("not within %.0f s", c), math.Inf(1)
	}
	return "–", math.Inf(1)
}

// samples: the median of a latency's rounds (a round that timed out counts as infinite) and
// the rounds themselves.
func (t *table) samples(col, key string) (string, float64) {
	raw, ok := t.r[col+"."+key].([]any)
	if !ok {
		return "–", math.Inf(1)
	}
	var xs []float64
	var parts []string
	for _, v := range raw {
		if x, ok := v.(float64); ok {
			xs = append(xs, x)
			parts = append(parts, fmt.Sprintf("%.1f", x))
		} else {
			xs = append(xs, math.Inf(1))
			parts = append(parts, "×")
		}
	}
	m := median(xs)
	head := fmt.Sprintf("%.2f s", m)
	if math.IsInf(m, 1) {
		c, _ := t.num(col, "latency_timeout_s")
		head = fmt.Sprintf("not within %.0f s", c)
	}
	return fmt.Sprintf("%s (%s)", head, strings.Join(parts, ", ")), m
}

func (t *table) build(elapsed float64) {
	bh, _ := t.num("base", "hosts")
	sh, _ := t.num("scale", "hosts")
	br, _ := t.num("base", "routes_created")
	sr, _ := t.num("scale", "routes_created")
	sn, _ := t.num("scale", "namespaces_created")
	t.row("hosts (of which HTTPRoutes)", fmt.Sprintf("%.0f (%.0f)", bh, br), fmt.Sprintf("%.0f (%.0f), %.0f more namespaces", sh, br+sr, sn), "", nil)
	cw := func(col string) string {
		w, ok := t.num(col, "create_writes")
		s, _ := t.num(col, "create_s")
		return f(w, ok, "%.0f writes") + f(s, ok, " in %.1f s")
	}
	t.row("API writes to create them", cw("base"), cw("scale"), "", nil)

	bs, _ := t.timed("base", "served_s", "served_timeout_s")
	ss, sv := t.timed("scale", "served_s", "served_timeout_s")
	detail := func(col string) string {
		ok, _ := t.num(col, "sweep_ok")
		tot, _ := t.num(col, "sweep_total")
		sw, _ := t.num(col, "sweep_s")
		if k := t.str(col, "sweep_failures"); ok < tot && k != "" {
			return fmt.Sprintf(" [sweep %.0f/%.0f ok, first pass %.1f s; not served: %s]", ok, tot, sw, k)
		}
		return fmt.Sprintf(" [sweep %.0f/%.0f ok, first pass %.1f s]", ok, tot, sw)
	}
	t.row("every host served over HTTP/3 on both nodes, after the last create", bs+detail("base"), ss+detail("scale"), "≤ 60 s", bptr(sv <= 60))
	bst, _ := t.timed("base", "status_s", "served_timeout_s")
	sst, stv := t.timed("scale", "status_s", "served_timeout_s")
	if math.IsInf(stv, 1) {
		sst += " (last: " + t.str("scale", "status_last") + ")"
	}
	if bst2 := t.str("base", "status_last"); strings.HasPrefix(bst, "not") {
		bst += " (last: " + bst2 + ")"
	}
	t.row("listener status: hostsSummary N/N and Ready=True, after the last create", bst, sst, "within the wait", bptr(!math.IsInf(stv, 1)))

	bl, okb := t.num("base", "listener_bytes")
	sl, oks := t.num("scale", "listener_bytes")
	t.row("listener object (kubectl get h3l -o json)", f(bl/1024, okb, "%.1f KiB"), f(sl/1024, oks, "%.1f KiB"), "≤ 64 KiB", bptr(oks && sl <= 64*1024))

	for _, m := range []struct {
		key, name, target string
		limit             float64
	}{
		{"steady_operator_mib", "operator RSS at rest", "≤ 200 MiB", 200},
		{"peak_operator_mib", "operator peak RSS (VmHWM) after loading", "", 0},
		{"steady_data-plane_mib", "data-plane RSS at rest (largest pod)", "≤ 150 MiB", 150},
		{"peak_data-plane_mib", "data-plane peak RSS (VmHWM) after loading", "", 0},
	} {
		b, okb := t.num("base", m.key)
		s, oks := t.num("scale", m.key)
		var met *bool
		if m.limit > 0 {
			met = bptr(oks && s <= m.limit)
		}
		bs, ss := f(b, okb, "%.0f MiB"), f(s, oks, "%.0f MiB")
		if strings.Contains(m.key, "data-plane") {
			phase := strings.SplitN(m.key, "_", 2)[0]
			bs += each(t.str("base", phase+"_dp_each"))
			ss += each(t.str("scale", phase+"_dp_each"))
		}
		t.row(m.name, bs, ss, m.target, met)
	}
	b, okb := t.num("base", "steady_dp_restarts")
	s, oks := t.num("scale", "steady_dp_restarts")
	t.row("data-plane container restarts, all pods, at the end of the window", f(b, okb, "%.0f"), f(s, oks, "%.0f"), "", nil)
	t.apiRows()
	t.latencyRows()
	t.restartRow()
	t.logRows()
	bser, okb := t.num("base", "series")
	sser, oks := t.num("scale", "series")
	limit := 50000 * float64(t.hosts) / 10000
	t.row("series in one data-plane scrape (after the sweep)", f(bser, okb, "%.0f"), f(sser, oks, "%.0f"), fmt.Sprintf("≤ %.0f", limit), bptr(oks && sser <= limit))
	if t.hosts <= 1000 {
		t.row("run time (after cluster up, before clean-up)", "", fmt.Sprintf("%.0f s", elapsed), "< 300 s", bptr(elapsed < 300))
	} else {
		t.row("run time (after cluster up, before clean-up)", "", fmt.Sprintf("%.0f s", elapsed), "", nil)
	}
}

// each: the figure of every pod, when there are several.
func each(list string) string {
	if !strings.Contains(list, ",") {
		return ""
	}
	return " (pods: " + list + ")"
}

func (t *table) apiRows() {
	b, okb := t.num("base", "api_per_min")
	s, oks := t.num("scale", "api_per_min")
	ratio := math.Inf(1)
	if okb && b > 0 && oks {
		ratio = s / b
	}
	w, _ := t.num("scale", "api_window_s")
	t.row(fmt.Sprintf("API requests per minute at rest (%.0f s window)", w), f(b, okb, "%.0f"), f(s, oks, "%.0f")+fmt.Sprintf(" (%.1f×)", ratio), "≤ 1.5× baseline", bptr(oks && ratio <= 1.5))
	bb, _ := t.r["base.api_by"].(map[string]any)
	sb, _ := t.r["scale.api_by"].(map[string]any)
	for _, k := range topKeys(bb, sb, 8) {
		x, okx := bb[k].(float64)
		y, oky := sb[k].(float64)
		t.row("  "+k, f(x, okx, "%.0f"), f(y, oky, "%.0f"), "", nil)
	}
	bw, okb := t.num("base", "watches")
	sw, oks := t.num("scale", "watches")
	t.row("watches open on the API server", f(bw, okb, "%.0f"), f(sw, oks, "%.0f"), "≤ baseline + 10 (none per Secret)", bptr(okb && oks && sw <= bw+10))
	bb, _ = t.r["base.watches_by"].(map[string]any)
	sb, _ = t.r["scale.watches_by"].(map[string]any)
	for _, k := range topKeys(bb, sb, 6) {
		x, okx := bb[k].(float64)
		y, oky := sb[k].(float64)
		t.row("  WATCH "+k, f(x, okx, "%.0f"), f(y, oky, "%.0f"), "", nil)
	}
}

func (t *table) latencyRows() {
	for _, m := range []struct{ key, name string }{
		{"new_s", "new annotated host (Ingress + Secret) served, median"},
		{"rotate_s", "rotated Secret's certificate on new connections, median"},
		{"remove_s", "removed annotation: handshakes refused, median"},
	} {
		b, _ := t.samples("base", m.key)
		s, sv := t.samples("scale", m.key)
		t.row(m.name, b, s, "≤ 3 s", bptr(sv <= 3))
	}
}

func (t *table) restartRow() {
	ready, rv := t.timed("scale", "restart_ready_s", "restart_timeout_s")
	served, sv := t.timed("scale", "restart_served_s", "restart_timeout_s")
	n, okn := t.num("scale", "restart_restarts")
	ok, _ := t.num("scale", "restart_sweep_ok")
	tot, _ := t.num("scale", "restart_sweep_total")
	bready, _ := t.timed("base", "restart_ready_s", "restart_timeout_s")
	bserved, _ := t.timed("base", "restart_served_s", "restart_timeout_s")
	bn, okbn := t.num("base", "restart_restarts")
	base := "–"
	if _, ok := t.num("base", "restart_timeout_s"); ok {
		base = fmt.Sprintf("Ready %s, serving %s, %s restarts", bready, bserved, f(bn, okbn, "%.0f"))
	}
	t.row("data-plane pod deleted: replacement Ready; serving every host; container restarts", base,
		fmt.Sprintf("Ready %s, serving %s [%.0f/%.0f], %s restarts", ready, served, ok, tot, f(n, okn, "%.0f")),
		"≤ 30 s, 0 restarts", bptr(rv <= 30 && sv <= 30 && okn && n == 0))
}

func (t *table) logRows() {
	for _, m := range []struct{ key, name string }{
		{"log_load_per_min", "log lines per pod per minute while loading (busiest pod)"},
		{"log_rest_per_min", "log lines per pod per minute at rest (busiest pod)"},
	} {
		b, okb := t.num("base", m.key)
		s, oks := t.num("scale", m.key)
		t.row(m.name, f(b, okb, "%.0f"), f(s, oks, "%.0f"), "", nil)
	}
	b, okb := t.num("base", "log_repeat")
	s, oks := t.num("scale", "log_repeat")
	within := func(v float64, ok bool) bool { return !ok || v <= repeatBudgetPerMinute }
	budget := fmt.Sprintf("≤ %d", repeatBudgetPerMinute)
	t.row("most repeated message in one minute, any level (1)", f(b, okb, "%.0f"), f(s, oks, "%.0f"), budget, bptr(oks && within(s, oks) && within(b, okb)))
	bw, okbw := t.num("base", "log_repeat_warn")
	sw, oksw := t.num("scale", "log_repeat_warn")
	t.row("most repeated warning or error in one minute, cluster-caused (2)", f(bw, okbw, "%.0f"), f(sw, oksw, "%.0f"), budget, bptr(oksw && within(sw, oksw) && within(bw, okbw)))
	bc, okbc := t.num("base", "log_repeat_client")
	sc, oksc := t.num("scale", "log_repeat_client")
	t.row("most repeated client-caused warning in one minute, rate-limited (3)", f(bc, okbc, "%.0f"), f(sc, oksc, "%.0f"), budget, bptr(within(sc, oksc) && within(bc, okbc)))
	t.notes = append(t.notes,
		"(1) baseline: "+t.str("base", "log_repeat_msg"), "(1) at HOSTS: "+t.str("scale", "log_repeat_msg"),
		"(2) baseline: "+t.str("base", "log_repeat_warn_msg"), "(2) at HOSTS: "+t.str("scale", "log_repeat_warn_msg"),
		"(3) baseline: "+t.str("base", "log_repeat_client_msg"), "(3) at HOSTS: "+t.str("scale", "log_repeat_client_msg"),
		"log lines per minute while loading: "+t.str("scale", "log_load_pods"),
		"log lines per minute at rest: "+t.str("scale", "log_rest_pods"))
}

func (t *table) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| measure | 4 hosts | %d hosts | target (%d hosts) | |\n|---|---|---|---|---|\n", t.hosts, t.hosts)
	for _, r := range t.rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r[0], esc(r[1]), esc(r[2]), r[3], r[4])
	}
	b.WriteString("\n")
	for _, n := range t.notes {
		fmt.Fprintf(&b, "- %s\n", esc(n))
	}
	return b.String()
}

func esc(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func cmdReport(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	var c common
	c.register(fs)
	hosts := fs.Int("hosts", 1000, "HOSTS of the run")
	assert := fs.Bool("assert", true, "exit 1 when a target is missed")
	out := fs.String("out", "", "also write the table here (markdown)")
	elapsed := fs.Float64("elapsed", 0, "seconds the run took after cluster up")
	_ = fs.Parse(args)
	r, err := loadResults(c.results)
	if err != nil {
		return err
	}
	t := &table{r: r, hosts: *hosts}
	t.build(*elapsed)
	md := t.markdown()
	fmt.Print(md)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
			return err
		}
	}
	if len(t.missed) == 0 {
		fmt.Printf("\nall targets met at %d hosts\n", *hosts)
		return nil
	}
	fmt.Printf("\n%d targets missed at %d hosts:\n", len(t.missed), *hosts)
	for _, m := range t.missed {
		fmt.Printf("  - %s\n", m)
	}
	if *assert {
		return fmt.Errorf("%d targets missed at %d hosts", len(t.missed), *hosts)
	}
	fmt.Println("(not asserted: --no-assert)")
	return nil
}
