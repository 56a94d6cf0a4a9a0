// A CoreDNS with only the plugins the dev control plane's real node needs (bind, health, errors,
// log, cache, kubernetes, forward): cluster DNS for Pods
// (the kubernetes plugin: Services, and a headless Service's Pods by hostname and subdomain, as
// a multi-node ManagedJob's ranks use them), everything else forwarded to the host's resolver.
// Built from CoreDNS's Go module like the other parts of the control plane (hack/controlplane.sh
// build coredns); started by hack/realnode.sh.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
)

func init() {
	// The order plugins run in (CoreDNS's plugin.cfg order, for the plugins built in).
	dnsserver.Directives = []string{"bind", "health", "errors", "log", "cache", "kubernetes", "forward"}
}

func main() { coremain.Run() }
