package main

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParsePromLabelsAndEscapes(t *testing.T) {
	text := `# HELP apiserver_request_total x
apiserver_request_total{code="200",resource="secrets",subresource="",verb="GET",x="a\"b,c}"} 42
apiserver_request_total{code="200",resource="",verb="GET"} 7
apiserver_longrunning_requests{group="",resource="secrets",verb="WATCH"} 3
plain_metric 1.5e3
`
	ss, err := parseProm(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 4 {
		t.Fatalf("want 4 samples, got %d: %+v", len(ss), ss)
	}
	if ss[0].labels["x"] != `a"b,c}` || ss[0].value != 42 || apiKey(ss[0].labels) != "GET secrets" {
		t.Fatalf("first sample: %+v", ss[0])
	}
	if apiKey(ss[1].labels) != "GET (non-resource)" {
		t.Fatalf("non-resource key: %q", apiKey(ss[1].labels))
	}
	if ss[3].name != "plain_metric" || ss[3].value != 1500 {
		t.Fatalf("unlabelled sample: %+v", ss[3])
	}
}

// Two lines of one cause differ only in field values: one key. Another message: another key.
func TestLogLinesOfOneCauseShareAKey(t *testing.T) {
	a := parseLogLine(`2026-12-02T01:02:03.123456Z  WARN h3_ingress::proxy::source::kube: watch of Secret h3i-scale-0001/h00004-tls failed: 403 Forbidden retry_in=1s`, time.Time{})
	b := parseLogLine(`2026-12-02T01:02:04.5Z  WARN h3_ingress::proxy::source::kube: watch of Secret h3i-scale-0917/h03668-tls failed: 403 Forbidden retry_in=2s`, time.Time{})
	c := parseLogLine(`2026-12-02T01:02:04.5Z  INFO h3_ingress::proxy::server: configuration reloaded hosts=4`, time.Time{})
	if a.key != b.key || a.level != "WARN" {
		t.Fatalf("same cause, different keys:\n%q\n%q", a.key, b.key)
	}
	if a.key == c.key || c.level != "INFO" {
		t.Fatalf("different messages share a key: %q", a.key)
	}
	if a.at.Second() != 3 || b.at.Second() != 4 {
		t.Fatalf("timestamps: %v %v", a.at, b.at)
	}
	j := parseLogLine(`{"timestamp":"2026-12-02T01:02:05Z","level":"WARN","target":"t","fields":{"message":"watch failed for ns 17"}}`, time.Time{})
	if j.level != "WARN" || j.at.Second() != 5 || !strings.Contains(j.key, "watch failed for ns #") {
		t.Fatalf("JSON line: %+v", j)
	}
	prev := time.Unix(100, 0)
	if cont := parseLogLine("   at src/main.rs:10", prev); !cont.at.Equal(prev) {
		t.Fatalf("a continuation line takes the previous time: %+v", cont)
	}
}

func TestRouteNamespacesAreTheShare(t *testing.T) {
	l := layout{perNS: 4, routeShare: 10, nsPrefix: "x"}
	n := 0
	for k := 0; k < 250; k++ {
		if l.routeNS(k) {
			n++
		}
	}
	if n != 25 || l.routeNS(0) {
		t.Fatalf("10%% of 250 namespaces: %d, namespace 0 a route namespace: %v", n, l.routeNS(0))
	}
	if h := l.host(9 * 4); h.Kind != "HTTPRoute" || h.Namespace != "x-0009" {
		t.Fatalf("host 36: %+v", h)
	}
	if h := l.host(5); h.Kind != "Ingress" || h.Name != "h00005.n0001.scale.h3i.test" || h.Secret != "h00005-tls" {
		t.Fatalf("host 5: %+v", h)
	}
}

func TestMedianCountsTimeoutsAsInfinite(t *testing.T) {
	if m := median([]float64{3, 1, 2}); m != 2 {
		t.Fatalf("median 1,2,3: %v", m)
	}
	if m := median([]float64{1, math.Inf(1), math.Inf(1)}); !math.IsInf(m, 1) {
		t.Fatalf("two timeouts of three: %v", m)
	}
	tb := &table{r: Results{"scale.new_s": []any{1.0, nil, 2.0}, "scale.latency_timeout_s": 30.0}}
	s, v := tb.samples("scale", "new_s")
	if v != 2 || !strings.Contains(s, "×") {
		t.Fatalf("samples: %q %v", s, v)
	}
}

func TestReportMarksMissedTargets(t *testing.T) {
	r := Results{
		"base.hosts": 4.0, "scale.hosts": 1000.0, "scale.served_timeout_s": 120.0,
		"scale.listener_bytes": 900000.0, "base.api_per_min": 100.0, "scale.api_per_min": 140.0,
		"base.watches": 50.0, "scale.watches": 2050.0, "scale.series": 4000.0,
	}
	tb := &table{r: r, hosts: 1000}
	tb.build(100)
	joined := strings.Join(tb.missed, "\n")
	for _, want := range []string{"every host served", "listener object", "watches open"} {
		if !strings.Contains(joined, want) {
			t.Fatalf("%q not among the missed targets:\n%s", want, joined)
		}
	}
	for _, met := range []string{"API requests per minute", "series in one data-plane scrape"} {
		if strings.Contains(joined, met) {
			t.Fatalf("%q is met but reported missed:\n%s", met, joined)
		}
	}
}

func TestClientCausedWarningsAreJudgedApartFromTheClusterCaused(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/h3-ingress.log"
	var lines []string
	for i := 0; i < 12; i++ {
		lines = append(lines, fmt.Sprintf(`2026-12-02T05:57:%02d.000000Z  WARN conn{client=10.0.0.%d:5000}: h3_ingress::proxy::tls: refusing QUIC handshake: SNI "h%d.test" is not a configured host reason=unknown_sni sni=h%d.test`, i, i, i, i))
	}
	for i := 0; i < 3; i++ {
		lines = append(lines, fmt.Sprintf(`2026-12-02T05:57:%02d.500000Z  WARN h3_ingress::watch: Secret watch (retrying) error=403 n=%d`, i, i))
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	from := time.Date(2026, 12, 2, 5, 50, 0, 0, time.UTC)
	w := window{from: from, to: from.Add(time.Hour)}
	_, _, all, warn, client, err := scanLog(path, w, w, w)
	if err != nil {
		t.Fatal(err)
	}
	if all.count != 12 || client.count != 12 || warn.count != 3 {
		t.Fatalf("all %d, client-caused %d, cluster-caused %d; want 12, 12, 3", all.count, client.count, warn.count)
	}
}

// Two reasons' suppressed-lines reports in one minute are two causes, not one repeated.
func TestMaskKeepsTheReason(t *testing.T) {
	line := func(reason string, n int) string {
		return fmt.Sprintf(`2026-12-02T12:00:01Z WARN h3_ingress::proxy::logs: %d similar log lines suppressed in the last 60s reason=%s suppressed=%d`, n, reason, n)
	}
	a, b := parseLogLine(line("unknown_sni", 3), time.Time{}), parseLogLine(line("upstream_failed", 9), time.Time{})
	if a.key == b.key {
		t.Fatalf("one key for two reasons: %q", a.key)
	}
	if c := parseLogLine(line("unknown_sni", 40), time.Time{}); c.key != a.key {
		t.Fatalf("counts changed the key: %q vs %q", c.key, a.key)
	}
	bound := func(family, addr string) string {
		return `2026-12-02T12:44:01Z INFO h3_ingress::proxy::endpoint: UDP socket bound family=` + family + ` address=` + addr
	}
	v4, v6 := parseLogLine(bound("ipv4", "0.0.0.0:443"), time.Time{}), parseLogLine(bound("ipv6", "[::]:443"), time.Time{})
	if v4.key == v6.key {
		t.Fatalf("one key for two sockets: %q", v4.key)
	}
}
