package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

var (
	ansi     = regexp.MustCompile(`\x1b\[[0-9;]*m`)
	fieldVal = regexp.MustCompile(`([A-Za-z_][\w.]*)=("(?:[^"\\]|\\.)*"|\S+)`)
	quoted   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'[^']*'`)
	digits   = regexp.MustCompile(`[0-9]+`)
	hexRun   = regexp.MustCompile(`\b[0-9a-f]{8,}\b`)
)

// logLine: a container log line's time, level and message with field values masked.
type logLine struct {
	at    time.Time
	level string
	key   string
}

// mask: the message without what varies between two occurrences of the same cause: field
// values (key=value), quoted strings, hex identifiers and digit runs. Two fields name the
// cause itself, so their values stay: `reason` (the data plane's rate limiter writes one line
// per reason) and `family` (each UDP socket, IPv4 and IPv6, says once what it was granted).
func mask(s string) string {
	var kept []string
	s = fieldVal.ReplaceAllStringFunc(s, func(kv string) string {
		k, v, _ := strings.Cut(kv, "=")
		if k == "reason" || k == "family" {
			kept = append(kept, k+"="+strings.Trim(v, `"`))
			return "\x00"
		}
		return k + "=…"
	})
	s = quoted.ReplaceAllString(s, `"…"`)
	s = hexRun.ReplaceAllString(s, "…")
	s = digits.ReplaceAllString(s, "#")
	for _, kv := range kept {
		s = strings.Replace(s, "\x00", kv, 1)
	}
	return s
}

// parseLogLine reads tracing's text format ("TIME LEVEL target: message fields") or a JSON
// line ({"timestamp","level","fields":{"message"}} and the like); prev stands in for a line
// without a time of its own (a continuation).
func parseLogLine(raw string, prev time.Time) logLine {
	raw = ansi.ReplaceAllString(raw, "")
	if strings.HasPrefix(raw, "{") {
		var m map[string]any
		if json.Unmarshal([]byte(raw), &m) == nil {
			at := prev
			for _, k := range []string{"timestamp", "ts", "time"} {
				if s, ok := m[k].(string); ok {
					if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
						at = t
					}
				}
			}
			msg, _ := m["message"].(string)
			if f, ok := m["fields"].(map[string]any); ok && msg == "" {
				msg, _ = f["message"].(string)
			}
			if msg == "" {
				msg, _ = m["msg"].(string)
			}
			lvl, _ := m["level"].(string)
			tgt, _ := m["target"].(string)
			return logLine{at: at, level: strings.ToUpper(lvl), key: strings.ToUpper(lvl) + " " + tgt + ": " + mask(msg)}
		}
	}
	f := strings.Fields(raw)
	if len(f) >= 2 {
		if t, err := time.Parse(time.RFC3339Nano, f[0]); err == nil {
			rest := strings.TrimSpace(strings.TrimPrefix(raw, f[0]))
			rest = strings.TrimSpace(strings.TrimPrefix(rest, f[1]))
			return logLine{at: t, level: f[1], key: f[1] + " " + mask(rest)}
		}
	}
	return logLine{at: prev, level: "", key: mask(strings.TrimSpace(raw))}
}

type window struct{ from, to time.Time }

func (w window) has(t time.Time) bool { return !t.Before(w.from) && t.Before(w.to) }
func (w window) minutes() float64     { return w.to.Sub(w.from).Minutes() }

type repeat struct {
	count       int
	pod, key    string
	minuteStart time.Time
}

