package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// cmdLatency: rounds of three changes, each timed from the moment the API server accepted it
// until every node shows it to new connections:
//   - a new host (Secret, then annotated Ingress) in the first namespace: served (GET 200);
//   - an existing host's Secret rotated: the new leaf on new handshakes;
//   - that new host's annotation removed (or, when it was not served in time, an existing
//     host's): handshakes refused with a TLS alert.
//
// The host count stays what it was (less one per round whose new host was not served).
func cmdLatency(args []string) error {
	fs := flag.NewFlagSet("latency", flag.ExitOnError)
	var c common
	var l layout
	c.register(fs)
	l.register(fs)
	rounds := fs.Int("rounds", 5, "rounds (each: new host, rotation, removal)")
	timeout := fs.Duration("timeout", 30*time.Second, "cap of each wait")
	_ = fs.Parse(args)
	st, k, p, err := c.open(true, true)
	if err != nil {
		return err
	}
	authority, err := loadCA(c.pki)
	if err != nil {
		return err
	}
	var rotatable []int // annotated Ingress hosts
	for i, h := range st.Hosts {
		if h.Annotated && h.Kind == "Ingress" && h.Index < probeIndexStart {
			rotatable = append(rotatable, i)
		}
	}
	if len(rotatable) == 0 {
		return fmt.Errorf("no annotated Ingress host to rotate")
	}
	ctx := context.Background()
	w := &writer{k: k, l: &l, ctx: ctx, mark: func() {}}
	nodes := c.nodeList()
	m := map[string][]any{}
	add := func(key string, d time.Duration, miss outcome) {
		m[key] = append(m[key], durOrNil(d))
		fmt.Printf("  %-7s %s%s\n", key, fmtDur(d, *timeout), missNote(d, miss))
	}
	for r := 0; r < *rounds; r++ {
		fmt.Printf("round %d\n", r+1)
		first := st.Hosts[0]
		h := hostAt(probeIndexStart+st.Probes, first.Namespace, 0, "Ingress")
		st.Probes++
		lc, err := authority.leaf(h.Name, l.useRSA)
		if err != nil {
			return err
		}
		if err := lc.writeNginx(c.nginxCerts, h.Name); err != nil {
			return err
		}
		if err := w.secret(h, lc, authority.certPEM, false); err != nil {
			return err
		}
		if err := w.ingress(h); err != nil {
			return err
		}
		t0 := time.Now()
		d, miss := p.until(ctx, nodes, h.Name, true, t0, *timeout, outcome.ok)
		add("new", d, miss)
		newServed := d >= 0
		h.CertSHA = lc.sha256
		st.Hosts = append(st.Hosts, h)

		ri := pick(st, rotatable, r*7919)
		q := st.Hosts[ri]
		lq, err := authority.leaf(q.Name, l.useRSA)
		if err != nil {
			return err
		}
		if err := lq.writeNginx(c.nginxCerts, q.Name); err != nil {
			return err
		}
		if err := w.secret(q, lq, authority.certPEM, true); err != nil {
			return err
		}
		t0 = time.Now()
		d, miss = p.until(ctx, nodes, q.Name, false, t0, *timeout, func(o outcome) bool { return o.ok() && o.Leaf == lq.sha256 })
		add("rotate", d, miss)
		st.Hosts[ri].CertSHA = lq.sha256

		// The removal needs a host that is served: the new one, else (it was not served in
		// time) an existing one; a host not served before its removal proves nothing.
		vi := len(st.Hosts) - 1
		if !newServed {
			vi = pick(st, rotatable, r*7919+len(rotatable)/2)
		}
		v := st.Hosts[vi]
		if pre, miss := p.until(ctx, nodes, v.Name, false, time.Now(), 0, outcome.ok); pre < 0 {
			m["remove"] = append(m["remove"], nil)
			fmt.Printf("  %-7s not measured: %s was not served before the removal (%s %.120s)\n", "remove", v.Name, miss.Kind, miss.Detail)
		} else {
			if err := unannotate(ctx, k, v); err != nil {
				return err
			}
			t0 = time.Now()
			d, miss = p.until(ctx, nodes, v.Name, false, t0, *timeout, func(o outcome) bool { return o.Kind == "refused" })
			add("remove", d, miss)
		}
		if vi != len(st.Hosts)-1 {
			// The new host that was not served in time leaves too, unmeasured, so the
			// cluster keeps the hosts the state names.
			if err := unannotate(ctx, k, h); err != nil {
				return err
			}
		}
		st.Hosts[len(st.Hosts)-1].Annotated = false
		st.Hosts[vi].Annotated = false
		if err := st.save(c.state); err != nil {
			return err
		}
		time.Sleep(time.Second)
	}
	kv := map[string]any{"latency_timeout_s": secs(*timeout)}
	for key, v := range m {
		kv[key+"_s"] = v
	}
	return mergeResults(c.results, c.col, kv)
}

func missNote(d time.Duration, o outcome) string {
	if d >= 0 {
		return ""
	}
	return fmt.Sprintf(" (last: %s %.120s)", o.Kind, o.Detail)
}

// pick: the first host still annotated among the candidates, from position at on.
func pick(st *State, cands []int, at int) int {
	for i := 0; i < len(cands); i++ {
		if c := cands[(at+i)%len(cands)]; st.Hosts[c].Annotated {
			return c
		}
	}
	return cands[at%len(cands)]
}

func unannotate(ctx context.Context, k *kube, h Host) error {
	patch := []byte(`{"metadata":{"annotations":{"` + annotation + `":null}}}`)
	err := retry(ctx, func() error {
		_, err := k.cs.NetworkingV1().Ingresses(h.Namespace).Patch(ctx, h.Object, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("ingress %s/%s: %w", h.Namespace, h.Object, err)
	}
	return nil
}
