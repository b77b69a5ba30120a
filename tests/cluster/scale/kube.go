package main

import (
	"context"
	"errors"
	"net"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

var (
	gvrListener  = schema.GroupVersionResource{Group: "h3-ingress.dev", Version: "v1alpha1", Resource: "http3listeners"}
	gvrGateway   = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}
	gvrHTTPRoute = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}
)

type kube struct {
	cs  *kubernetes.Clientset
	dyn dynamic.Interface
}

// newKube: clients without client-go's default 5 requests/s limit, so the parallel workers
// (not a client-side throttle) decide how fast objects are made.
func newKube(kubeconfig string) (*kube, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS = 5000
	cfg.Burst = 10000
	cfg.Timeout = 60 * time.Second
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &kube{cs: cs, dyn: dyn}, nil
}

// retry: a call the API server may shed under load (429, timeouts, 5xx) is tried again with
// backoff; AlreadyExists means an earlier attempt went through.
func retry(ctx context.Context, call func() error) error {
	delay := 200 * time.Millisecond
	var err error
	for attempt := 0; attempt < 8; attempt++ {
		err = call()
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		var ne net.Error
		transient := apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) ||
			apierrors.IsTimeout(err) || apierrors.IsInternalError(err) ||
			apierrors.IsServiceUnavailable(err) || errors.As(err, &ne)
		if !transient {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Second)
	}
	return err
}
