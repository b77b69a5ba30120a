package main

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

const (
	annotation      = "h3-ingress.dev/enabled"
	controllerName  = "example.com/h3i-scale-gateway"
	namespaceLabel  = "h3i-scale"
	hostDomain      = "scale.h3i.test"
	probeIndexStart = 900000
)

// layout: how host indexes map to namespaces and kinds.
type layout struct {
	perNS      int
	routeShare float64 // percent of namespaces whose hosts are HTTPRoutes
	nsPrefix   string
	class      string // IngressClass
	gwClass    string // GatewayClass
	useRSA     bool
}

func (l *layout) nsIndex(i int) int { return i / l.perNS }
func (l *layout) nsName(k int) string {
	return fmt.Sprintf("%s-%04d", l.nsPrefix, k)
}

// routeNS: HTTPRoute namespaces spread evenly, routeShare percent of them (namespace 0, the
// baseline's, is one only at 100 %).
func (l *layout) routeNS(k int) bool {
	s := l.routeShare / 100
	return int(float64(k+1)*s) > int(float64(k)*s)
}

func (l *layout) host(i int) Host {
	k := l.nsIndex(i)
	kind := "Ingress"
	if l.routeNS(k) {
		kind = "HTTPRoute"
	}
	return hostAt(i, l.nsName(k), k, kind)
}

func hostAt(i int, ns string, k int, kind string) Host {
	short := fmt.Sprintf("h%05d", i)
	return Host{
		Index: i, Name: fmt.Sprintf("%s.n%04d.%s", short, k, hostDomain), Namespace: ns,
		Secret: short + "-tls", Kind: kind, Object: short, Annotated: true,
	}
}

func (l *layout) register(fs *flag.FlagSet) {
	fs.IntVar(&l.perNS, "per-ns", 4, "hosts per namespace")
	fs.Float64Var(&l.routeShare, "route-share", 10, "percent of namespaces whose hosts are annotated HTTPRoutes")
	fs.StringVar(&l.nsPrefix, "ns-prefix", "h3i-scale", "namespace name prefix")
	fs.StringVar(&l.class, "class", "nginx", "IngressClass of the Ingresses")
	fs.StringVar(&l.gwClass, "gateway-class", "h3i-scale", "GatewayClass of the Gateways")
	fs.BoolVar(&l.useRSA, "rsa", false, "RSA-2048 keys (cert-manager's default) instead of ECDSA P-256")
}

func cmdCreate(args []string) error {
	fs := flag.NewFlagSet("create", flag.ExitOnError)
	var c common
	var l layout
	c.register(fs)
	l.register(fs)
	from := fs.Int("from", 0, "first host index")
	to := fs.Int("to", 4, "host index after the last")
	workers := fs.Int("workers", 48, "parallel API writers")
	_ = fs.Parse(args)
	st, k, _, err := c.open(true, false)
	if err != nil {
		return err
	}
	authority, err := loadCA(c.pki)
	if err != nil {
		return err
	}
	t0 := time.Now()
	hosts := make([]Host, 0, *to-*from)
	for i := *from; i < *to; i++ {
		hosts = append(hosts, l.host(i))
	}
	certs, err := issueAll(authority, hosts, l.useRSA, c.nginxCerts)
	if err != nil {
		return err
	}
	tCerts := time.Since(t0)
	byNS := map[int][]int{} // namespace index -> positions in hosts
	var order []int
	for p, h := range hosts {
		ns := l.nsIndex(h.Index)
		if _, ok := byNS[ns]; !ok {
			order = append(order, ns)
		}
		byNS[ns] = append(byNS[ns], p)
	}
	ctx := context.Background()
	var last atomic.Int64
	var objects atomic.Int64
	mark := func() {
		objects.Add(1)
		now := time.Now().UnixMilli()
		for old := last.Load(); now > old && !last.CompareAndSwap(old, now); old = last.Load() {
		}
	}
	start := time.Now()
	err = parallel(*workers, len(order), func(j int) error {
		nsk := order[j]
		w := &writer{k: k, l: &l, ctx: ctx, mark: mark}
		return w.namespace(nsk, hosts, byNS[nsk], certs, authority.certPEM)
	})
	if err != nil {
		return err
	}
	for p := range hosts {
		hosts[p].CertSHA = certs[p].sha256
	}
	st.Hosts = append(st.Hosts, hosts...)
	st.FirstCreate = start.UnixMilli()
	st.LastCreate = last.Load()
	if err := st.save(c.state); err != nil {
		return err
	}
	apiSecs := secs(time.UnixMilli(st.LastCreate).Sub(start))
	routes := 0
	for _, h := range hosts {
		if h.Kind == "HTTPRoute" {
			routes++
		}
	}
	fmt.Printf("%d hosts (%d HTTPRoutes) in %d namespaces: certificates %.1fs, %d API writes in %.1fs (%.0f/s, %d workers)\n",
		len(hosts), routes, len(order), secs(tCerts), objects.Load(), apiSecs, float64(objects.Load())/max(apiSecs, 0.001), *workers)
	if c.results == "" {
		return nil
	}
	return mergeResults(c.results, c.col, map[string]any{
		"create_s": apiSecs, "create_writes": objects.Load(), "certs_s": secs(tCerts),
		"hosts_created": len(hosts), "routes_created": routes, "namespaces_created": len(order),
	})
}

