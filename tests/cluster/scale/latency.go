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
//   - that new host's annotation removed: handshakes refused with a TLS alert.
//
// The host count stays what it was.
func cmdLatency(args []string) error {
	fs := flag.NewFlagSet("latency", flag.ExitOnError)
	var c common
	var l layout
	c.register(fs)
	l.register(fs)
	rounds := fs.Int("rounds", 5, "rounds (each: new host, rotation, removal)")
	timeout := fs.Duration("timeout", 30*time.Second, "cap of each wait")
	_ = fs.Parse(args)
	st, err := loadState(c.state)
	if err != nil {
		return err
	}
	authority, err := loadCA(c.pki)
	if err != nil {
		return err
	}
	k, err := newKube(c.kubeconfig)
	if err != nil {
		return err
	}
	p, err := newProber(c.ca, c.port)
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
		h.CertSHA = lc.sha256
		st.Hosts = append(st.Hosts, h)

		ri := rotatable[(r*7919)%len(rotatable)]
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

		patch := []byte(`{"metadata":{"annotations":{"` + annotation + `":null}}}`)
		err = retry(ctx, func() error {
			_, err := k.cs.NetworkingV1().Ingresses(h.Namespace).Patch(ctx, h.Object, types.MergePatchType, patch, metav1.PatchOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("ingress %s/%s: %w", h.Namespace, h.Object, err)
		}
		t0 = time.Now()
		d, miss = p.until(ctx, nodes, h.Name, false, t0, *timeout, func(o outcome) bool { return o.Kind == "refused" })
		add("remove", d, miss)
		st.Hosts[len(st.Hosts)-1].Annotated = false
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
