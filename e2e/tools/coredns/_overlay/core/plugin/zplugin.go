// The plugins compiled into the dev cluster's CoreDNS: exactly the directives of its Corefile
// (hisparse_devcluster.realnode.plan.corefile), as CoreDNS's plugin.cfg selects them at compile time.
// build.sh puts this file in place of the module's core/plugin/zplugin.go (go build -overlay); the
// module's list compiles every cloud backend's SDK, which more than triples the build on two cores.

package plugin

import (
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)
