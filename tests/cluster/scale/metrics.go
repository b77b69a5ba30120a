package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// sample: one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

func parseProm(r io.Reader) ([]sample, error) {
	var out []sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		s := sample{labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(line, "{ "); i >= 0 && line[i] == '{' {
			s.name = line[:i]
			end := labelEnd(line, i+1)
			if end < 0 {
				continue
			}
			parseLabels(line[i+1:end], s.labels)
			rest = strings.TrimSpace(line[end+1:])
		} else if i >= 0 {
			s.name, rest = line[:i], strings.TrimSpace(line[i+1:])
		}
		v, err := strconv.ParseFloat(strings.Fields(rest + " x")[0], 64)
		if err != nil {
			continue
		}
		s.value = v
		out = append(out, s)
	}
	return out, sc.Err()
}

// labelEnd: the index of the '}' closing a label set that starts at i (quotes respected).
func labelEnd(s string, i int) int {
	inQ := false
	for ; i < len(s); i++ {
		switch {
		case s[i] == '\\' && inQ:
			i++
		case s[i] == '"':
			inQ = !inQ
		case s[i] == '}' && !inQ:
			return i
		}
	}
	return -1
}

func parseLabels(s string, into map[string]string) {
	for len(s) > 0 {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return
		}
		key := strings.TrimSpace(strings.TrimPrefix(s[:eq], ","))
		var b strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(s[i])
				}
				continue
			}
			b.WriteByte(s[i])
		}
		into[key] = b.String()
		s = strings.TrimPrefix(s[min(i+1, len(s)):], ",")
	}
}

func parseFile(path string) ([]sample, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseProm(f)
}

// apiKey: "VERB resource[/subresource]" of an apiserver_request_total series; non-resource
// requests (/metrics, /healthz, ...) are counted under their verb alone.
func apiKey(l map[string]string) string {
	res := l["resource"]
	if l["subresource"] != "" {
		res += "/" + l["subresource"]
	}
	if res == "" {
		res = "(non-resource)"
	}
	return l["verb"] + " " + res
}

// cmdAPIRate: requests per minute over a window from two scrapes of the API server's own
// apiserver_request_total, in all and per verb and resource.
func cmdAPIRate(args []string) error {
	fs := flag.NewFlagSet("apirate", flag.ExitOnError)
	var c common
	c.register(fs)
	before := fs.String("before", "", "scrape at the window's start")
	after := fs.String("after", "", "scrape at the window's end")
	seconds := fs.Float64("seconds", 60, "window length")
	_ = fs.Parse(args)
	sum := func(path string) (map[string]float64, error) {
		ss, err := parseFile(path)
		if err != nil {
			return nil, err
		}
		m := map[string]float64{}
		for _, s := range ss {
			if s.name == "apiserver_request_total" {
				m[apiKey(s.labels)] += s.value
			}
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("%s: no apiserver_request_total", path)
		}
		return m, nil
	}
	b, err := sum(*before)
	if err != nil {
		return err
	}
	a, err := sum(*after)
	if err != nil {
		return err
	}
	by := map[string]any{}
	total := 0.0
	for k, v := range a {
		d := (v - b[k]) * 60 / *seconds
		if d > 0 {
			by[k] = d
			total += d
		}
	}
	fmt.Printf("API requests per minute over %.0fs: %.0f\n", *seconds, total)
	return mergeResults(c.results, c.col, map[string]any{"api_per_min": total, "api_by": by, "api_window_s": *seconds})
}

// cmdWatches: watches open on the API server (apiserver_longrunning_requests, verb WATCH)
// in all and per resource, from one scrape.
func cmdWatches(args []string) error {
	fs := flag.NewFlagSet("watches", flag.ExitOnError)
	var c common
	c.register(fs)
	scrape := fs.String("scrape", "", "a scrape of the API server's /metrics")
	_ = fs.Parse(args)
	ss, err := parseFile(*scrape)
	if err != nil {
		return err
	}
	by := map[string]any{}
	total := 0.0
	found := false
	for _, s := range ss {
		if s.name != "apiserver_longrunning_requests" {
			continue
		}
		found = true
		if s.labels["verb"] != "WATCH" || s.value == 0 {
			continue
		}
		res := s.labels["resource"]
		if g := s.labels["group"]; g != "" {
			res += "." + g
		}
		prev, _ := by[res].(float64)
		by[res] = prev + s.value
		total += s.value
	}
	if !found {
		return fmt.Errorf("%s: no apiserver_longrunning_requests", *scrape)
	}
	fmt.Printf("watches open: %.0f\n", total)
	return mergeResults(c.results, c.col, map[string]any{"watches": total, "watches_by": by})
}

// cmdSeries: the series one scrape of a data-plane pod returns (non-comment lines).
func cmdSeries(args []string) error {
	fs := flag.NewFlagSet("series", flag.ExitOnError)
	var c common
	c.register(fs)
	node := fs.String("node", "10.77.0.1", "the pod's address")
	_ = fs.Parse(args)
	t0 := time.Now()
	resp, err := httpClient.Get(fmt.Sprintf("http://%s:%d/metrics", *node, c.metricsPort))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	n := 0
	for _, l := range strings.Split(string(body), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			n++
		}
	}
	fmt.Printf("one scrape of %s: %d series, %d bytes, %.2fs\n", *node, n, len(body), secs(time.Since(t0)))
	return mergeResults(c.results, c.col, map[string]any{"series": n, "scrape_bytes": len(body)})
}

// topKeys: the keys of two maps by the larger value first.
func topKeys(a, b map[string]any, n int) []string {
	seen := map[string]float64{}
	for _, m := range []map[string]any{a, b} {
		for k, v := range m {
			f, _ := v.(float64)
			seen[k] = max(seen[k], f)
		}
	}
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if seen[keys[i]] != seen[keys[j]] {
			return seen[keys[i]] > seen[keys[j]]
		}
		return keys[i] < keys[j]
	})
	if len(keys) > n {
		keys = keys[:n]
	}
	return keys
}