// cmdLogs: for the product's pods (every container log the node agent kept in the
// namespace's directory, replaced pods included): lines per pod per minute during the load
// and at rest, and the message repeated most often within one calendar minute (in all, and
// among warnings and errors).
func cmdLogs(args []string) error {
	fs := flag.NewFlagSet("logs", flag.ExitOnError)
	var c common
	c.register(fs)
	podLogs := fs.String("pod-logs", os.Getenv("H3I_POD_LOGS"), "the node agent's pod directory")
	var load, rest, rep window
	ms := func(name string, into *time.Time) {
		fs.Func(name, "unix milliseconds", func(s string) error {
			var v int64
			_, err := fmt.Sscan(s, &v)
			*into = time.UnixMilli(v)
			return err
		})
	}
	ms("load-from", &load.from)
	ms("load-to", &load.to)
	ms("rest-from", &rest.from)
	ms("rest-to", &rest.to)
	ms("repeat-from", &rep.from)
	ms("repeat-to", &rep.to)
	_ = fs.Parse(args)
	files, _ := filepath.Glob(filepath.Join(*podLogs, c.namespace, "*", "*.log"))
	loadPer, restPer := map[string]float64{}, map[string]float64{}
	var worst, worstWarn, worstClient repeat
	for _, path := range files {
		if strings.HasPrefix(filepath.Base(path), "_") {
			continue
		}
		pod := filepath.Base(filepath.Dir(path)) + "/" + strings.TrimSuffix(filepath.Base(path), ".log")
		nLoad, nRest, all, warn, client, err := scanLog(path, load, rest, rep)
		if err != nil {
			return err
		}
		if nLoad > 0 && load.minutes() > 0 {
			loadPer[pod] = float64(nLoad) / load.minutes()
		}
		if nRest > 0 && rest.minutes() > 0 {
			restPer[pod] = float64(nRest) / rest.minutes()
		}
		if all.count > worst.count {
			worst, worst.pod = all, pod
		}
		if warn.count > worstWarn.count {
			worstWarn, worstWarn.pod = warn, pod
		}
		if client.count > worstClient.count {
			worstClient, worstClient.pod = client, pod
		}
	}
	kv := map[string]any{
		"log_load_per_min": maxVal(loadPer), "log_rest_per_min": maxVal(restPer),
		"log_load_pods": perPod(loadPer), "log_rest_pods": perPod(restPer),
		"log_load_window_s": load.to.Sub(load.from).Seconds(), "log_rest_window_s": rest.to.Sub(rest.from).Seconds(),
		"log_repeat": worst.count, "log_repeat_msg": describe(worst),
		"log_repeat_warn": worstWarn.count, "log_repeat_warn_msg": describe(worstWarn),
		"log_repeat_client": worstClient.count, "log_repeat_client_msg": describe(worstClient),
	}
	fmt.Printf("log lines per pod per minute: load %s; rest %s\n", perPod(loadPer), perPod(restPer))
	fmt.Printf("most repeated in one minute: %d× %s\n", worst.count, describe(worst))
	fmt.Printf("most repeated warning or error in one minute: %d× %s\n", worstWarn.count, describe(worstWarn))
	fmt.Printf("most repeated client-caused (rate-limited) warning in one minute: %d× %s\n", worstClient.count, describe(worstClient))
	return mergeResults(c.results, c.col, kv)
}

// clientCaused: the reasons of the data plane's rate limiter for lines that clients or the
// upstream cause (src/proxy/logs.rs, Reason::as_str), told apart from what the cluster
// causes (watch errors, API refusals) in the table; both are held to once per cause per
// minute.
var clientCaused = regexp.MustCompile(`\breason="?(unknown_sni|upstream_failed|upstream_mid_response|upstream_certificate|upstream_renewal|request_budget|handover|rollout|superseded|resumed)\b`)

// repeatBudgetPerMinute: lines of one cause in one calendar minute, whatever the level.
const repeatBudgetPerMinute = 1

func scanLog(path string, load, rest, rep window) (nLoad, nRest int, all, warn, client repeat, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, all, warn, client, err
	}
	defer f.Close()
	type bucket struct {
		minute time.Time
		key    string
	}
	counts := map[bucket]int{}
	levels := map[string]string{}
	limited := map[string]bool{}
	var prev time.Time
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		l := parseLogLine(sc.Text(), prev)
		prev = l.at
		if load.has(l.at) {
			nLoad++
		}
		if rest.has(l.at) {
			nRest++
		}
		if rep.has(l.at) && l.key != "" {
			counts[bucket{l.at.Truncate(time.Minute), l.key}]++
			levels[l.key] = l.level
			if clientCaused.MatchString(sc.Text()) {
				limited[l.key] = true
			}
		}
	}
	for b, n := range counts {
		if n > all.count {
			all = repeat{count: n, key: b.key, minuteStart: b.minute}
		}
		lv := levels[b.key]
		if !(lv == "WARN" || lv == "ERROR") {
			continue
		}
		if limited[b.key] {
			if n > client.count {
				client = repeat{count: n, key: b.key, minuteStart: b.minute}
			}
		} else if n > warn.count {
			warn = repeat{count: n, key: b.key, minuteStart: b.minute}
		}
	}
	return nLoad, nRest, all, warn, client, sc.Err()
}

func describe(r repeat) string {
	if r.count == 0 {
		return "none"
	}
	k := r.key
	if len(k) > 140 {
		k = k[:140] + "…"
	}
	return fmt.Sprintf("%s at %s: %s", r.pod, r.minuteStart.UTC().Format("15:04"), k)
}

func maxVal(m map[string]float64) float64 {
	v := 0.0
	for _, x := range m {
		v = max(v, x)
	}
	return v
}

func perPod(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, m[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