// issueAll: every host's certificate, in parallel on all cores, written for nginx too.
func issueAll(c *ca, hosts []Host, useRSA bool, nginxDir string) ([]*leafCert, error) {
	certs := make([]*leafCert, len(hosts))
	err := parallel(runtime.NumCPU(), len(hosts), func(p int) error {
		lc, err := c.leaf(hosts[p].Name, useRSA)
		if err != nil {
			return err
		}
		certs[p] = lc
		return lc.writeNginx(nginxDir, hosts[p].Name)
	})
	return certs, err
}

// parallel runs fn(0..n-1) on `workers` goroutines and returns the first error.
func parallel(workers, n int, fn func(int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for w := 0; w < min(workers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				j := int(next.Add(1) - 1)
				if j >= n {
					return
				}
				if err := fn(j); err != nil {
					once.Do(func() { first = err })
					next.Store(int64(n))
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// writer makes one namespace's objects, in the order a user's tools would: the namespace, the
// Secrets, then the Ingresses, or the Gateway (status written as its controller would) and
// the HTTPRoutes (accepted by that controller).
type writer struct {
	k    *kube
	l    *layout
	ctx  context.Context
	mark func()
}

func (w *writer) do(call func() error) error {
	if err := retry(w.ctx, call); err != nil {
		return err
	}
	w.mark()
	return nil
}

func (w *writer) namespace(nsk int, hosts []Host, pos []int, certs []*leafCert, caPEM []byte) error {
	ns := w.l.nsName(nsk)
	err := w.do(func() error {
		_, err := w.k.cs.CoreV1().Namespaces().Create(w.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: ns, Labels: map[string]string{namespaceLabel: "1"}}}, metav1.CreateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("namespace %s: %w", ns, err)
	}
	for _, p := range pos {
		if err := w.secret(hosts[p], certs[p], caPEM, false); err != nil {
			return err
		}
	}
	if w.l.routeNS(nsk) {
		return w.gatewayAndRoutes(ns, hosts, pos)
	}
	for _, p := range pos {
		if err := w.ingress(hosts[p]); err != nil {
			return err
		}
	}
	return nil
}

// secret: a kubernetes.io/tls Secret as cert-manager writes it (its annotations included,
// so the objects have a realistic size).
func (w *writer) secret(h Host, lc *leafCert, caPEM []byte, update bool) error {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: h.Secret, Namespace: h.Namespace,
			Labels: map[string]string{"controller.cert-manager.io/fao": "true"},
			Annotations: map[string]string{
				"cert-manager.io/certificate-name": h.Object, "cert-manager.io/issuer-name": "h3i-scale-ca",
				"cert-manager.io/issuer-kind": "ClusterIssuer", "cert-manager.io/issuer-group": "cert-manager.io",
				"cert-manager.io/common-name": h.Name, "cert-manager.io/alt-names": h.Name,
			}},
		Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": lc.certPEM, "tls.key": lc.keyPEM, "ca.crt": caPEM},
	}
	return w.do(func() error {
		var err error
		if update {
			_, err = w.k.cs.CoreV1().Secrets(h.Namespace).Update(w.ctx, s, metav1.UpdateOptions{})
		} else {
			_, err = w.k.cs.CoreV1().Secrets(h.Namespace).Create(w.ctx, s, metav1.CreateOptions{})
		}
		if err != nil {
			return fmt.Errorf("secret %s/%s: %w", h.Namespace, h.Secret, err)
		}
		return nil
	})
}

func (w *writer) ingress(h Host) error {
	prefix := networkingv1.PathTypePrefix
	class := w.l.class
	ing := &networkingv1.Ingress{
		ObjectMeta: metav1.ObjectMeta{Name: h.Object, Namespace: h.Namespace,
			Annotations: map[string]string{annotation: "true"}},
		Spec: networkingv1.IngressSpec{
			IngressClassName: &class,
			TLS:              []networkingv1.IngressTLS{{Hosts: []string{h.Name}, SecretName: h.Secret}},
			Rules: []networkingv1.IngressRule{{Host: h.Name, IngressRuleValue: networkingv1.IngressRuleValue{
				HTTP: &networkingv1.HTTPIngressRuleValue{Paths: []networkingv1.HTTPIngressPath{{
					Path: "/", PathType: &prefix,
					Backend: networkingv1.IngressBackend{Service: &networkingv1.IngressServiceBackend{
						Name: "web", Port: networkingv1.ServiceBackendPort{Number: 80}}},
				}}},
			}}},
		},
	}
	return w.do(func() error {
		_, err := w.k.cs.NetworkingV1().Ingresses(h.Namespace).Create(w.ctx, ing, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("ingress %s/%s: %w", h.Namespace, h.Object, err)
		}
		return nil
	})
}

func condition(typ, reason string) map[string]any {
	return map[string]any{"type": typ, "status": "True", "reason": reason, "message": "",
		"observedGeneration": 1, "lastTransitionTime": time.Now().UTC().Format(time.RFC3339)}
}

// gatewayAndRoutes: one Gateway per namespace with an HTTPS listener per host (its own
// certificate), its status as a gateway controller writes it (the address its proxy listens
// on, here the node's nginx), and one annotated HTTPRoute per host, accepted by that controller.
func (w *writer) gatewayAndRoutes(ns string, hosts []Host, pos []int) error {
	var listeners, lstatus []any
	for _, p := range pos {
		h := hosts[p]
		listeners = append(listeners, map[string]any{
			"name": "l-" + h.Object, "port": 443, "protocol": "HTTPS", "hostname": h.Name,
			"tls":           map[string]any{"mode": "Terminate", "certificateRefs": []any{map[string]any{"kind": "Secret", "name": h.Secret}}},
			"allowedRoutes": map[string]any{"namespaces": map[string]any{"from": "Same"}},
		})
		lstatus = append(lstatus, map[string]any{
			"name": "l-" + h.Object, "attachedRoutes": 1,
			"supportedKinds": []any{map[string]any{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute"}},
			"conditions":     []any{condition("Accepted", "Accepted"), condition("Programmed", "Programmed"), condition("ResolvedRefs", "ResolvedRefs")},
		})
	}
	gw := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
		"metadata": map[string]any{"name": "gw", "namespace": ns},
		"spec":     map[string]any{"gatewayClassName": w.l.gwClass, "listeners": listeners},
	}}
	gws := w.k.dyn.Resource(gvrGateway).Namespace(ns)
	if err := w.do(func() error { _, err := gws.Create(w.ctx, gw, metav1.CreateOptions{}); return err }); err != nil {
		return fmt.Errorf("gateway %s/gw: %w", ns, err)
	}
	if err := w.status(gws.Patch, "gw", map[string]any{"status": map[string]any{
		"addresses":  []any{map[string]any{"type": "IPAddress", "value": "127.0.0.1"}},
		"conditions": []any{condition("Accepted", "Accepted"), condition("Programmed", "Programmed")},
		"listeners":  lstatus,
	}}); err != nil {
		return fmt.Errorf("gateway %s/gw status: %w", ns, err)
	}
	routes := w.k.dyn.Resource(gvrHTTPRoute).Namespace(ns)
	for _, p := range pos {
		h := hosts[p]
		rt := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
			"metadata": map[string]any{"name": h.Object, "namespace": ns, "annotations": map[string]any{annotation: "true"}},
			"spec": map[string]any{
				"parentRefs": []any{map[string]any{"name": "gw", "sectionName": "l-" + h.Object}},
				"hostnames":  []any{h.Name},
				"rules":      []any{map[string]any{"backendRefs": []any{map[string]any{"name": "web", "port": 80}}}},
			},
		}}
		if err := w.do(func() error { _, err := routes.Create(w.ctx, rt, metav1.CreateOptions{}); return err }); err != nil {
			return fmt.Errorf("httproute %s/%s: %w", ns, h.Object, err)
		}
		if err := w.status(routes.Patch, h.Object, map[string]any{"status": map[string]any{"parents": []any{map[string]any{
			"parentRef": map[string]any{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw",
				"namespace": ns, "sectionName": "l-" + h.Object},
			"controllerName": controllerName,
			"conditions":     []any{condition("Accepted", "Accepted"), condition("ResolvedRefs", "ResolvedRefs")},
		}}}}); err != nil {
			return fmt.Errorf("httproute %s/%s status: %w", ns, h.Object, err)
		}
	}
	return nil
}

type patcher func(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*unstructured.Unstructured, error)

func (w *writer) status(patch patcher, name string, body map[string]any) error {
	data, err := jsonBytes(body)
	if err != nil {
		return err
	}
	return w.do(func() error {
		_, err := patch(w.ctx, name, types.MergePatchType, data, metav1.PatchOptions{FieldManager: "h3i-scale-gateway"}, "status")
		return err
	})
}
